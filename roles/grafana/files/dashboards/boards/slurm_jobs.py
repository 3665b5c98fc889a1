"""Slurm jobs: GPU allocation and use per job, user and account; queue; node states."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from . import panels
from .frame import common_variables, dashboard, section, var_idle_threshold
from .panels import Item, Panel
from .queries import CL, IDLE_THRESHOLD, JOB_SEL, NO_REPLICA, table_target, target

J, C = JOB_SEL, CL
JOB_LABELS = "job_id, user, account, partition"


# What the dashboard shows, for its description in Grafana.
DESCRIPTION = (
    "GPU allocation and utilization per job, user, account and partition; the queue "
    "with pending reasons; node states. The GPU totals, queue and node-state panels read "
    "the Slurm exporter's cluster-wide series: on a sharded site pick the global tier "
    "(it federates them, and holds the per-job, user and account rollups)."
)


def mean_utilization(by: str, rollup: str, sel: str) -> str:
    """Mean GPU utilization per `by` labels: a rollup's utilization sum over its GPU count."""
    group = f" by ({by}) " if by else ""
    return (
        f"sum{group}({rollup}:gpu_utilization_percent:sum{{{sel}}}) / "
        f"sum{group}({rollup}:gpu_utilization_percent:count{{{sel}}})"
    )


def utilization_per(label: str, rollup: str, sel: str) -> Panel:
    query = target(mean_utilization(label, rollup, sel), f"{{{{{label}}}}}")
    return panels.timeseries(f"GPU utilization per {label}", [query], "percent", minmax=(0, 100))


def stacked(title: str, expr: str, legend: str, **kw) -> Panel:
    return panels.timeseries(title, [target(expr, legend)], stack=True, **kw)


def _totals() -> list[Panel]:
    idle = f"sum({NO_REPLICA}(slurm_job:gpus_allocated_idle:count{{{J}}})) or vector(0)"
    idle_hours = f"sum({NO_REPLICA}(cluster:gpu_hours_allocated_idle:sum1h{{{C}}}))"
    some = panels.thresholds((None, "green"), (1, "orange"))
    stats = [
        panels.stat("GPUs allocated", [target(f"max(slurm_gpus_alloc{{{C}}})")]),
        panels.stat("GPUs idle (unallocated)", [target(f"max(slurm_gpus_idle{{{C}}})")]),
        panels.stat("GPUs unavailable", [target(f"max(slurm_gpus_other{{{C}}})")], steps=some),
        panels.stat(
            "Allocated GPUs busy",
            [target(mean_utilization("", "slurm_job", J))],
            "percent",
            steps=panels.thresholds((None, "red"), (30, "yellow"), (70, "green")),
        ),
        panels.stat("Allocated idle GPUs (under ${idle_threshold} %)", [target(idle)], steps=some),
        panels.stat(
            "Idle allocated GPU-hours (under ${idle_threshold} %, last hour)",
            [target(idle_hours)],
        ),
    ]
    return [p.span(4).height(4) for p in stats]


def _running_jobs() -> list[Panel]:
    gpus = f"sum by ({JOB_LABELS}) ({NO_REPLICA}(slurm_job:gpus_allocated:sum{{{J}}}))"
    idle = f"sum by ({JOB_LABELS}) ({NO_REPLICA}(slurm_job:gpus_allocated_idle:count{{{J}}}))"
    # job_id keeps its name: the row link reads ${__data.fields.job_id}.
    columns = {
        "Value #A": "GPUs",
        "Value #B": "GPU util %",
        "Value #C": "idle GPUs",
    }
    return [
        panels.table(
            "Running jobs: GPUs and utilization",
            [
                table_target(gpus, "A"),
                table_target(mean_utilization(JOB_LABELS, "slurm_job", J), "B"),
                table_target(idle, "C"),
            ],
            rename=columns,
            size=(24, 10),
            links=[panels.JOB_ROW_LINK],
        ),
    ]


