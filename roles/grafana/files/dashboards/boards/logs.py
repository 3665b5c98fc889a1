"""Logs: kernel XID lines and Slurm daemon logs per node from Loki."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from .blocks import (
    CL,
    LOKI,
    NODE_LINK,
    Item,
    logs_panel,
    loki_target,
    timeseries_panel,
)
from .frame import Variable, common_variables, dashboard, row, var_loki, var_query, var_textbox

STREAM = f'{CL}, rack=~"${{rack}}", node=~"${{node}}"'


def _variables() -> list[Variable]:
    return [
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
        var_textbox("search", "Line filter (regex)"),
    ]


def _nvidia_xid() -> list[Item]:
    return [
        row("NVIDIA XID"),
        [
            timeseries_panel(
                "XID lines per node and code",
                [
                    loki_target(
                        f'sum by (node, xid) (count_over_time({{{STREAM}, source="kernel", '
                        f'xid=~".+", pci_bus_id=~"${{pci_bus_id}}"}} [$__auto]))'
                    )
                ],
                bars=True,
                fill=80,
                datasource=LOKI,
                links=[NODE_LINK],
                size=(24, 7),
            ),
            logs_panel(
                "Kernel XID and fallen-off-the-bus lines",
                [
                    loki_target(
                        f'{{{STREAM}, source="kernel", pci_bus_id=~"${{pci_bus_id}}"}} '
                        f'|~ "NVRM: (Xid|.*fallen off the bus)" |~ "(?i)${{search}}"'
                    )
                ],
                size=(24, 10),
            ),
        ],
    ]


def _slurm_daemons() -> list[Item]:
    return [
        row("Slurm daemons"),
        [
            timeseries_panel(
                "Slurm daemon errors per node",
                [
                    loki_target(
                        f"sum by (node, source) (count_over_time({{{STREAM}, "
                        f'source=~"slurmd|slurmctld|slurmdbd", level=~"error|fatal|err|crit"}} '
                        f"[$__auto]))"
                    )
                ],
                bars=True,
                fill=80,
                datasource=LOKI,
                size=(24, 7),
            ),
            logs_panel(
                "Slurm daemon logs",
                [
                    loki_target(
                        f'{{{STREAM}, source=~"slurmd|slurmctld|slurmdbd"}} |~ "(?i)${{search}}"'
                    )
                ],
                size=(24, 10),
            ),
        ],
    ]


def _kernel() -> list[Item]:
    return [
        row("Kernel"),
        [
            logs_panel(
                "Kernel messages",
                [loki_target(f'{{{STREAM}, source="kernel"}} |~ "(?i)${{search}}"')],
                size=(24, 10),
            ),
        ],
    ]


def build() -> dm.Dashboard:
    return dashboard(
        "gpufleet-logs",
        "Logs",
        "Kernel XID lines and Slurm daemon logs per node from Loki (shipped by Alloy). XID "
        "lines carry the labels xid and pci_bus_id; the GPU filter maps GPU indices to PCI "
        "ids through Prometheus.",
        [*_nvidia_xid(), *_slurm_daemons(), *_kernel()],
        _variables(),
        tags=["logs"],
        refresh="",
        time_from="now-24h",
    )
