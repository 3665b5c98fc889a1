"""Find a Slurm job in Prometheus: its nodes, GPU indices, owner and time span.

Source: the gpufleet Slurm exporter's per-job series (src/gpufleet_node/slurm_exporter/
metrics.py), present while the job runs: ``slurm_job_gpus_allocated{job_id, node, user,
account, partition}`` (GPUs per node) and ``slurm_job_gpu_index_info{job_id, node, gpu}``
(Slurm's GPU index). Slurm's index names a device file, /dev/nvidia<minor>, which need
not be the NVML index ``gpu`` of the GPU series (jobstats issue #34): it is translated
through ``gpu:device_minor:info{gpu, minor}``, the map the gpufleet-slurm rules join on,
and taken as the NVML index where a node reports no minors (the rules' fallback). The span
is the first and last sample of ``slurm_job_gpus_allocated``: exact at the end, within one
step at the start. A job Slurm requeued shows its series stop and come back: the report
covers its last run (nodes, GPUs and span), and says when the earlier one ended.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field

from gpufleet_node.job_summary.gpuids import minor_map, nvml_indices
from gpufleet_node.job_summary.prom import PromClient, Sample
from gpufleet_node.job_summary.summary import (
    JOB_ID,
    MAX_TIME,
    SAFE_GPU,
    SAFE_NODE,
    JobIdentity,
    canonical_job_id,
    node_regex,
)
from gpufleet_node.numbers import in_range

__all__ = ["JOB_ID", "JobPlace", "check_job_id", "find_job"]
# What squeue/sacct print for an array task (123_4) or a het component (123+1).
DISPLAY_ID = re.compile(r"^[0-9]{1,12}[_+][0-9]{1,9}$")
MAX_GPUS_PER_NODE = 4096
SPAN_STEP_S = 60  # resolution of the start time
# The span's subquery steps fall on whole minutes: a running or just-ended job's last
# samples, past the last step, are found at a 1 s step over this many seconds before now.
LAST_SAMPLES_S = 2 * SPAN_STEP_S
# Absent this many steps in a row, the job stopped (a requeue, or the exporter was down), as
# opposed to a missed scrape. Prometheus answers at most 11,000 points per series.
GAP_STEPS = 3
MAX_POINTS = 10_000
MAX_SUBQUERY_POINTS = 20_000  # under VictoriaMetrics' 30,000 per series


@dataclass
class JobPlace(JobIdentity):
    """What one Prometheus knows about a job (a shard knows the job's nodes it scrapes)."""

    gpus_allocated: dict[str, int] = field(default_factory=dict)  # node -> GPUs
    gpu_indices: dict[str, list[str]] = field(default_factory=dict)  # node -> ["0", "1"]
    earlier_run_end: float = 0.0  # the last sample before a gap (a requeue); 0: no gap

    def merge(self, other: JobPlace) -> JobPlace:
        """Two shards' parts of one job."""
        if not self.gpus_allocated:
            return other
        if not other.gpus_allocated:
            return self
        return JobPlace(
            job_id=self.job_id,
            user=self.user or other.user,
            account=self.account or other.account,
            partition=self.partition or other.partition,
            cluster=self.cluster or other.cluster,
            start=min(self.start, other.start),
            end=max(self.end, other.end),
            gpus_allocated={**self.gpus_allocated, **other.gpus_allocated},
            gpu_indices={**self.gpu_indices, **other.gpu_indices},
            earlier_run_end=max(self.earlier_run_end, other.earlier_run_end),
        )


def check_job_id(job_id: str) -> str:
    if DISPLAY_ID.fullmatch(job_id):
        raise ValueError(
            f"{job_id!r} is an array task or a heterogeneous component: give its own JobId "
            "(squeue -o %A or sacct -X -o JobIDRaw)"
        )
    return canonical_job_id(job_id)


def find_job(client: PromClient, job_id: str, lookback_s: int, now: float) -> JobPlace:
    """The job as this Prometheus saw it in the last ``lookback_s``; empty if never."""
    selector = f'slurm_job_gpus_allocated{{job_id="{check_job_id(job_id)}"}}'
    place = allocation(client, JobPlace(job_id=job_id), selector, lookback_s, now)
    if not place.gpus_allocated:
        return place
    place.start, place.end = span_of(client, selector, lookback_s, now)
    step = max(SPAN_STEP_S, -(-(place.end - place.start) // MAX_POINTS))
    presence = client.query_range(f"count({selector})", place.start, place.end, step)
    seen = sorted(t for _, values in presence for t, _ in values if math.isfinite(t))
    if seen:
        start, earlier_end = last_run(seen, GAP_STEPS * step)
        if earlier_end:
            window = round(place.end - start) + SPAN_STEP_S
            rescoped = allocation(client, JobPlace(job_id=job_id), selector, window, place.end)
            if rescoped.gpus_allocated:
                rescoped.start, rescoped.end = start, place.end
                rescoped.earlier_run_end = earlier_end
                place = rescoped
    span = f"[{max(60, round(place.end - place.start))}s]"
    place.gpu_indices = recorded_gpus(client, job_id, place, span) or slurm_gpus(
        client, job_id, place, span
    )
    return place


def times(samples: list[Sample]) -> list[float]:
    """The sample values that are Unix times (``timestamp()`` answers); NaN, +/-Inf,
    negative or far-future values are no time and are dropped."""
    found = (in_range(sample.value, 0, MAX_TIME) for sample in samples)
    return [value for value in found if value is not None]


def span_of(client: PromClient, selector: str, lookback_s: int, now: float) -> tuple[float, float]:
    """(first, last sample time) of ``selector`` in the lookback, to SPAN_STEP_S.

    A long lookback is searched at a coarser step first, then around what it found:
    VictoriaMetrics refuses a subquery of more than 30,000 points (1.79's default).
    """
    coarse = max(SPAN_STEP_S, -(-lookback_s // MAX_SUBQUERY_POINTS))
    ts = f"timestamp({selector})"
    starts = times(client.query(f"min(min_over_time({ts}[{lookback_s}s:{coarse}s]))", now))
    ends = times(client.query(f"max(max_over_time({ts}[{lookback_s}s:{coarse}s]))", now))
    # The last samples at 1 s: a step may miss one just before its staleness marker.
    recent = f"max(max_over_time({ts}[{LAST_SAMPLES_S}s:1s]))"
    ends += times(client.query(recent, now))
    if not starts and ends:
        # Younger than one coarse step: no coarse point after its first sample yet, so
        # that sample is in the last step (at 1 s).
        young = f"min(min_over_time({ts}[{coarse + SPAN_STEP_S}s:1s]))"
        starts = times(client.query(young, now))
    if not starts and not ends:
        # Over, and shorter than one coarse step: no coarse point saw it.
        return brief_span(client, selector, lookback_s, now) or (now, now)
    start = starts[0] if starts else now
    end = max(ends) if ends else now
    if coarse > SPAN_STEP_S and starts and ends:
        # The coarse first point is at most one coarse step after the first sample, and the
        # last one at most one before the last sample (a staleness marker may hide it).
        near = f"[{coarse + SPAN_STEP_S}s:{SPAN_STEP_S}s]"
        first = times(client.query(f"min(min_over_time({ts}{near}))", start))
        last = times(client.query(f"max(max_over_time({ts}{near}))", min(now, end + coarse)))
        start = first[0] if first else start
        end = max(end, last[0]) if last else end
    return min(start, end), end


def brief_span(
    client: PromClient, selector: str, lookback_s: int, now: float
) -> tuple[float, float] | None:
    """(first, last sample time) of a finished job shorter than the coarse step, or None.

    A range query of sample counts per window covers every sample (the windows tile the
    lookback); the first and the last window with any are then searched at 1 s.
    """
    window = max(SPAN_STEP_S, -(-lookback_s // MAX_POINTS))
    counts = f"count(count_over_time({selector}[{window}s]))"
    seen = client.query_range(counts, now - lookback_s, now, window)
    found = sorted(t for _, values in seen for t, count in values if count > 0)
    found = [t for t in found if in_range(t, 0, MAX_TIME) is not None]
    if not found:
        return None
    ts = f"timestamp({selector})[{window + SPAN_STEP_S}s:1s]"
    first = times(client.query(f"min(min_over_time({ts}))", found[0]))
    last = times(client.query(f"max(max_over_time({ts}))", found[-1]))
    if not first or not last:
        return None
    return min(first[0], last[0]), last[0]


def allocation(
    client: PromClient, place: JobPlace, selector: str, window_s: int, at: float
) -> JobPlace:
    """``place`` with the job's GPUs per node and its owner, as seen in ``window_s``."""
    for sample in client.query(f"max_over_time({selector}[{window_s}s])", at):
        node = sample.labels.get("node", "")
        if not SAFE_NODE.fullmatch(node):
            continue  # a label we cannot put in a query is not a node we can report
        if not 0 <= sample.value <= MAX_GPUS_PER_NODE:
            continue  # not a GPU count (NaN, Inf or garbage)
        place.gpus_allocated[node] = int(sample.value)
        place.user = place.user or sample.labels.get("user", "")
        place.account = place.account or sample.labels.get("account", "")
        place.partition = place.partition or sample.labels.get("partition", "")
        place.cluster = place.cluster or sample.labels.get("cluster", "")
    return place


def last_run(times: list[float], gap_s: float) -> tuple[float, float]:
    """(start of the last run, end of the run before it or 0.0) from sorted presence times."""
    start, earlier_end = times[0], 0.0
    for previous, current in itertools.pairwise(times):
        if current - previous > gap_s:
            start, earlier_end = current, previous
    return start, earlier_end


def recorded_gpus(
    client: PromClient, job_id: str, place: JobPlace, span: str
) -> dict[str, list[str]]:
    """The job's GPUs as the rules joined them at each instant (NVML index), over its span."""
    series = f'slurm_job_gpu:gpu_utilization_percent:max{{job_id="{job_id}"}}'
    out: dict[str, set[str]] = {}
    for sample in client.query(f"max_over_time({series}{span})", place.end):
        node, gpu = sample.labels.get("node", ""), sample.labels.get("gpu", "")
        if node in place.gpus_allocated and SAFE_GPU.fullmatch(gpu):
            out.setdefault(node, set()).add(gpu)
    return {node: sorted(gpus, key=int) for node, gpus in out.items()}


def slurm_gpus(client: PromClient, job_id: str, place: JobPlace, span: str) -> dict[str, list[str]]:
    """Without the recorded series: Slurm's indices, translated through the device minors
    the nodes reported during the job's span (not before: a map may have changed)."""
    index_selector = f'slurm_job_gpu_index_info{{job_id="{job_id}"}}'
    slurm_indices: dict[str, list[str]] = {}
    for sample in client.query(f"max_over_time({index_selector}{span})", place.end):
        node, gpu = sample.labels.get("node", ""), sample.labels.get("gpu", "")
        if node in place.gpus_allocated and SAFE_GPU.fullmatch(gpu):
            slurm_indices.setdefault(node, []).append(gpu)
    if not slurm_indices:
        return {}
    minors = f'gpu:device_minor:info{{node=~"{node_regex(list(slurm_indices))}"}}'
    pairs = client.query(f"max_over_time({minors}{span})", place.end)
    labels = [pair.labels for pair in pairs]
    return nvml_indices(
        slurm_indices, minor_map(labels), {label.get("node", "") for label in labels}
    )


def slurm_seen(client: PromClient, lookback_s: int, now: float) -> bool:
    """Whether this Prometheus holds any per-job Slurm series in the window."""
    found = client.query(f"count(max_over_time(slurm_job_gpus_allocated[{lookback_s}s]))", now)
    return bool(found and found[0].value > 0)
