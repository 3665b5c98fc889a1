#!/usr/bin/env python3
"""CPU time of one GPU collection cycle on an 8-GPU node, without nvidia-smi's own time.

Compares, on the same nvidia-smi test double (H100 load capture replicated to 8 GPUs):

- ``service loop``: the role's default mode, the collector's ``--interval`` loop as its
  systemd service runs it: one long-running process that tells systemd READY=1 and
  WATCHDOG=1 over $NOTIFY_SOCKET. The bench is that socket: one cycle is the loop
  process's own CPU time (/proc/PID/schedstat) from one WATCHDOG=1 to the next, its
  sleep and the notification included (the double, a child, is not in it);
- ``timer --once``: gpu_collector_mode timer, a process per cycle as the systemd timer
  runs it: the zipapp the role installs (interpreter start-up, and compiling the modules
  each time: a zipapp holds no byte code);
- ``timer -m --once``: the same run as ``python3 -m gpufleet_node.gpu_collector`` from a
  byte-compiled copy of the package, so the compile step is cached;
The service loop runs the zipapp too, as its unit does.
- ``bash baseline``: bench/baseline_nvidia_smi_textfile.sh (one nvidia-smi call for six
  fields, read/echo), as cron runs it.

Time of the double (the stand-in for nvidia-smi) is excluded: the double appends its
own getrusage(RUSAGE_SELF) to a log at exit (FAKE_NVIDIA_SMI_RUSAGE_LOG), and that is
subtracted from the RUSAGE_CHILDREN delta of each process tree run once per cycle.
The rounds interleave the modes (the loop is stopped, SIGSTOP, while the others run),
so load from elsewhere on the machine falls on all of them alike. The last line compares
the default mode with the baseline (target: at most half of it).
Usage: python3 bench/gpu_collector_bench.py [--runs N] [--gpus N]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "gpufleet_node"
FAKE_SMI = REPO / "tests" / "gpu" / "fake_nvidia_smi.py"
BASELINE = REPO / "bench" / "baseline_nvidia_smi_textfile.sh"
CAPTURE = (
    REPO
    / "tests"
    / "fixtures"
    / "nvidia-smi"
    / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
)


def cpu(usage: resource.struct_rusage) -> tuple[float, float]:
    return usage.ru_utime, usage.ru_stime


def drain_double_log(path: Path) -> tuple[float, float, int]:
    """Sum and clear what the double logged: (user, sys, calls)."""
    if not path.exists():
        return 0.0, 0.0, 0
    lines = path.read_text().split()
    path.unlink()
    user = sum(float(x) for x in lines[0::2])
    system = sum(float(x) for x in lines[1::2])
    return user, system, len(lines) // 2


def measure_process(
    argv: list[str], log: Path, env: dict[str, str] | None = None
) -> tuple[float, float, float]:
    """(user, sys, double total) of a process tree, the double's time removed."""
    before = cpu(resource.getrusage(resource.RUSAGE_CHILDREN))
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
    after = cpu(resource.getrusage(resource.RUSAGE_CHILDREN))
    d_user, d_sys, _ = drain_double_log(log)
    return after[0] - before[0] - d_user, after[1] - before[1] - d_sys, d_user + d_sys


def schedstat_seconds(pid: int) -> float:
    """CPU time the process's (only) thread has run, in seconds."""
    with open(f"/proc/{pid}/schedstat", encoding="ascii") as handle:
        return int(handle.read().split()[0]) / 1e9


