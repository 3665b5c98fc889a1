"""The job report's math: per-GPU and per-node figures, a verdict and advice. Pure."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gpufleet.jobstats.collect import Figures
from gpufleet.jobstats.discover import JobPlace
from gpufleet_node.job_summary.summary import Fault, unique_faults

IDLE_THRESHOLD = 5.0  # percent; the SlurmJobGpuIdle rules' default
LOW_UTILIZATION = 25.0  # percent; a job's mean under this is "underused"
LOW_MEMORY = 0.25  # peak GPU memory share under which a smaller GPU would do


@dataclass(frozen=True)
class GpuStat:
    node: str
    gpu: str
    util_mean: float | None = None
    util_max: float | None = None
    mem_used_max: float | None = None  # bytes
    mem_total: float | None = None  # bytes
    power_mean: float | None = None  # watts
    power_max: float | None = None

    @property
    def has_data(self) -> bool:
        return self.util_max is not None


@dataclass(frozen=True)
class NodeStat:
    node: str
    gpus_allocated: int
    cpu_mean: float | None = None  # 0..1 of the node's CPUs
    cpu_max: float | None = None
    mem_max: float | None = None  # 0..1 of the node's memory
    mem_total: float | None = None  # bytes
    cpus: float | None = None


@dataclass
class JobReport:
    job_id: str
    user: str
    account: str
    partition: str
    cluster: str
    start: float
    end: float
    running: bool
    threshold: float
    gpus: list[GpuStat]
    nodes: list[NodeStat]
    util_mean: float | None
    verdict: str
    advice: list[str]
    missing: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)  # first seen first


# What a report repeats of its job's place, as the place has it.
PLACE_FIELDS = ("job_id", "user", "account", "partition", "cluster", "start", "end")


def gpu_stats(place: JobPlace, figures: Figures) -> list[GpuStat]:
    """One entry per GPU the job holds, in node and index order; None where no data."""
    stats = []
    for node in sorted(place.gpu_indices):
        for gpu in place.gpu_indices[node]:
            values = figures.gpus.get((node, gpu), {})
            stats.append(GpuStat(node=node, gpu=gpu, **values))
    return stats


def node_stats(place: JobPlace, figures: Figures) -> list[NodeStat]:
    return [
        NodeStat(node=node, gpus_allocated=count, **figures.nodes.get(node, {}))
        for node, count in sorted(place.gpus_allocated.items())
    ]


def utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))


INDICES_UNKNOWN = (
    "the Slurm exporter reports none for shared GRES or when its series cap is reached"
)


def missing_data(
    place: JobPlace, gpus: list[GpuStat], nodes: list[NodeStat], why: str = INDICES_UNKNOWN
) -> list[str]:
    """One line per hole in the data: what is missing and why it may be (``why``: of GPU
    indices unknown)."""
    lines = []
    if place.earlier_run_end:
        lines.append(
            f"the job's series stopped at {utc(place.earlier_run_end)} and came back at "
            f"{utc(place.start)} (a requeue, or the Slurm exporter was down): the figures "
            "cover the last run only"
        )
    for node, count in sorted(place.gpus_allocated.items()):
        known = len(place.gpu_indices.get(node, []))
        if known < count:
            lines.append(f"{node}: {count - known} of {count} GPU indices unknown ({why})")
    no_data = [f"{g.node}:{g.gpu}" for g in gpus if not g.has_data]
    if no_data:
        lines.append(
            f"no GPU utilization for {', '.join(no_data)} (GPU collector down, MIG, or "
            "the node's shard lost the data)"
        )
    no_node = [n.node for n in nodes if n.cpu_mean is None]
    if no_node:
        lines.append(f"no CPU figures for {', '.join(no_node)} (node_exporter not scraped)")
    return lines


def ranges(indices: list[str]) -> str:
    """["0", "2", "3", "4"] -> "0,2-4"."""
    numbers = sorted({int(i) for i in indices})
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def mean_utilization(gpus: list[GpuStat]) -> float | None:
    values = [g.util_mean for g in gpus if g.util_mean is not None]
    return sum(values) / len(values) if values else None


def idle_gpus(gpus: list[GpuStat], threshold: float) -> list[GpuStat]:
    """GPUs that never reached ``threshold`` percent during the job."""
    return [g for g in gpus if g.util_max is not None and g.util_max < threshold]


def verdict(gpus: list[GpuStat], threshold: float) -> tuple[str, list[str]]:
    """A one-word verdict and concrete advice, most wasteful first."""
    measured = [g for g in gpus if g.has_data]
    if not measured:
        return "no data", ["no GPU figures for this job: see the missing-data lines"]
    advice = []
    idle = idle_gpus(measured, threshold)
    by_node: dict[str, list[str]] = {}
    for gpu in idle:
        by_node.setdefault(gpu.node, []).append(gpu.gpu)
    for node, indices in sorted(by_node.items()):
        word = "GPU" if len(indices) == 1 else "GPUs"
        advice.append(
            f"{node}: {word} {ranges(indices)} stayed under {threshold:g} % utilization "
            "for the whole run"
        )
    busy = len(measured) - len(idle)
    unknown = len(gpus) - len(measured)
    if idle and unknown:
        # GPUs without figures may be busy or idle: no count to request can be given.
        advice.append(f"{unknown} of the job's GPUs have no figures: see the missing-data lines")
    elif idle and busy > 0:
        advice.append(f"request {busy} GPU{'s' if busy != 1 else ''} instead of {len(gpus)}")
    elif idle:
        advice.append(
            "the job used none of its GPUs: check that it finds them (CUDA_VISIBLE_DEVICES, "
            "a CUDA build of the framework) or run it on CPU nodes"
        )
    mean = mean_utilization(measured) or 0.0
    working = [g for g in measured if g not in idle]
    if working and mean_utilization(working) is not None:
        working_mean = mean_utilization(working) or 0.0
        if working_mean < LOW_UTILIZATION:
            advice.append(
                f"the GPUs in use averaged {working_mean:.0f} % utilization: look for data "
                "loading or CPU-bound steps (more dataloader workers, larger batches)"
            )
    peaks = [g.mem_used_max / g.mem_total for g in working if g.mem_used_max and g.mem_total]
    if peaks and max(peaks) < LOW_MEMORY:
        advice.append(
            f"GPU memory peaked at {max(peaks):.0%} of the GPU: a smaller GPU or a MIG slice "
            "would do"
        )
    if idle:
        return "idle GPUs", advice
    if mean < LOW_UTILIZATION:
        return "underused", advice
    return "good", advice or ["the job used its GPUs well"]


# The verdict's first line when a GPU or node of the job faulted: the figures stay as
# measured, but they may be the fault's (a GPU off the bus reads idle or not at all).
FAULT_ADVICE = (
    "a GPU health check failed during the run: the figures and this advice may "
    "reflect the fault, not the job (a failed GPU can read idle or stop "
    "reporting)"
)


def build_report(place: JobPlace, figures: Figures, threshold: float, running: bool) -> JobReport:
    gpus = gpu_stats(place, figures)
    nodes = node_stats(place, figures)
    word, advice = verdict(gpus, threshold)
    faults = unique_faults(figures.faults)  # shards that scrape a node both
    if faults:
        advice = [FAULT_ADVICE, *advice]
    return JobReport(
        **{name: getattr(place, name) for name in PLACE_FIELDS},
        running=running,
        threshold=threshold,
        gpus=gpus,
        nodes=nodes,
        util_mean=mean_utilization(gpus),
        verdict=word,
        advice=advice,
        missing=missing_data(place, gpus, nodes),
        faults=faults,
    )
