#!/usr/bin/env python3
"""jobstats benchmark: `gpufleet jobstats` for a 64-GPU job and `gpufleet report idle
--since 7d` against a real Prometheus holding a synthetic week of a GPU cluster.

    .venv/bin/python bench/jobstats_bench.py [--nodes 1000] [--gpus 8] [--days 7]
                                             [--interval 300] [--workdir DIR]

The TSDB holds what a shard (or standalone Prometheus) of that cluster would hold for the
series jobstats reads: the recorded gpu:* and node:* rollups of every GPU and node, the
Slurm exporter's per-job series of a job mix (whole-node jobs of 2-24 h back to back, a
third of them with 2 idle GPUs), the per-(job, GPU) utilization rule and the idle GPU-hour
rules, one sample per --interval. The default, 300 s, is coarser than a shard's (rules
every 15 s): 1,000 nodes x 8 GPUs is about 53,000 series, 107 M samples a week at 300 s
(534 M at 60 s, which promtool cannot backfill on a 2-core machine in under an hour); it
matches the 5-minute step of `report idle --threshold`, and a query reads 1/20 of the
samples it would on a real shard. Raw exporter series (node_exporter's and the collector's
own) are left out: jobstats never reads them, they would only grow the index. It is
written as one OpenMetrics file per UTC day and backfilled with sid's `promtool tsdb
create-blocks-from openmetrics`, then served by sid's prometheus on loopback (both
downloaded by apt and unpacked like the unit tests do, tests/unit/sid_deb.py).

Prints the generation and backfill times, then for each command the median wall time of
3 runs (a fresh `python -m gpufleet` process each, as a user runs it) and Prometheus' query
stats (stats=all: samples read, time spent in Prometheus). `report idle --threshold` is
also timed in its previous shape (one subquery by user and another by account, both over
every per-GPU series) against the current one (one by user and account). Target: under
2 s for the job report. Not run by CI; it needs several GiB of disk at full size.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "unit"), str(REPO / "tests" / "unit" / "jobstats")]

import sid_deb  # noqa: E402
from jobstats_synth import backfill, labels, prometheus  # noqa: E402

from gpufleet.jobstats.idle import STEP_MIN  # noqa: E402
from gpufleet_node.job_summary.prom import PromClient  # noqa: E402

GIB = 1024**3
BIG_JOB = "9000001"
BIG_GPUS = 64
DAY = 86400


class Cluster:
    """Nodes, their jobs as (start, end, job_id, user, account, per-GPU utilization)."""

    def __init__(self, nodes: int, gpus: int, start: int, end: int, interval: int) -> None:
        self.rng = random.Random(14)
        self.names = [f"gpu{n:04d}" for n in range(nodes)]
        self.gpus = gpus
        self.interval = interval
        self.users = [f"user{u:03d}" for u in range(max(1, nodes // 5))]
        self.account_of = {
            u: f"acct{i % max(1, nodes // 20):02d}" for i, u in enumerate(self.users)
        }
        self.big_nodes = self.names[: max(1, BIG_GPUS // gpus)]
        big_start = start + (end - start) * 4 // 7 // interval * interval
        self.big = (big_start, big_start + DAY, BIG_JOB, "alice", "physics",
                    [90.0] * (gpus - 2) + [0.0, 0.0])  # fmt: skip
        self.next_id = 1000
        self.jobs = {name: self.node_jobs(name, start, end) for name in self.names}

    def node_jobs(self, name: str, start: int, end: int) -> list[tuple]:
        jobs: list[tuple] = []
        windows = [(start, end)]
        if name in self.big_nodes:
            jobs.append(self.big)
            windows = [(start, self.big[0] - self.interval), (self.big[1] + self.interval, end)]
        for lo, hi in windows:
            t = lo
            while t < hi:
                length = self.rng.randrange(2 * 3600, 24 * 3600) // self.interval * self.interval
                stop = min(hi, t + length)
                user = self.rng.choice(self.users)
                util = [self.rng.uniform(30, 98) for _ in range(self.gpus)]
                if self.rng.random() < 0.33:
                    util[-2:] = [0.0, 0.0]
                self.next_id += 1
                jobs.append((t, stop, str(self.next_id), user, self.account_of[user], util))
                t = stop + self.rng.randrange(0, 3600) // self.interval * self.interval
        jobs.sort()
        return jobs


def segments(jobs: list[tuple], lo: int, hi: int) -> list[tuple[int, int, tuple | None]]:
    """[lo, hi) cut into (from, to, job or None) pieces."""
    pieces, t = [], lo
    for job in jobs:
        start, end = max(job[0], lo, t), min(job[1] + 1, hi)  # a job may start as one ends
        if start >= end:
            continue
        if start > t:
            pieces.append((t, start, None))
        pieces.append((start, end, job))
        t = end
    if t < hi:
        pieces.append((t, hi, None))
    return pieces


def write_day(cluster: Cluster, lo: int, hi: int, path: Path) -> int:
    """The OpenMetrics file of [lo, hi); returns the samples written."""
    step = cluster.interval
    first = (lo + step - 1) // step * step
    stamps = [str(t) for t in range(first, hi, step)]

    def index(t: int) -> int:
        return max(0, (t - first + step - 1) // step)

    written = 0
    with path.open("w", encoding="utf-8") as out:

        def emit(prefix: str, value: str, a: int, b: int) -> None:
            nonlocal written
            chunk = stamps[index(a) : index(b)]
            out.write("".join(f"{prefix}{value} {ts}\n" for ts in chunk))
            written += len(chunk)

        def gpu_family(name: str, value_of) -> None:  # type: ignore[no-untyped-def]
            out.write(f"# TYPE {name} gauge\n")
            for node in cluster.names:
                pieces = segments(cluster.jobs[node], lo, hi)
                for gpu in range(cluster.gpus):
                    prefix = f'{name}{{cluster="c1",gpu="{gpu}",gpu_model="H100",node="{node}"}} '
                    for a, b, job in pieces:
                        emit(prefix, value_of(job, gpu), a, b)

        def util(job: tuple | None, gpu: int) -> float:
            return job[5][gpu] if job else 0.0

        gpu_family("gpu:utilization_percent:max", lambda j, g: f"{util(j, g):.1f}")
        gpu_family("gpu:memory_used_bytes:sum", lambda j, g: str(int(util(j, g) * 0.8 * GIB)))
        gpu_family("gpu:memory_total_bytes:sum", lambda j, g: str(80 * GIB))
        gpu_family("gpu:power_draw_watts:max", lambda j, g: f"{60 + 6 * util(j, g):.0f}")
        node_values = {
            "node:cpu_utilization:ratio": lambda j: "0.35" if j else "0.01",
            "node:memory_utilization:ratio": lambda j: "0.4" if j else "0.05",
            "node:memory_total_bytes:sum": lambda j: str(2048 * GIB),
            "node:cpus:count": lambda j: "128",
        }
        for name, value_of in node_values.items():
            out.write(f"# TYPE {name} gauge\n")
            for node in cluster.names:
                prefix = f'{name}{{cluster="c1",node="{node}"}} '
                for a, b, job in segments(cluster.jobs[node], lo, hi):
                    emit(prefix, value_of(job), a, b)
        job_pieces = [
            (node, a, b, job)
            for node in cluster.names
            for a, b, job in segments(cluster.jobs[node], lo, hi)
            if job
        ]
        out.write("# TYPE slurm_job_gpus_allocated gauge\n")
        for node, a, b, job in job_pieces:
            lab = labels(account=job[4], cluster="c1", job_id=job[2], node=node,
                         partition="gpu", user=job[3])  # fmt: skip
            emit(f"slurm_job_gpus_allocated{lab} ", str(cluster.gpus), a, b)
        out.write("# TYPE slurm_job_gpu_index_info gauge\n")
        for node, a, b, job in job_pieces:
            for gpu in range(cluster.gpus):
                lab = labels(cluster="c1", gpu=str(gpu), job_id=job[2], node=node)
                emit(f"slurm_job_gpu_index_info{lab} ", "1", a, b)
        name = "slurm_job_gpu:gpu_utilization_percent:max"
        out.write(f"# TYPE {name} gauge\n")
        for node, a, b, job in job_pieces:
            for gpu in range(cluster.gpus):
                lab = labels(account=job[4], cluster="c1", gpu=str(gpu), job_id=job[2],
                             node=node, partition="gpu", user=job[3])  # fmt: skip
                emit(f"{name}{lab} ", f"{job[5][gpu]:.1f}", a, b)
        written += idle_hour_families(cluster, job_pieces, stamps, out)
        out.write("# EOF\n")
    return written


def idle_hour_families(cluster: Cluster, job_pieces: list, stamps: list[str], out) -> int:  # type: ignore[no-untyped-def]
    """The idle GPU-hour rules: idle GPUs held per user/account at each sample."""
    if not stamps:
        return 0
    first, step = int(stamps[0]), cluster.interval
    per: dict[tuple[str, str], list[int]] = {}
    for _node, a, b, job in job_pieces:
        idle = sum(1 for u in job[5] if u < 5)
        for key in (("user", job[3]), ("account", job[4])):
            counts = per.setdefault(key, [0] * len(stamps))
            for i in range(max(0, (a - first) // step), min(len(stamps), (b - first) // step)):
                counts[i] += idle
    written = 0
    for kind in ("user", "account"):
        name = f"slurm_{kind}:gpu_hours_allocated_idle:sum1h"
        out.write(f"# TYPE {name} gauge\n")
        for (key, value), counts in sorted(per.items()):
            if key == kind:
                prefix = f'{name}{{cluster="c1",{kind}="{value}"}} '
                out.write(
                    "".join(f"{prefix}{c} {ts}\n" for c, ts in zip(counts, stamps, strict=True))
                )
                written += len(stamps)
    out.write("# TYPE cluster:gpu_hours_allocated_idle:sum1h gauge\n")
    out.write(
        "".join(f'cluster:gpu_hours_allocated_idle:sum1h{{cluster="c1"}} 0 {ts}\n' for ts in stamps)
    )
    return written + len(stamps)


def timed(argv: list[str], runs: int = 3) -> tuple[float, str, str]:
    """Median wall time of ``python -m gpufleet ARGV``, its stdout and its stats line."""
    walls, out, err = [], "", ""
    for _ in range(runs):
        began = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "gpufleet", *argv], capture_output=True, text=True, check=False
        )
        walls.append(time.monotonic() - began)
        out, err = result.stdout, result.stderr
        if result.returncode != 0:
            raise SystemExit(f"gpufleet {' '.join(argv)}: exit {result.returncode}: {err}")
    return statistics.median(walls), out, err.strip()


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def previous_threshold_shape(url: str, since_s: int, threshold: float) -> None:
    """`report idle --threshold` as it was before one query answered both keys: a query
    by user, then one by account (the same subquery twice)."""
    client = PromClient(url, timeout=600.0, want_stats=True)
    inner = (
        f"(max_over_time(slurm_job_gpu:gpu_utilization_percent:max[{STEP_MIN}m]) < {threshold:g})"
    )
    walls = []
    for _ in range(3):
        client.stats.clear()
        began = time.monotonic()
        for key in ("user", "account"):
            client.query(
                f"sum by ({key}) (count_over_time({inner}[{since_s}s:{STEP_MIN}m]))"
                f" * {STEP_MIN / 60:.6g}"
            )
        walls.append(time.monotonic() - began)
    samples = sum(s.get("samples", {}).get("totalQueryableSamples", 0) for s in client.stats)
    inside = sum(s.get("timings", {}).get("execTotalTime", 0.0) for s in client.stats)
    print(f"\nprevious shape of report idle --threshold {threshold:g} (2 queries, by user and "
          f"by account): {statistics.median(walls):.2f} s (median of 3, queries only)\n"
          f"  {samples:,} samples read, {inside:.2f} s in Prometheus (last run)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--interval", type=int, default=300, help="seconds between samples")
    parser.add_argument("--workdir", help="keep the TSDB here (default: a temporary directory)")
    args = parser.parse_args()
    if args.nodes * args.gpus < BIG_GPUS:
        raise SystemExit(f"need at least {BIG_GPUS} GPUs for the 64-GPU job")
    cache = REPO / ".cache"
    promtool = sid_deb.unpacked("promtool", cache / "promtool") / "usr" / "bin" / "promtool"
    binary = sid_deb.unpacked("prometheus", cache / "prometheus") / "usr" / "bin" / "prometheus"
    work = Path(args.workdir or tempfile.mkdtemp(prefix="jobstats-bench."))
    tsdb = work / "tsdb"
    end = int(time.time()) // args.interval * args.interval
    start = end - args.days * DAY
    print(
        f"machine: {os.cpu_count()} CPUs ({cpu_model()}), {platform.system()} "
        f"{platform.release()}; {binary.parent.parent.parent.name}"
    )
    print(f"cluster: {args.nodes} nodes x {args.gpus} GPUs, {args.days} days, one sample "
          f"every {args.interval} s (synthetic; a shard's rules write every 15 s)")  # fmt: skip
    began = time.monotonic()
    cluster = Cluster(args.nodes, args.gpus, start, end, args.interval)
    samples = generate_s = backfill_s = 0.0
    if not tsdb.exists():
        day = start // DAY * DAY
        while day < end:
            lo, hi = max(start, day), min(end + 1, day + DAY)
            text = work / "day.om"
            t0 = time.monotonic()
            samples += write_day(cluster, lo, hi, text)
            t1 = time.monotonic()
            backfill(promtool, text, tsdb, max_block="24h")
            backfill_s += time.monotonic() - t1
            generate_s += t1 - t0
            text.unlink()
            day += DAY
        print(f"generated {samples / 1e6:.1f} M samples in {generate_s:.0f} s, backfilled in "
              f"{backfill_s:.0f} s (total {time.monotonic() - began:.0f} s)")  # fmt: skip
    jobs = sum(len(v) for v in cluster.jobs.values())
    print(f"jobs: {jobs}; the {BIG_GPUS}-GPU job {BIG_JOB} on {len(cluster.big_nodes)} nodes, 24 h")
    with prometheus(binary, tsdb) as url:
        base = ["--prometheus", url, "--stats", "--timeout", "600"]
        timed(["report", "idle", "--since", "1h", *base], runs=1)  # load the blocks once
        for argv in (
            ["jobstats", BIG_JOB, *base],
            ["report", "idle", "--since", f"{args.days * 24}h", *base],
            ["report", "idle", "--since", f"{args.days * 24}h", "--threshold", "10", *base],
        ):
            wall, out, stats = timed(argv)
            verdict = re.search(r"(?m)^verdict: .*$|^request .*$", out)
            print(f"\ngpufleet {' '.join(argv[: argv.index('--prometheus')])}: {wall:.2f} s "
                  f"(median of 3)\n  {stats}")  # fmt: skip
            if verdict:
                print(f"  {verdict.group(0)}")
        previous_threshold_shape(url, args.days * DAY, 10.0)
        began = time.monotonic()
        unknown = subprocess.run(
            [sys.executable, "-m", "gpufleet", "jobstats", "1", *base],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        print(f"\ngpufleet jobstats for an unknown job: {time.monotonic() - began:.2f} s, exit "
              f"{unknown.returncode}\n  {unknown.stderr.strip()}")  # fmt: skip
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
