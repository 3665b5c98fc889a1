"""The known scenario of the live jobstats tests (see conftest.py), as OpenMetrics text.

Job 4242 (alice/physics) held GPUs 0-3 of n1 and 0-1 of n2 for exactly 2 h, ended an hour
or more ago, with known per-GPU utilization (UTIL; n1:2 and n1:3 idle). Job 4343 (bob/chem)
runs now on n2's GPUs 2-3. Outside their jobs the GPUs are at 100 %, so a report that reads
outside the job's span is off by far more than sampling error. Job 4444 (carol/bio) was
requeued: its first run held n1:0, its second, after a 10-minute gap, n2:0.

GPU health checks (the GPU collector's node_gpu_health_check, FAULTS): during job 4343,
n2:3 (its GPU) and n2 itself (a node check) fail, n2:1 (not its GPU) fails and n2:2 only
warns; n1:0 failed until 2 minutes before job 4242 started (within the lookback delta of
its first steps). Job 4242 had no fault.
"""

from __future__ import annotations

from pathlib import Path

from jobstats_synth import Job, job_families, labels, write_family

STEP = 30
GIB = 1024**3
# (node, gpu) -> (mean utilization %, jitter amplitude): value = mean + jitter * (k - 2),
# k = (t / 30) % 5, so a run of whole 5-sample cycles averages exactly the mean.
UTIL = {
    ("n1", 0): (80.0, 5.0),
    ("n1", 1): (60.0, 5.0),
    ("n1", 2): (1.0, 0.5),
    ("n1", 3): (0.0, 0.0),
    ("n2", 0): (90.0, 5.0),
    ("n2", 1): (40.0, 3.0),
}
MEM_USED_GIB = {("n1", 0): 30.0, ("n1", 1): 30.0, ("n2", 0): 60.0, ("n2", 1): 10.0}
CPU = {"n1": 0.25, "n2": 0.5}
SITE_THRESHOLD = 10.0


def faults(hour: int, now: float) -> list[tuple[dict[str, str], int, int]]:
    """(labels, first, last sample time) of each failing or warning health check."""
    until = int(now) // STEP * STEP
    n2 = {"node": "n2", "state": "fail"}
    return [
        ({**n2, "gpu": "3", "check": "xid", "reason": "xid79 (fallen off the bus)"},
         hour - 1800, until),
        ({**n2, "gpu": "1", "check": "ecc_uncorrectable", "reason": "2 uncorrectable ECC errors"},
         hour - 1500, until),
        ({**n2, "check": "gpu_count", "reason": "3 of 4 GPUs present"}, hour - 900, hour - 600),
        ({"node": "n2", "state": "warn", "gpu": "2", "check": "retired_pages",
          "reason": "page retirement pending, reboot"}, hour - 1800, until),
        ({"node": "n1", "state": "fail", "gpu": "0", "check": "row_remap_pending",
          "reason": "row remap pending, reset the GPU"}, hour - 5 * 3600, hour - 3 * 3600 - 120),
    ]  # fmt: skip


def build_jobs(now: float) -> tuple[Job, Job, int]:
    hour = int(now) // 3600 * 3600
    done = Job("4242", "alice", "physics", "gpu", hour - 3 * 3600, hour - 3600,
               {"n1": [0, 1, 2, 3], "n2": [0, 1]})  # fmt: skip
    running = Job("4343", "bob", "chem", "gpu", hour - 3600, int(now) // STEP * STEP,
                  {"n2": [2, 3]})  # fmt: skip
    return done, running, hour


def requeued_runs(hour: int) -> tuple[Job, Job]:
    """Job 4444's two runs: n1:0, then (requeued, 10 minutes later) n2:0; both at 100 %."""
    first = Job("4444", "carol", "bio", "gpu", hour - 3000, hour - 1800, {"n1": [0]})
    second = Job("4444", "carol", "bio", "gpu", hour - 1200, hour - 600, {"n2": [0]})
    return first, second


