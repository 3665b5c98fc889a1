"""Command line: arguments, file checks, and the serving loop."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable

from gpufleet_node import __version__
from gpufleet_node.slurm_exporter import __doc__ as _PACKAGE_DOC
from gpufleet_node.slurm_exporter.collect import Collector
from gpufleet_node.slurm_exporter.model import (
    DEFAULT_MAX_GPU_INDEX_SERIES,
    DEFAULT_MAX_JOB_SERIES,
    JOB_SOURCES,
    JSON_MIN_VERSION,
)
from gpufleet_node.slurm_exporter.server import (
    WEB_MAX_CONNECTIONS,
    WEB_MAX_CONNECTIONS_PER_ADDRESS,
    WEB_READ_TIMEOUT,
    WEB_WRITE_TIMEOUT,
    make_server,
)
from gpufleet_node.slurm_exporter.shards import NodeMap, NodeMapError
from gpufleet_node.webconfig import WebConfig, WebConfigError

LOG = logging.getLogger("gpufleet_slurm_exporter")


def _add_file_arguments(p: argparse.ArgumentParser, name: str, what: str) -> None:
    """--NAME-file (reread when it changes) and --check-NAME FILE (check it, then exit)."""
    p.add_argument(f"--{name}-file", default=None, help=f"{what}; reread when it changes")
    noun = name.replace("-", " ")
    p.add_argument(
        f"--check-{name}",
        metavar="FILE",
        default=None,
        help=f"only check that FILE loads as a {noun} (exit 0) or say why not (exit 2)",
    )


def _check_file(path: str, what: str, load: Callable[[str], object]) -> int:
    """Exit status of --check-*: 0 when ``load`` takes the file, else 2 with the reason."""
    try:
        load(path)
    except (WebConfigError, NodeMapError) as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="gpufleet-slurm-exporter", description=_PACKAGE_DOC.splitlines()[0]
    )
    p.add_argument("--listen-address", default=":9341", help="host:port (default :9341)")
    # SchedMD advises 60-120 s between queries of the whole job table (two per collection).
    p.add_argument("--collect-interval", type=float, default=60.0, help="seconds (default 60)")
    p.add_argument(
        "--command-timeout", type=float, default=10.0, help="per command, seconds (default 10)"
    )
    p.add_argument(
        "--max-job-series",
        type=int,
        default=DEFAULT_MAX_JOB_SERIES,
        help=f"cap on exported (running job, node) pairs (default {DEFAULT_MAX_JOB_SERIES})",
    )
    p.add_argument(
        "--max-gpu-index-series",
        type=int,
        default=DEFAULT_MAX_GPU_INDEX_SERIES,
        help="cap on exported slurm_job_gpu_index_info series"
        f" (default {DEFAULT_MAX_GPU_INDEX_SERIES})",
    )
    p.add_argument(
        "--job-source",
        choices=JOB_SOURCES,
        default="auto",
        help="how job records are read: json (scontrol --json), text (scontrol -o), or auto"
        " (json from Slurm {}.{:02d} on, else text; default auto)".format(*JSON_MIN_VERSION),
    )
    p.add_argument(
        "--max-stale",
        type=float,
        default=300.0,
        help="serve a failed command's last good values this long (default 300 s)",
    )
    p.add_argument("--slurm-bin-dir", default=None, help="directory of the Slurm commands")
    p.add_argument(
        "--web-max-connections",
        type=int,
        default=WEB_MAX_CONNECTIONS,
        help=f"open HTTP connections at most (default {WEB_MAX_CONNECTIONS})",
    )
    p.add_argument(
        "--web-read-timeout",
        type=float,
        default=WEB_READ_TIMEOUT,
        help="seconds a connection has for TLS handshake, request line and headers"
        f" (default {WEB_READ_TIMEOUT:g})",
    )
    p.add_argument(
        "--web-write-timeout",
        type=float,
        default=WEB_WRITE_TIMEOUT,
        help=f"seconds a connection has to take the whole answer (default {WEB_WRITE_TIMEOUT:g})",
    )
    p.add_argument(
        "--web-max-connections-per-address",
        type=int,
        default=WEB_MAX_CONNECTIONS_PER_ADDRESS,
        help="open HTTP connections from one client address at most"
        f" (default {WEB_MAX_CONNECTIONS_PER_ADDRESS})",
    )
    _add_file_arguments(
        p, "web-config", "TLS and basic auth, in node_exporter's web config shape written as JSON"
    )
    _add_file_arguments(
        p,
        "node-map",
        'JSON {"shards": {"0": [node, ...], ...}}: which Prometheus shard owns which'
        " node, for /metrics?shard=K[&cluster=1]",
    )
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--version", action="version", version=__version__)
    args = p.parse_args(argv)
    for path, what, load in (
        (args.check_web_config, "web config", WebConfig),
        (args.check_node_map, "node map", NodeMap),
    ):
        if path is not None:
            return _check_file(path, what, load)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        node_map = NodeMap(args.node_map_file) if args.node_map_file else None
    except NodeMapError as exc:
        LOG.error("node map: %s", exc)
        return 2
    collector = Collector(
        command_timeout=args.command_timeout,
        max_job_series=args.max_job_series,
        max_stale=args.max_stale,
        bin_dir=args.slurm_bin_dir,
        job_source=args.job_source,
        max_gpu_index_series=args.max_gpu_index_series,
        node_map=node_map,
    )
    stop = threading.Event()
    thread = threading.Thread(
        target=collector.loop, args=(args.collect_interval, stop), name="collector", daemon=True
    )
    try:
        web = WebConfig(args.web_config_file)
    except WebConfigError as exc:
        LOG.error("web config: %s", exc)
        return 2
    try:
        server = make_server(
            args.listen_address,
            collector,
            web,
            max_connections=args.web_max_connections,
            read_timeout=args.web_read_timeout,
            write_timeout=args.web_write_timeout,
            max_connections_per_address=args.web_max_connections_per_address,
        )
    except (OSError, ValueError) as exc:
        LOG.error("cannot listen on %s: %s", args.listen_address, exc)
        return 2

    def _stop(signum: int, _frame: object) -> None:
        LOG.info("signal %d, shutting down", signum)
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    thread.start()
    LOG.info(
        "listening on %s (%s%s)",
        args.listen_address,
        "https" if web.current().tls else "http",
        ", basic auth" if web.current().users else "",
    )
    server.serve_forever()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
