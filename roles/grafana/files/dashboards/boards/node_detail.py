# ruff: noqa: E501  (PromQL/LogQL strings read better unbroken than split to fit)
"""Node detail: one node's host, per-GPU, disk and network panels."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from .blocks import (
    CL,
    GPU_SEL,
    NODE_SEL,
    PCT,
    TEMP,
    Item,
    Panel,
    by_thresholds,
    dashed,
    gauge_panel,
    mirrored,
    stat_panel,
    table_panel,
    table_target,
    target,
    thresholds,
    timeseries_panel,
)
from .frame import common_variables, dashboard, row

N, G = NODE_SEL, GPU_SEL
FS = (
    f'{N}, fstype!~"tmpfs|overlay|squashfs|ramfs|devtmpfs|nsfs|autofs|fuse.*", '
    f'mountpoint!~"/run.*|/sys.*|/proc.*|/dev.*"'
)


def _gpus_1() -> list[Panel]:
    """GPU memory used per GPU; GPU utilization; GPU temperature; GPU power draw."""
    return [
        timeseries_panel(
            "GPU memory used per GPU",
            [
                target(f"gpu:memory_used_bytes:sum{{{G}}}", "{{node}} GPU {{gpu}}"),
                target(f"max(gpu:memory_total_bytes:sum{{{G}}})", "memory size", "B"),
            ],
            "bytes",
            overrides=[dashed("B", "red")],
            size=(12, 9),
        ),
        timeseries_panel(
            "GPU utilization",
            [target(f"gpu:utilization_percent:max{{{G}}}", "{{node}} GPU {{gpu}}")],
            "percent",
            minmax=(0, 100),
            steps=PCT,
            threshold_style="dashed",
            size=(12, 9),
        ),
        timeseries_panel(
            "GPU temperature",
            [target(f"gpu:temperature_celsius:max{{{G}}}", "{{node}} GPU {{gpu}}")],
            "celsius",
            steps=TEMP,
            threshold_style="line+area",
            color=by_thresholds(),
            gradient="scheme",
            size=(12, 9),
        ),
        timeseries_panel(
            "GPU power draw",
            [
                target(f"gpu:power_draw_watts:max{{{G}}}", "{{node}} GPU {{gpu}}"),
                target(f"max(gpu:power_limit_watts:max{{{G}}})", "power limit", "B"),
            ],
            "watt",
            overrides=[dashed("B", "red")],
            size=(12, 9),
        ),
    ]


def _gpus_2() -> list[Panel]:
    """Throttle reasons active; Slurm jobs on these GPUs."""
    return [
        timeseries_panel(
            "Throttle reasons active",
            [
                target(
                    f"gpu:clock_event_reason_active:max{{{G}}} > 0",
                    "GPU {{gpu}} {{reason}}",
                )
            ],
            bars=True,
            fill=80,
            size=(12, 8),
        ),
        table_panel(
            "Slurm jobs on these GPUs",
            [
                table_target(
                    f'slurm_job_gpu:gpu_utilization_percent:max{{{CL}, node=~"${{node}}", '
                    f'gpu=~"${{gpu}}"}}'
                )
            ],
            rename={"Value": "GPU utilization %", "job_id": "job"},
            size=(12, 8),
        ),
    ]


def _host() -> list[Item]:
    return [
        row("Host"),
        [
            stat_panel(
                "Scraped by shard",
                [
                    target(
                        f"max by (shard) (node:up:max{{{N}}})",
                        "shard {{shard}}",
                        instant=True,
                    )
                ],
                desc="Per-GPU and disk panels need the raw series: on a sharded site pick "
                "this shard's datasource (gpufleet Prometheus shard N). Empty shard: a "
                "standalone Prometheus, which has everything.",
                options_text="name",
                size=(24, 3),
            ),
        ],
        [
            timeseries_panel(
                "CPU utilization",
                [target(f"node:cpu_utilization:ratio{{{N}}}", "{{node}}")],
                "percentunit",
                minmax=(0, 1),
                size=(12, 8),
            ),
            timeseries_panel(
                "Memory used",
                [
                    target(
                        f"node:memory_total_bytes:sum{{{N}}} - "
                        f"node:memory_available_bytes:sum{{{N}}}",
                        "{{node}} used",
                    ),
                    target(f"node:memory_total_bytes:sum{{{N}}}", "{{node}} total", "B"),
                ],
                "bytes",
                overrides=[dashed("B")],
                size=(12, 8),
            ),
        ],
    ]


def _gpus() -> list[Item]:
    return [
        row("GPUs"),
        [*_gpus_1(), *_gpus_2()],
    ]


def _disks_and_network() -> list[Item]:
    return [
        row("Disks and network"),
        [
            gauge_panel(
                "Disk usage",
                [
                    target(
                        f"1 - node_filesystem_avail_bytes{{{FS}}} / node_filesystem_size_bytes{{{FS}}}",
                        "{{mountpoint}}",
                    )
                ],
                unit="percentunit",
                minmax=(0, 1),
                steps=thresholds((None, "green"), (0.7, "yellow"), (0.85, "red")),
                size=(8, 8),
            ),
            timeseries_panel(
                "Network receive / transmit",
                [
                    target(f"node:network_receive_bytes:sum_rate5m{{{N}}}", "{{node}} receive"),
                    target(
                        f"node:network_transmit_bytes:sum_rate5m{{{N}}}",
                        "{{node}} transmit",
                        "B",
                    ),
                ],
                "Bps",
                overrides=[mirrored("B")],
                size=(16, 8),
            ),
        ],
    ]


def build() -> dm.Dashboard:
    return dashboard(
        "gpufleet-node-detail",
        "Node detail",
        "One node: CPU, memory, per-GPU memory, utilization, temperature and power, disks "
        "and network. Disk gauges read node_exporter series: on a sharded site pick the "
        "node's shard datasource.",
        [*_host(), *_gpus(), *_disks_and_network()],
        common_variables(node_multi=False),
        tags=["gpu", "node"],
    )
