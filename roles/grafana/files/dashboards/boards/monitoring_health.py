"""Monitoring health: Prometheus shards, rules, Alertmanager, exporter freshness."""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dm

from gpufleet.sizing import DEFAULT_MAX_SERIES_PER_SHARD

from . import panels
from .frame import common_variables, dashboard, section, var_constant
from .panels import Item, Panel
from .queries import CL, NODE_SEL, rate_sum, table_target, target

C = CL


# What the dashboard shows, for its description in Grafana.
DESCRIPTION = (
    "The monitoring itself: Prometheus shards and their series against capacity, "
    "scrape durations, queries against their limits, rule evaluation, the Alertmanager "
    "cluster and the freshness of the GPU collector and the Slurm exporter. Pick a shard "
    "datasource to see one shard's own view."
)


def _prometheus() -> list[Item]:
    per_prometheus = "{{node}} {{instance}}"
    head = f"max by (node, instance) (prometheus_tsdb_head_series{{{C}}})"
    samples = rate_sum("node, instance", "prometheus_tsdb_head_samples_appended_total", C)
    return section(
        "Prometheus",
        [
            panels.with_limit(
                "Head series per Prometheus vs capacity",
                [target(head, per_prometheus)],
                target("vector(${series_capacity})", "capacity", "B"),
                desc="Active series per Prometheus; the red line is the series_capacity "
                "variable: gpufleet's default series budget per shard "
                "(monitoring.max_series_per_shard; PrometheusSeriesNearBudget at 80 %).",
            ),
            panels.timeseries("Samples ingested per second", [target(samples, per_prometheus)]),
            panels.with_limit(
                "Targets up per job",
                [target(f"sum by (job) (up{{{C}}})", "{{job}} up")],
                target(f"count by (job) (up{{{C}}})", "{{job}} total", "B"),
                color=None,
            ),
            panels.timeseries(
                "Scrape duration, slowest target per job",
                [target(f"max by (job) (scrape_duration_seconds{{{C}}})", "{{job}}")],
                "s",
                desc="Compare with the scrape timeout: a job near it loses scrapes.",
            ),
            panels.table(
                "Targets down",
                [table_target(f"up{{{C}}} == 0")],
                hide=["Value", "__name__"],
                size=(24, 6),
            ),
        ],
    )


def _queries() -> list[Panel]:
    """Queries against the limits the prometheus role sets (docs/prometheus.md, "Query
    limits and the query log"): the engine's time per stage (the summary's sum and count:
    the global tier keeps those, not its quantiles), queries in flight against
    --query.max-concurrency, and the query API's requests by status code (refusals
    among them)."""
    by = "node, instance, slice"
    stage = (
        f"{rate_sum(by, 'prometheus_engine_query_duration_seconds_sum', C)}"
        f" / {rate_sum(by, 'prometheus_engine_query_duration_seconds_count', C)}"
    )
    running = f"max by (node, instance) (prometheus_engine_queries{{{C}}})"
    limit = f"min(prometheus_engine_queries_concurrent_max{{{C}}})"
    # Every status code, 200 too: a healthy cluster draws its answered queries, and a
    # refusal shows as a series of its own next to them (an empty panel proves nothing).
    api = f'{C}, handler=~"/api/v1/query(_range)?"'
    answered = rate_sum("node, instance, code", "prometheus_http_requests_total", api)
    return [
        panels.timeseries(
            "Query time per stage (mean)",
            [target(stage, "{{node}} {{instance}} {{slice}}")],
            "s",
            desc="inner_eval: evaluation; queue_time: waiting for a free slot "
            "(--query.max-concurrency); compare with --query.timeout. The query log "
            "names the slow queries.",
            size=(8, 8),
        ),
        panels.with_limit(
            "Queries running vs max concurrency",
            [target(running, "{{node}} {{instance}}")],
            target(limit, "max concurrency", "B"),
            desc="Queries beyond the limit wait in a queue.",
            size=(8, 8),
        ),
        panels.timeseries(
            "Query requests by status code",
            [target(answered, "{{node}} {{instance}} {{code}}")],
            "reqps",
            desc="200: answered. 422: more samples than --query.max-samples; 503: past "
            "--query.timeout; 499: canceled by the client; 400: a bad query.",
            size=(8, 8),
        ),
    ]


