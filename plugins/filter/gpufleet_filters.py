"""Jinja2 filters shared by gpufleet's roles."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import bcrypt

try:
    from gpufleet import scrape_targets
    from gpufleet.inventory import prometheus_port
    from gpufleet.slurm_native import native_metrics_problem, parse_show_config
    from gpufleet_node.gpu_collector.slurm import valid_cgroup_root
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
    from gpufleet import scrape_targets
    from gpufleet.inventory import prometheus_port
    from gpufleet.slurm_native import native_metrics_problem, parse_show_config
    from gpufleet_node.gpu_collector.slurm import valid_cgroup_root

# Pure functions of src/gpufleet, under their filter names (tests and bench/ import these).
gpufleet_targets = scrape_targets.targets
gpufleet_metrics_paths = scrape_targets.metrics_paths
gpufleet_shard_targets = scrape_targets.shard_targets

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


# --- the opt-in firewall (roles/exporter_firewall) -----------------------------------------

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Read from the hosts that are sources: the addresses their connections come from.
_SOURCE_ADDRESSES = "exporter_firewall_source_addresses"
_PROTOCOLS = ("tcp", "udp")


def _networks(values: Iterable[object] | None, where: str) -> list[Network]:
    networks = []
    for value in values or []:
        try:
            networks.append(ipaddress.ip_network(str(value).strip()))
        except ValueError as err:
            raise ValueError(f"{where}: {value!r} is not an IP address or CIDR ({err})") from err
    return networks


def _host_networks(hostnames: Iterable[str], hostvars: Mapping[str, Any]) -> list[Network]:
    """The networks connections from hostnames come from, one host at a time."""
    networks: list[Network] = []
    for name in sorted(set(hostnames)):
        host = hostvars[name]
        explicit = host.get(_SOURCE_ADDRESSES) or []
        if explicit:
            networks += _networks(explicit, f"{name}: {_SOURCE_ADDRESSES}")
            continue
        address = str(host.get("ansible_host") or name)
        try:
            networks.append(ipaddress.ip_network(address))
        except ValueError as err:
            raise ValueError(
                f"{name}: ansible_host {address!r} is not an IP address; the firewall needs "
                f"the addresses {name} connects from: set {_SOURCE_ADDRESSES} "
                "for that host"
            ) from err
    return networks


def _by_family(networks: Iterable[Network]) -> dict[str, list[str]]:
    """Collapsed (nftables refuses overlapping intervals) and sorted, per family."""
    networks = list(networks)
    families = {}
    for version, key in ((4, "ipv4"), (6, "ipv6")):
        collapsed = ipaddress.collapse_addresses(n for n in networks if n.version == version)
        families[key] = [
            str(n.network_address) if n.prefixlen == n.max_prefixlen else str(n)
            for n in sorted(collapsed)
        ]
    return families


def gpufleet_firewall_sources(
    hostnames: Iterable[str],
    hostvars: Mapping[str, Any],
    extra_sources: Iterable[object] | None = (),
    variable: str = "exporter_firewall_extra_sources",
) -> dict[str, list[str]]:
    """Source networks allowed to reach a port, as {"ipv4": [...], "ipv6": [...]}.

    Each host of hostnames contributes its exporter_firewall_source_addresses when set
    (a host that connects from another interface), else its ansible_host, the address
    the other hosts know it by. A host name is refused: a firewall that resolved names
    would depend on DNS when it loads. extra_sources (addresses or CIDRs) are added;
    variable is the variable they come from, which an error names. The networks are
    collapsed per family and sorted, so the same inventory always renders the same rules.
    """
    return _by_family([*_networks(extra_sources, variable), *_host_networks(hostnames, hostvars)])


def _port_number(value: object) -> int:
    """value as a port number, or 0 when it is none."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,5}", value.strip()):
        return int(value)
    return 0


def _ports(value: object, variable: str, protocol: str) -> list[int]:
    """The ports a port variable holds: one port, or a list of them."""
    if isinstance(value, (str, bytes, int)) or not isinstance(value, Iterable):
        values: list[object] = [value]
    elif isinstance(value, Mapping):
        values = [value]
    else:
        values = list(value)
    ports = []
    for item in values:
        number = _port_number(item)
        if not 0 < number < 65536:
            raise ValueError(
                f"exporter firewall: {variable}: {item!r} is not a {protocol.upper()} port "
                "(a number from 1 to 65535)"
            )
        ports.append(number)
    return ports


