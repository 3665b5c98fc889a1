"""Prometheus' file_sd targets, from the exporter registry and the inventory.

Pure: no Ansible imports, no I/O. The prometheus role's vars (``_prometheus_jobs``,
``_prometheus_targets``) call these through the filters of
plugins/filter/gpufleet_filters.py, with the exporter registry (roles/_exporters), the
inventory's groups and its hostvars; every target group is
``{"targets": ["address:port"], "labels": {...}}``. The same filters give each scrape
job gpufleet's own settings (:func:`scrape_job_defaults`) and the Slurm exporter its
per-shard scrapes (:func:`node_shards`, :func:`slurm_params`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from gpufleet.lifecycle import is_leaving
from gpufleet.server_ports import server_address, servers
from gpufleet.sizing import registry_field
from gpufleet.web import web_ca

# The kinds of Prometheus instance (gpufleet.inventory.prometheus_instances): an
# exporter's `modes` names those that scrape it.
MODES = ("standalone", "shard", "global")


class TargetGroup(TypedDict):
    """One file_sd entry: its targets and their labels."""

    targets: list[str]
    labels: dict[str, str]


def host_port(address: str, port: int) -> str:
    """address:port, an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _port(value: object, default: int, host: str) -> int:
    """A TCP port from the inventory (a number or its text), else default."""
    value = default if value is None or value == "" else value
    text = str(value).strip()
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"host {host}: port {value!r} is not a TCP port (1-65535)")
    return int(text)


def targets(
    hostnames: Iterable[str],
    hostvars: Mapping[str, Any],
    port: int,
    port_variable: str | None = None,
) -> list[TargetGroup]:
    """file_sd target groups for one exporter on hosts, labelled from the inventory.

    The port is each host's own port_variable (node_exporter_port, from its host_vars or
    group_vars), else ``port``: an override moves the scrape with the exporter. The
    labels are the inventory plugin's gpufleet_target_labels plus node (the
    inventory name, which Slurm and the dashboards use); roles never derive them. A host
    that is leaving (remove_node.yml, :func:`gpufleet.lifecycle.is_leaving`) has none.
    """
    groups: list[TargetGroup] = []
    for name in sorted(hostnames):
        host = hostvars[name]
        if is_leaving(host):
            continue
        labels = {str(k): str(v) for k, v in dict(host.get("gpufleet_target_labels") or {}).items()}
        labels["node"] = name
        address = str(host.get("ansible_host") or name)
        own = host.get(port_variable) if port_variable else None
        groups.append({"targets": [host_port(address, _port(own, port, name))], "labels": labels})
    return groups


def metrics_paths(groups: list[TargetGroup], paths: list[str] | None) -> list[TargetGroup]:
    """One target group per group and path, its __metrics_path__ set: one job scrapes
    several endpoints of the same daemon (slurmctld's /metrics/nodes, /metrics/jobs...)."""
    if not paths:
        return groups
    for path in paths:
        if not isinstance(path, str) or not path.startswith("/") or any(c in path for c in "?# "):
            raise ValueError(f"metrics path {path!r} is not an absolute URL path")
    return [
        # metrics_path keeps the endpoints' up (and scrape_*) series apart: one failing
        # endpoint must not make a single `up` series flap.
        {
            "targets": group["targets"],
            "labels": {**group["labels"], "__metrics_path__": path, "metrics_path": path},
        }
        for group in groups
        for path in paths
    ]