def _rules() -> list[Panel]:
    duration = (
        f"max by (rule_group) (prometheus_rule_group_last_duration_seconds{{{C}}}"
        f" / prometheus_rule_group_interval_seconds{{{C}}})"
    )
    failures = rate_sum("node, instance", "prometheus_rule_evaluation_failures_total", C)
    missed = rate_sum("node, instance", "prometheus_rule_group_iterations_missed_total", C)
    return [
        panels.timeseries(
            "Rule group evaluation time / interval",
            [target(duration, "{{rule_group}}")],
            "percentunit",
            steps=panels.thresholds((None, "green"), (0.5, "yellow"), (0.9, "red")),
            threshold_style="dashed",
        ),
        panels.timeseries(
            "Rule evaluation failures and missed iterations",
            [target(failures, "{{node}} failures"), target(missed, "{{node}} missed", "B")],
            "ops",
        ),
    ]


def _alertmanager() -> list[Panel]:
    members = f"max by (node, instance) (alertmanager_cluster_members{{{C}}})"
    failed = f"max by (node, instance) (alertmanager_cluster_failed_peers{{{C}}})"
    active = f'max by (node) (alertmanager_alerts{{{C}, state="active"}})'
    sent = rate_sum("integration", "alertmanager_notifications_total", C)
    not_sent = rate_sum("integration", "alertmanager_notifications_failed_total", C)
    known = f"min by (node) (prometheus_notifications_alertmanagers_discovered{{{C}}})"
    notifications = [
        target(sent, "{{integration}} sent"),
        target(not_sent, "{{integration}} failed", "B"),
        target(known, "{{node}} Alertmanagers known", "C"),
    ]
    return [
        panels.with_limit(
            "Alertmanager cluster members",
            [target(members, "{{node}} members")],
            target(failed, "{{node}} failed peers", "B"),
            size=(8, 8),
        ),
        panels.timeseries("Active alerts", [target(active, "{{node}}")], size=(8, 8)),
        panels.timeseries(
            "Notifications", notifications, overrides=[panels.dashed("B", "red")], size=(8, 8)
        ),
    ]


def _collectors() -> list[Item]:
    age = (
        f"time() - max by (node) (node_gpu_collector_last_success_timestamp_seconds{{{NODE_SEL}}})"
    )
    slurm_age = f"time() - max(slurm_exporter_last_collect_timestamp_seconds{{{C}}})"
    slurm_commands = f"max by (command) (slurm_exporter_command_duration_seconds{{{C}}})"
    down = [
        target(f"node_gpu_collector_success{{{NODE_SEL}}} == 0", "{{node}} collector failing"),
        target(f'up{{{C}, job="dcgm"}} == 0', "{{node}} dcgm-exporter down", "B"),
    ]
    slurm = [
        target(slurm_age, "last collection"),
        target(slurm_commands, "{{command}} duration", "B"),
    ]
    return section(
        "Collectors",
        [
            panels.timeseries(
                "GPU collector: age of the last success",
                [target(age, "{{node}}")],
                "s",
                steps=panels.thresholds((None, "green"), (45, "red")),
                threshold_style="dashed",
                size=(8, 8),
            ),
            panels.timeseries(
                "GPU collector failing / dcgm-exporter down",
                down,
                bars=True,
                fill=80,
                size=(8, 8),
            ),
            panels.timeseries(
                "Slurm exporter: age of the last collection", slurm, "s", size=(8, 8)
            ),
        ],
    )


def build() -> dm.Dashboard:
    capacity = var_constant(
        "series_capacity", "Series per shard (capacity)", str(DEFAULT_MAX_SERIES_PER_SHARD)
    )
    rows = [
        *_prometheus(),
        *section("Queries", _queries()),
        *section("Rules and alerts", _rules() + _alertmanager()),
        *_collectors(),
    ]
    return dashboard(
        "gpufleet-monitoring-health",
        "Monitoring health",
        DESCRIPTION,
        rows,
        [*common_variables(), capacity],
        tags=["meta"],
    )