class ServiceLoop:
    """The collector's --interval loop with the bench as its systemd notify socket."""

    def __init__(self, argv: list[str], work: Path, env: dict[str, str]) -> None:
        self.log = work / "loop-double-rusage.log"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(work / "notify"))
        self.sock.settimeout(60)
        env = {**env, "NOTIFY_SOCKET": str(work / "notify")}
        env["FAKE_NVIDIA_SMI_RUSAGE_LOG"] = str(self.log)
        self.proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
        if b"READY=1" not in self.sock.recv(4096):
            raise RuntimeError("the loop's first message is not READY=1")
        self.proc.send_signal(signal.SIGSTOP)

    def next_cycle(self) -> float:
        message = self.sock.recv(4096)
        if message != b"WATCHDOG=1":
            raise RuntimeError(f"unexpected notification {message!r}")
        return schedstat_seconds(self.proc.pid)

    def measure(self) -> tuple[float, float, float]:
        """(cpu, 0, double) of one loop iteration: WATCHDOG=1 to WATCHDOG=1."""
        self.proc.send_signal(signal.SIGCONT)
        start = self.next_cycle()
        drain_double_log(self.log)
        end = self.next_cycle()
        self.proc.send_signal(signal.SIGSTOP)  # in its sleep: it does not run meanwhile
        d_user, d_sys, _ = drain_double_log(self.log)
        return end - start, 0.0, d_user + d_sys

    def close(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.sock.close()


def median_ms(runs: list[tuple[float, float, float]], index: int | None = None) -> float:
    if index is None:
        return statistics.median(r[0] + r[1] for r in runs) * 1000
    return statistics.median(r[index] for r in runs) * 1000


def summarize(name: str, runs: list[tuple[float, float, float]], split: bool = True) -> str:
    user, system = (f"{median_ms(runs, i):>9.1f}" if split else f"{'-':>9}" for i in (0, 1))
    return f"{name:<34}{user}{system}{median_ms(runs):>10.2f}{median_ms(runs, 2):>16.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--python",
        default="/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable,
        help="interpreter for the --once runs (default: the system one, as on hosts)",
    )
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    (work / "bin").mkdir()
    (work / "out").mkdir()
    smi = work / "bin" / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_SMI}" "$@"\n')
    smi.chmod(0o755)
    log = work / "double-rusage.log"
    os.environ.update(
        FAKE_NVIDIA_SMI_CONFIG=str(work / "none.conf"),
        FAKE_NVIDIA_SMI_CAPTURE=str(CAPTURE),
        FAKE_NVIDIA_SMI_STATE="load",
        FAKE_NVIDIA_SMI_GPUS=str(opts.gpus),
        FAKE_NVIDIA_SMI_RUSAGE_LOG=str(log),
        PATH=f"{smi.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    common = ["--nvidia-smi", str(smi), "--textfile-dir", str(work / "out")]
    common += ["--state-dir", str(work / "state"), "--xid-source", "none"]
    lib = work / "lib"
    lib.mkdir()
    shutil.copytree(PACKAGE, lib / PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__"))
    collector = work / "gpufleet-gpu-collector.pyz"
    subprocess.run(
        [sys.executable, "-m", "gpufleet_node.build", "--app", "gpu_collector", str(collector)],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    subprocess.run([opts.python, "-m", "compileall", "-q", str(lib)], check=True)
    module_env = {**os.environ, "PYTHONPATH": str(lib)}
    # Cycles 0.3 s apart: after each WATCHDOG=1 the loop sleeps, and is stopped there.
    loop = ServiceLoop(
        [opts.python, str(collector), *common, "--interval", "0.3"], work, os.environ
    )
    once = ["--once", *common]
    runs = {
        "service": loop.measure,
        "once": lambda: measure_process([opts.python, str(collector), *once], log),
        "module": lambda: measure_process(
            [opts.python, "-m", "gpufleet_node.gpu_collector", *once], log, module_env
        ),
        "bash": lambda: measure_process(["bash", str(BASELINE), str(work / "out")], log),
    }
    results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in runs}
    try:
        for i in range(opts.runs + 1):  # first round warms caches and is dropped
            for key, run in runs.items():
                measured = run()
                if i:
                    results[key].append(measured)
    finally:
        loop.close()
    series = sum(
        1
        for line in (work / "out" / "gpufleet_gpu.prom").read_text().splitlines()
        if line[:1] != "#"
    )
    base = sum(
        1 for line in (work / "out" / "nvidia_smi.prom").read_text().splitlines() if line[:1] != "#"
    )
    print(f"GPU collection cycle, {opts.gpus} GPUs (H100 load capture), median of {opts.runs} runs")
    version = subprocess.run([opts.python, "--version"], capture_output=True, text=True).stdout
    print(f"collector on {opts.python} ({version.strip()}), {os.cpu_count()} CPUs")
    print("CPU ms, excluding nvidia-smi (the double, shown in the last column)")
    print(f"{'':<34}{'user':>9}{'sys':>9}{'user+sys':>10}{'double (excl.)':>16}")
    print(summarize("service loop, one cycle (default)", results["service"], split=False))
    print(summarize("timer --once (zipapp)", results["once"]))
    print(summarize("timer -m --once (pyc)", results["module"]))
    print(summarize("bash baseline (cron)", results["bash"]))
    print(f"series written: collector {series}, baseline {base}")
    default, baseline = median_ms(results["service"]), median_ms(results["bash"])
    verdict = "met" if default <= baseline / 2 else "NOT met"
    print(
        f"default mode (service loop): {default:.2f} ms per cycle = "
        f"{100 * default / baseline:.0f} % of the bash baseline's {baseline:.2f} ms "
        f"(target: at most 50 %, {verdict})"
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
