"""Slurm job: one job's GPUs (utilization, memory, power), its nodes' CPU and memory, and
the Slurm daemon log lines that name it."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from . import panels
from .frame import (
    Variable,
    dashboard,
    section,
    var_idle_threshold,
    var_loki,
    var_prometheus,
    var_query,
)
from .panels import Item, Panel
from .queries import CL, IDLE_THRESHOLD, PROM, loki_target, table_target, target

JOB = f'{CL}, job_id="${{job_id}}"'
# The job's (node, GPU) pairs, GPUs named by the collector's/dcgm-exporter's `gpu` label:
# the per-job rule already joined Slurm's GPU index to it (gpufleet-slurm.rules.yml).
JOB_GPUS = f"group by (cluster, node, gpu) (slurm_job_gpu:gpu_utilization_percent:max{{{JOB}}})"
# The job's nodes, from the Slurm exporter's allocation series.
JOB_NODES = f"group by (cluster, node) (slurm_job_gpus_allocated{{{JOB}}})"
PER_GPU = "{{node}} GPU {{gpu}}"

# What the dashboard shows, for its description in Grafana.
DESCRIPTION = (
    "One Slurm job: per-GPU utilization, memory and power of the GPUs it holds, CPU and "
    "memory of its nodes, and the Slurm daemon log lines that name it. Open it as "
    "/d/gpufleet-slurm-job/slurm-job?var-job_id=JOBID (docs/grafana.md). The per-GPU "
    "series live on the Prometheus that scrapes the job's nodes: on a sharded site pick "
    "that shard (or VictoriaMetrics)."
)


def on_job_gpus(metric: str) -> str:
    return f"{metric}{{{CL}}} * on (cluster, node, gpu) group_left () {JOB_GPUS}"


def on_job_nodes(expr: str) -> str:
    return f"{expr} * on (cluster, node) group_left () {JOB_NODES}"


def var_job_nodes() -> db.QueryVariable:
    """The job's nodes, all selected, for the Loki stream selector (hidden)."""
    return (
        db.QueryVariable("job_nodes")
        .label("Job nodes")
        .datasource(PROM)
        .query(
            {
                "query": f"label_values(slurm_job_gpus_allocated{{{JOB}}}, node)",
                "refId": "job_nodes-variable",
            }
        )
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.NUMERICAL_ASC)
        .hide(dm.VariableHide.HIDE_VARIABLE)
        .include_all(True)
        .multi(True)
        .current(dm.VariableOption(text=["All"], value=["$__all"]))
        .options([])
    )


def _variables() -> list[Variable]:
    jobs = f"label_values(slurm_job_gpus_allocated{{{CL}}}, job_id)"
    return [
        var_prometheus(),
        var_loki(),
        var_query("cluster", "Cluster", "label_values(node:up:max, cluster)", multi=False),
        var_query("job_id", "Job", jobs, multi=False, include_all=False),
        var_job_nodes(),
        var_idle_threshold(),
    ]


def _summary() -> list[Panel]:
    owner = f"max by (job_id, user, account, partition) (slurm_job_gpus_allocated{{{JOB}}})"
    gpus = f"sum(slurm_job_gpus_allocated{{{JOB}}})"
    mean = f"avg(slurm_job_gpu:gpu_utilization_percent:max{{{JOB}}})"
    idle = f"sum(slurm_job:gpus_allocated_idle:count{{{JOB}}}) or vector(0)"
    busy = panels.thresholds((None, "red"), (30, "yellow"), (70, "green"))
    return [
        panels.table("Job", [table_target(owner)], hide=["Value"], size=(9, 4)),
        panels.stat("GPUs held", [target(gpus)]).span(5).height(4),
        panels.stat("Mean GPU utilization", [target(mean)], "percent", steps=busy)
        .span(5)
        .height(4),
        panels.stat(
            "Idle GPUs (under ${idle_threshold} %)",
            [target(idle)],
            steps=panels.thresholds((None, "green"), (1, "orange")),
        )
        .span(5)
        .height(4),
    ]


def _gpus() -> list[Panel]:
    used = target(on_job_gpus("gpu:memory_used_bytes:sum"), PER_GPU)
    size = target(f"max({on_job_gpus('gpu:memory_total_bytes:sum')})", "memory size", "B")
    power = target(on_job_gpus("gpu:power_draw_watts:max"), PER_GPU)
    limit = target(f"max({on_job_gpus('gpu:power_limit_watts:max')})", "power limit", "B")
    utilization = target(f"slurm_job_gpu:gpu_utilization_percent:max{{{JOB}}}", PER_GPU)
    return [
        panels.with_limit(
            "GPU utilization per GPU",
            [utilization],
            target(IDLE_THRESHOLD, "idle threshold", "B"),
            "percent",
            color="orange",
            minmax=(0, 100),
        ),
        panels.with_limit("GPU memory used per GPU", [used], size, "bytes"),
        panels.with_limit("GPU power per GPU", [power], limit, "watt"),
    ]


def _nodes() -> list[Panel]:
    cpu = target(on_job_nodes(f"node:cpu_utilization:ratio{{{CL}}}"), "{{node}}")
    total = f"node:memory_total_bytes:sum{{{CL}}}"
    used = f"({total} - node:memory_available_bytes:sum{{{CL}}})"
    memory = target(on_job_nodes(f"{used} / {total}"), "{{node}}")
    return [
        panels.timeseries(title, [query], "percentunit", minmax=(0, 1), links=[panels.NODE_LINK])
        for title, query in (("CPU utilization per node", cpu), ("Memory used per node", memory))
    ]


def _logs() -> list[Item]:
    # slurmd and slurmctld name a job as JobId=N, job N, StepId=N.x, job_N (cgroups) or, in
    # slurmstepd's lines, [N.batch] / [N.0]. slurmctld runs on the controller, which is not
    # among the job's nodes: its lines are a second query.
    names = "(?i)(jobid[= ]|job[ _]|stepid=|\\\\[)${job_id}([^0-9]|$)"
    nodes = f'{{{CL}, node=~"${{job_nodes}}", source="slurmd"}} |~ "{names}"'
    controller = f'{{{CL}, source="slurmctld"}} |~ "{names}"'
    queries = [loki_target(nodes, "A"), loki_target(controller, "B")]
    lines = panels.logs("Slurm daemon lines naming the job", queries, size=(24, 10))
    return section("Logs", [lines])


def build() -> dm.Dashboard:
    rows = [
        *section("Job", _summary()),
        *section("GPUs", _gpus()),
        *section("Nodes", _nodes()),
        *_logs(),
    ]
    return dashboard(
        "gpufleet-slurm-job",
        "Slurm job",
        DESCRIPTION,
        rows,
        _variables(),
        tags=["slurm"],
        time_from="now-24h",
    )