def _runs_on(group: str, group_names: set[str]) -> bool:
    return group == "all" or group in group_names


def gpufleet_firewall_rules(
    services: Mapping[str, Mapping[str, Any]],
    group_names: Iterable[str],
    groups: Mapping[str, Iterable[str]],
    hostvars: Mapping[str, Any],
    address_lists: Mapping[str, Iterable[object] | None] | None = None,
) -> list[dict[str, Any]]:
    """What the firewall protects on a host: one rule per protected service.

    services maps a service to {group, rule?, tcp?, udp?, source_groups?,
    source_variables?}: it runs on the hosts of group ("all" is every host) and listens
    on the ports of tcp and udp, each a mapping of port variable -> port or list of
    ports; the hosts of source_groups and the addresses of the address_lists named in
    source_variables may connect. Services with the same rule (default: the service's
    name) share one rule. Only the services that run on this host (group_names) count.

    Returns the rules sorted by name, each {name, services, tcp, udp, ipv4, ipv6} with
    sorted, unique ports and collapsed sources (gpufleet_firewall_sources); a service
    without a port here adds nothing. A port outside 1-65535, or one that two rules claim,
    is refused with a ValueError naming the variables.
    """
    member = set(group_names or [])
    lists = dict(address_lists or {})
    # Every list is checked on every host, whether a rule here reads it or not.
    for variable, values in lists.items():
        _networks(values, variable)
    merged: dict[str, dict[str, Any]] = {}
    claimed: dict[tuple[str, int], tuple[str, str]] = {}
    for service in sorted(services or {}):
        spec = services[service]
        if not _runs_on(str(spec["group"]), member):
            continue
        ports = {
            (protocol, port, str(variable))
            for protocol in _PROTOCOLS
            for variable, value in (spec.get(protocol) or {}).items()
            for port in _ports(value, str(variable), protocol)
        }
        if not ports:  # exporter_firewall_extra_ports: [], say
            continue
        name = str(spec.get("rule") or service)
        rule = merged.setdefault(
            name,
            {"services": [], "tcp": set(), "udp": set(), "hosts": set(), "variables": set()},
        )
        rule["services"].append(service)
        for protocol, port, variable in sorted(ports):
            owner, first = claimed.setdefault((protocol, port), (name, variable))
            if owner != name:
                raise ValueError(
                    f"exporter firewall: {protocol.upper()} port {port} is both {first} "
                    f"({owner}) and {variable} ({name}) on this host: a port has one set of "
                    "allowed sources"
                )
            rule[protocol].add(port)
        for group in spec.get("source_groups") or []:
            rule["hosts"].update(groups.get(group) or [])
        for variable in spec.get("source_variables") or []:
            if variable not in lists:
                raise ValueError(
                    f"exporter firewall: {service} takes sources from {variable}, "
                    "which is not one of the address lists"
                )
            rule["variables"].add(variable)
    rules = []
    for name in sorted(merged):
        rule = merged[name]
        networks = [
            network
            for variable in sorted(rule["variables"])
            for network in _networks(lists[variable], variable)
        ]
        try:
            networks += _host_networks(rule["hosts"], hostvars)
        except ValueError as err:
            raise ValueError(f"exporter firewall, sources of the {name} rule: {err}") from err
        rules.append(
            {
                "name": name,
                "services": sorted(rule["services"]),
                "tcp": sorted(rule["tcp"]),
                "udp": sorted(rule["udp"]),
                **_by_family(networks),
            }
        )
    return rules


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpufleet_bcrypt": gpufleet_bcrypt,
            "gpufleet_targets": gpufleet_targets,
            "gpufleet_metrics_paths": gpufleet_metrics_paths,
            "gpufleet_prometheus_port": gpufleet_prometheus_port,
            "gpufleet_shard_targets": gpufleet_shard_targets,
            "gpufleet_slurmctld_metrics_problem": gpufleet_slurmctld_metrics_problem,
            "gpufleet_scrape_job_defaults": gpufleet_scrape_job_defaults,
            "gpufleet_node_shards": gpufleet_node_shards,
            "gpufleet_valid_cgroup_root": gpufleet_valid_cgroup_root,
            "gpufleet_slurm_params": gpufleet_slurm_params,
            "gpufleet_firewall_sources": gpufleet_firewall_sources,
            "gpufleet_firewall_rules": gpufleet_firewall_rules,
        }
