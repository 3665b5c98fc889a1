"""Jinja2 filters shared by gpufleet's roles."""

from __future__ import annotations

import base64
import hashlib
import ipaddress

import bcrypt

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


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def gpufleet_targets(hostnames: list[str], hostvars, port: int) -> list[dict]:
    """file_sd target groups for one exporter port on hosts, labelled from the inventory.

    The labels are the inventory plugin's gpufleet_target_labels plus node (the
    inventory name, which Slurm and the dashboards use); roles never derive them.
    """
    groups = []
    for name in sorted(hostnames):
        host = hostvars[name]
        labels = {str(k): str(v) for k, v in dict(host.get("gpufleet_target_labels") or {}).items()}
        labels["node"] = name
        address = str(host.get("ansible_host") or name)
        groups.append({"targets": [_host_port(address, int(port))], "labels": labels})
    return groups


def gpufleet_prometheus_port(instance: dict, port_base: int) -> int:
    """standalone and global listen on the base port; shard k on base + 1 + k."""
    if instance.get("mode") == "shard":
        return int(port_base) + 1 + int(instance["shard"])
    return int(port_base)


def gpufleet_shard_targets(prometheus_hosts: list[str], hostvars, port_base: int) -> list[dict]:
    """file_sd target groups for every shard instance (all replicas) in the inventory."""
    groups = []
    for name in sorted(prometheus_hosts):
        host = hostvars[name]
        address = str(host.get("ansible_host") or name)
        for instance in host.get("gpufleet_prometheus_instances") or []:
            if instance.get("mode") != "shard":
                continue
            groups.append(
                {
                    "targets": [_host_port(address, gpufleet_prometheus_port(instance, port_base))],
                    "labels": {
                        "shard": str(instance["shard"]),
                        "replica": str(instance["replica"]),
                        "node": name,
                    },
                }
            )
    return sorted(groups, key=lambda g: (int(g["labels"]["shard"]), g["labels"]["replica"]))


def _networks(values, where: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    networks = []
    for value in values or []:
        try:
            networks.append(ipaddress.ip_network(str(value).strip()))
        except ValueError as err:
            raise ValueError(f"{where}: {value!r} is not an IP address or CIDR ({err})") from err
    return networks


def gpufleet_firewall_sources(hostnames: list[str], hostvars, extra_sources=()) -> dict:
    """Source networks allowed to reach exporter ports, as {"ipv4": [...], "ipv6": [...]}.

    Each host of hostnames (the Prometheus hosts) contributes its
    exporter_firewall_source_addresses when set (a host that scrapes from another
    interface), else its ansible_host, the address Prometheus' targets use. A host
    name is refused: a firewall that resolved names would depend on DNS when it loads.
    The networks are collapsed per family (nftables refuses overlapping intervals)
    and sorted, so the same inventory always renders the same rules.
    """
    networks = _networks(extra_sources, "exporter_firewall_extra_sources")
    for name in sorted(set(hostnames)):
        host = hostvars[name]
        explicit = host.get("exporter_firewall_source_addresses") or []
        if explicit:
            networks += _networks(explicit, f"{name}: exporter_firewall_source_addresses")
            continue
        address = str(host.get("ansible_host") or name)
        try:
            networks.append(ipaddress.ip_network(address))
        except ValueError as err:
            raise ValueError(
                f"{name}: ansible_host {address!r} is not an IP address; the exporter firewall "
                f"needs the addresses {name} scrapes from: set exporter_firewall_source_addresses "
                "for that host"
            ) from err
    families = {}
    for version, key in ((4, "ipv4"), (6, "ipv6")):
        collapsed = ipaddress.collapse_addresses(n for n in networks if n.version == version)
        families[key] = [
            str(n.network_address) if n.prefixlen == n.max_prefixlen else str(n)
            for n in sorted(collapsed)
        ]
    return families


def gpufleet_exporter_ports(exporters: dict, group_names: list[str], extra_ports=()) -> list[int]:
    """TCP ports of the exporters that run on a host, plus extra ports, sorted and unique.

    exporters maps an exporter to {group, port}: it runs on the hosts of that group
    (the group its playbook targets; "all" is every host), listening on port.
    """
    ports = [
        spec["port"]
        for spec in (exporters or {}).values()
        if spec["group"] == "all" or spec["group"] in (group_names or [])
    ]
    result = set()
    for port in [*ports, *(extra_ports or [])]:
        try:
            number = int(port)
        except (TypeError, ValueError):
            number = 0
        if not 0 < number < 65536:
            raise ValueError(f"exporter firewall: {port!r} is not a TCP port")
        result.add(number)
    return sorted(result)


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpufleet_bcrypt": gpufleet_bcrypt,
            "gpufleet_targets": gpufleet_targets,
            "gpufleet_prometheus_port": gpufleet_prometheus_port,
            "gpufleet_shard_targets": gpufleet_shard_targets,
            "gpufleet_firewall_sources": gpufleet_firewall_sources,
            "gpufleet_exporter_ports": gpufleet_exporter_ports,
        }
