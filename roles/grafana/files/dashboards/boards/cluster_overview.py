"""Cluster overview: GPUs up vs expected, load, health events, idle allocations."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from .blocks import (
    GPU_SEL,
    JOB_SEL,
    LOGS_LINK,
    NODE_LINK,
    NODE_SEL,
    PCT,
    TEMP,
    Item,
    Panel,
    dashed,
    heatmap_panel,
    stat_panel,
    table_panel,
    table_target,
    target,
    thresholds,
    timeseries_panel,
)
from .frame import common_variables, dashboard, row

N, G = NODE_SEL, GPU_SEL


def _gpu_counts() -> list[Panel]:
    """GPUs reported against the inventory."""
    panels = [
        stat_panel(
            "GPUs up",
            [target(f"sum(node:gpus_present:count{{{N}}})")],
            desc="GPUs the collectors and dcgm-exporter report.",
        ),
        stat_panel(
            "GPUs expected",
            [target(f"sum(node:gpus_expected:count{{{N}}})")],
            desc="GPUs the inventory says the selected nodes have.",
        ),
        stat_panel(
            "GPUs missing",
            [
                target(
                    f"sum(clamp_min(node:gpus_expected:count{{{N}}} - "
                    f"(node:gpus_present:count{{{N}}} or node:gpus_expected:count{{{N}}} * 0), 0))"
                )
            ],
            steps=thresholds((None, "green"), (1, "red")),
            desc="Expected minus reported, per node (a GPU fell off the bus or did not "
            "initialise).",
        ),
    ]
    return [p.span(3).height(4) for p in panels]


def _gpu_load() -> list[Panel]:
    """Load, allocation and the hottest GPU."""
    panels = [
        stat_panel(
            "GPU utilization",
            [
                target(
                    f"sum(node:gpu_utilization_percent:sum{{{N}}}) / "
                    f"sum(node:gpu_utilization_percent:count{{{N}}})"
                )
            ],
            unit="percent",
            steps=thresholds((None, "red"), (30, "yellow"), (70, "green")),
        ),
        stat_panel(
            "GPU memory used",
            [
                target(
                    f"sum(node:gpu_memory_used_bytes:sum{{{N}}}) / "
                    f"sum(node:gpu_memory_total_bytes:sum{{{N}}})"
                )
            ],
            unit="percentunit",
            steps=PCT,
        ),
        stat_panel(
            "Power draw / limit",
            [
                target(
                    f"sum(node:gpu_power_draw_watts:sum{{{N}}}) / "
                    f"sum(node:gpu_power_limit_watts:sum{{{N}}})"
                )
            ],
            unit="percentunit",
            steps=PCT,
        ),
        stat_panel(
            "Hottest GPU",
            [target(f"max(node:gpu_temperature_celsius:max{{{N}}})")],
            unit="celsius",
            steps=TEMP,
        ),
        stat_panel(
            "Allocated idle GPUs",
            [target(f"sum(slurm_job:gpus_allocated_idle:count{{{JOB_SEL}}}) or vector(0)")],
            steps=thresholds((None, "green"), (1, "orange")),
            desc="GPUs held by running Slurm jobs that stayed below 5 % for 30 minutes.",
        ),
    ]
    return [p.span(3).height(4) for p in panels]


def _heatmap() -> Panel:
    query = target(
        # Per-GPU series live on the shards; the global tier has the per-node
        # average only, shown as one row per node (gpu="avg").
        f"max by (cluster, node, gpu) (gpu:utilization_percent:max{{{G}}}) or on (cluster, node) "
        f'label_replace(node:gpu_utilization_percent:avg{{{N}}}, "gpu", "avg", "", "")',
        "{{node}}/{{gpu}}",
        interval="1m",
    )
    return heatmap_panel(
        "GPU utilization per node / GPU",
        query,
        unit="percent",
        minmax=(0, 100),
        desc="One row per GPU; colour = utilization. Empty rows are GPUs without data.",
        links=[NODE_LINK],
        size=(24, 12),
    )


def _health_events_1() -> list[Panel]:
    """GPUs throttled, by reason; XID errors per minute; Uncorrectable ECC errors (since driver
    load).
    """
    return [
        timeseries_panel(
            "GPUs throttled, by reason",
            [
                target(
                    f"sum by (reason) (node:gpu_clock_event_reason_active:sum{{{N}}})",
                    "{{reason}}",
                )
            ],
            stack=True,
            bars=True,
            fill=80,
            desc="GPUs with an active clock-event (throttle) reason: power cap, "
            "thermal or hardware slowdown.",
            size=(8, 8),
        ),
        timeseries_panel(
            "XID errors per minute",
            [
                target(
                    f"(sum by (node, xid, critical) (gpu:xid_errors:rate5m{{{G}}}) or on (node) "
                    f"sum by (node, critical) (node:gpu_xid_errors:sum_rate5m{{{N}}})) * 60 > 0",
                    "{{node}} XID {{xid}} (critical={{critical}})",
                )
            ],
            "short",
            bars=True,
            fill=80,
            links=[LOGS_LINK],
            size=(8, 8),
        ),
        timeseries_panel(
            "Uncorrectable ECC errors (since driver load)",
            [
                target(
                    f"max by (node, gpu) (node_gpu_ecc_uncorrected_errors_total"
                    f'{{{G}, scope="volatile"}}) > 0 or max by (node, gpu) '
                    f"(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{G}}}) > 0",
                    "{{node}} GPU {{gpu}}",
                )
            ],
            desc="gpufleet collector (volatile scope) or dcgm-exporter (DBE volatile).",
            links=[NODE_LINK],
            size=(8, 8),
        ),
    ]


def _health_events_2() -> list[Panel]:
    """GPUs missing, per node; Critical XIDs in the last hour; Allocated but idle GPUs (Slurm)."""
    return [
        table_panel(
            "GPUs missing, per node",
            [
                table_target(
                    f"node:gpus_expected:count{{{N}}} - "
                    f"(node:gpus_present:count{{{N}}} or node:gpus_expected:count{{{N}}} * 0)"
                    " > 0"
                )
            ],
            rename={"Value": "missing GPUs"},
            links=[NODE_LINK],
            size=(8, 8),
        ),
        table_panel(
            "Critical XIDs in the last hour",
            [
                table_target(
                    f"sum by (node, gpu, xid) (increase(node_gpu_xid_errors_total"
                    f'{{{G}, critical="true"}}[1h])) > 0 or max by (node, gpu, xid) '
                    f"(DCGM_EXP_XID_ERRORS_COUNT{{{G}}}) > 0"
                )
            ],
            rename={"Value": "events"},
            links=[LOGS_LINK],
            size=(8, 8),
        ),
        table_panel(
            "Allocated but idle GPUs (Slurm)",
            [table_target(f"slurm_job:gpus_allocated_idle:count{{{JOB_SEL}}}")],
            rename={"Value": "idle GPUs", "job_id": "job"},
            size=(8, 8),
        ),
    ]


def _gpus() -> list[Item]:
    return [
        row("GPUs"),
        _gpu_counts() + _gpu_load(),
        [_heatmap()],
        [
            timeseries_panel(
                "GPU utilization per node",
                [target(f"node:gpu_utilization_percent:avg{{{N}}}", "{{node}}")],
                "percent",
                minmax=(0, 100),
                links=[NODE_LINK],
                size=(12, 8),
            ),
            timeseries_panel(
                "GPU memory used per node",
                [target(f"node:gpu_memory_utilization:ratio{{{N}}}", "{{node}}")],
                "percentunit",
                minmax=(0, 1),
                links=[NODE_LINK],
                size=(12, 8),
            ),
            timeseries_panel(
                "GPU power draw vs limit",
                [
                    target(f"sum(node:gpu_power_draw_watts:sum{{{N}}})", "power draw"),
                    target(f"sum(node:gpu_power_limit_watts:sum{{{N}}})", "power limit", "B"),
                ],
                "watt",
                overrides=[dashed("B", "red")],
                size=(12, 8),
            ),
            timeseries_panel(
                "GPU temperature (hottest GPU per node)",
                [target(f"node:gpu_temperature_celsius:max{{{N}}}", "{{node}}")],
                "celsius",
                steps=TEMP,
                threshold_style="dashed",
                links=[NODE_LINK],
                size=(12, 8),
            ),
        ],
    ]


def _health_events() -> list[Item]:
    return [
        row("Health events"),
        _health_events_1(),
        _health_events_2(),
    ]


def build() -> dm.Dashboard:
    return dashboard(
        "gpufleet-cluster-overview",
        "Cluster overview",
        "GPUs up vs expected, utilization, memory, power, temperature, throttling, XID/ECC "
        "events and GPUs Slurm allocated that sit idle. On the global tier the heatmap shows "
        "one row per node; the ECC and critical-XID tables need a shard datasource.",
        [*_gpus(), *_health_events()],
        common_variables(),
        tags=["gpu", "overview"],
    )
