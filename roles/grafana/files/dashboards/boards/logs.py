"""Logs: kernel XID lines and Slurm daemon logs per node from Loki."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from . import panels
from .frame import (
    Variable,
    common_variables,
    dashboard,
    section,
    var_loki,
    var_query,
    var_textbox,
)
from .panels import Item, Panel
from .queries import CL, LOKI, loki_target

STREAM = f'{CL}, rack=~"${{rack}}", node=~"${{node}}"'


# What the dashboard shows, for its description in Grafana.
DESCRIPTION = (
    "Kernel XID lines and Slurm daemon logs per node from Loki (shipped by Alloy). XID "
    "lines carry the labels xid and pci_bus_id; the GPU filter maps GPU indices to PCI "
    "ids through Prometheus."
)


def _variables() -> list[Variable]:
    return [
        *common_variables(),
        var_loki(),
        var_query(
            "pci_bus_id",
            "GPU PCI id",
            'query_result(group by (pci_bus_id) (node_gpu_info{cluster=~"${cluster}", '
            'node=~"${node}", gpu=~"${gpu}"}) or group by (pci_bus_id) ('
            # dcgm-exporter <= 4.8 or 4.9 (DCGM 4.7) name of the GPU temperature.
            '{__name__=~"DCGM_FI_DEV_GPU_TEMP|DCGM_FI_DEV_GPU_TEMP_CELSIUS", '
            'cluster=~"${cluster}", node=~"${node}", gpu=~"${gpu}"}))',
            regex='/pci_bus_id="([^"]+)"/',
        ),
        var_textbox("search", "Line filter (regex)"),
    ]


def log_rate(title: str, by: str, selector: str, **kw) -> Panel:
    """Lines of the selected stream per $__auto interval, counted by the labels `by`."""
    query = f"sum by ({by}) (count_over_time({{{STREAM}, {selector}}} [$__auto]))"
    lines = [loki_target(query)]
    return panels.timeseries(title, lines, bars=True, fill=80, datasource=LOKI, size=(24, 7), **kw)


def log_lines(title: str, selector: str, pipeline: str = "") -> Panel:
    """The selected stream's lines that match the `search` variable."""
    query = f'{{{STREAM}, {selector}}} {pipeline}|~ "(?i)${{search}}"'
    return panels.logs(title, [loki_target(query)], size=(24, 10))


def _nvidia_xid() -> list[Item]:
    xid_lines = 'source="kernel", xid=~".+", pci_bus_id=~"${pci_bus_id}"'
    kernel_lines = 'source="kernel", pci_bus_id=~"${pci_bus_id}"'
    nvrm = '|~ "NVRM: (Xid|.*fallen off the bus)" '
    return section(
        "NVIDIA XID",
        [
            log_rate(
                "XID lines per node and code", "node, xid", xid_lines, links=[panels.NODE_LINK]
            ),
            log_lines("Kernel XID and fallen-off-the-bus lines", kernel_lines, nvrm),
        ],
    )


def _slurm_daemons() -> list[Item]:
    daemons = 'source=~"slurmd|slurmctld|slurmdbd"'
    errors = f'{daemons}, level=~"error|fatal|err|crit"'
    return section(
        "Slurm daemons",
        [
            log_rate("Slurm daemon errors per node", "node, source", errors),
            log_lines("Slurm daemon logs", daemons),
        ],
    )


def _kernel() -> list[Item]:
    return section("Kernel", [log_lines("Kernel messages", 'source="kernel"')])


def build() -> dm.Dashboard:
    rows = [*_nvidia_xid(), *_slurm_daemons(), *_kernel()]
    return dashboard(
        "gpufleet-logs",
        "Logs",
        DESCRIPTION,
        rows,
        _variables(),
        tags=["logs"],
        refresh="",
        time_from="now-24h",
    )
