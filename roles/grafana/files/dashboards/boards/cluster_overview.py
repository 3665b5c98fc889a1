"""Cluster overview: GPUs up vs expected, load, health events, idle allocations."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from . import panels
from .frame import common_variables, dashboard, section
from .panels import Item, Panel
from .queries import GPU_SEL, JOB_SEL, NODE_SEL, Query, table_target, target

N, G = NODE_SEL, GPU_SEL
# Expected minus reported GPUs per node; a node that reports none counts all as missing.
MISSING = (
    f"node:gpus_expected:count{{{N}}} - "
    f"(node:gpus_present:count{{{N}}} or node:gpus_expected:count{{{N}}} * 0)"
)


# What the dashboard shows, for its description in Grafana.
DESCRIPTION = (
    "GPUs up vs expected, utilization, memory, power, temperature, throttling, XID/ECC "
    "events and GPUs Slurm allocated that sit idle. On the global tier the heatmap shows "
    "one row per node; the ECC and critical-XID tables need a shard datasource."
)


def fleet_ratio(part: str, whole: str) -> Query:
    """One number for the selected nodes: node rollup `part` summed over `whole` summed."""
    return target(f"sum(node:{part}{{{N}}}) / sum(node:{whole}{{{N}}})")


def _gpu_counts() -> list[Panel]:
    """GPUs reported against the inventory."""
    return [
        panels.stat(
            "GPUs up",
            [target(f"sum(node:gpus_present:count{{{N}}})")],
            desc="GPUs the collectors and dcgm-exporter report.",
        ),
        panels.stat(
            "GPUs expected",
            [target(f"sum(node:gpus_expected:count{{{N}}})")],
            desc="GPUs the inventory says the selected nodes have.",
        ),
        panels.stat(
            "GPUs missing",
            [target(f"sum(clamp_min({MISSING}, 0))")],
            steps=panels.thresholds((None, "green"), (1, "red")),
            desc="Expected minus reported, per node (a GPU fell off the bus or did not "
            "initialise).",
        ),
    ]


def _gpu_load() -> list[Panel]:
    """Load, allocation and the hottest GPU."""
    utilization = fleet_ratio("gpu_utilization_percent:sum", "gpu_utilization_percent:count")
    memory = fleet_ratio("gpu_memory_used_bytes:sum", "gpu_memory_total_bytes:sum")
    power = fleet_ratio("gpu_power_draw_watts:sum", "gpu_power_limit_watts:sum")
    idle = f"sum(slurm_job:gpus_allocated_idle:count{{{JOB_SEL}}}) or vector(0)"
    return [
        panels.stat(
            "GPU utilization",
            [utilization],
            unit="percent",
            steps=panels.thresholds((None, "red"), (30, "yellow"), (70, "green")),
        ),
        panels.stat("GPU memory used", [memory], unit="percentunit", steps=panels.PCT),
        panels.stat("Power draw / limit", [power], unit="percentunit", steps=panels.PCT),
        panels.stat(
            "Hottest GPU",
            [target(f"max(node:gpu_temperature_celsius:max{{{N}}})")],
            unit="celsius",
            steps=panels.TEMP,
        ),
        panels.stat(
            "Allocated idle GPUs",
            [target(idle)],
            steps=panels.thresholds((None, "green"), (1, "orange")),
            desc="GPUs held by running Slurm jobs that stayed below 5 % for 30 minutes.",
        ),
    ]


def _heatmap() -> Panel:
    query = target(
        # Per-GPU series live on the shards; the global tier has the per-node
        # average only, shown as one row per node (gpu="avg").
        f"max by (cluster, node, gpu) (gpu:utilization_percent:max{{{G}}}) or on (cluster, node) "
        f'label_replace(node:gpu_utilization_percent:avg{{{N}}}, "gpu", "avg", "", "")',
        "{{node}}/{{gpu}}",
        interval="1m",
    )
    return panels.heatmap(
        "GPU utilization per node / GPU",
        query,
        unit="percent",
        minmax=(0, 100),
        desc="One row per GPU; colour = utilization. Empty rows are GPUs without data.",
        links=[panels.NODE_LINK],
        size=(24, 12),
    )


def per_node(title: str, rollup: str, unit: str, top: float) -> Panel:
    """One line per node of a node rollup from 0 to `top`."""
    query = target(f"node:{rollup}{{{N}}}", "{{node}}")
    return panels.timeseries(title, [query], unit, minmax=(0, top), links=[panels.NODE_LINK])


def _per_node() -> list[Panel]:
    """Per-node lines, each linking to the node's detail dashboard."""
    power = target(f"sum(node:gpu_power_draw_watts:sum{{{N}}})", "power draw")
    limit = target(f"sum(node:gpu_power_limit_watts:sum{{{N}}})", "power limit", "B")
    return [
        per_node("GPU utilization per node", "gpu_utilization_percent:avg", "percent", 100),
        per_node("GPU memory used per node", "gpu_memory_utilization:ratio", "percentunit", 1),
        panels.with_limit("GPU power draw vs limit", [power], limit, "watt"),
        panels.timeseries(
            "GPU temperature (hottest GPU per node)",
            [target(f"node:gpu_temperature_celsius:max{{{N}}}", "{{node}}")],
            "celsius",
            steps=panels.TEMP,
            threshold_style="dashed",
            links=[panels.NODE_LINK],
        ),
    ]


