"""Command line and entry point."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import os
import signal
import sys

from .. import commands
from .collect import Collector
from .model import DEFAULT_OUTPUT, DEFAULT_STATE_DIR
from .service import Notifier, Stop, _stop, run_loop
from .slurm import valid_cgroup_root


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvidia-smi", default="", help="path to nvidia-smi (default: PATH)")
    parser.add_argument("--amd-smi", default="", help="path to amd-smi (default: PATH)")
    parser.add_argument("--rocm-smi", default="", help="path to rocm-smi (default: PATH)")
    parser.add_argument("--vendor", choices=("auto", "nvidia", "amd"), default="auto")
    parser.add_argument("--textfile-dir", default="/var/lib/node_exporter/textfile_collector")
    parser.add_argument(
        "--output-name", default=DEFAULT_OUTPUT, help="file name, must end in .prom"
    )
    parser.add_argument(
        "--state-dir", default=DEFAULT_STATE_DIR, help="XID counters, field memory; '' disables"
    )
    parser.add_argument("--once", action="store_true", help="one collection, then exit")
    parser.add_argument(
        "--interval", type=float, default=15.0, help="seconds between cycles (loop mode)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="deadline of a whole cycle: vendor tool calls and journalctl",
    )
    parser.add_argument("--expected-gpus", type=int, default=None, help="GPUs this node must have")
    parser.add_argument(
        "--xid-source",
        default="none",
        help="journald, kmsg, none, or a FILE of kernel log lines (tests)",
    )
    parser.add_argument(
        "--proc-root",
        default="/proc",
        help="where /proc/PID/cgroup and /proc/driver/nvidia/gpus are read",
    )
    parser.add_argument(
        "--slurm-cgroup-root",
        default="",
        help="cgroup under which slurmd's hierarchy lies, as the collector sees it "
        "(a slurmd in a container without its own cgroup namespace); default: the root",
    )
    args = parser.parse_args(argv)
    if not valid_cgroup_root(args.slurm_cgroup_root):
        parser.error("--slurm-cgroup-root must be an absolute cgroup path without a trailing /")
    if not args.output_name.endswith(".prom") or "/" in args.output_name:
        parser.error("--output-name must be a plain file name ending in .prom")
    if args.timeout <= 0 or args.interval <= 0:
        parser.error("--timeout and --interval must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The vendor tools inherit this environment; set once, not copied per command.
    os.environ["LC_ALL"] = "C"
    # The cycle logs each failure with its reason; the shared runner's own warnings would
    # repeat them (and journalctl's expected exit 1 in a container, every cycle).
    logging.getLogger(commands.__name__).setLevel(logging.ERROR)
    collector = Collector(args)
    if args.once:
        return 0 if collector.cycle() else 1
    faulthandler.enable()  # the watchdog's SIGABRT leaves where the loop hung in the log
    signal.signal(signal.SIGTERM, _stop)
    with contextlib.suppress(Stop):
        run_loop(collector, args.interval, Notifier.from_environ())
    return 0


if __name__ == "__main__":
    sys.exit(main())
