"""Jinja2 filters shared by gpufleet's roles."""

from __future__ import annotations

import base64
import hashlib

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


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpufleet_bcrypt": gpufleet_bcrypt,
            "gpufleet_targets": gpufleet_targets,
            "gpufleet_prometheus_port": gpufleet_prometheus_port,
            "gpufleet_shard_targets": gpufleet_shard_targets,
        }
