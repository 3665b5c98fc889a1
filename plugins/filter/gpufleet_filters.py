"""Jinja2 filters shared by gpufleet's roles and playbooks: gpufleet's only filter plugin.

Thin glue over src/gpufleet, where the logic lives and is explained: each filter is a
function of a gpufleet module under its filter name, or a short glue function below that
makes Ansible's values plain first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

try:
    import gpufleet  # noqa: F401 (installed, or the checkout's src/ below)
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
from gpufleet import (
    alert_for,
    alert_routes,
    file_sync,
    firewall,
    lifecycle,
    masking,
    openpgp,
    preflight,
    query_limits,
    render_escape,
    rule_files,
    rule_labels,
    scrape_targets,
    server_ports,
    slurm_idle,
    web,
)
from gpufleet.inventory import prometheus_port, prometheus_ports
from gpufleet.shardlock import LockError
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
gpufleet_web_client = web.web_client
gpufleet_web_ca = web.web_ca
gpufleet_scrape_clients = web.scrape_clients
gpufleet_scrape_cas = web.scrape_cas
gpufleet_prometheus_client = web.prometheus_client
gpufleet_grafana_client = web.grafana_client
gpufleet_alert_for = alert_for.set_durations
gpufleet_alert_for_problems = alert_for.setting_problems
gpufleet_slurm_idle_rules = slurm_idle.idle_rules
gpufleet_openpgp_select = openpgp.select_key
gpufleet_openpgp_fingerprints = openpgp.primary_fingerprints
# Every value a template writes into a unit, environment or INI file goes through one of
# these (gpufleet.render_escape explains each format's quoting).
gpufleet_systemd_arg = render_escape.systemd_arg
gpufleet_systemd_executable = render_escape.systemd_executable
gpufleet_systemd_path = render_escape.systemd_path
gpufleet_systemd_environment = render_escape.systemd_environment
gpufleet_systemd_value = render_escape.systemd_specifiers
gpufleet_env_value = render_escape.env_value
gpufleet_env_words = render_escape.env_words
gpufleet_ini_name = render_escape.ini_name
gpufleet_ini_value = render_escape.ini_value
gpufleet_ini_problems = render_escape.ini_problems


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


# A node's removal (playbooks/remove_node.yml): gpufleet.lifecycle.
def gpufleet_leaving_hosts(spec: object, groups: Mapping[str, Any]) -> dict[str, Any]:
    """{hosts, problem}: the hosts gpufleet_remove_nodes names, or why not (one line)."""
    return dict(lifecycle.leaving_hosts(spec, groups))


def gpufleet_staying(hostnames: Iterable[str], hostvars: Mapping[str, Any]) -> list[str]:
    """hostnames without the hosts marked gpufleet_leaving."""
    return lifecycle.staying(hostnames, hostvars)


def gpufleet_groups_staying(
    groups: Mapping[str, Iterable[str]], hostvars: Mapping[str, Any]
) -> dict[str, list[str]]:
    """Every group without the hosts marked gpufleet_leaving."""
    return lifecycle.groups_staying(groups, hostvars)


def gpufleet_lock_without(text: str, file: str, hosts: Iterable[str]) -> dict[str, str]:
    """{text, problem}: the shard lock's text without hosts, or why it cannot be read."""
    try:
        return {"text": lifecycle.lock_without(str(text), str(file), list(hosts)), "problem": ""}
    except LockError as err:
        return {"text": "", "problem": f"{file}: {err}"}


class FilterModule:
    def filters(self) -> dict[str, Any]:
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
            "gpufleet_stale_sources": file_sync.stale_sources,
            "gpufleet_stale_contents": file_sync.stale_contents,
            "gpufleet_stale_directories": file_sync.stale_directories,
            "gpufleet_target_files": scrape_targets.target_files,
            "gpufleet_rule_files": rule_files.rule_files,
            "gpufleet_web_client": gpufleet_web_client,
            "gpufleet_web_ca": gpufleet_web_ca,
            "gpufleet_scrape_clients": gpufleet_scrape_clients,
            "gpufleet_scrape_cas": gpufleet_scrape_cas,
            "gpufleet_prometheus_client": gpufleet_prometheus_client,
            "gpufleet_grafana_client": gpufleet_grafana_client,
            "gpufleet_alert_for": gpufleet_alert_for,
            "gpufleet_alert_for_problems": gpufleet_alert_for_problems,
            "gpufleet_slurm_idle_rules": gpufleet_slurm_idle_rules,
            "gpufleet_openpgp_select": gpufleet_openpgp_select,
            "gpufleet_openpgp_fingerprints": gpufleet_openpgp_fingerprints,
            "gpufleet_systemd_arg": gpufleet_systemd_arg,
            "gpufleet_systemd_executable": gpufleet_systemd_executable,
            "gpufleet_systemd_path": gpufleet_systemd_path,
            "gpufleet_systemd_environment": gpufleet_systemd_environment,
            "gpufleet_systemd_value": gpufleet_systemd_value,
            "gpufleet_env_value": gpufleet_env_value,
            "gpufleet_env_words": gpufleet_env_words,
            "gpufleet_ini_name": gpufleet_ini_name,
            "gpufleet_ini_value": gpufleet_ini_value,
            "gpufleet_ini_problems": gpufleet_ini_problems,
            "gpufleet_leaving_hosts": gpufleet_leaving_hosts,
            "gpufleet_staying": gpufleet_staying,
            "gpufleet_groups_staying": gpufleet_groups_staying,
            "gpufleet_lock_without": gpufleet_lock_without,
        }
