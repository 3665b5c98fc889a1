"""The exporter firewall's rules (roles/exporter_firewall), from the inventory.

Pure: no Ansible imports, no I/O. The role's vars call these through the filters of
plugins/filter/gpufleet_filters.py: exporter_services makes the registry's exporters
services, rules turns the services that run on a host into its nftables rules, from
the sources (:func:`sources`) that may reach each.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict, TypeVar

from gpufleet.lifecycle import is_leaving
from gpufleet.sizing import registry_field

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Read from the hosts that are sources: the addresses their connections come from.
_SOURCE_ADDRESSES = "exporter_firewall_source_addresses"
_PROTOCOLS = ("tcp", "udp")
# Who may reach an exporter: Prometheus (shards, replicas, standalone and global
# instances) and the addresses of exporter_firewall_extra_sources.
_EXPORTER_SOURCE_GROUPS = ("prometheus", "prometheus_global")
_EXPORTER_SOURCE_VARIABLES = ("exporter_firewall_extra_sources",)


class Service(TypedDict, total=False):
    """A protected service, as :func:`rules` reads it (group is required)."""

    rule: str
    group: str
    tcp: dict[str, Any]
    udp: dict[str, Any]
    source_groups: list[str]
    source_variables: list[str]


def exporter_services(
    registry: Mapping[str, Mapping[str, Any]], host_vars: Mapping[str, Any]
) -> dict[str, Service]:
    """The services of the registry's exporters with firewall: true, by their role.

    Each is in the "exporter" rule, runs on its group's hosts and listens on this host's
    own port variable (host_vars: the host's inventory variables) when the inventory
    sets it, else on the registry's port: where Prometheus scrapes it. A value is kept
    as it is (a null one too, which :func:`rules` refuses, naming the variable).
    Prometheus and exporter_firewall_extra_sources may connect. Two entries of one role
    make one service, the later one's.
    """
    out: dict[str, Service] = {}
    for job, exporter in registry.items():
        if not registry_field(job, exporter, "firewall"):
            continue
        variable = registry_field(job, exporter, "port_variable")
        port = (
            host_vars[variable] if variable in host_vars else registry_field(job, exporter, "port")
        )
        out[registry_field(job, exporter, "role")] = {
            "rule": "exporter",
            "group": registry_field(job, exporter, "group"),
            "tcp": {variable: port},
            "source_groups": list(_EXPORTER_SOURCE_GROUPS),
            "source_variables": list(_EXPORTER_SOURCE_VARIABLES),
        }
    return out


def _networks(values: Iterable[object] | None, where: str) -> list[Network]:
    networks = []
    for value in values or []:
        try:
            networks.append(ipaddress.ip_network(str(value).strip()))
        except ValueError as err:
            raise ValueError(f"{where}: {value!r} is not an IP address or CIDR ({err})") from err
    return networks


def _host_networks(hostnames: Iterable[str], hostvars: Mapping[str, Any]) -> list[Network]:
    """The networks connections from hostnames come from, one host at a time; a host
    that is leaving (remove_node.yml, :func:`gpufleet.lifecycle.is_leaving`) is none."""
    networks: list[Network] = []
    for name in sorted(set(hostnames)):
        host = hostvars[name]
        if is_leaving(host):
            continue
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


_N = TypeVar("_N", ipaddress.IPv4Network, ipaddress.IPv6Network)


def _collapsed(networks: Iterable[_N]) -> list[str]:
    """Collapsed (nftables refuses overlapping intervals) and sorted; a host bare."""
    return [
        str(n.network_address) if n.prefixlen == n.max_prefixlen else str(n)
        for n in sorted(ipaddress.collapse_addresses(networks))
    ]


def _by_family(networks: Iterable[Network]) -> dict[str, list[str]]:
    """Collapsed and sorted (:func:`_collapsed`), per family."""
    networks = list(networks)
    return {
        "ipv4": _collapsed(n for n in networks if isinstance(n, ipaddress.IPv4Network)),
        "ipv6": _collapsed(n for n in networks if isinstance(n, ipaddress.IPv6Network)),
    }


def sources(
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


def rules(
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
    sorted, unique ports and collapsed sources (:func:`sources`); a service
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
