"""Node detail: one node's host, per-GPU, disk and network panels."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from . import panels
from .frame import common_variables, dashboard, section
from .panels import Item, Panel
from .queries import CL, GPU_SEL, NODE_SEL, table_target, target

N, G = NODE_SEL, GPU_SEL
FS = (
    f'{N}, fstype!~"tmpfs|overlay|squashfs|ramfs|devtmpfs|nsfs|autofs|fuse.*", '
    f'mountpoint!~"/run.*|/sys.*|/proc.*|/dev.*"'
)


PER_GPU = "{{node}} GPU {{gpu}}"


# What the dashboard shows, for its description in Grafana.
DESCRIPTION = (
    "One node: CPU, memory, per-GPU memory, utilization, temperature and power, disks "
    "and network. Disk gauges read node_exporter series: on a sharded site pick the "
    "node's shard datasource."
)


def _host() -> list[Item]:
    shard = target(f"max by (shard) (node:up:max{{{N}}})", "shard {{shard}}", instant=True)
    total = f"node:memory_total_bytes:sum{{{N}}}"
    used = f"{total} - node:memory_available_bytes:sum{{{N}}}"
    return section(
        "Host",
        [
            panels.stat(
                "Scraped by shard",
                [shard],
                desc="Per-GPU and disk panels need the raw series: on a sharded site pick "
                "this shard's datasource (gpufleet Prometheus shard N). Empty shard: a "
                "standalone Prometheus, which has everything.",
                options_text="name",
                size=(24, 3),
            ),
        ],
        [
            panels.timeseries(
                "CPU utilization",
                [target(f"node:cpu_utilization:ratio{{{N}}}", "{{node}}")],
                "percentunit",
                minmax=(0, 1),
            ),
            panels.with_limit(
                "Memory used",
                [target(used, "{{node}} used")],
                target(total, "{{node}} total", "B"),
                "bytes",
                color=None,
            ),
        ],
    )


def _gpu_vitals() -> list[Panel]:
    memory = target(f"gpu:memory_used_bytes:sum{{{G}}}", PER_GPU)
    memory_size = target(f"max(gpu:memory_total_bytes:sum{{{G}}})", "memory size", "B")
    power = target(f"gpu:power_draw_watts:max{{{G}}}", PER_GPU)
    power_limit = target(f"max(gpu:power_limit_watts:max{{{G}}})", "power limit", "B")
    return [
        panels.with_limit("GPU memory used per GPU", [memory], memory_size, "bytes", size=(12, 9)),
        panels.timeseries(
            "GPU utilization",
            [target(f"gpu:utilization_percent:max{{{G}}}", PER_GPU)],
            "percent",
            minmax=(0, 100),
            steps=panels.PCT,
            threshold_style="dashed",
            size=(12, 9),
        ),
        panels.timeseries(
            "GPU temperature",
            [target(f"gpu:temperature_celsius:max{{{G}}}", PER_GPU)],
            "celsius",
            steps=panels.TEMP,
            threshold_style="line+area",
            color=panels.by_thresholds(),
            gradient="scheme",
            size=(12, 9),
        ),
        panels.with_limit("GPU power draw", [power], power_limit, "watt", size=(12, 9)),
    ]


def _gpu_jobs() -> list[Panel]:
    throttled = f"gpu:clock_event_reason_active:max{{{G}}} > 0"
    jobs = f'slurm_job_gpu:gpu_utilization_percent:max{{{CL}, node=~"${{node}}", gpu=~"${{gpu}}"}}'
    return [
        panels.timeseries(
            "Throttle reasons active",
            [target(throttled, "GPU {{gpu}} {{reason}}")],
            bars=True,
            fill=80,
        ),
        panels.table(
            "Slurm jobs on these GPUs",
            [table_target(jobs)],
            rename={"Value": "GPU utilization %", "job_id": "job"},
        ),
    ]


def _disks_and_network() -> list[Item]:
    disk = f"1 - node_filesystem_avail_bytes{{{FS}}} / node_filesystem_size_bytes{{{FS}}}"
    receive = target(f"node:network_receive_bytes:sum_rate5m{{{N}}}", "{{node}} receive")
    transmit = f"node:network_transmit_bytes:sum_rate5m{{{N}}}"
    return section(
        "Disks and network",
        [
            panels.gauge(
                "Disk usage",
                [target(disk, "{{mountpoint}}")],
                unit="percentunit",
                minmax=(0, 1),
                steps=panels.thresholds((None, "green"), (0.7, "yellow"), (0.85, "red")),
                size=(8, 8),
            ),
            panels.timeseries(
                "Network receive / transmit",
                [receive, target(transmit, "{{node}} transmit", "B")],
                "Bps",
                overrides=[panels.mirrored("B")],
                size=(16, 8),
            ),
        ],
    )


def build() -> dm.Dashboard:
    rows = [*_host(), *section("GPUs", _gpu_vitals() + _gpu_jobs()), *_disks_and_network()]
    return dashboard(
        "gpufleet-node-detail",
        "Node detail",
        DESCRIPTION,
        rows,
        common_variables(node_multi=False),
        tags=["gpu", "node"],
    )
