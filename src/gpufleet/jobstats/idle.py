"""GPU-hours allocated to jobs while idle, by user and by account.

Without ``--threshold``: the gpufleet-slurm recording rules, which already count them hour
by hour at the SlurmJobGpuIdle threshold (``slurm_user:gpu_hours_allocated_idle:sum1h``
and the account form; ``global_`` forms on the global tier). A window of N hours is the
sum of N hourly points (``[N h - 1m : 1h]``, the rules' own convention).

With ``--threshold T``: computed from the per-(job, GPU) utilization series on the shards
(or the standalone Prometheus): a 5-minute step counts when the GPU's maximum in it stayed
under T. Costlier (its cost grows with the GPUs and the window: a 5-minute subquery over
every per-(job, GPU) series), so it is asked once, by user and account together, and the
user and account totals are both summed from that answer (a job's series carries both
labels); the global tier cannot answer it (those series are not federated).
"""

from __future__ import annotations

import re
from typing import Any

from gpufleet.jobstats.report import IDLE_THRESHOLD
from gpufleet_node.job_summary.prom import PromClient, PromError
from gpufleet_node.numbers import finite, in_range

DURATION = re.compile(r"^([1-9][0-9]{0,4})([hdw])$")
HOURS = {"h": 1, "d": 24, "w": 168}
STEP_MIN = 5
# The site's idle threshold (prometheus_slurm_idle_gpu_threshold_percent) as the rules
# record it: the same value SlurmJobGpuIdle and the idle-GPU recording rules use.
THRESHOLD_SERIES = "gpufleet:slurm_idle_gpu_threshold:percent"


def site_threshold(client: PromClient, now: float) -> tuple[float, list[str]]:
    """(the rules' idle threshold, notes); the shipped default, with a note, when absent.

    ``max``: the global tier holds one federated copy per shard replica, all equal.
    """
    samples = client.query(f"max({THRESHOLD_SERIES})", now)
    values = [v for v in (in_range(s.value, 0, 100) for s in samples) if v is not None]
    if values:
        return values[0], []
    return IDLE_THRESHOLD, [
        f"{client.url}: no {THRESHOLD_SERIES} (gpufleet-slurm rules older than this "
        f"gpufleet, or not loaded): the default idle threshold, {IDLE_THRESHOLD:g} %"
    ]


def parse_since(text: str, option: str = "--since") -> int:
    """``7d`` -> seconds; whole hours, days or weeks (the rules are hourly)."""
    match = DURATION.fullmatch(text)
    if not match:
        raise ValueError(f"{option} {text[:20]!r}: use whole hours, days or weeks (24h, 7d, 2w)")
    hours = int(match.group(1)) * HOURS[match.group(2)]
    if hours > 24 * 400:
        raise ValueError(f"{option} {text}: at most 400 days")
    return hours * 3600


def recorded_expr(prefix: str, key: str, since_s: int) -> str:
    series = f"{prefix}slurm_{key}:gpu_hours_allocated_idle:sum1h"
    return f"sum by ({key}) (sum_over_time({series}[{since_s - 60}s:1h]))"


def raw_expr(since_s: int, threshold: float) -> str:
    inner = (
        f"(max_over_time(slurm_job_gpu:gpu_utilization_percent:max[{STEP_MIN}m]) < {threshold:g})"
    )
    return (
        f"sum by (user, account) (count_over_time({inner}[{since_s}s:{STEP_MIN}m]))"
        f" * {STEP_MIN / 60:.6g}"
    )


def recorded_prefix(client: PromClient, since_s: int, now: float) -> str:
    """``global_`` on the global tier, "" on a shard or standalone Prometheus."""
    for prefix in ("global_", ""):
        probe = f"count(last_over_time({prefix}cluster:gpu_hours_allocated_idle:sum1h[{since_s}s]))"
        if client.query(probe, now):
            return prefix
    raise PromError(
        f"{client.url}: no idle GPU-hour recordings in this window (the gpufleet-slurm rules "
        "not loaded, no Slurm exporter, or the window is outside retention)"
    )


# A sample that is no number of GPU-hours (NaN, +/-Inf, negative, or past this bound, which
# also keeps every sum finite) is left out of the totals and counted under REJECTED.
MAX_GPU_HOURS = 1e12
REJECTED = "rejected"  # totals[REJECTED]["values"]: how many samples were left out


def by_key(samples: list[Any], key: str) -> tuple[dict[str, float], int]:
    """(hours per ``key`` label value, how many samples were no number of hours)."""
    totals: dict[str, float] = {}
    rejected = 0
    for sample in samples:
        hours = in_range(sample.value, 0, MAX_GPU_HOURS)
        if hours is None:
            rejected += 1
            continue
        name = sample.labels.get(key, "")
        totals[name] = totals.get(name, 0.0) + hours
    return totals, rejected


def _totals(answers: dict[str, list[Any]]) -> dict[str, dict[str, float]]:
    """{"user": ..., "account": ..., REJECTED: {"values": n}} of each key's samples."""
    totals: dict[str, dict[str, float]] = {REJECTED: {"values": 0.0}}
    for key, samples in answers.items():
        totals[key], rejected = by_key(samples, key)
        totals[REJECTED]["values"] += rejected
    return totals


def rejected_notes(totals: dict[str, dict[str, float]]) -> list[str]:
    count = int(totals.get(REJECTED, {}).get("values", 0))
    if not count:
        return []
    return [
        f"{count} values left out: not a number of GPU-hours (NaN, Inf, negative or over "
        f"{MAX_GPU_HOURS:g})"
    ]


def recorded(client: PromClient, since_s: int, now: float) -> dict[str, dict[str, float]]:
    prefix = recorded_prefix(client, since_s, now)
    return _totals(
        {key: client.query(recorded_expr(prefix, key, since_s), now) for key in ("user", "account")}
    )


def raw(
    client: PromClient, since_s: int, now: float, threshold: float
) -> dict[str, dict[str, float]]:
    samples = client.query(raw_expr(since_s, threshold), now)
    return _totals({key: samples for key in ("user", "account")})


def add(parts: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Shards' parts of the same totals."""
    total: dict[str, dict[str, float]] = {"user": {}, "account": {}, REJECTED: {}}
    for part in parts:
        for key, values in part.items():
            for name, hours in values.items():
                total.setdefault(key, {})[name] = total[key].get(name, 0.0) + hours
    return total


def rows(totals: dict[str, float], key: str) -> list[dict[str, Any]]:
    """Largest first; zero rows dropped (hours without idle GPUs record 0)."""
    counted = {name: hours for name, hours in totals.items() if finite(hours) is not None}
    ordered = sorted(counted.items(), key=lambda item: (-item[1], item[0]))
    return [{key: name, "gpu_hours": round(hours, 3)} for name, hours in ordered if hours > 0.0005]
