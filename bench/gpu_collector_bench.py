#!/usr/bin/env python3
"""CPU time of one GPU collection cycle on an 8-GPU node, without nvidia-smi's own time.

Compares, on the same nvidia-smi test double (H100 load capture replicated to 8 GPUs):

- ``collector --once``: a process per cycle, as the systemd timer runs it (includes
  the Python interpreter start-up and, run as a script, compiling the file each time);
- ``collector -m --once``: the same, run as ``python3 -m gpufleet_gpu_collector`` from a
  byte-compiled directory, so the compile step is cached;
- ``collector cycle``: one cycle inside a running process (``--interval`` loop mode),
  measured with getrusage(RUSAGE_SELF) around the cycle;
- ``bash baseline``: bench/baseline_nvidia_smi_textfile.sh (one nvidia-smi call for six
  fields, read/echo), as cron runs it.

Time of the double (the stand-in for nvidia-smi) is excluded: the double appends its
own getrusage(RUSAGE_SELF) to a log at exit (FAKE_NVIDIA_SMI_RUSAGE_LOG), and that is
subtracted from the RUSAGE_CHILDREN delta of each measured process tree.
Usage: python3 bench/gpu_collector_bench.py [--runs N] [--gpus N]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLLECTOR = REPO / "roles" / "gpu_collector" / "files" / "gpufleet_gpu_collector.py"
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


def load_collector():
    spec = importlib.util.spec_from_file_location("gpufleet_gpu_collector", COLLECTOR)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def measure_in_process(collector, args: list[str], log: Path) -> tuple[float, float, float]:
    instance = collector.Collector(collector.parse_args(args))
    before = cpu(resource.getrusage(resource.RUSAGE_SELF))
    instance.cycle()
    after = cpu(resource.getrusage(resource.RUSAGE_SELF))
    d_user, d_sys, _ = drain_double_log(log)
    return after[0] - before[0], after[1] - before[1], d_user + d_sys


def summarize(name: str, runs: list[tuple[float, float, float]]) -> str:
    user = statistics.median(r[0] for r in runs) * 1000
    system = statistics.median(r[1] for r in runs) * 1000
    total = statistics.median((r[0] + r[1]) for r in runs) * 1000
    double = statistics.median(r[2] for r in runs) * 1000
    return f"{name:<28}{user:>9.1f}{system:>9.1f}{total:>10.1f}{double:>16.1f}"


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
    common = ["--once", "--nvidia-smi", str(smi), "--textfile-dir", str(work / "out")]
    common += ["--state-dir", str(work / "state"), "--xid-source", "none"]
    collector = load_collector()
    lib = work / "lib"
    lib.mkdir()
    (lib / COLLECTOR.name).write_bytes(COLLECTOR.read_bytes())
    subprocess.run([opts.python, "-m", "compileall", "-q", str(lib)], check=True)
    module_env = {**os.environ, "PYTHONPATH": str(lib)}
    runs = {
        "once": lambda: measure_process([opts.python, str(COLLECTOR), *common], log),
        "module": lambda: measure_process(
            [opts.python, "-m", COLLECTOR.stem, *common], log, module_env
        ),
        "cycle": lambda: measure_in_process(collector, common, log),
        "bash": lambda: measure_process(["bash", str(BASELINE), str(work / "out")], log),
    }
    results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in runs}
    for i in range(opts.runs + 1):  # first round warms caches and is dropped
        for key, run in runs.items():
            measured = run()
            if i:
                results[key].append(measured)
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
    print(
        f"{opts.python} ({version.strip()}) for --once; "
        f"in-process cycle on {sys.version.split()[0]}"
    )
    print("CPU ms, excluding nvidia-smi (the double, shown in the last column)")
    print(f"{'':<28}{'user':>9}{'sys':>9}{'user+sys':>10}{'double (excl.)':>16}")
    print(summarize("collector --once (script)", results["once"]))
    print(summarize("collector -m --once (pyc)", results["module"]))
    print(summarize("collector cycle (loop)", results["cycle"]))
    print(summarize("bash baseline (cron)", results["bash"]))
    print(f"series written: collector {series}, baseline {base}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
