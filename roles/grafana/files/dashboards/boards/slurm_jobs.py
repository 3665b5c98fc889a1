"""Slurm jobs: GPU allocation and use per job, user and account; queue; node states."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from .blocks import (
    CL,
    JOB_SEL,
    NO_REPLICA,
    NODE_LINK,
    Item,
    Panel,
    bargauge_panel,
    dashed,
    stat_panel,
    table_panel,
    table_target,
    target,
    thresholds,
    timeseries_panel,
)
from .frame import common_variables, dashboard, row

J, C = JOB_SEL, CL


def _gpus_1() -> list[Panel]:
    """GPUs allocated; GPUs idle (unallocated); GPUs unavailable; Allocated GPUs busy; Allocated
    idle GPUs; Idle allocated GPU-hours (last hour).
    """
    return [
        stat_panel("GPUs allocated", [target(f"max(slurm_gpus_alloc{{{C}}})")], size=(4, 4)),
        stat_panel(
            "GPUs idle (unallocated)", [target(f"max(slurm_gpus_idle{{{C}}})")], size=(4, 4)
        ),
        stat_panel(
            "GPUs unavailable",
            [target(f"max(slurm_gpus_other{{{C}}})")],
            steps=thresholds((None, "green"), (1, "orange")),
            size=(4, 4),
        ),
        stat_panel(
            "Allocated GPUs busy",
            [
                target(
                    f"sum(slurm_job:gpu_utilization_percent:sum{{{J}}}) / "
                    f"sum(slurm_job:gpu_utilization_percent:count{{{J}}})"
                )
            ],
            "percent",
            steps=thresholds((None, "red"), (30, "yellow"), (70, "green")),
            size=(4, 4),
        ),
        stat_panel(
            "Allocated idle GPUs",
            [target(f"sum({NO_REPLICA}(slurm_job:gpus_allocated_idle:count{{{J}}})) or vector(0)")],
            steps=thresholds((None, "green"), (1, "orange")),
            size=(4, 4),
        ),
        stat_panel(
            "Idle allocated GPU-hours (last hour)",
            [target(f"sum({NO_REPLICA}(cluster:gpu_hours_allocated_idle:sum1h{{{C}}}))")],
            size=(4, 4),
        ),
    ]


def _gpus_2() -> list[Panel]:
    """Running jobs: GPUs and utilization."""
    return [
        table_panel(
            "Running jobs: GPUs and utilization",
            [
                table_target(
                    f"sum by (job_id, user, account, partition) "
                    f"({NO_REPLICA}(slurm_job:gpus_allocated:sum{{{J}}}))",
                    "A",
                ),
                table_target(
                    f"sum by (job_id, user, account, partition) "
                    f"(slurm_job:gpu_utilization_percent:sum{{{J}}}) / "
                    f"sum by (job_id, user, account, partition) "
                    f"(slurm_job:gpu_utilization_percent:count{{{J}}})",
                    "B",
                ),
                table_target(
                    f"sum by (job_id, user, account, partition) "
                    f"({NO_REPLICA}(slurm_job:gpus_allocated_idle:count{{{J}}}))",
                    "C",
                ),
            ],
            rename={
                "job_id": "job",
                "Value #A": "GPUs",
                "Value #B": "GPU util %",
                "Value #C": "idle GPUs",
            },
            size=(24, 10),
        ),
    ]


def _gpus_3() -> list[Panel]:
    """GPU utilization per job (top 20); GPUs allocated per user; GPU utilization per user."""
    return [
        timeseries_panel(
            "GPU utilization per job (top 20)",
            [
                target(
                    f"topk(20, sum by (job_id, user) (slurm_job:gpu_utilization_percent:sum"
                    f"{{{J}}}) / sum by (job_id, user) "
                    f"(slurm_job:gpu_utilization_percent:count{{{J}}}))",
                    "{{job_id}} ({{user}})",
                )
            ],
            "percent",
            minmax=(0, 100),
            size=(12, 8),
        ),
        timeseries_panel(
            "GPUs allocated per user",
            [
                target(
                    f"sum by (user) ({NO_REPLICA}(slurm_job:gpus_allocated:sum{{{J}}}))",
                    "{{user}}",
                )
            ],
            stack=True,
            size=(12, 8),
        ),
        timeseries_panel(
            "GPU utilization per user",
            [
                target(
                    f"sum by (user) (slurm_user:gpu_utilization_percent:sum{{{C}}}) / "
                    f"sum by (user) (slurm_user:gpu_utilization_percent:count{{{C}}})",
                    "{{user}}",
                )
            ],
            "percent",
            minmax=(0, 100),
            size=(12, 8),
        ),
    ]


def _gpus_4() -> list[Panel]:
    """GPU utilization per account; GPUs allocated per partition; GPU utilization per partition."""
    return [
        timeseries_panel(
            "GPU utilization per account",
            [
                target(
                    f"sum by (account) (slurm_account:gpu_utilization_percent:sum{{{C}}}) / "
                    f"sum by (account) (slurm_account:gpu_utilization_percent:count{{{C}}})",
                    "{{account}}",
                )
            ],
            "percent",
            minmax=(0, 100),
            size=(12, 8),
        ),
        timeseries_panel(
            "GPUs allocated per partition",
            [
                target(
                    f"max by (partition) (slurm_partition_gpus_allocated{{{J}}})",
                    "{{partition}}",
                )
            ],
            stack=True,
            size=(12, 8),
        ),
        timeseries_panel(
            "GPU utilization per partition",
            [
                target(
                    f"sum by (partition) (partition:gpu_utilization_percent:sum{{{J}}}) / "
                    f"sum by (partition) (partition:gpu_utilization_percent:count{{{J}}})",
                    "{{partition}}",
                )
            ],
            "percent",
            minmax=(0, 100),
            size=(12, 8),
        ),
    ]


def _gpus_5() -> list[Panel]:
    """Idle allocated GPUs per user; Idle allocated GPU-hours per account (hourly)."""
    return [
        timeseries_panel(
            "Idle allocated GPUs per user",
            [
                target(
                    f"sum by (user) ({NO_REPLICA}(slurm_user:gpus_allocated_idle:sum{{{C}}}))",
                    "{{user}}",
                )
            ],
            stack=True,
            bars=True,
            fill=80,
            size=(12, 8),
        ),
        timeseries_panel(
            "Idle allocated GPU-hours per account (hourly)",
            [
                target(
                    f"sum by (account) "
                    f"({NO_REPLICA}(slurm_account:gpu_hours_allocated_idle:sum1h{{{C}}}))",
                    "{{account}}",
                )
            ],
            stack=True,
            size=(12, 8),
        ),
    ]


def _queue_1() -> list[Panel]:
    """Jobs running and pending per partition; Pending jobs by reason; Jobs pending per user (top
    10).
    """
    return [
        timeseries_panel(
            "Jobs running and pending per partition",
            [
                target(
                    f"max by (partition) (slurm_partition_jobs_running{{{J}}})",
                    "{{partition}} running",
                ),
                target(
                    f"max by (partition) (slurm_partition_jobs_pending{{{J}}})",
                    "{{partition}} pending",
                    "B",
                ),
            ],
            overrides=[dashed("B")],
            size=(12, 8),
        ),
        bargauge_panel(
            "Pending jobs by reason",
            [
                target(
                    f"sort_desc(max by (reason) (slurm_jobs_pending_by_reason{{{C}}}))",
                    "{{reason}}",
                    instant=True,
                )
            ],
            size=(12, 8),
        ),
        timeseries_panel(
            "Jobs pending per user (top 10)",
            [
                target(
                    f"topk(10, sum by (user) ({NO_REPLICA}(slurm_queue_pending{{{J}}})))",
                    "{{user}}",
                )
            ],
            stack=True,
            size=(12, 8),
        ),
    ]


def _queue_2() -> list[Panel]:
    """Scheduler cycle."""
    return [
        timeseries_panel(
            "Scheduler cycle",
            [
                target(f"max(slurm_scheduler_last_cycle{{{C}}}) / 1e6", "main cycle"),
                target(
                    f"max(slurm_scheduler_backfill_last_cycle{{{C}}}) / 1e6",
                    "backfill cycle",
                    "B",
                ),
            ],
            "s",
            size=(12, 8),
        ),
    ]


def _gpus() -> list[Item]:
    return [
        row("GPUs"),
        _gpus_1(),
        _gpus_2(),
        [*_gpus_3(), *_gpus_4(), *_gpus_5()],
    ]


def _queue() -> list[Item]:
    return [
        row("Queue"),
        [*_queue_1(), *_queue_2()],
    ]


def _nodes() -> list[Item]:
    return [
        row("Nodes"),
        [
            timeseries_panel(
                "Nodes by state",
                [
                    target(
                        f"sum(max by (partition) (slurm_nodes_{state}{{{J}}}))",
                        state,
                        chr(65 + i),
                    )
                    for i, state in enumerate(
                        ["alloc", "mix", "idle", "drain", "down", "fail", "maint", "resv"]
                    )
                ],
                stack=True,
                fill=60,
                size=(12, 8),
            ),
            table_panel(
                "Nodes with a reason (drained, down, ...)",
                [
                    table_target(
                        f"max by (node, state, reason) (slurm_node_state_reason_info{{{C}}})"
                    )
                ],
                hide=["Value"],
                links=[NODE_LINK],
                size=(12, 8),
            ),
        ],
    ]


def build() -> dm.Dashboard:
    return dashboard(
        "gpufleet-slurm-jobs",
        "Slurm jobs",
        "GPU allocation and utilization per job, user, account and partition; the queue "
        "with pending reasons; node states. The GPU totals, queue and node-state panels read "
        "the Slurm exporter's cluster-wide series: on a sharded site pick the global tier "
        "(it federates them, and holds the per-job, user and account rollups).",
        [*_gpus(), *_queue(), *_nodes()],
        common_variables(),
        tags=["slurm"],
    )
