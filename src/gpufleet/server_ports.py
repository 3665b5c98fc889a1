"""Where gpufleet's servers listen, as their clients reach them.

The registry's ``servers_registry`` (roles/_exporters/defaults/main.yml) declares each
port a server listens on once: its ``port_variable`` (loki_http_port, ...) and that
variable's default ``port``. A client (Grafana's datasources, Alloy's push URLs, the job
summary's Prometheus URLs, Prometheus' federation of the shards) reads the server host's
own variable, from its host_vars or group_vars, else the default: exactly as Prometheus
scrapes an exporter (:func:`gpufleet.scrape_targets.targets`). A site that moves Loki
sets loki_http_port on the Loki hosts and every client follows.

Pure apart from :func:`servers`, which reads the registry file. The roles call these
through the filters of plugins/filter/gpufleet_filters.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from gpufleet import strictyaml
from gpufleet.inventory import prometheus_port
from gpufleet.sizing import EXPORTERS_FILE, RegistryError

REGISTRY = "servers_registry"
# What every entry has: the role that runs the server, its group, the port variable and
# that variable's default.
KEYS = ("role", "group", "port_variable", "port")


def _is_port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536


def checked_servers(data: Any, file: str) -> dict[str, dict[str, Any]]:
    """``servers_registry`` of a loaded registry file, every entry's keys checked."""
    registry = data.get(REGISTRY) if isinstance(data, dict) else None
    if not isinstance(registry, dict):
        raise RegistryError(file, REGISTRY, "must be a mapping of server ports")
    for name, entry in registry.items():
        where = f"{REGISTRY}.{name}"
        if not isinstance(entry, dict):
            raise RegistryError(file, where, "must be a mapping")
        for key in KEYS:
            if key not in entry:
                raise RegistryError(file, f"{where}.{key}", "is missing")
        for key in ("role", "group", "port_variable"):
            if not isinstance(entry[key], str) or not entry[key]:
                raise RegistryError(file, f"{where}.{key}", "must be a name")
        if not _is_port(entry["port"]):
            raise RegistryError(file, f"{where}.port", f"{entry['port']!r} is not a TCP port")
    return registry


@cache
def servers() -> dict[str, dict[str, Any]]:
    """The servers' ports by entry name, as the strict loader reads the registry file
    (the roles read the same file through Ansible)."""
    file = str(EXPORTERS_FILE)
    try:
        data = strictyaml.load_as_ansible_reads_it(EXPORTERS_FILE.read_text(encoding="utf-8"))
    except OSError as err:
        raise RegistryError(file, "", f"cannot read: {err.strerror or err}") from None
    except strictyaml.YamlProblem as problem:
        raise RegistryError(file, problem.where, problem.problem) from None
    return checked_servers(data, file)


def _field(entry: Mapping[str, Any], key: str) -> Any:
    if key not in entry:
        raise ValueError(f"{REGISTRY} entry {dict(entry)!r} has no {key}")
    return entry[key]


def server_port(
    host: str,
    hostvars: Mapping[str, Any],
    entry: Mapping[str, Any],
    instance: Mapping[str, Any] | None = None,
) -> int:
    """The port the server of entry listens on, on host: the host's own port variable
    (hostvars[host][entry.port_variable]: its host_vars or group_vars), else the
    entry's port.

    ``instance``: a Prometheus instance on the host (the inventory plugin's
    gpufleet_prometheus_instances): the port variable is then its base, and the
    instance's port is the base's (standalone and global) or base + 1 + k (shard k).
    A value that is no TCP port (1-65535, a number or its digits) is refused, naming
    the host and the variable.
    """
    variable = str(_field(entry, "port_variable"))
    default = _field(entry, "port")
    own = hostvars[host]
    value = own.get(variable, default)
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and text.isascii() and text.isdigit():
        text = int(text)
    if not _is_port(text):
        raise ValueError(f"host {host}: {variable} {value!r} is not a TCP port (1-65535)")
    port = int(text)
    if instance is None:
        return port
    found = prometheus_port(instance, port)
    if not _is_port(found):
        raise ValueError(
            f"host {host}: {variable} {value!r} puts Prometheus instance "
            f"{instance.get('name', '?')} on port {found}, not a TCP port (1-65535)"
        )
    return found


def server_address(
    host: str,
    hostvars: Mapping[str, Any],
    entry: Mapping[str, Any],
    instance: Mapping[str, Any] | None = None,
) -> str:
    """address:port of the server on host (its ansible_host, else its name; an IPv6
    address in brackets), the port as :func:`server_port` gives it."""
    address = str(hostvars[host].get("ansible_host") or host)
    port = server_port(host, hostvars, entry, instance)
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def server_urls(
    hosts: Iterable[str],
    hostvars: Mapping[str, Any],
    entry: Mapping[str, Any],
    scheme: str = "http",
    path: str = "",
) -> list[str]:
    """scheme://address:port/path of the server on each of hosts, in their order (once
    each): Alloy pushes to every Loki host."""
    if path and not path.startswith("/"):
        raise ValueError(f"path {path!r} is not an absolute URL path")
    return [
        f"{scheme}://{server_address(str(host), hostvars, entry)}{path}"
        for host in dict.fromkeys(hosts)
    ]