def util(job: Job, other: Job, node: str, gpu: int, t: int) -> float:
    if job.running_at(t) and gpu in job.gpus.get(node, []):
        mean, jitter = UTIL[(node, gpu)]
        return mean + jitter * ((t // STEP) % 5 - 2)
    if other.running_at(t) and gpu in other.gpus.get(node, []):
        return 70.0
    return 100.0


def write_series(path: Path, now: float) -> tuple[Job, Job]:
    job, other, hour = build_jobs(now)
    requeued = requeued_runs(hour)
    times = list(range(job.start - 3600, int(now) // STEP * STEP + 1, STEP))
    gpus = [(node, gpu) for node in ("n1", "n2") for gpu in range(4)]
    base = {"cluster": "c1", "gpu_model": "H100", "partition": "gpu", "rack": "r1"}

    def gpu_series(value: object) -> list:
        return [
            (labels(**base, gpu=str(g), node=n), lambda t, n=n, g=g: value(n, g, t))  # type: ignore[operator]
            for n, g in gpus
        ]

    def mem(n: str, g: int, t: int) -> float:
        busy = job.running_at(t) and (n, g) in MEM_USED_GIB
        return (MEM_USED_GIB[(n, g)] if busy else 1.0) * GIB

    def power(n: str, g: int, t: int) -> float:
        return 60.0 + 3 * util(job, other, n, g, t)

    def idle_hours(t: int) -> float:
        overlap = min(t, job.end) - max(t - 3600, job.start)
        return 2 * max(0, overlap) / 3600

    families = {
        "gpu:utilization_percent:max": gpu_series(lambda n, g, t: util(job, other, n, g, t)),
        "gpu:memory_used_bytes:sum": gpu_series(mem),
        "gpu:memory_total_bytes:sum": gpu_series(lambda n, g, t: 80.0 * GIB),
        "gpu:power_draw_watts:max": gpu_series(power),
        "node:cpu_utilization:ratio": [
            (labels(**base, node=n), lambda t, n=n: CPU[n] if job.running_at(t) else 0.9)
            for n in CPU
        ],
        "node:memory_utilization:ratio": [(labels(**base, node=n), lambda t: 0.3) for n in CPU],
        "node:memory_total_bytes:sum": [
            (labels(**base, node=n), lambda t: 512.0 * GIB) for n in CPU
        ],
        "node:cpus:count": [(labels(**base, node=n), lambda t: 64.0) for n in CPU],
        **job_families([job, other, *requeued]),
        "slurm_job_gpu:gpu_utilization_percent:max": [
            (
                labels(
                    account=j.account,
                    cluster="c1",
                    gpu=str(g),
                    job_id=j.job_id,
                    node=n,
                    partition=j.partition,
                    user=j.user,
                ),
                lambda t, j=j, n=n, g=g: util(job, other, n, g, t) if j.running_at(t) else None,
            )
            for j in (job, other, *requeued)
            for n, indices in j.gpus.items()
            for g in indices
        ],
        "slurm_user:gpu_hours_allocated_idle:sum1h": [
            (labels(cluster="c1", user="alice"), idle_hours),
            (labels(cluster="c1", user="bob"), lambda t: 0.0),
        ],
        "slurm_account:gpu_hours_allocated_idle:sum1h": [
            (labels(account="physics", cluster="c1"), idle_hours),
            (labels(account="chem", cluster="c1"), lambda t: 0.0),
        ],
        "cluster:gpu_hours_allocated_idle:sum1h": [(labels(cluster="c1"), idle_hours)],
        # The site's idle threshold as the rules record it (no labels); not the default 5,
        # so the reports show that they read it. The idle GPUs are the same under 5 and 10.
        "gpufleet:slurm_idle_gpu_threshold:percent": [(labels(), lambda t: SITE_THRESHOLD)],
        "node_gpu_health_check": [
            (
                labels(**{**base, **pairs}),
                lambda t, first=first, last=last: 1.0 if first <= t <= last else None,
            )
            for pairs, first, last in faults(hour, now)
        ],
    }
    with path.open("w", encoding="utf-8") as out:
        for name, series in families.items():
            write_family(out, name, series, times)
        out.write("# EOF\n")
    assert hour  # the layout is relative to the current hour
    return job, other
