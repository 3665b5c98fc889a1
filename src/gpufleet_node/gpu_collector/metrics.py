"""Samples to node_gpu_* series, rendered with the shared exposition writer."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from ..exposition import Family, render
from .model import FAMILIES, PREFIX, GpuData, Sample, family_type
from .nvidia import ComputeApp
from .slurm import JobRef, job_label


def base_labels(gpu: GpuData) -> tuple[tuple[str, str], ...]:
    return (("gpu", gpu.gpu), ("uuid", gpu.uuid), ("vendor", gpu.vendor))


def to_samples(gpus: list[GpuData]) -> list[Sample]:
    samples = [Sample("devices", (), float(len(gpus)))]
    for gpu in gpus:
        base = base_labels(gpu)
        samples.append(Sample("info", base + tuple(sorted(gpu.info.items())), 1.0))
        samples.extend([Sample(name, base + extra, value) for name, extra, value in gpu.values])
        if gpu.unreadable is not None:
            samples.append(Sample("unreadable_fields", base, float(gpu.unreadable)))
    return samples


def compute_app_samples(
    gpus: list[GpuData],
    apps: list[ComputeApp],
    jobs: dict[str, set[JobRef]],
    sluid_ids: dict[str, str] | None = None,
) -> list[Sample]:
    samples = []
    for gpu in gpus:
        base = base_labels(gpu)
        mine = [a for a in apps if a.gpu_uuid == gpu.uuid]
        samples.append(Sample("compute_processes", base, float(len(mine))))
        known = [a.used_bytes for a in mine if a.used_bytes is not None]
        if known or not mine:
            samples.append(Sample("compute_processes_used_memory_bytes", base, float(sum(known))))
        samples.extend(job_samples(base, jobs.get(gpu.uuid, set()), sluid_ids or {}))
    return samples


def job_samples(
    base: tuple[tuple[str, str], ...], jobs: set[JobRef], sluid_ids: dict[str, str]
) -> list[Sample]:
    out = set()
    for job in jobs:
        labels = (*base, ("job_id", job_label(job, sluid_ids)), ("user", job.user))
        out.add(labels + ((("sluid", job.sluid),) if job.sluid else ()))
    return [Sample("slurm_job_info", labels, 1.0) for labels in sorted(out)]


def health_samples(
    success: bool,
    duration: float,
    last_success: float | None,
    reason: str | None = None,
) -> list[Sample]:
    samples = [
        Sample("collector_success", (), 1.0 if success else 0.0),
        Sample("collector_duration_seconds", (), round(duration, 6)),
    ]
    if last_success is not None:
        samples.append(
            Sample("collector_last_success_timestamp_seconds", (), round(last_success, 3))
        )
    if not success:
        samples.append(Sample("collector_error_info", (("reason", reason or "exec_error"),), 1.0))
    return samples


def render_metrics(samples: Iterable[Sample]) -> str:
    """Group samples by family (FAMILIES order) with # HELP / # TYPE lines.

    Labels keep the collector's order (gpu, uuid, vendor, then the rest), so the
    families are filled directly rather than through ``Family.set`` (which sorts them).
    """
    by_name: dict[str, Family] = {}
    for sample in samples:
        if sample.name not in FAMILIES:
            raise KeyError(f"undeclared metric family {sample.name}")
        family = by_name.get(sample.name)
        if family is None:
            family = Family(PREFIX + sample.name, family_type(sample.name), FAMILIES[sample.name])
            by_name[sample.name] = family
        # one value per series, first wins
        family.samples.setdefault(sample.labels, float(sample.value))
    return render([by_name[name] for name in FAMILIES if name in by_name])


LAST_SUCCESS_RE = re.compile(
    r"^" + PREFIX + r"collector_last_success_timestamp_seconds\s+([0-9.eE+]+)\s*$", re.MULTILINE
)


def previous_last_success(text: str | None) -> float | None:
    match = LAST_SUCCESS_RE.search(text or "")
    try:
        value = float(match.group(1)) if match else None
    except ValueError:  # e.g. "1..2" in a hand-edited file
        return None
    return value if value is not None and math.isfinite(value) else None