def _per_owner() -> list[Panel]:
    top_jobs = f"topk(20, {mean_utilization('job_id, user', 'slurm_job', J)})"
    per_user = f"sum by (user) ({NO_REPLICA}(slurm_job:gpus_allocated:sum{{{J}}}))"
    per_partition = f"max by (partition) (slurm_partition_gpus_allocated{{{J}}})"
    idle_users = f"sum by (user) ({NO_REPLICA}(slurm_user:gpus_allocated_idle:sum{{{C}}}))"
    idle_hours = (
        f"sum by (account) ({NO_REPLICA}(slurm_account:gpu_hours_allocated_idle:sum1h{{{C}}}))"
    )
    return [
        panels.with_limit(
            "GPU utilization per job (top 20)",
            [target(top_jobs, "{{job_id}} ({{user}})")],
            target(IDLE_THRESHOLD, "idle threshold", "B"),
            "percent",
            color="orange",
            minmax=(0, 100),
            links=[panels.JOB_SERIES_LINK],
        ),
        stacked("GPUs allocated per user", per_user, "{{user}}"),
        utilization_per("user", "slurm_user", C),
        utilization_per("account", "slurm_account", C),
        stacked("GPUs allocated per partition", per_partition, "{{partition}}"),
        utilization_per("partition", "partition", J),
        stacked(
            "Idle allocated GPUs per user (under ${idle_threshold} %)",
            idle_users,
            "{{user}}",
            bars=True,
            fill=80,
        ),
        stacked(
            "Idle allocated GPU-hours per account (under ${idle_threshold} %, hourly)",
            idle_hours,
            "{{account}}",
        ),
    ]


def _queue() -> list[Item]:
    running = f"max by (partition) (slurm_partition_jobs_running{{{J}}})"
    pending = f"max by (partition) (slurm_partition_jobs_pending{{{J}}})"
    reasons = f"sort_desc(max by (reason) (slurm_jobs_pending_by_reason{{{C}}}))"
    per_user = f"topk(10, sum by (user) ({NO_REPLICA}(slurm_queue_pending{{{J}}})))"
    main = f"max(slurm_scheduler_last_cycle{{{C}}}) / 1e6"
    backfill = f"max(slurm_scheduler_backfill_last_cycle{{{C}}}) / 1e6"
    cycles = [target(main, "main cycle"), target(backfill, "backfill cycle", "B")]
    return section(
        "Queue",
        [
            panels.with_limit(
                "Jobs running and pending per partition",
                [target(running, "{{partition}} running")],
                target(pending, "{{partition}} pending", "B"),
                color=None,
            ),
            panels.bargauge(
                "Pending jobs by reason", [target(reasons, "{{reason}}", instant=True)]
            ),
            stacked("Jobs pending per user (top 10)", per_user, "{{user}}"),
            panels.timeseries("Scheduler cycle", cycles, "s"),
        ],
    )


def _nodes() -> list[Item]:
    states = ["alloc", "mix", "idle", "drain", "down", "fail", "maint", "resv"]
    by_state = [
        target(f"sum(max by (partition) (slurm_nodes_{state}{{{J}}}))", state, chr(65 + i))
        for i, state in enumerate(states)
    ]
    reasons = f"max by (node, state, reason) (slurm_node_state_reason_info{{{C}}})"
    return section(
        "Nodes",
        [
            panels.timeseries("Nodes by state", by_state, stack=True, fill=60),
            panels.table(
                "Nodes with a reason (drained, down, ...)",
                [table_target(reasons)],
                hide=["Value"],
                links=[panels.NODE_LINK],
            ),
        ],
    )


def build() -> dm.Dashboard:
    rows = [*section("GPUs", _totals(), _running_jobs(), _per_owner()), *_queue(), *_nodes()]
    return dashboard(
        "gpufleet-slurm-jobs",
        "Slurm jobs",
        DESCRIPTION,
        rows,
        [*common_variables(), var_idle_threshold()],
        tags=["slurm"],
    )
