"""Jinja2 filters shared by gpufleet's roles."""

from __future__ import annotations

import os
import sys

try:
    import gpufleet  # noqa: F401 (installed, or the checkout's src/ below)
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
from gpufleet import (
    alert_routes,
    firewall,
    masking,
    preflight,
    query_limits,
    rule_labels,
    scrape_targets,
    server_ports,
    web,
)
from gpufleet.inventory import prometheus_port, prometheus_ports
from gpufleet.slurm_native import native_metrics_problem, parse_show_config
from gpufleet_node.gpu_collector.slurm import valid_cgroup_root

# Pure functions of src/gpufleet, under their filter names (bench/ imports these).
gpufleet_targets = scrape_targets.targets
gpufleet_metrics_paths = scrape_targets.metrics_paths
gpufleet_mode_jobs = scrape_targets.mode_jobs
gpufleet_registry_targets = scrape_targets.registry_targets
gpufleet_shard_targets = scrape_targets.shard_targets
gpufleet_scrape_job_defaults = scrape_targets.scrape_job_defaults
gpufleet_node_shards = scrape_targets.node_shards
gpufleet_slurm_params = scrape_targets.slurm_params
gpufleet_prometheus_urls = scrape_targets.prometheus_urls
gpufleet_prometheus_port = prometheus_port
gpufleet_prometheus_ports = prometheus_ports
gpufleet_server_port = server_ports.server_port
gpufleet_server_address = server_ports.server_address
gpufleet_server_urls = server_ports.server_urls
gpufleet_firewall_exporters = firewall.exporter_services
gpufleet_firewall_sources = firewall.sources
gpufleet_firewall_rules = firewall.rules
gpufleet_control_names = preflight.control_names
gpufleet_bounds_problems = preflight.bounds_problems
gpufleet_masked_refusal = masking.masked_refusal
gpufleet_bcrypt = web.bcrypt_hash


# Glue: Ansible's values made plain, then src/gpufleet asks.
def gpufleet_valid_cgroup_root(root: object) -> bool:
    """The GPU collector's own rule for --slurm-cgroup-root: the preflight asks it."""
    return valid_cgroup_root(str(root))


def gpufleet_slurmctld_metrics_problem(show_config: str, prometheus_has_token: bool) -> str:
    """Why Prometheus cannot scrape slurmctld's own metrics ("" when it can), from the
    output of ``scontrol show config`` (gpufleet.slurm_native)."""
    return native_metrics_problem(
        parse_show_config(str(show_config)), prometheus_has_token=bool(prometheus_has_token)
    )


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpufleet_bcrypt": gpufleet_bcrypt,
            "gpufleet_targets": gpufleet_targets,
            "gpufleet_metrics_paths": gpufleet_metrics_paths,
            "gpufleet_prometheus_port": gpufleet_prometheus_port,
            "gpufleet_prometheus_ports": gpufleet_prometheus_ports,
            "gpufleet_server_port": gpufleet_server_port,
            "gpufleet_server_address": gpufleet_server_address,
            "gpufleet_server_urls": gpufleet_server_urls,
            "gpufleet_mode_jobs": gpufleet_mode_jobs,
            "gpufleet_registry_targets": gpufleet_registry_targets,
            "gpufleet_shard_targets": gpufleet_shard_targets,
            "gpufleet_slurmctld_metrics_problem": gpufleet_slurmctld_metrics_problem,
            "gpufleet_scrape_job_defaults": gpufleet_scrape_job_defaults,
            "gpufleet_node_shards": gpufleet_node_shards,
            "gpufleet_prometheus_urls": gpufleet_prometheus_urls,
            "gpufleet_valid_cgroup_root": gpufleet_valid_cgroup_root,
            "gpufleet_slurm_params": gpufleet_slurm_params,
            "gpufleet_firewall_exporters": gpufleet_firewall_exporters,
            "gpufleet_firewall_sources": gpufleet_firewall_sources,
            "gpufleet_firewall_rules": gpufleet_firewall_rules,
            "gpufleet_control_names": gpufleet_control_names,
            "gpufleet_bounds_problems": gpufleet_bounds_problems,
            "gpufleet_masked_refusal": gpufleet_masked_refusal,
            "gpufleet_query_max_samples": query_limits.sized_max_samples,
            "gpufleet_query_limit_problems": query_limits.setting_problems,
            "gpufleet_query_flag_conflicts": query_limits.flag_conflicts,
            "gpufleet_query_log_problems": query_limits.log_problems,
            "gpufleet_rule_labels": rule_labels.with_node_labels,
            "gpufleet_rule_label_problems": rule_labels.name_problems,
            "gpufleet_alertmanager_severity_routes": alert_routes.severity_routes,
            "gpufleet_alertmanager_timing_problems": alert_routes.timing_problems,
        }
