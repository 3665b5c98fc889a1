"""A finished job's figures from the Prometheus instances that hold its series.

The same queries as ``gpufleet jobstats`` (src/gpufleet/jobstats/discover.py and
collect.py), which the summary must reproduce, through the same client
(:mod:`gpufleet_node.job_summary.prom`): the job's nodes, owner and span from the
Slurm exporter's ``slurm_job_gpus_allocated``; its GPUs (NVML index) from the recorded
``slurm_job_gpu:gpu_utilization_percent:max``, else Slurm's index through the nodes'
device minors; then one instant query per figure over the job's span on the ``gpu:*``
and ``node:*`` recording rules, and one for the health checks that failed on its GPUs and
nodes (``fault_query``). The client gives NaN and +/-Inf as they come: every
value is checked (a range, ``figure_value``) before it is used.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Callable

from gpufleet_node.job_summary.gpuids import minor_map, nvml_indices
from gpufleet_node.job_summary.prom import PromClient, PromError, Sample
from gpufleet_node.job_summary.summary import (
    FIGURES,
    MAX_GPUS_PER_NODE,
    MAX_TIME,
    SAFE_GPU,
    SAFE_NODE,
    Summary,
    fault_query,
    faults_of,
    figure_value,
    node_regex,
    unique_faults,
)
from gpufleet_node.numbers import in_range

SPAN_STEP_S = 60
# The span's subquery steps fall on whole minutes, so right after a job ends (when the
# epilog runs) its last samples are past the last step: they are found at a 1 s step over
# this many seconds before now.
LAST_SAMPLES_S = 2 * SPAN_STEP_S


def find(client: PromClient, job_id: str, lookback_s: int, now: float) -> Summary:
    """The job's part on this Prometheus (no nodes: it holds none of it)."""
    selector = f'slurm_job_gpus_allocated{{job_id="{job_id}"}}'
    part = Summary(job_id)
    for labels, value in client.query(f"max_over_time({selector}[{lookback_s}s])", now):
        node = labels.get("node", "")
        if not SAFE_NODE.fullmatch(node) or not 0 <= value <= MAX_GPUS_PER_NODE:
            continue
        part.nodes[node] = (int(value), {})
        part.user = part.user or labels.get("user", "")
        part.account = part.account or labels.get("account", "")
        part.partition = part.partition or labels.get("partition", "")
        part.cluster = part.cluster or labels.get("cluster", "")
    if not part.nodes:
        return part
    ts = f"timestamp({selector})[{lookback_s}s:{SPAN_STEP_S}s]"
    starts = client.query(f"min(min_over_time({ts}))", now)
    ends = client.query(f"max(max_over_time({ts}))", now)
    recent = f"timestamp({selector})[{LAST_SAMPLES_S}s:1s]"
    ends += client.query(f"max(max_over_time({recent}))", now)
    if not starts and ends:
        # Shorter than a step: no whole-minute point saw it, so its first sample is in the
        # last samples' window (as jobstats' span_of).
        young = f"timestamp({selector})[{LAST_SAMPLES_S}s:1s]"
        starts = client.query(f"min(min_over_time({young}))", now)
    end_times, start_times = _times(ends), _times(starts)
    part.end = max(end_times) if end_times else now
    part.start = min(start_times[0], part.end) if start_times else part.end
    return part


def _times(samples: Iterable[Sample]) -> list[float]:
    """The values that are Unix times (``timestamp()`` answers), in order."""
    found = (in_range(value, 0, MAX_TIME - 1) for _, value in samples)
    return [value for value in found if value is not None]


