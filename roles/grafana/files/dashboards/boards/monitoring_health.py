"""Monitoring health: Prometheus shards, rules, Alertmanager, exporter freshness."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from gpufleet.sizing import DEFAULT_MAX_SERIES_PER_SHARD

from .blocks import (
    CL,
    NODE_SEL,
    Item,
    Panel,
    dashed,
    table_panel,
    table_target,
    target,
    thresholds,
    timeseries_panel,
)
from .frame import common_variables, dashboard, row, var_constant

C = CL


def _prometheus_1() -> list[Panel]:
    """Head series per Prometheus vs capacity; Samples ingested per second; Targets up per job;
    Scrape duration, slowest target per job.
    """
    return [
        timeseries_panel(
            "Head series per Prometheus vs capacity",
            [
                target(
                    f"max by (node, instance) (prometheus_tsdb_head_series{{{C}}})",
                    "{{node}} {{instance}}",
                ),
                target("vector(${series_capacity})", "capacity", "B"),
            ],
            overrides=[dashed("B", "red")],
            desc="Active series per Prometheus; the red line is the series_capacity "
            "variable: gpufleet's default series budget per shard "
            "(monitoring.max_series_per_shard; PrometheusSeriesNearBudget at 80 %).",
            size=(12, 8),
        ),
        timeseries_panel(
            "Samples ingested per second",
            [
                target(
                    f"sum by (node, instance) (rate(prometheus_tsdb_head_samples_appended_total"
                    f"{{{C}}}[$__rate_interval]))",
                    "{{node}} {{instance}}",
                )
            ],
            "short",
            size=(12, 8),
        ),
        timeseries_panel(
            "Targets up per job",
            [
                target(f"sum by (job) (up{{{C}}})", "{{job}} up"),
                target(f"count by (job) (up{{{C}}})", "{{job}} total", "B"),
            ],
            overrides=[dashed("B")],
            size=(12, 8),
        ),
        timeseries_panel(
            "Scrape duration, slowest target per job",
            [target(f"max by (job) (scrape_duration_seconds{{{C}}})", "{{job}}")],
            "s",
            desc="Compare with the scrape timeout: a job near it loses scrapes.",
            size=(12, 8),
        ),
    ]


def _prometheus_2() -> list[Panel]:
    """Targets down."""
    return [
        table_panel(
            "Targets down",
            [table_target(f"up{{{C}}} == 0")],
            hide=["Value", "__name__"],
            size=(24, 6),
        ),
    ]


def _rules_and_alerts_1() -> list[Panel]:
    """Rule group evaluation time / interval; Rule evaluation failures and missed iterations."""
    return [
        timeseries_panel(
            "Rule group evaluation time / interval",
            [
                target(
                    f"max by (rule_group) (prometheus_rule_group_last_duration_seconds{{{C}}}"
                    f" / prometheus_rule_group_interval_seconds{{{C}}})",
                    "{{rule_group}}",
                )
            ],
            "percentunit",
            steps=thresholds((None, "green"), (0.5, "yellow"), (0.9, "red")),
            threshold_style="dashed",
            size=(12, 8),
        ),
        timeseries_panel(
            "Rule evaluation failures and missed iterations",
            [
                target(
                    f"sum by (node, instance) (rate(prometheus_rule_evaluation_failures"
                    f"_total{{{C}}}[$__rate_interval]))",
                    "{{node}} failures",
                ),
                target(
                    f"sum by (node, instance) (rate(prometheus_rule_group_iterations"
                    f"_missed_total{{{C}}}[$__rate_interval]))",
                    "{{node}} missed",
                    "B",
                ),
            ],
            "ops",
            size=(12, 8),
        ),
    ]


def _rules_and_alerts_2() -> list[Panel]:
    """Alertmanager cluster members; Active alerts."""
    return [
        timeseries_panel(
            "Alertmanager cluster members",
            [
                target(
                    f"max by (node, instance) (alertmanager_cluster_members{{{C}}})",
                    "{{node}} members",
                ),
                target(
                    f"max by (node, instance) (alertmanager_cluster_failed_peers{{{C}}})",
                    "{{node}} failed peers",
                    "B",
                ),
            ],
            overrides=[dashed("B", "red")],
            size=(8, 8),
        ),
        timeseries_panel(
            "Active alerts",
            [
                target(
                    f'max by (node) (alertmanager_alerts{{{C}, state="active"}})',
                    "{{node}}",
                )
            ],
            size=(8, 8),
        ),
    ]


def _rules_and_alerts_3() -> list[Panel]:
    """Notifications."""
    return [
        timeseries_panel(
            "Notifications",
            [
                target(
                    f"sum by (integration) (rate(alertmanager_notifications_total{{{C}}}"
                    f"[$__rate_interval]))",
                    "{{integration}} sent",
                ),
                target(
                    f"sum by (integration) (rate(alertmanager_notifications_failed_total"
                    f"{{{C}}}[$__rate_interval]))",
                    "{{integration}} failed",
                    "B",
                ),
                target(
                    f"min by (node) (prometheus_notifications_alertmanagers_discovered{{{C}}})",
                    "{{node}} Alertmanagers known",
                    "C",
                ),
            ],
            "short",
            overrides=[dashed("B", "red")],
            size=(8, 8),
        ),
    ]


def _prometheus() -> list[Item]:
    return [
        row("Prometheus"),
        [*_prometheus_1(), *_prometheus_2()],
    ]


def _rules_and_alerts() -> list[Item]:
    return [
        row("Rules and alerts"),
        [*_rules_and_alerts_1(), *_rules_and_alerts_2(), *_rules_and_alerts_3()],
    ]


def _collectors() -> list[Item]:
    return [
        row("Collectors"),
        [
            timeseries_panel(
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
                size=(8, 8),
            ),
            timeseries_panel(
                "GPU collector failing / dcgm-exporter down",
                [
                    target(
                        f"node_gpu_collector_success{{{NODE_SEL}}} == 0",
                        "{{node}} collector failing",
                    ),
                    target(f'up{{{C}, job="dcgm"}} == 0', "{{node}} dcgm-exporter down", "B"),
                ],
                bars=True,
                fill=80,
                size=(8, 8),
            ),
            timeseries_panel(
                "Slurm exporter: age of the last collection",
                [
                    target(
                        f"time() - max(slurm_exporter_last_collect_timestamp_seconds{{{C}}})",
                        "last collection",
                    ),
                    target(
                        f"max by (command) (slurm_exporter_command_duration_seconds{{{C}}})",
                        "{{command}} duration",
                        "B",
                    ),
                ],
                "s",
                size=(8, 8),
            ),
        ],
    ]


def build() -> dm.Dashboard:
    capacity = var_constant(
        "series_capacity", "Series per shard (capacity)", str(DEFAULT_MAX_SERIES_PER_SHARD)
    )
    return dashboard(
        "gpufleet-monitoring-health",
        "Monitoring health",
        "The monitoring itself: Prometheus shards and their series against capacity, "
        "scrape durations, rule evaluation, the Alertmanager cluster and the freshness of "
        "the GPU collector and the Slurm exporter. Pick a shard datasource to see one "
        "shard's own view.",
        [*_prometheus(), *_rules_and_alerts(), *_collectors()],
        [*common_variables(), capacity],
        tags=["meta"],
    )
