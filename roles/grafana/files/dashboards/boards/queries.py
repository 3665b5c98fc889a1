"""Selectors and queries: label filters of the template variables, Prometheus and Loki
queries made with grafana-foundation-sdk's typed query builders."""

from __future__ import annotations

import re

from grafana_foundation_sdk.builders import loki as lq
from grafana_foundation_sdk.builders import prometheus as pq
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import prometheus as pm

Query = pq.Dataquery | lq.Dataquery

# The global tier federates both replicas of each shard: a sum of counts takes one first
# (a no-op on a shard, whose own series carry no replica label).
NO_REPLICA = "max without (replica) "
PROM = cm.DataSourceRef(type_val="prometheus", uid="${datasource}")
LOKI = cm.DataSourceRef(type_val="loki", uid="${loki}")

# Label filters. `partition` on node-level series is the comma-joined list of the node's
# partitions (docs/inventory.md), so one partition matches as a list element.
PART = 'partition=~"(.*,)?(${partition})(,.*)?"'
CL = 'cluster=~"${cluster}"'
NODE_SEL = f'{CL}, rack=~"${{rack}}", {PART}, node=~"${{node}}"'
GPU_SEL = f'{NODE_SEL}, gpu=~"${{gpu}}"'
# Slurm job series carry the job's own partition (one value).
JOB_SEL = f'{CL}, partition=~"${{partition}}"'

# The site's idle-GPU threshold (%) as the Slurm rules record it: the global tier holds one
# copy per shard replica (max); the shipped 5 where the rules predate the series.
IDLE_THRESHOLD = "(max(gpufleet:slurm_idle_gpu_threshold:percent) or vector(5))"

# Recording-rule rollups the global tier federates from both replicas of every shard
# (docs/alerts.md, "Federation"): `max without (replica)` folds the two copies into one
# and is a no-op on a shard or a standalone Prometheus, so one query serves all tiers.
FEDERATED = re.compile(
    r"\b((?:node|cluster|rack|partition|gpu_model|slurm_job|slurm_user|slurm_account)"
    r":[a-z0-9_]+:[a-z0-9_]+)(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})"
)


def dedup_replicas(expr: str) -> str:
    return FEDERATED.sub(r"max without (replica) (\1\2)", expr)


def target(
    expr: str, legend: str = "", ref: str = "A", *, instant: bool = False, interval: str = ""
) -> pq.Dataquery:
    query = (
        pq.Dataquery()
        .datasource(PROM)
        .expr(dedup_replicas(expr))
        .legend_format(legend or "__auto")
        .ref_id(ref)
    )
    if instant:
        query.instant()
    if interval:
        query.interval(interval)
    return query


def rate_sum(by: str, metric: str, sel: str) -> str:
    """Per-second rate of counter `metric`, summed by the labels `by`."""
    return f"sum by ({by}) (rate({metric}{{{sel}}}[$__rate_interval]))"


def table_target(expr: str, ref: str = "A") -> pq.Dataquery:
    return target(expr, ref=ref, instant=True).format(pm.PromQueryFormat.TABLE)


def loki_target(expr: str, ref: str = "A") -> lq.Dataquery:
    return lq.Dataquery().datasource(LOKI).expr(expr).ref_id(ref).query_type("range")