def gpu_indices(client: PromClient, part: Summary, span: str) -> dict[str, list[str]]:
    """Each node's GPUs (NVML index) during the job: recorded joins, else Slurm's indices
    through the device minors the nodes reported (index = minor where none)."""
    series = f'slurm_job_gpu:gpu_utilization_percent:max{{job_id="{part.job_id}"}}'
    recorded = _pairs(client.query(f"max_over_time({series}{span})", part.end), part.nodes)
    if recorded:
        return recorded
    indices = f'slurm_job_gpu_index_info{{job_id="{part.job_id}"}}'
    slurm = _pairs(client.query(f"max_over_time({indices}{span})", part.end), part.nodes)
    if not slurm:
        return {}
    minors = f'gpu:device_minor:info{{node=~"{node_regex(slurm)}"}}'
    labels = [labels for labels, _ in client.query(f"max_over_time({minors}{span})", part.end)]
    return nvml_indices(slurm, minor_map(labels), {label.get("node", "") for label in labels})


def _pairs(samples: Iterable[Sample], nodes: Iterable[str]) -> dict[str, list[str]]:
    wanted = set(nodes)
    out: dict[str, set[str]] = {}
    for labels, _ in samples:
        node, gpu = labels.get("node", ""), labels.get("gpu", "")
        if node in wanted and SAFE_GPU.fullmatch(gpu):
            out.setdefault(node, set()).add(gpu)
    return {node: sorted(gpus, key=int) for node, gpus in out.items()}


def figures(client: PromClient, part: Summary, start: float, end: float) -> None:
    """Fill the part's node and GPU figures over [start, end] (the whole job's span)."""
    span = f"[{max(60, round(end - start))}s]"
    part.end = end
    indices = gpu_indices(client, part, span)
    for node, gpus in indices.items():
        for gpu in gpus:
            part.gpus[(node, gpu)] = {}
    nodes = node_regex(part.nodes)
    for (kind, name), (func, series) in FIGURES.items():
        query = f'{func}({series}{{node=~"{nodes}"}}{span})'
        for labels, answered in client.query(query, end):
            node, value = labels.get("node", ""), figure_value(answered)
            if value is None:  # negative or absurd: no figure, as jobstats reads it live
                continue
            if kind == "node" and node in part.nodes:
                part.nodes[node][1][name] = value
            elif (node, labels.get("gpu", "")) in part.gpus:
                part.gpus[(node, labels.get("gpu", ""))][name] = value
    held = {node: {gpu for n, gpu in part.gpus if n == node} for node in part.nodes}
    part.faults = faults_of(
        client.query(fault_query(part.nodes, start, end), end), held, start, end
    )


THRESHOLD_SERIES = "gpufleet:slurm_idle_gpu_threshold:percent"


def site_threshold(client: PromClient, at: float) -> float | None:
    """The rules' idle threshold (gpufleet-slurm rules), or None where they predate it."""
    values = [value for _, value in client.query(f"max({THRESHOLD_SERIES})", at)]
    return values[0] if values and 0 <= values[0] <= 100 else None


def merge(job_id: str, parts: Sequence[Summary]) -> Summary:
    """The shards' parts of one job (each holds the nodes it scrapes)."""
    whole = Summary(job_id)
    for part in parts:
        if not part.nodes:
            continue
        if not whole.nodes:
            whole.start, whole.end = part.start, part.end
        whole.start, whole.end = min(whole.start, part.start), max(whole.end, part.end)
        whole.user = whole.user or part.user
        whole.account = whole.account or part.account
        whole.partition = whole.partition or part.partition
        whole.cluster = whole.cluster or part.cluster
        whole.nodes.update(part.nodes)
        whole.gpus.update(part.gpus)
        whole.faults = unique_faults([*whole.faults, *part.faults])
        whole.faults_dropped += part.faults_dropped
    return whole


def first_answer(
    urls: Sequence[str], make: Callable[[str], PromClient], name: str
) -> tuple[PromClient | None, str]:
    """The first replica of an instance that answers a trivial query, or why none did."""
    errors = []
    for url in urls:
        try:
            client = make(url)
            client.query("vector(1)", 0)
            return client, ""
        except PromError as err:
            errors.append(str(err))
    return None, f"{name}: no replica answers: {'; '.join(errors) or 'none listed'}"
