"""Jinja2 filters shared by gpufleet's roles."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

import bcrypt

try:
    from gpufleet import firewall, masking, preflight, scrape_targets
    from gpufleet.inventory import prometheus_port, prometheus_ports
    from gpufleet.slurm_native import native_metrics_problem, parse_show_config
    from gpufleet_node.gpu_collector.slurm import valid_cgroup_root
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
    from gpufleet import firewall, masking, preflight, scrape_targets
    from gpufleet.inventory import prometheus_port, prometheus_ports
    from gpufleet.slurm_native import native_metrics_problem, parse_show_config
    from gpufleet_node.gpu_collector.slurm import valid_cgroup_root

# Pure functions of src/gpufleet, under their filter names (tests and bench/ import these).
gpufleet_targets = scrape_targets.targets
gpufleet_metrics_paths = scrape_targets.metrics_paths
gpufleet_mode_jobs = scrape_targets.mode_jobs
gpufleet_registry_targets = scrape_targets.registry_targets
gpufleet_shard_targets = scrape_targets.shard_targets
gpufleet_prometheus_ports = prometheus_ports
gpufleet_firewall_exporters = firewall.exporter_services
gpufleet_firewall_sources = firewall.sources
gpufleet_firewall_rules = firewall.rules
gpufleet_control_names = preflight.control_names
gpufleet_bounds_problems = preflight.bounds_problems
gpufleet_masked_refusal = masking.masked_refusal

# bcrypt's own base64 alphabet (not the standard one).
_BCRYPT_ALPHABET = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_STD_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def bcrypt_salt(seed: str, rounds: int = 10) -> bytes:
    """A bcrypt salt derived from seed, so a rerun renders the same hash (idempotence).

    The seed is host and user specific; the salt still differs between hosts and users.
    """
    digest = hashlib.sha256(seed.encode()).digest()[:16]
    encoded = base64.b64encode(digest).decode().rstrip("=")
    translated = encoded.translate(str.maketrans(_STD_ALPHABET, _BCRYPT_ALPHABET))
    # 16 bytes make 22 characters; bcrypt ignores the low bits of the last one.
    return f"$2b${rounds:02d}${translated[:22]}".encode()


def gpufleet_bcrypt(password: str, seed: str, rounds: int = 10) -> str:
    """Hash password with bcrypt, as the Prometheus exporter-toolkit web config expects."""
    if not password:
        raise ValueError("gpufleet_bcrypt: refusing to hash an empty password")
    return bcrypt.hashpw(str(password).encode(), bcrypt_salt(seed, rounds)).decode()


def gpufleet_prometheus_port(instance: dict, port_base: int) -> int:
    """standalone and global listen on the base port; shard k on base + 1 + k."""
    return prometheus_port(instance, port_base)


# --- the Slurm exporter's per-shard scrapes (roles/slurm_exporter, roles/prometheus) --------

# The inventory plugin's shard plan: group prometheus_shard_K holds the hosts shard K scrapes.
_SHARD_GROUP = re.compile(r"prometheus_shard_([0-9]{1,6})")


def _shard_groups(groups: Mapping[str, Any]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for name, hosts in dict(groups).items():
        match = _SHARD_GROUP.fullmatch(str(name))
        if match:
            out[int(match.group(1))] = sorted({str(h) for h in hosts or []})
    return out


def gpufleet_valid_cgroup_root(root: object) -> bool:
    """The GPU collector's own rule for --slurm-cgroup-root: the preflight asks it."""
    return valid_cgroup_root(str(root))


_METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def gpufleet_scrape_job_defaults(registry: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """gpufleet's own settings of each scrape job, from the exporter registry: an entry's
    job_settings, a drop of the families it lists as exporter_duplicates (served by
    gpufleet's Slurm exporter already), and what the rules rely on for the slurm job
    (its node and partition labels describe jobs, not the controller)."""
    out: dict[str, dict[str, Any]] = {"slurm": {"honor_labels": True}}
    for job, exporter in registry.items():
        settings = {**dict(exporter.get("job_settings") or {}), **out.get(job, {})}
        duplicates = sorted(exporter.get("exporter_duplicates") or {})
        bad = [name for name in duplicates if not _METRIC_NAME_RE.match(str(name))]
        if bad:
            raise ValueError(
                f"exporters_registry.{job}.exporter_duplicates: not a metric name: {bad[0]!r}"
            )
        if duplicates:
            drop = {"source_labels": ["__name__"], "regex": "|".join(duplicates), "action": "drop"}
            settings["metric_relabel_configs"] = [
                *settings.get("metric_relabel_configs", []),
                drop,
            ]
        if settings:
            out[job] = settings
    return out


def gpufleet_slurmctld_metrics_problem(show_config: str, prometheus_has_token: bool) -> str:
    """Why Prometheus cannot scrape slurmctld's own metrics ("" when it can), from the
    output of ``scontrol show config`` (gpufleet.slurm_native)."""
    return native_metrics_problem(
        parse_show_config(str(show_config)), prometheus_has_token=bool(prometheus_has_token)
    )


def gpufleet_node_shards(groups: Mapping[str, Any]) -> dict:
    """The Slurm exporter's node map: {"shards": {"K": [hosts shard K scrapes]}}.

    From the same groups that give each shard its node targets (tasks/instance.yml of the
    prometheus role), so the exporter never derives the sharding itself. Node names are
    inventory names, the `node` label of every target and of the Slurm series.
    """
    return {"shards": {str(k): hosts for k, hosts in sorted(_shard_groups(groups).items())}}


def gpufleet_slurm_params(instance: Mapping[str, Any], groups: Mapping[str, Any]) -> dict:
    """Scrape params of the slurm job of one Prometheus instance.

    A shard asks for its own nodes (shard=K); the lowest shard also for the cluster-level
    series (cluster=1): the queue, partitions, users, accounts, scheduler, exporter health
    and nodes no shard owns. Standalone (and anything else) asks for everything: {}.
    """
    if instance.get("mode") != "shard":
        return {}
    shard = int(instance["shard"])
    params = {"shard": [str(shard)]}
    if shard <= min(_shard_groups(groups), default=shard):
        params["cluster"] = ["1"]
    return params


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpufleet_bcrypt": gpufleet_bcrypt,
            "gpufleet_targets": gpufleet_targets,
            "gpufleet_metrics_paths": gpufleet_metrics_paths,
            "gpufleet_prometheus_port": gpufleet_prometheus_port,
            "gpufleet_prometheus_ports": gpufleet_prometheus_ports,
            "gpufleet_mode_jobs": gpufleet_mode_jobs,
            "gpufleet_registry_targets": gpufleet_registry_targets,
            "gpufleet_shard_targets": gpufleet_shard_targets,
            "gpufleet_slurmctld_metrics_problem": gpufleet_slurmctld_metrics_problem,
            "gpufleet_scrape_job_defaults": gpufleet_scrape_job_defaults,
            "gpufleet_node_shards": gpufleet_node_shards,
            "gpufleet_valid_cgroup_root": gpufleet_valid_cgroup_root,
            "gpufleet_slurm_params": gpufleet_slurm_params,
            "gpufleet_firewall_exporters": gpufleet_firewall_exporters,
            "gpufleet_firewall_sources": gpufleet_firewall_sources,
            "gpufleet_firewall_rules": gpufleet_firewall_rules,
            "gpufleet_control_names": gpufleet_control_names,
            "gpufleet_bounds_problems": gpufleet_bounds_problems,
            "gpufleet_masked_refusal": gpufleet_masked_refusal,
        }
