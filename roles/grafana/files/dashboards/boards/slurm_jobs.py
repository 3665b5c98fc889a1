"""Slurm jobs: GPU allocation and use per job, user and account; queue; node states."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from .blocks import (
    CL,
    JOB_SEL,
    NO_REPLICA,
    NODE_LINK,
    Cell,
    Item,
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


def _gpus_allocated() -> Cell:
    return (stat_panel("GPUs allocated", [target(f"max(slurm_gpus_alloc{{{C}}})")]), 4, 4)


def _gpus_idle_unallocated() -> Cell:
    return (stat_panel("GPUs idle (unallocated)", [target(f"max(slurm_gpus_idle{{{C}}})")]), 4, 4)


def _gpus_unavailable() -> Cell:
    return (
        stat_panel(
            "GPUs unavailable",
            [target(f"max(slurm_gpus_other{{{C}}})")],
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        4,
        4,
    )


def _allocated_gpus_busy() -> Cell:
    return (
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
        ),
        4,
        4,
    )


def _allocated_idle_gpus() -> Cell:
    return (
        stat_panel(
            "Allocated idle GPUs",
            [target(f"sum({NO_REPLICA}(slurm_job:gpus_allocated_idle:count{{{J}}})) or vector(0)")],
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        4,
        4,
    )


def _idle_allocated_gpu_hours_last_hour() -> Cell:
    return (
        stat_panel(
            "Idle allocated GPU-hours (last hour)",
            [target(f"sum({NO_REPLICA}(cluster:gpu_hours_allocated_idle:sum1h{{{C}}}))")],
        ),
        4,
        4,
    )


def _gpus_line2() -> list[Cell]:
    return [
        (
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
            ),
            24,
            10,
        ),
    ]


def _gpu_utilization_per_job_top_20() -> Cell:
    return (
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
        ),
        12,
        8,
    )


def _gpus_allocated_per_user() -> Cell:
    return (
        timeseries_panel(
            "GPUs allocated per user",
            [
                target(
                    f"sum by (user) ({NO_REPLICA}(slurm_job:gpus_allocated:sum{{{J}}}))",
                    "{{user}}",
                )
            ],
            stack=True,
        ),
        12,
        8,
    )


def _gpu_utilization_per_user() -> Cell:
    return (
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
        ),
        12,
        8,
    )


def _gpu_utilization_per_account() -> Cell:
    return (
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
        ),
        12,
        8,
    )


def _gpus_allocated_per_partition() -> Cell:
    return (
        timeseries_panel(
            "GPUs allocated per partition",
            [
                target(
                    f"max by (partition) (slurm_partition_gpus_allocated{{{J}}})",
                    "{{partition}}",
                )
            ],
            stack=True,
        ),
        12,
        8,
    )


def _gpu_utilization_per_partition() -> Cell:
    return (
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
        ),
        12,
        8,
    )


def _idle_allocated_gpus_per_user() -> Cell:
    return (
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
        ),
        12,
        8,
    )


def _idle_allocated_gpu_hours_per_account_hou() -> Cell:
    return (
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
        ),
        12,
        8,
    )


def _gpus() -> list[Item]:
    return [
        row("GPUs"),
        [
            _gpus_allocated(),
            _gpus_idle_unallocated(),
            _gpus_unavailable(),
            _allocated_gpus_busy(),
            _allocated_idle_gpus(),
            _idle_allocated_gpu_hours_last_hour(),
        ],
        _gpus_line2(),
        [
            _gpu_utilization_per_job_top_20(),
            _gpus_allocated_per_user(),
            _gpu_utilization_per_user(),
            _gpu_utilization_per_account(),
            _gpus_allocated_per_partition(),
            _gpu_utilization_per_partition(),
            _idle_allocated_gpus_per_user(),
            _idle_allocated_gpu_hours_per_account_hou(),
        ],
    ]


def _jobs_running_and_pending_per_partition() -> Cell:
    return (
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
        ),
        12,
        8,
    )


def _pending_jobs_by_reason() -> Cell:
    return (
        bargauge_panel(
            "Pending jobs by reason",
            [
                target(
                    f"sort_desc(max by (reason) (slurm_jobs_pending_by_reason{{{C}}}))",
                    "{{reason}}",
                    instant=True,
                )
            ],
        ),
        12,
        8,
    )


def _jobs_pending_per_user_top_10() -> Cell:
    return (
        timeseries_panel(
            "Jobs pending per user (top 10)",
            [
                target(
                    f"topk(10, sum by (user) ({NO_REPLICA}(slurm_queue_pending{{{J}}})))",
                    "{{user}}",
                )
            ],
            stack=True,
        ),
        12,
        8,
    )


def _scheduler_cycle() -> Cell:
    return (
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
        ),
        12,
        8,
    )


def _queue() -> list[Item]:
    return [
        row("Queue"),
        [
            _jobs_running_and_pending_per_partition(),
            _pending_jobs_by_reason(),
            _jobs_pending_per_user_top_10(),
            _scheduler_cycle(),
        ],
    ]


def _nodes_line1() -> list[Cell]:
    return [
        (
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
            ),
            12,
            8,
        ),
        (
            table_panel(
                "Nodes with a reason (drained, down, ...)",
                [
                    table_target(
                        f"max by (node, state, reason) (slurm_node_state_reason_info{{{C}}})"
                    )
                ],
                hide=["Value"],
                links=[NODE_LINK],
            ),
            12,
            8,
        ),
    ]


def _nodes() -> list[Item]:
    return [
        row("Nodes"),
        _nodes_line1(),
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