def mode_jobs(registry: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """The scrape jobs of each kind of instance: {mode: [job, ...]} for every mode, in
    the registry's order (an entry's `modes` lists the kinds that scrape it)."""
    return {
        mode: [
            job
            for job, exporter in registry.items()
            if mode in registry_field(job, exporter, "modes")
        ]
        for mode in MODES
    }


def registry_targets(
    registry: Mapping[str, Mapping[str, Any]],
    groups: Mapping[str, Iterable[str]],
    hostvars: Mapping[str, Any],
    scraped: Iterable[str],
) -> dict[str, list[TargetGroup]]:
    """The target groups of every registry job: {job: [TargetGroup, ...]}.

    A sharded exporter runs on the hosts of its group that the instance scrapes
    (``scraped``: the hosts of its shard, or every host for a standalone instance); any
    other on every host of its group (none when the inventory has no such group). Each
    on the host's own port variable, else the entry's port; an entry with metrics_paths
    gets one group per host and path.
    """
    scraped = set(scraped)
    out: dict[str, list[TargetGroup]] = {}
    for job, exporter in registry.items():
        hosts = list(groups.get(registry_field(job, exporter, "group")) or [])
        if registry_field(job, exporter, "sharded"):
            hosts = [name for name in dict.fromkeys(hosts) if name in scraped]
        found = targets(
            hosts,
            hostvars,
            registry_field(job, exporter, "port"),
            registry_field(job, exporter, "port_variable"),
        )
        out[job] = metrics_paths(found, exporter.get("metrics_paths"))
    return out


def target_files(targets_by_job: Mapping[str, Any], directory: str) -> dict[str, str]:
    """{path: content} of an instance's file_sd files: ``<directory>/<job>.json`` for each
    job, written as Ansible's ``to_nice_json(indent=2)`` writes it, with a final newline."""
    return {
        f"{directory}/{job}.json": json.dumps(
            groups, indent=2, sort_keys=True, separators=(",", ": ")
        )
        + "\n"
        for job, groups in targets_by_job.items()
    }


def shard_targets(
    prometheus_hosts: Iterable[str],
    hostvars: Mapping[str, Any],
    port_base: int | None = None,
) -> list[TargetGroup]:
    """file_sd target groups for every shard instance (all replicas) in the inventory.

    Each on its own host's port: that host's prometheus_port_base, else the registry's
    default (gpufleet.server_ports). ``port_base`` is not read: it was the calling
    instance's own base, which is not the shard host's where only one of them sets it.
    """
    del port_base  # the prometheus role's call still passes it
    entry = servers()["prometheus"]
    groups: list[TargetGroup] = []
    for name in sorted(prometheus_hosts):
        host = hostvars[name]
        for instance in host.get("gpufleet_prometheus_instances") or []:
            if instance.get("mode") != "shard":
                continue
            groups.append(
                {
                    "targets": [server_address(name, hostvars, entry, instance)],
                    "labels": {
                        "shard": str(instance["shard"]),
                        "replica": str(instance["replica"]),
                        "node": name,
                    },
                }
            )
    return sorted(groups, key=lambda g: (int(g["labels"]["shard"]), g["labels"]["replica"]))


_METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def scrape_job_defaults(registry: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
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


# --- the Slurm exporter's per-shard scrapes (roles/slurm_exporter, roles/prometheus) --------

# The inventory plugin's shard plan: group prometheus_shard_K holds the hosts shard K scrapes.
_SHARD_GROUP = re.compile(r"prometheus_shard_([0-9]{1,6})")


def shard_groups(groups: Mapping[str, Any]) -> dict[int, list[str]]:
    """{K: the hosts of group prometheus_shard_K, sorted} for every such group."""
    out: dict[int, list[str]] = {}
    for name, hosts in dict(groups).items():
        match = _SHARD_GROUP.fullmatch(str(name))
        if match:
            out[int(match.group(1))] = sorted({str(h) for h in hosts or []})
    return out


def node_shards(groups: Mapping[str, Any]) -> dict[str, dict[str, list[str]]]:
    """The Slurm exporter's node map: {"shards": {"K": [hosts shard K scrapes]}}.

    From the same groups that give each shard its node targets (tasks/instance.yml of the
    prometheus role), so the exporter never derives the sharding itself. Node names are
    inventory names, the `node` label of every target and of the Slurm series.
    """
    return {"shards": {str(k): hosts for k, hosts in sorted(shard_groups(groups).items())}}


def slurm_params(instance: Mapping[str, Any], groups: Mapping[str, Any]) -> dict[str, list[str]]:
    """Scrape params of the slurm job of one Prometheus instance.

    A shard asks for its own nodes (shard=K); the lowest shard also for the cluster-level
    series (cluster=1): the queue, partitions, users, accounts, scheduler, exporter health
    and nodes no shard owns. Standalone (and anything else) asks for everything: {}.
    """
    if instance.get("mode") != "shard":
        return {}
    shard = int(instance["shard"])
    params = {"shard": [str(shard)]}
    if shard <= min(shard_groups(groups), default=shard):
        params["cluster"] = ["1"]
    return params


def prometheus_urls(hosts: Iterable[str], hostvars: Mapping[str, Any]) -> list[dict[str, Any]]:
    """[{name, urls}] of the shard and standalone instances on hosts (the global tier
    holds no per-job series): each instance's replicas' base URLs, in replica order, by
    instance name. The scheme follows the hosts' own TLS settings (gpufleet.web.web_ca);
    the port is the instance's on its host's own prometheus_port_base, else the
    registry's (gpufleet.server_ports)."""
    names = sorted(set(hosts))
    scheme = "https" if web_ca(names, hostvars, "prometheus") else "http"
    entry = servers()["prometheus"]
    replicas: dict[str, list[tuple[int, str]]] = {}
    for host in names:
        settings = hostvars[host]
        for instance in settings.get("gpufleet_prometheus_instances") or []:
            if instance.get("mode") == "global":
                continue
            url = f"{scheme}://{server_address(host, hostvars, entry, instance)}"
            replicas.setdefault(str(instance["name"]), []).append(
                (int(instance.get("replica") or 0), url)
            )
    return [
        {"name": name, "urls": [url for _, url in sorted(rows)]}
        for name, rows in sorted(replicas.items())
    ]