def _gpus() -> list[Item]:
    stats = [p.span(3).height(4) for p in _gpu_counts() + _gpu_load()]
    return section("GPUs", stats, [_heatmap()], _per_node())


def _event_rates() -> list[Panel]:
    throttled = f"sum by (reason) (node:gpu_clock_event_reason_active:sum{{{N}}})"
    xids = (
        f"(sum by (node, xid, critical) (gpu:xid_errors:rate5m{{{G}}}) or on (node) "
        f"sum by (node, critical) (node:gpu_xid_errors:sum_rate5m{{{N}}})) * 60 > 0"
    )
    ecc = (
        f"max by (node, gpu) (node_gpu_ecc_uncorrected_errors_total"
        f'{{{G}, scope="volatile"}}) > 0 or max by (node, gpu) '
        f"(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{G}}}) > 0"
    )
    return [
        panels.timeseries(
            "GPUs throttled, by reason",
            [target(throttled, "{{reason}}")],
            stack=True,
            bars=True,
            fill=80,
            desc="GPUs with an active clock-event (throttle) reason: power cap, "
            "thermal or hardware slowdown.",
            size=(8, 8),
        ),
        panels.timeseries(
            "XID errors per minute",
            [target(xids, "{{node}} XID {{xid}} (critical={{critical}})")],
            bars=True,
            fill=80,
            links=[panels.LOGS_LINK],
            size=(8, 8),
        ),
        panels.timeseries(
            "Uncorrectable ECC errors (since driver load)",
            [target(ecc, "{{node}} GPU {{gpu}}")],
            desc="gpufleet collector (volatile scope) or dcgm-exporter (DBE volatile).",
            links=[panels.NODE_LINK],
            size=(8, 8),
        ),
    ]


def _event_tables() -> list[Panel]:
    critical_xids = (
        f"sum by (node, gpu, xid) (increase(node_gpu_xid_errors_total"
        f'{{{G}, critical="true"}}[1h])) > 0 or max by (node, gpu, xid) '
        f"(DCGM_EXP_XID_ERRORS_COUNT{{{G}}}) > 0"
    )
    idle = f"slurm_job:gpus_allocated_idle:count{{{JOB_SEL}}}"
    missing = {"Value": "missing GPUs"}
    return [
        panels.table(
            "GPUs missing, per node",
            [table_target(f"{MISSING} > 0")],
            rename=missing,
            links=[panels.NODE_LINK],
            size=(8, 8),
        ),
        panels.table(
            "Critical XIDs in the last hour",
            [table_target(critical_xids)],
            rename={"Value": "events"},
            links=[panels.LOGS_LINK],
            size=(8, 8),
        ),
        panels.table(
            "Allocated but idle GPUs (Slurm)",
            [table_target(idle)],
            rename={"Value": "idle GPUs", "job_id": "job"},
            size=(8, 8),
        ),
    ]


def build() -> dm.Dashboard:
    rows = [*_gpus(), *section("Health events", _event_rates(), _event_tables())]
    return dashboard(
        "gpufleet-cluster-overview",
        "Cluster overview",
        DESCRIPTION,
        rows,
        common_variables(),
        tags=["gpu", "overview"],
    )
