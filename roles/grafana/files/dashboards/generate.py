#!/usr/bin/env python3
# ruff: noqa: E501  (PromQL/LogQL strings read better unbroken than split to fit)
"""Generate gpufleet's Grafana dashboards (the *.json files next to this script).

    python3 roles/grafana/files/dashboards/generate.py            # rewrite the JSON files
    python3 roles/grafana/files/dashboards/generate.py --check    # exit 1 if they differ
    python3 roles/grafana/files/dashboards/generate.py --queries  # print every query

The panels read the recording rules of roles/prometheus/files/rules (fed by both the
gpufleet GPU collector and dcgm-exporter), the Slurm exporter, node_exporter and
Prometheus/Alertmanager self-metrics. No instance, host or port appears in a query: the
template variables select cluster, rack, partition, node and GPU by inventory labels.
tests/unit/test_dashboards.py checks that the committed JSON equals this output, that
every PromQL query parses (promtool) and that every metric it names exists.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from gpufleet.sizing import DEFAULT_MAX_SERIES_PER_SHARD

HERE = Path(__file__).resolve().parent
# The global tier federates both replicas of each shard: a sum of counts takes one first
# (a no-op on a shard, whose own series carry no replica label).
NO_REPLICA = "max without (replica) "
SCHEMA_VERSION = 42  # Grafana 12.2 - 13.x classic dashboard model
PROM = {"type": "prometheus", "uid": "${datasource}"}
LOKI = {"type": "loki", "uid": "${loki}"}

# Label filters. `partition` on node-level series is the comma-joined list of the node's
# partitions (docs/inventory.md), so one partition matches as a list element.
PART = 'partition=~"(.*,)?(${partition})(,.*)?"'
CL = 'cluster=~"${cluster}"'
NODE_SEL = f'{CL}, rack=~"${{rack}}", {PART}, node=~"${{node}}"'
GPU_SEL = f'{NODE_SEL}, gpu=~"${{gpu}}"'
# Slurm job series carry the job's own partition (one value).
JOB_SEL = f'{CL}, partition=~"${{partition}}"'

LOGS_LINK = {
    "title": "Logs of ${__field.labels.node}",
    "url": "/d/gpufleet-logs/logs?var-node=${__field.labels.node}&${__url_time_range}"
    "&var-cluster=${cluster}",
}
NODE_LINK = {
    "title": "Node detail: ${__field.labels.node}",
    "url": "/d/gpufleet-node-detail/node-detail?var-node=${__field.labels.node}"
    "&${__url_time_range}&var-cluster=${cluster}",
}


# ------------------------------------------------------------------ building blocks


# Recording-rule rollups the global tier federates from both replicas of every shard
# (docs/alerts.md, "Federation"): `max without (replica)` folds the two copies into one
# and is a no-op on a shard or a standalone Prometheus, so one query serves all tiers.
FEDERATED = re.compile(
    r"\b((?:node|cluster|rack|partition|gpu_model|slurm_job|slurm_user|slurm_account)"
    r":[a-z0-9_]+:[a-z0-9_]+)(\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})"
)


def dedup_replicas(expr: str) -> str:
    return FEDERATED.sub(r"max without (replica) (\1\2)", expr)


def target(expr: str, legend: str = "", ref: str = "A", **extra) -> dict:
    expr = dedup_replicas(expr)
    out = {"datasource": PROM, "expr": expr, "legendFormat": legend or "__auto", "refId": ref}
    out.update(extra)
    return out


def table_target(expr: str, ref: str = "A") -> dict:
    return target(expr, "", ref, format="table", instant=True, range=False)


def loki_target(expr: str, ref: str = "A", **extra) -> dict:
    out = {"datasource": LOKI, "expr": expr, "refId": ref, "queryType": "range"}
    out.update(extra)
    return out


def thresholds(*steps: tuple[float | None, str]) -> dict:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


def dashed(ref: str, color: str | None = None, name: str | None = None) -> dict:
    """Override that draws query `ref` as a dashed line (optionally in a fixed colour)."""
    props = [
        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
        {"id": "custom.fillOpacity", "value": 0},
        {"id": "custom.lineWidth", "value": 2},
    ]
    if color:
        props.append({"id": "color", "value": {"mode": "fixed", "fixedColor": color}})
    if name:
        props.append({"id": "displayName", "value": name})
    return {"matcher": {"id": "byFrameRefID", "options": ref}, "properties": props}


def panel(
    kind: str,
    title: str,
    targets: list[dict],
    *,
    unit: str = "short",
    desc: str = "",
    steps: dict | None = None,
    overrides: list[dict] | None = None,
    custom: dict | None = None,
    options: dict | None = None,
    color: dict | None = None,
    minmax: tuple[float | None, float | None] = (None, None),
    links: list | None = None,
    transformations: list | None = None,
    datasource: dict = PROM,
) -> dict:
    defaults: dict = {"unit": unit, "color": color or {"mode": "palette-classic"}}
    if steps:
        defaults["thresholds"] = steps
    if minmax[0] is not None:
        defaults["min"] = minmax[0]
    if minmax[1] is not None:
        defaults["max"] = minmax[1]
    if custom:
        defaults["custom"] = custom
    if links:
        defaults["links"] = links
    out = {
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": datasource,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": options or {},
    }
    if transformations:
        out["transformations"] = transformations
    return out


def timeseries(
    title: str,
    targets: list[dict],
    unit: str = "short",
    *,
    stack: bool = False,
    fill: int = 10,
    bars: bool = False,
    threshold_style: str | None = None,
    **kw,
) -> dict:
    custom = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1,
        "fillOpacity": fill,
        "gradientMode": kw.pop("gradient", "none"),
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        "axisSoftMin": 0,
    }
    if threshold_style:
        custom["thresholdsStyle"] = {"mode": threshold_style}
    options = {
        "legend": {"displayMode": "table", "placement": "right", "calcs": ["mean", "max"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel("timeseries", title, targets, unit=unit, custom=custom, options=options, **kw)


def stat(
    title: str,
    targets: list[dict],
    unit: str = "short",
    steps: dict | None = None,
    options_text: str = "auto",
    **kw,
) -> dict:
    options = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background",
        "graphMode": "area",
        "textMode": options_text,
        "justifyMode": "auto",
        "orientation": "auto",
    }
    steps = steps or thresholds((None, "blue"))
    return panel(
        "stat",
        title,
        targets,
        unit=unit,
        steps=steps,
        options=options,
        color={"mode": "thresholds"},
        **kw,
    )


def table(
    title: str,
    targets: list[dict],
    *,
    rename: dict | None = None,
    hide: list[str] | None = None,
    **kw,
) -> dict:
    exclude = {name: True for name in ["Time", *(hide or [])]}
    transformations = [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": exclude, "renameByName": rename or {}}},
    ]
    options = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}
    return panel("table", title, targets, options=options, transformations=transformations, **kw)


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def layout(items: list) -> list[dict]:
    """items: row dicts, or lists of (panel, width, height) filling 24-column lines."""
    out, y, pid = [], 0, 1
    for item in items:
        if isinstance(item, dict):
            item = dict(item, id=pid, gridPos={"h": 1, "w": 24, "x": 0, "y": y})
            out.append(item)
            pid, y = pid + 1, y + 1
            continue
        x, line_h = 0, 0
        for p, w, h in item:
            if x + w > 24:
                x, y, line_h = 0, y + line_h, 0
            out.append(dict(p, id=pid, gridPos={"h": h, "w": w, "x": x, "y": y}))
            pid, x, line_h = pid + 1, x + w, max(line_h, h)
        y += line_h
    return out


# ------------------------------------------------------------------ template variables


def var_datasource() -> dict:
    return {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {"text": "gpufleet Prometheus", "value": "gpufleet-prometheus"},
        "regex": "",
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "refresh": 1,
    }


def var_loki() -> dict:
    return {
        "name": "loki",
        "label": "Loki",
        "type": "datasource",
        "query": "loki",
        "current": {"text": "gpufleet Loki", "value": "gpufleet-loki"},
        "regex": "",
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "refresh": 1,
    }


def var_query(
    name: str,
    label: str,
    query: str,
    *,
    multi: bool = True,
    include_all: bool = True,
    regex: str = "",
) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": PROM,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "regex": regex,
        "refresh": 2,
        "sort": 3,
        "hide": 0,
        "includeAll": include_all,
        "allValue": ".*" if include_all else None,
        "multi": multi,
        "current": {"text": ["All"], "value": ["$__all"]} if include_all else {},
        "options": [],
    }


def common_variables(*, node_multi: bool = True) -> list[dict]:
    return [
        var_datasource(),
        var_query("cluster", "Cluster", "label_values(node:up:max, cluster)", multi=False),
        var_query("rack", "Rack", f"label_values(node:up:max{{{CL}}}, rack)"),
        var_query(
            "partition",
            "Partition",
            f"label_values(node_partition:membership:info{{{CL}}}, partition)",
        ),
        var_query(
            "node",
            "Node",
            f'label_values(node:up:max{{{CL}, rack=~"${{rack}}", {PART}}}, node)',
            multi=node_multi,
            include_all=node_multi,
        ),
        var_query(
            "gpu",
            "GPU",
            f'label_values(gpu:utilization_percent:max{{{CL}, node=~"${{node}}"}}, gpu)',
        ),
    ]


def dashboard(
    uid: str,
    title: str,
    description: str,
    panels: list,
    variables: list,
    *,
    tags: list[str],
    refresh: str = "1m",
    time_from: str = "now-6h",
) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gpufleet", *tags],
        "editable": False,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": refresh,
        "time": {"from": time_from, "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "links": [
            {
                "type": "dashboards",
                "tags": ["gpufleet"],
                "asDropdown": True,
                "title": "gpufleet",
                "includeVars": True,
                "keepTime": True,
                "icon": "external link",
                "targetBlank": False,
                "tooltip": "",
                "url": "",
            }
        ],
        "templating": {"list": variables},
        "panels": layout(panels),
    }


# ------------------------------------------------------------------ dashboards

PCT = thresholds((None, "green"), (70, "yellow"), (90, "red"))
TEMP = thresholds((None, "green"), (70, "yellow"), (80, "orange"), (85, "red"))


def cluster_overview() -> dict:
    n, g = NODE_SEL, GPU_SEL
    gpus = [
        stat(
            "GPUs up",
            [target(f"sum(node:gpus_present:count{{{n}}})")],
            desc="GPUs the collectors and dcgm-exporter report.",
        ),
        stat(
            "GPUs expected",
            [target(f"sum(node:gpus_expected:count{{{n}}})")],
            desc="GPUs the inventory says the selected nodes have.",
        ),
        stat(
            "GPUs missing",
            [
                target(
                    f"sum(clamp_min(node:gpus_expected:count{{{n}}} - "
                    f"(node:gpus_present:count{{{n}}} or node:gpus_expected:count{{{n}}} * 0), 0))"
                )
            ],
            steps=thresholds((None, "green"), (1, "red")),
            desc="Expected minus reported, per node (a GPU fell off the bus or did not "
            "initialise).",
        ),
        stat(
            "GPU utilization",
            [
                target(
                    f"sum(node:gpu_utilization_percent:sum{{{n}}}) / "
                    f"sum(node:gpu_utilization_percent:count{{{n}}})"
                )
            ],
            unit="percent",
            steps=thresholds((None, "red"), (30, "yellow"), (70, "green")),
        ),
        stat(
            "GPU memory used",
            [
                target(
                    f"sum(node:gpu_memory_used_bytes:sum{{{n}}}) / "
                    f"sum(node:gpu_memory_total_bytes:sum{{{n}}})"
                )
            ],
            unit="percentunit",
            steps=PCT,
        ),
        stat(
            "Power draw / limit",
            [
                target(
                    f"sum(node:gpu_power_draw_watts:sum{{{n}}}) / "
                    f"sum(node:gpu_power_limit_watts:sum{{{n}}})"
                )
            ],
            unit="percentunit",
            steps=PCT,
        ),
        stat(
            "Hottest GPU",
            [target(f"max(node:gpu_temperature_celsius:max{{{n}}})")],
            unit="celsius",
            steps=TEMP,
        ),
        stat(
            "Allocated idle GPUs",
            [target(f"sum(slurm_job:gpus_allocated_idle:count{{{JOB_SEL}}}) or vector(0)")],
            steps=thresholds((None, "green"), (1, "orange")),
            desc="GPUs held by running Slurm jobs that stayed below 5 % for 30 minutes.",
        ),
    ]
    heat = panel(
        "heatmap",
        "GPU utilization per node / GPU",
        [
            target(
                # Per-GPU series live on the shards; the global tier has the per-node
                # average only, shown as one row per node (gpu="avg").
                f"max by (cluster, node, gpu) (gpu:utilization_percent:max{{{g}}}) or on (cluster, node) "
                f'label_replace(node:gpu_utilization_percent:avg{{{n}}}, "gpu", "avg", "", "")',
                "{{node}}/{{gpu}}",
                interval="1m",
            )
        ],
        unit="percent",
        minmax=(0, 100),
        desc="One row per GPU; colour = utilization. Empty rows are GPUs without data.",
        options={
            "calculate": False,
            "yAxis": {"axisPlacement": "left", "reverse": False},
            "rowsFrame": {"layout": "auto"},
            "color": {
                "mode": "scheme",
                "scheme": "RdYlGn",
                "fill": "dark-orange",
                "scale": "linear",
                "exponent": 0.5,
                "steps": 64,
                "reverse": False,
                "min": 0,
                "max": 100,
            },
            "cellGap": 1,
            "legend": {"show": True},
            "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": True},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "filterValues": {"le": 1e-09},
        },
        links=[NODE_LINK],
    )
    return dashboard(
        "gpufleet-cluster-overview",
        "Cluster overview",
        "GPUs up vs expected, utilization, memory, power, temperature, throttling, XID/ECC "
        "events and GPUs Slurm allocated that sit idle. On the global tier the heatmap shows "
        "one row per node; the ECC and critical-XID tables need a shard datasource.",
        [
            row("GPUs"),
            [(p, 3, 4) for p in gpus],
            [(heat, 24, 12)],
            [
                (
                    timeseries(
                        "GPU utilization per node",
                        [target(f"node:gpu_utilization_percent:avg{{{n}}}", "{{node}}")],
                        "percent",
                        minmax=(0, 100),
                        links=[NODE_LINK],
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "GPU memory used per node",
                        [target(f"node:gpu_memory_utilization:ratio{{{n}}}", "{{node}}")],
                        "percentunit",
                        minmax=(0, 1),
                        links=[NODE_LINK],
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "GPU power draw vs limit",
                        [
                            target(f"sum(node:gpu_power_draw_watts:sum{{{n}}})", "power draw"),
                            target(
                                f"sum(node:gpu_power_limit_watts:sum{{{n}}})", "power limit", "B"
                            ),
                        ],
                        "watt",
                        overrides=[dashed("B", "red")],
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "GPU temperature (hottest GPU per node)",
                        [target(f"node:gpu_temperature_celsius:max{{{n}}}", "{{node}}")],
                        "celsius",
                        steps=TEMP,
                        threshold_style="dashed",
                        links=[NODE_LINK],
                    ),
                    12,
                    8,
                ),
            ],
            row("Health events"),
            [
                (
                    timeseries(
                        "GPUs throttled, by reason",
                        [
                            target(
                                f"sum by (reason) (node:gpu_clock_event_reason_active:sum{{{n}}})",
                                "{{reason}}",
                            )
                        ],
                        stack=True,
                        bars=True,
                        fill=80,
                        desc="GPUs with an active clock-event (throttle) reason: power cap, "
                        "thermal or hardware slowdown.",
                    ),
                    8,
                    8,
                ),
                (
                    timeseries(
                        "XID errors per minute",
                        [
                            target(
                                f"(sum by (node, xid, critical) (gpu:xid_errors:rate5m{{{g}}}) or on (node) "
                                f"sum by (node, critical) (node:gpu_xid_errors:sum_rate5m{{{n}}})) * 60 > 0",
                                "{{node}} XID {{xid}} (critical={{critical}})",
                            )
                        ],
                        "short",
                        bars=True,
                        fill=80,
                        links=[LOGS_LINK],
                    ),
                    8,
                    8,
                ),
                (
                    timeseries(
                        "Uncorrectable ECC errors (since driver load)",
                        [
                            target(
                                f"max by (node, gpu) (node_gpu_ecc_uncorrected_errors_total"
                                f'{{{g}, scope="volatile"}}) > 0 or max by (node, gpu) '
                                f"(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{g}}}) > 0",
                                "{{node}} GPU {{gpu}}",
                            )
                        ],
                        desc="gpufleet collector (volatile scope) or dcgm-exporter (DBE volatile).",
                        links=[NODE_LINK],
                    ),
                    8,
                    8,
                ),
            ],
            [
                (
                    table(
                        "GPUs missing, per node",
                        [
                            table_target(
                                f"node:gpus_expected:count{{{n}}} - "
                                f"(node:gpus_present:count{{{n}}} or node:gpus_expected:count{{{n}}} * 0)"
                                " > 0"
                            )
                        ],
                        rename={"Value": "missing GPUs"},
                        links=[NODE_LINK],
                    ),
                    8,
                    8,
                ),
                (
                    table(
                        "Critical XIDs in the last hour",
                        [
                            table_target(
                                f"sum by (node, gpu, xid) (increase(node_gpu_xid_errors_total"
                                f'{{{g}, critical="true"}}[1h])) > 0 or max by (node, gpu, xid) '
                                f"(DCGM_EXP_XID_ERRORS_COUNT{{{g}}}) > 0"
                            )
                        ],
                        rename={"Value": "events"},
                        links=[LOGS_LINK],
                    ),
                    8,
                    8,
                ),
                (
                    table(
                        "Allocated but idle GPUs (Slurm)",
                        [table_target(f"slurm_job:gpus_allocated_idle:count{{{JOB_SEL}}}")],
                        rename={"Value": "idle GPUs", "job_id": "job"},
                    ),
                    8,
                    8,
                ),
            ],
        ],
        common_variables(),
        tags=["gpu", "overview"],
    )


def node_detail() -> dict:
    n, g = NODE_SEL, GPU_SEL
    fs = (
        f'{n}, fstype!~"tmpfs|overlay|squashfs|ramfs|devtmpfs|nsfs|autofs|fuse.*", '
        f'mountpoint!~"/run.*|/sys.*|/proc.*|/dev.*"'
    )
    return dashboard(
        "gpufleet-node-detail",
        "Node detail",
        "One node: CPU, memory, per-GPU memory, utilization, temperature and power, disks "
        "and network. Disk gauges read node_exporter series: on a sharded site pick the "
        "node's shard datasource.",
        [
            row("Host"),
            [
                (
                    stat(
                        "Scraped by shard",
                        [
                            target(
                                f"max by (shard) (node:up:max{{{n}}})",
                                "shard {{shard}}",
                                instant=True,
                            )
                        ],
                        desc="Per-GPU and disk panels need the raw series: on a sharded site pick "
                        "this shard's datasource (gpufleet Prometheus shard N). Empty shard: a "
                        "standalone Prometheus, which has everything.",
                        options_text="name",
                    ),
                    24,
                    3,
                ),
            ],
            [
                (
                    timeseries(
                        "CPU utilization",
                        [target(f"node:cpu_utilization:ratio{{{n}}}", "{{node}}")],
                        "percentunit",
                        minmax=(0, 1),
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "Memory used",
                        [
                            target(
                                f"node:memory_total_bytes:sum{{{n}}} - "
                                f"node:memory_available_bytes:sum{{{n}}}",
                                "{{node}} used",
                            ),
                            target(f"node:memory_total_bytes:sum{{{n}}}", "{{node}} total", "B"),
                        ],
                        "bytes",
                        overrides=[dashed("B")],
                    ),
                    12,
                    8,
                ),
            ],
            row("GPUs"),
            [
                (
                    timeseries(
                        "GPU memory used per GPU",
                        [
                            target(f"gpu:memory_used_bytes:sum{{{g}}}", "{{node}} GPU {{gpu}}"),
                            target(f"max(gpu:memory_total_bytes:sum{{{g}}})", "memory size", "B"),
                        ],
                        "bytes",
                        overrides=[dashed("B", "red")],
                    ),
                    12,
                    9,
                ),
                (
                    timeseries(
                        "GPU utilization",
                        [target(f"gpu:utilization_percent:max{{{g}}}", "{{node}} GPU {{gpu}}")],
                        "percent",
                        minmax=(0, 100),
                        steps=PCT,
                        threshold_style="dashed",
                    ),
                    12,
                    9,
                ),
                (
                    timeseries(
                        "GPU temperature",
                        [target(f"gpu:temperature_celsius:max{{{g}}}", "{{node}} GPU {{gpu}}")],
                        "celsius",
                        steps=TEMP,
                        threshold_style="line+area",
                        color={"mode": "thresholds"},
                        gradient="scheme",
                    ),
                    12,
                    9,
                ),
                (
                    timeseries(
                        "GPU power draw",
                        [
                            target(f"gpu:power_draw_watts:max{{{g}}}", "{{node}} GPU {{gpu}}"),
                            target(f"max(gpu:power_limit_watts:max{{{g}}})", "power limit", "B"),
                        ],
                        "watt",
                        overrides=[dashed("B", "red")],
                    ),
                    12,
                    9,
                ),
                (
                    timeseries(
                        "Throttle reasons active",
                        [
                            target(
                                f"gpu:clock_event_reason_active:max{{{g}}} > 0",
                                "GPU {{gpu}} {{reason}}",
                            )
                        ],
                        bars=True,
                        fill=80,
                    ),
                    12,
                    8,
                ),
                (
                    table(
                        "Slurm jobs on these GPUs",
                        [
                            table_target(
                                f'slurm_job_gpu:gpu_utilization_percent:max{{{CL}, node=~"${{node}}", '
                                f'gpu=~"${{gpu}}"}}'
                            )
                        ],
                        rename={"Value": "GPU utilization %", "job_id": "job"},
                    ),
                    12,
                    8,
                ),
            ],
            row("Disks and network"),
            [
                (
                    panel(
                        "gauge",
                        "Disk usage",
                        [
                            target(
                                f"1 - node_filesystem_avail_bytes{{{fs}}} / "
                                f"node_filesystem_size_bytes{{{fs}}}",
                                "{{mountpoint}}",
                            )
                        ],
                        unit="percentunit",
                        minmax=(0, 1),
                        steps=thresholds((None, "green"), (0.7, "yellow"), (0.85, "red")),
                        color={"mode": "thresholds"},
                        options={
                            "reduceOptions": {
                                "calcs": ["lastNotNull"],
                                "fields": "",
                                "values": False,
                            },
                            "showThresholdMarkers": True,
                            "showThresholdLabels": False,
                            "orientation": "auto",
                        },
                    ),
                    8,
                    8,
                ),
                (
                    timeseries(
                        "Network receive / transmit",
                        [
                            target(
                                f"node:network_receive_bytes:sum_rate5m{{{n}}}", "{{node}} receive"
                            ),
                            target(
                                f"node:network_transmit_bytes:sum_rate5m{{{n}}}",
                                "{{node}} transmit",
                                "B",
                            ),
                        ],
                        "Bps",
                        overrides=[
                            {
                                "matcher": {"id": "byFrameRefID", "options": "B"},
                                "properties": [{"id": "custom.transform", "value": "negative-Y"}],
                            }
                        ],
                    ),
                    16,
                    8,
                ),
            ],
        ],
        common_variables(node_multi=False),
        tags=["gpu", "node"],
    )


def slurm_jobs() -> dict:
    j, c = JOB_SEL, CL
    return dashboard(
        "gpufleet-slurm-jobs",
        "Slurm jobs",
        "GPU allocation and utilization per job, user, account and partition; the queue "
        "with pending reasons; node states. The GPU totals, queue and node-state panels read "
        "the Slurm exporter's cluster-wide series: on a sharded site pick the global tier "
        "(it federates them, and holds the per-job, user and account rollups).",
        [
            row("GPUs"),
            [
                (stat("GPUs allocated", [target(f"max(slurm_gpus_alloc{{{c}}})")]), 4, 4),
                (stat("GPUs idle (unallocated)", [target(f"max(slurm_gpus_idle{{{c}}})")]), 4, 4),
                (
                    stat(
                        "GPUs unavailable",
                        [target(f"max(slurm_gpus_other{{{c}}})")],
                        steps=thresholds((None, "green"), (1, "orange")),
                    ),
                    4,
                    4,
                ),
                (
                    stat(
                        "Allocated GPUs busy",
                        [
                            target(
                                f"sum(slurm_job:gpu_utilization_percent:sum{{{j}}}) / "
                                f"sum(slurm_job:gpu_utilization_percent:count{{{j}}})"
                            )
                        ],
                        "percent",
                        steps=thresholds((None, "red"), (30, "yellow"), (70, "green")),
                    ),
                    4,
                    4,
                ),
                (
                    stat(
                        "Allocated idle GPUs",
                        [
                            target(
                                f"sum({NO_REPLICA}(slurm_job:gpus_allocated_idle:count{{{j}}})) or vector(0)"
                            )
                        ],
                        steps=thresholds((None, "green"), (1, "orange")),
                    ),
                    4,
                    4,
                ),
                (
                    stat(
                        "Idle allocated GPU-hours (last hour)",
                        [
                            target(
                                f"sum({NO_REPLICA}(cluster:gpu_hours_allocated_idle:sum1h{{{c}}}))"
                            )
                        ],
                    ),
                    4,
                    4,
                ),
            ],
            [
                (
                    table(
                        "Running jobs: GPUs and utilization",
                        [
                            table_target(
                                f"sum by (job_id, user, account, partition) "
                                f"({NO_REPLICA}(slurm_job:gpus_allocated:sum{{{j}}}))",
                                "A",
                            ),
                            table_target(
                                f"sum by (job_id, user, account, partition) "
                                f"(slurm_job:gpu_utilization_percent:sum{{{j}}}) / "
                                f"sum by (job_id, user, account, partition) "
                                f"(slurm_job:gpu_utilization_percent:count{{{j}}})",
                                "B",
                            ),
                            table_target(
                                f"sum by (job_id, user, account, partition) "
                                f"({NO_REPLICA}(slurm_job:gpus_allocated_idle:count{{{j}}}))",
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
            ],
            [
                (
                    timeseries(
                        "GPU utilization per job (top 20)",
                        [
                            target(
                                f"topk(20, sum by (job_id, user) (slurm_job:gpu_utilization_percent:sum"
                                f"{{{j}}}) / sum by (job_id, user) "
                                f"(slurm_job:gpu_utilization_percent:count{{{j}}}))",
                                "{{job_id}} ({{user}})",
                            )
                        ],
                        "percent",
                        minmax=(0, 100),
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "GPUs allocated per user",
                        [
                            target(
                                f"sum by (user) ({NO_REPLICA}(slurm_job:gpus_allocated:sum{{{j}}}))",
                                "{{user}}",
                            )
                        ],
                        stack=True,
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "GPU utilization per user",
                        [
                            target(
                                f"sum by (user) (slurm_user:gpu_utilization_percent:sum{{{c}}}) / "
                                f"sum by (user) (slurm_user:gpu_utilization_percent:count{{{c}}})",
                                "{{user}}",
                            )
                        ],
                        "percent",
                        minmax=(0, 100),
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "GPU utilization per account",
                        [
                            target(
                                f"sum by (account) (slurm_account:gpu_utilization_percent:sum{{{c}}}) / "
                                f"sum by (account) (slurm_account:gpu_utilization_percent:count{{{c}}})",
                                "{{account}}",
                            )
                        ],
                        "percent",
                        minmax=(0, 100),
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "GPUs allocated per partition",
                        [
                            target(
                                f"max by (partition) (slurm_partition_gpus_allocated{{{j}}})",
                                "{{partition}}",
                            )
                        ],
                        stack=True,
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "GPU utilization per partition",
                        [
                            target(
                                f"sum by (partition) (partition:gpu_utilization_percent:sum{{{j}}}) / "
                                f"sum by (partition) (partition:gpu_utilization_percent:count{{{j}}})",
                                "{{partition}}",
                            )
                        ],
                        "percent",
                        minmax=(0, 100),
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "Idle allocated GPUs per user",
                        [
                            target(
                                f"sum by (user) ({NO_REPLICA}(slurm_user:gpus_allocated_idle:sum{{{c}}}))",
                                "{{user}}",
                            )
                        ],
                        stack=True,
                        bars=True,
                        fill=80,
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "Idle allocated GPU-hours per account (hourly)",
                        [
                            target(
                                f"sum by (account) "
                                f"({NO_REPLICA}(slurm_account:gpu_hours_allocated_idle:sum1h{{{c}}}))",
                                "{{account}}",
                            )
                        ],
                        stack=True,
                    ),
                    12,
                    8,
                ),
            ],
            row("Queue"),
            [
                (
                    timeseries(
                        "Jobs running and pending per partition",
                        [
                            target(
                                f"max by (partition) (slurm_partition_jobs_running{{{j}}})",
                                "{{partition}} running",
                            ),
                            target(
                                f"max by (partition) (slurm_partition_jobs_pending{{{j}}})",
                                "{{partition}} pending",
                                "B",
                            ),
                        ],
                        overrides=[dashed("B")],
                    ),
                    12,
                    8,
                ),
                (
                    panel(
                        "bargauge",
                        "Pending jobs by reason",
                        [
                            target(
                                f"sort_desc(max by (reason) (slurm_jobs_pending_by_reason{{{c}}}))",
                                "{{reason}}",
                                instant=True,
                            )
                        ],
                        options={
                            "orientation": "horizontal",
                            "displayMode": "gradient",
                            "reduceOptions": {
                                "calcs": ["lastNotNull"],
                                "fields": "",
                                "values": False,
                            },
                            "showUnfilled": True,
                        },
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "Jobs pending per user (top 10)",
                        [
                            target(
                                f"topk(10, sum by (user) ({NO_REPLICA}(slurm_queue_pending{{{j}}})))",
                                "{{user}}",
                            )
                        ],
                        stack=True,
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "Scheduler cycle",
                        [
                            target(f"max(slurm_scheduler_last_cycle{{{c}}}) / 1e6", "main cycle"),
                            target(
                                f"max(slurm_scheduler_backfill_last_cycle{{{c}}}) / 1e6",
                                "backfill cycle",
                                "B",
                            ),
                        ],
                        "s",
                    ),
                    12,
                    8,
                ),
            ],
            row("Nodes"),
            [
                (
                    timeseries(
                        "Nodes by state",
                        [
                            target(
                                f"sum(max by (partition) (slurm_nodes_{state}{{{j}}}))",
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
                    table(
                        "Nodes with a reason (drained, down, ...)",
                        [
                            table_target(
                                f"max by (node, state, reason) (slurm_node_state_reason_info{{{c}}})"
                            )
                        ],
                        hide=["Value"],
                        links=[NODE_LINK],
                    ),
                    12,
                    8,
                ),
            ],
        ],
        common_variables(),
        tags=["slurm"],
    )


def monitoring_health() -> dict:
    c = CL
    return dashboard(
        "gpufleet-monitoring-health",
        "Monitoring health",
        "The monitoring itself: Prometheus shards and their series against capacity, "
        "scrape durations, rule evaluation, the Alertmanager cluster and the freshness of "
        "the GPU collector and the Slurm exporter. Pick a shard datasource to see one "
        "shard's own view.",
        [
            row("Prometheus"),
            [
                (
                    timeseries(
                        "Head series per Prometheus vs capacity",
                        [
                            target(
                                f"max by (node, instance) (prometheus_tsdb_head_series{{{c}}})",
                                "{{node}} {{instance}}",
                            ),
                            target("vector(${series_capacity})", "capacity", "B"),
                        ],
                        overrides=[dashed("B", "red")],
                        desc="Active series per Prometheus; the red line is the series_capacity "
                        "variable: gpufleet's default series budget per shard "
                        "(monitoring.max_series_per_shard; PrometheusSeriesNearBudget at 80 %).",
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "Samples ingested per second",
                        [
                            target(
                                f"sum by (node, instance) (rate(prometheus_tsdb_head_samples_appended_total"
                                f"{{{c}}}[$__rate_interval]))",
                                "{{node}} {{instance}}",
                            )
                        ],
                        "short",
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "Targets up per job",
                        [
                            target(f"sum by (job) (up{{{c}}})", "{{job}} up"),
                            target(f"count by (job) (up{{{c}}})", "{{job}} total", "B"),
                        ],
                        overrides=[dashed("B")],
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "Scrape duration, slowest target per job",
                        [target(f"max by (job) (scrape_duration_seconds{{{c}}})", "{{job}}")],
                        "s",
                        desc="Compare with the scrape timeout: a job near it loses scrapes.",
                    ),
                    12,
                    8,
                ),
                (
                    table(
                        "Targets down",
                        [table_target(f"up{{{c}}} == 0")],
                        hide=["Value", "__name__"],
                    ),
                    24,
                    6,
                ),
            ],
            row("Rules and alerts"),
            [
                (
                    timeseries(
                        "Rule group evaluation time / interval",
                        [
                            target(
                                f"max by (rule_group) (prometheus_rule_group_last_duration_seconds{{{c}}}"
                                f" / prometheus_rule_group_interval_seconds{{{c}}})",
                                "{{rule_group}}",
                            )
                        ],
                        "percentunit",
                        steps=thresholds((None, "green"), (0.5, "yellow"), (0.9, "red")),
                        threshold_style="dashed",
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "Rule evaluation failures and missed iterations",
                        [
                            target(
                                f"sum by (node, instance) (rate(prometheus_rule_evaluation_failures"
                                f"_total{{{c}}}[$__rate_interval]))",
                                "{{node}} failures",
                            ),
                            target(
                                f"sum by (node, instance) (rate(prometheus_rule_group_iterations"
                                f"_missed_total{{{c}}}[$__rate_interval]))",
                                "{{node}} missed",
                                "B",
                            ),
                        ],
                        "ops",
                    ),
                    12,
                    8,
                ),
                (
                    timeseries(
                        "Alertmanager cluster members",
                        [
                            target(
                                f"max by (node, instance) (alertmanager_cluster_members{{{c}}})",
                                "{{node}} members",
                            ),
                            target(
                                f"max by (node, instance) (alertmanager_cluster_failed_peers"
                                f"{{{c}}})",
                                "{{node}} failed peers",
                                "B",
                            ),
                        ],
                        overrides=[dashed("B", "red")],
                    ),
                    8,
                    8,
                ),
                (
                    timeseries(
                        "Active alerts",
                        [
                            target(
                                f'max by (node) (alertmanager_alerts{{{c}, state="active"}})',
                                "{{node}}",
                            )
                        ],
                    ),
                    8,
                    8,
                ),
                (
                    timeseries(
                        "Notifications",
                        [
                            target(
                                f"sum by (integration) (rate(alertmanager_notifications_total{{{c}}}"
                                f"[$__rate_interval]))",
                                "{{integration}} sent",
                            ),
                            target(
                                f"sum by (integration) (rate(alertmanager_notifications_failed_total"
                                f"{{{c}}}[$__rate_interval]))",
                                "{{integration}} failed",
                                "B",
                            ),
                            target(
                                f"min by (node) (prometheus_notifications_alertmanagers_discovered"
                                f"{{{c}}})",
                                "{{node}} Alertmanagers known",
                                "C",
                            ),
                        ],
                        "short",
                        overrides=[dashed("B", "red")],
                    ),
                    8,
                    8,
                ),
            ],
            row("Collectors"),
            [
                (
                    timeseries(
                        "GPU collector: age of the last success",
                        [
                            target(
                                f"time() - max by (node) (node_gpu_collector_last_success_timestamp_seconds"
                                f"{{{NODE_SEL}}})",
                                "{{node}}",
                            )
                        ],
                        "s",
                        steps=thresholds((None, "green"), (45, "red")),
                        threshold_style="dashed",
                    ),
                    8,
                    8,
                ),
                (
                    timeseries(
                        "GPU collector failing / dcgm-exporter down",
                        [
                            target(
                                f"node_gpu_collector_success{{{NODE_SEL}}} == 0",
                                "{{node}} collector failing",
                            ),
                            target(
                                f'up{{{c}, job="dcgm"}} == 0', "{{node}} dcgm-exporter down", "B"
                            ),
                        ],
                        bars=True,
                        fill=80,
                    ),
                    8,
                    8,
                ),
                (
                    timeseries(
                        "Slurm exporter: age of the last collection",
                        [
                            target(
                                f"time() - max(slurm_exporter_last_collect_timestamp_seconds{{{c}}})",
                                "last collection",
                            ),
                            target(
                                f"max by (command) (slurm_exporter_command_duration_seconds{{{c}}})",
                                "{{command}} duration",
                                "B",
                            ),
                        ],
                        "s",
                    ),
                    8,
                    8,
                ),
            ],
        ],
        [
            *common_variables(),
            {
                "name": "series_capacity",
                "label": "Series per shard (capacity)",
                "type": "constant",
                "query": str(DEFAULT_MAX_SERIES_PER_SHARD),
                "hide": 2,
                "current": {
                    "text": str(DEFAULT_MAX_SERIES_PER_SHARD),
                    "value": str(DEFAULT_MAX_SERIES_PER_SHARD),
                },
            },
        ],
        tags=["meta"],
        refresh="1m",
    )


def logs() -> dict:
    stream = f'{CL}, rack=~"${{rack}}", node=~"${{node}}"'
    variables = [
        *common_variables(),
        var_loki(),
        var_query(
            "pci_bus_id",
            "GPU PCI id",
            'query_result(group by (pci_bus_id) (node_gpu_info{cluster=~"${cluster}", '
            'node=~"${node}", gpu=~"${gpu}"}) or group by (pci_bus_id) (DCGM_FI_DEV_GPU_TEMP'
            '{cluster=~"${cluster}", node=~"${node}", gpu=~"${gpu}"}))',
            regex='/pci_bus_id="([^"]+)"/',
        ),
        {
            "name": "search",
            "label": "Line filter (regex)",
            "type": "textbox",
            "query": "",
            "current": {"text": "", "value": ""},
            "hide": 0,
        },
    ]
    logs_opts = {
        "showTime": True,
        "wrapLogMessage": True,
        "sortOrder": "Descending",
        "enableLogDetails": True,
        "dedupStrategy": "none",
        "prettifyLogMessage": False,
        "showLabels": False,
        "showCommonLabels": False,
    }
    return dashboard(
        "gpufleet-logs",
        "Logs",
        "Kernel XID lines and Slurm daemon logs per node from Loki (shipped by Alloy). XID "
        "lines carry the labels xid and pci_bus_id; the GPU filter maps GPU indices to PCI "
        "ids through Prometheus.",
        [
            row("NVIDIA XID"),
            [
                (
                    timeseries(
                        "XID lines per node and code",
                        [
                            loki_target(
                                f'sum by (node, xid) (count_over_time({{{stream}, source="kernel", '
                                f'xid=~".+", pci_bus_id=~"${{pci_bus_id}}"}} [$__auto]))'
                            )
                        ],
                        bars=True,
                        fill=80,
                        datasource=LOKI,
                        links=[NODE_LINK],
                    ),
                    24,
                    7,
                ),
                (
                    panel(
                        "logs",
                        "Kernel XID and fallen-off-the-bus lines",
                        [
                            loki_target(
                                f'{{{stream}, source="kernel", pci_bus_id=~"${{pci_bus_id}}"}} '
                                f'|~ "NVRM: (Xid|.*fallen off the bus)" |~ "(?i)${{search}}"'
                            )
                        ],
                        datasource=LOKI,
                        options=logs_opts,
                    ),
                    24,
                    10,
                ),
            ],
            row("Slurm daemons"),
            [
                (
                    timeseries(
                        "Slurm daemon errors per node",
                        [
                            loki_target(
                                f"sum by (node, source) (count_over_time({{{stream}, "
                                f'source=~"slurmd|slurmctld|slurmdbd", level=~"error|fatal|err|crit"}} '
                                f"[$__auto]))"
                            )
                        ],
                        bars=True,
                        fill=80,
                        datasource=LOKI,
                    ),
                    24,
                    7,
                ),
                (
                    panel(
                        "logs",
                        "Slurm daemon logs",
                        [
                            loki_target(
                                f'{{{stream}, source=~"slurmd|slurmctld|slurmdbd"}} |~ "(?i)${{search}}"'
                            )
                        ],
                        datasource=LOKI,
                        options=logs_opts,
                    ),
                    24,
                    10,
                ),
            ],
            row("Kernel"),
            [
                (
                    panel(
                        "logs",
                        "Kernel messages",
                        [loki_target(f'{{{stream}, source="kernel"}} |~ "(?i)${{search}}"')],
                        datasource=LOKI,
                        options=logs_opts,
                    ),
                    24,
                    10,
                ),
            ],
        ],
        variables,
        tags=["logs"],
        refresh="",
        time_from="now-24h",
    )


DASHBOARDS = {
    "cluster-overview.json": cluster_overview,
    "node-detail.json": node_detail,
    "slurm-jobs.json": slurm_jobs,
    "monitoring-health.json": monitoring_health,
    "logs.json": logs,
}


def render(build) -> str:
    return json.dumps(build(), indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--queries", action="store_true", help="print every query")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        text = render(build)
        path = HERE / name
        if args.queries:
            for p in json.loads(text)["panels"]:
                for t in p.get("targets", []):
                    print(f"{name}\t{p['title']}\t{t['datasource']['type']}\t{t['expr']}")
        elif args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("out of date: " + ", ".join(stale) + " (run generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
