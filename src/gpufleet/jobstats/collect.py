"""Per-GPU and per-node figures of a job's nodes over the job's span.

Reads the gpufleet recording rules every shard (or standalone Prometheus) evaluates
(roles/prometheus/files/rules): ``gpu:*`` unify the GPU collector's ``node_gpu_*`` series
and dcgm-exporter's ``DCGM_FI_*`` (docs/gpu-collector.md, docs/dcgm-exporter.md); ``node:*``
come from node_exporter (``node_cpu_seconds_total``, ``node_memory_*``). One instant query
per figure at the job's end, over a range as long as the job, and one for the GPU health
checks that failed on the job's GPUs and nodes during it (``node_gpu_health_check``, see
:func:`gpufleet_node.job_summary.summary.fault_query`): a handful of queries however many
GPUs the job holds.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gpufleet.jobstats.discover import JobPlace
from gpufleet_node.job_summary.prom import PromClient
from gpufleet_node.job_summary.summary import (
    FIGURES,
    SAFE_GPU,
    Fault,
    fault_query,
    faults_of,
    figure_value,
    node_regex,
)


@dataclass(frozen=True)
class Figures:
    gpus: dict[tuple[str, str], dict[str, float]]  # (node, gpu) -> figure -> value
    nodes: dict[str, dict[str, float]]  # node -> figure -> value
    faults: list[Fault] = field(default_factory=list)  # on the job's GPUs and nodes


def span_seconds(place: JobPlace) -> int:
    """The range of the queries: the job's span, at least one minute."""
    return max(60, round(place.end - place.start))


def collect(client: PromClient, place: JobPlace) -> Figures:
    """The figures of the job's nodes on this Prometheus, queried in parallel."""
    nodes = node_regex(list(place.gpus_allocated))
    window = f"[{span_seconds(place)}s]"
    queries = {
        key: f'{func}({series}{{node=~"{nodes}"}}{window})'
        for key, (func, series) in FIGURES.items()
    }
    held = {node: place.gpu_indices.get(node, []) for node in place.gpus_allocated}
    with ThreadPoolExecutor(max_workers=4) as pool:
        health = pool.submit(
            client.query, fault_query(place.gpus_allocated, place.start, place.end), place.end
        )
        results = pool.map(lambda q: client.query(q, place.end), queries.values())
        answers = dict(zip(queries, results, strict=True))
        faults = faults_of(health.result(), held, place.start, place.end)
    gpus: dict[tuple[str, str], dict[str, float]] = {}
    node_figures: dict[str, dict[str, float]] = {}
    for (kind, name), samples in answers.items():
        for sample in samples:
            node = sample.labels.get("node", "")
            value = figure_value(sample.value)  # NaN, Inf, negative: no figure, as stored
            if node not in place.gpus_allocated or value is None:
                continue
            if kind == "node":
                node_figures.setdefault(node, {})[name] = value
                continue
            gpu = sample.labels.get("gpu", "")
            if SAFE_GPU.fullmatch(gpu):
                gpus.setdefault((node, gpu), {})[name] = value
    return Figures(gpus, node_figures, faults)
