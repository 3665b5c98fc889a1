"""Load and validate a gpufleet node list (``*.gpufleet.yml``) into frozen dataclasses.

Every problem raises :class:`NodeListError` naming the file, the key path and what is
wrong, on one line, e.g.
``nodes.gpufleet.yml: nodes[2].gpu.count: must be a non-negative integer, got -1``.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpufleet import hostlist, slurmconf
from gpufleet.sharding import DEFAULT_MAX_IMBALANCE, DEFAULT_REBALANCE_MARGIN
from gpufleet.shardlock import LockError, ShardLock, parse_lock

PLUGIN_NAME = "gpufleet"
CONSTRUCTED_KEYS = (
    "compose",
    "groups",
    "keyed_groups",
    "strict",
    "leading_separator",
    "use_extra_vars",
)
TOP_LEVEL_KEYS = ("plugin", "cluster", "nodes", "servers", "monitoring", "slurm", *CONSTRUCTED_KEYS)
SERVER_KEYS = ("hosts", "address", "rack", "partition", "cpus", "expected_series", "labels", "vars")
NODE_KEYS = (*SERVER_KEYS, "gpu", "gpu_collector")
GPU_KEYS = ("vendor", "model", "count")
MONITORING_HOST_KEYS = (
    "prometheus_hosts",
    "global_hosts",
    "alertmanager_hosts",
    "grafana_hosts",
    "loki_hosts",
)
MONITORING_KEYS = (
    "shards",
    "replicas",
    "sharding",
    "max_imbalance",
    "rebalance_margin",
    "pin",
    "shard_lock",
    *MONITORING_HOST_KEYS,
)
SLURM_KEYS = ("controller_hosts", "conf", "node_defaults")
SLURM_DEFAULT_KEYS = ("address", "rack", "gpu_vendor", "gpu_collector", "labels", "vars")

GPU_VENDORS = ("nvidia", "amd")
GPU_COLLECTORS = ("smi", "dcgm")
SHARDING_MODES = ("balanced", "rack")
# Labels Prometheus or gpufleet set themselves; a user label must not shadow them.
RESERVED_LABELS = ("cluster", "rack", "partition", "gpu_model", "job", "instance")

# Series estimate (see docs/inventory.md): node_exporter ~30 per logical CPU plus ~1,000
# for NICs, disks, filesystems; dcgm-exporter ~25 per GPU, the smi textfile ~20.
BASE_SERIES = 1000
SERIES_PER_CPU = 30
SERIES_PER_GPU = {"dcgm": 25, "smi": 20}
DEFAULT_CPUS = 64

_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_NAME_TOKEN_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_DOTTED_NUMBERS_RE = re.compile(r"^[0-9.]+$")


class NodeListError(ValueError):
    """One clear, one-line problem in a node list: file, key path, message."""

    def __init__(self, file: str, key_path: str, message: str) -> None:
        self.file = file
        self.key_path = key_path
        self.message = message
        super().__init__(f"{file}: {key_path}: {message}" if key_path else f"{file}: {message}")


@dataclass(frozen=True)
class Host:
    name: str
    role: str  # "node" (compute) or "server" (login, monitoring, controller)
    address: str
    rack: str
    partitions: tuple[str, ...]
    gpu_vendor: str
    gpu_model: str
    gpu_count: int
    gpu_collector: str
    cpus: int
    expected_series: int
    labels: Mapping[str, str] = field(default_factory=dict)
    vars: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # key path of the defining entry, for error messages


@dataclass(frozen=True)
class Monitoring:
    shards: int = 1
    replicas: int = 1
    sharding: str = "balanced"
    max_imbalance: float = DEFAULT_MAX_IMBALANCE
    rebalance_margin: float = DEFAULT_REBALANCE_MARGIN
    pin: Mapping[str, int] = field(default_factory=dict)
    shard_lock: str = ""  # the lock file's path (relative to the node list resolved), or ""
    prometheus_hosts: tuple[str, ...] = ()
    global_hosts: tuple[str, ...] = ()
    alertmanager_hosts: tuple[str, ...] = ()
    grafana_hosts: tuple[str, ...] = ()
    loki_hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeList:
    file: str
    cluster: str
    hosts: tuple[Host, ...]
    monitoring: Monitoring
    slurm_controller_hosts: tuple[str, ...] = ()
    lock: ShardLock | None = None  # the shard lock's content, if configured and present


def describe(value: Any) -> str:
    """Short repr for messages: strings quoted, long values cut."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def type_name(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean"}.get(
        next((t for t in (bool, dict, list, str) if isinstance(value, t)), type(value)),
        type(value).__name__,
    )


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Checker:
    """Validation helpers bound to one file, so every error names it."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, key_path: str, message: str) -> NodeListError:
        return NodeListError(self.file, key_path, message)

    def mapping(self, value: Any, key_path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(key_path, f"must be a mapping, got {type_name(value)}")
        return value

    def known_keys(self, value: Mapping[str, Any], allowed: tuple[str, ...], key_path: str) -> None:
        for key in value:
            if key not in allowed:
                where = f"{key_path}.{key}" if key_path else str(key)
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = (
                    f"; did you mean {close[0]!r}?"
                    if close
                    else f" (allowed: {', '.join(allowed)})"
                )
                raise self.fail(where, f"unknown key{hint}")

    def string(self, value: Any, key_path: str, pattern: re.Pattern[str] | None = None) -> str:
        if is_int(value):
            value = str(value)
        if not isinstance(value, str) or not value:
            raise self.fail(key_path, f"must be a non-empty string, got {describe(value)}")
        if pattern and not pattern.match(value):
            raise self.fail(
                key_path, f"invalid value {value!r} (allowed characters: A-Z a-z 0-9 _ . -)"
            )
        return str(value)

    def integer(self, value: Any, key_path: str, minimum: int) -> int:
        if not is_int(value) or value < minimum:
            what = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
            raise self.fail(key_path, f"must be {what}, got {describe(value)}")
        return int(value)

    def number(self, value: Any, key_path: str, minimum: float) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
            raise self.fail(key_path, f"must be a number >= {minimum:.1f}, got {describe(value)}")
        return float(value)

    def choice(self, value: Any, key_path: str, choices: tuple[str, ...], what: str) -> str:
        if value not in choices:
            raise self.fail(
                key_path, f"unknown {what} {describe(value)} (choose one of: {', '.join(choices)})"
            )
        return str(value)

    def hostlist(self, value: Any, key_path: str) -> tuple[str, ...]:
        """A hostlist expression, or a YAML list of them."""
        expressions = value if isinstance(value, list) else [value]
        if not expressions:
            raise self.fail(key_path, "names no host")
        names: list[str] = []
        for expression in expressions:
            if not isinstance(expression, str):
                raise self.fail(key_path, f"must be a hostlist string, got {type_name(expression)}")
            try:
                names.extend(hostlist.expand(expression))
            except hostlist.HostlistError as err:
                raise self.fail(key_path, str(err)) from err
        for name in names:
            if not _HOSTNAME_RE.match(name):
                raise self.fail(key_path, f"invalid host name {name!r}")
        return tuple(names)

    def labels(self, value: Any, key_path: str) -> dict[str, str]:
        result: dict[str, str] = {}
        for name, label_value in self.mapping(value, key_path).items():
            where = f"{key_path}.{name}"
            if not isinstance(name, str) or not _LABEL_NAME_RE.match(name):
                raise self.fail(
                    where, "invalid Prometheus label name (must match [a-zA-Z_][a-zA-Z0-9_]*)"
                )
            if name.startswith("__"):
                raise self.fail(where, "label names starting with '__' are reserved for Prometheus")
            if name in RESERVED_LABELS:
                raise self.fail(where, f"label {name!r} is set by gpufleet or Prometheus")
            if isinstance(label_value, bool) or not isinstance(label_value, str | int | float):
                raise self.fail(
                    where, f"label value must be a string, got {type_name(label_value)}"
                )
            result[name] = str(label_value)
        return result

    def host_vars(self, value: Any, key_path: str) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for name, var_value in self.mapping(value, key_path).items():
            where = f"{key_path}.{name}"
            if not isinstance(name, str) or not name.isidentifier():
                raise self.fail(where, "invalid variable name")
            if name.startswith("gpufleet_") or name == "ansible_host":
                raise self.fail(
                    where, "set by gpufleet; use the entry's keys (address, rack, ...) instead"
                )
            result[name] = var_value
        return result

    def partitions(self, value: Any, key_path: str) -> tuple[str, ...]:
        items = value if isinstance(value, list) else [value]
        return tuple(self.string(item, key_path, _NAME_TOKEN_RE) for item in items)


def render_address(pattern: str, name: str) -> str:
    """Fill ``{name}`` and ``{num}`` (the host's last number, as an int) into ``pattern``."""
    number = hostlist.last_number(name)
    fields = {
        field_name
        for _, field_name, _, _ in string.Formatter().parse(pattern)
        if field_name is not None
    }
    unknown = fields - {"name", "num"}
    if unknown:
        raise ValueError(f"unknown placeholder {{{sorted(unknown)[0]}}} (use {{name}} or {{num}})")
    if "num" in fields and number is None:
        raise ValueError(f"host {name!r} has no number for {{num}}")
    return pattern.format(name=name, num=number)


def address_problem(address: str) -> str | None:
    """Why ``address`` is not a usable IP or host name, or None."""
    try:
        ipaddress.ip_address(address)
        return None
    except ValueError:
        pass
    if _DOTTED_NUMBERS_RE.match(address):
        return f"{address!r} is not a valid IP address"
    if not _HOSTNAME_RE.match(address):
        return f"{address!r} is neither an IP address nor a valid host name"
    return None


def has_placeholder(pattern: str) -> bool:
    return any(field_name is not None for _, field_name, _, _ in string.Formatter().parse(pattern))


def estimate_series(cpus: int, gpu_count: int, collector: str) -> int:
    return BASE_SERIES + SERIES_PER_CPU * cpus + SERIES_PER_GPU.get(collector, 0) * gpu_count


@dataclass
class EntrySpec:
    """One validated entry before it is split into hosts."""

    names: tuple[str, ...]
    role: str
    address: str | None = None
    rack: str = ""
    partitions: tuple[str, ...] = ()
    gpu_vendor: str = ""
    gpu_model: str = ""
    gpu_count: int = 0
    gpu_collector: str = ""
    cpus: int | None = None
    expected_series: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    vars: dict[str, Any] = field(default_factory=dict)
    per_host_addresses: tuple[str, ...] = ()


def parse_gpu(check: Checker, value: Any, key_path: str) -> tuple[str, str, int]:
    gpu = check.mapping(value, key_path)
    check.known_keys(gpu, GPU_KEYS, key_path)
    count = gpu.get("count", 0)
    if not is_int(count) or count < 0:
        raise check.fail(
            f"{key_path}.count", f"must be a non-negative integer, got {describe(count)}"
        )
    if count == 0:
        return "", "", 0
    if "vendor" not in gpu:
        raise check.fail(f"{key_path}.vendor", "required when count > 0")
    vendor = check.choice(gpu["vendor"], f"{key_path}.vendor", GPU_VENDORS, "vendor")
    if "model" not in gpu:
        raise check.fail(f"{key_path}.model", "required when count > 0")
    model = check.string(gpu["model"], f"{key_path}.model", _NAME_TOKEN_RE)
    return vendor, model, count


def parse_entry(check: Checker, raw: Any, key_path: str, role: str) -> EntrySpec:
    entry = check.mapping(raw, key_path)
    check.known_keys(entry, NODE_KEYS if role == "node" else SERVER_KEYS, key_path)
    if "hosts" not in entry:
        raise check.fail(f"{key_path}.hosts", "required")
    spec = EntrySpec(names=check.hostlist(entry["hosts"], f"{key_path}.hosts"), role=role)
    fill_common(check, spec, entry, key_path)
    if "gpu" in entry:
        spec.gpu_vendor, spec.gpu_model, spec.gpu_count = parse_gpu(
            check, entry["gpu"], f"{key_path}.gpu"
        )
    collector = entry.get("gpu_collector", "smi")
    collector = check.choice(collector, f"{key_path}.gpu_collector", GPU_COLLECTORS, "collector")
    if spec.gpu_count:
        if collector == "dcgm" and spec.gpu_vendor != "nvidia":
            raise check.fail(
                f"{key_path}.gpu_collector", f"dcgm needs NVIDIA GPUs, not {spec.gpu_vendor}"
            )
        spec.gpu_collector = collector
    return spec


def fill_common(check: Checker, spec: EntrySpec, entry: Mapping[str, Any], key_path: str) -> None:
    """Keys shared by nodes, servers and slurm.conf defaults."""
    if "address" in entry:
        spec.address = check.string(entry["address"], f"{key_path}.address")
    if "rack" in entry:
        spec.rack = check.string(entry["rack"], f"{key_path}.rack", _NAME_TOKEN_RE)
    if "partition" in entry:
        spec.partitions = check.partitions(entry["partition"], f"{key_path}.partition")
    if "cpus" in entry:
        spec.cpus = check.integer(entry["cpus"], f"{key_path}.cpus", 1)
    if "expected_series" in entry:
        spec.expected_series = check.integer(
            entry["expected_series"], f"{key_path}.expected_series", 1
        )
    if "labels" in entry:
        spec.labels = check.labels(entry["labels"], f"{key_path}.labels")
    if "vars" in entry:
        spec.vars = check.host_vars(entry["vars"], f"{key_path}.vars")


def entry_addresses(check: Checker, spec: EntrySpec, key_path: str) -> list[str]:
    if spec.per_host_addresses:
        addresses = list(spec.per_host_addresses)
    elif spec.address is None:
        return list(spec.names)
    else:
        if not has_placeholder(spec.address) and len(spec.names) > 1:
            raise check.fail(
                f"{key_path}.address",
                f"{spec.address!r} would be the duplicate address of all {len(spec.names)} hosts; "
                "use {num} or {name}",
            )
        try:
            addresses = [render_address(spec.address, name) for name in spec.names]
        except (ValueError, IndexError, KeyError) as err:
            raise check.fail(f"{key_path}.address", f"pattern {spec.address!r}: {err}") from err
    for name, address in zip(spec.names, addresses, strict=True):
        problem = address_problem(address)
        if problem:
            raise check.fail(f"{key_path}.address", f"{problem} (for host {name})")
    return addresses


def build_hosts(check: Checker, spec: EntrySpec, key_path: str, cluster: str) -> list[Host]:
    addresses = entry_addresses(check, spec, key_path)
    cpus = spec.cpus or DEFAULT_CPUS
    series = spec.expected_series or estimate_series(cpus, spec.gpu_count, spec.gpu_collector)
    return [
        Host(
            name=name,
            role=spec.role,
            address=address,
            rack=spec.rack,
            partitions=spec.partitions,
            gpu_vendor=spec.gpu_vendor,
            gpu_model=spec.gpu_model,
            gpu_count=spec.gpu_count,
            gpu_collector=spec.gpu_collector,
            cpus=cpus,
            expected_series=series,
            labels=spec.labels,
            vars=spec.vars,
            source=key_path,
        )
        for name, address in zip(spec.names, addresses, strict=True)
    ]


def guess_vendor(gpu_type: str | None) -> str:
    """Slurm Gres types carry no vendor; AMD Instinct types are ``mi250`` and the like."""
    lowered = (gpu_type or "").lower()
    return "amd" if lowered.startswith("mi") or "amd" in lowered else "nvidia"


def slurm_entries(
    check: Checker, slurm: Mapping[str, Any], node_list_file: str, read_text: Callable[[str], str]
) -> list[tuple[EntrySpec, Checker, str]]:
    """Entries for the NodeName= lines of ``slurm.conf``, with ``node_defaults`` applied."""
    conf_value = check.string(slurm["conf"], "slurm.conf")
    conf_path = os.path.join(os.path.dirname(os.path.abspath(node_list_file)), conf_value)
    defaults = check.mapping(slurm.get("node_defaults", {}), "slurm.node_defaults")
    check.known_keys(defaults, SLURM_DEFAULT_KEYS, "slurm.node_defaults")
    template = EntrySpec(names=(), role="node")
    fill_common(check, template, defaults, "slurm.node_defaults")
    vendor = defaults.get("gpu_vendor")
    if vendor is not None:
        check.choice(vendor, "slurm.node_defaults.gpu_vendor", GPU_VENDORS, "vendor")
    collector = check.choice(
        defaults.get("gpu_collector", "smi"),
        "slurm.node_defaults.gpu_collector",
        GPU_COLLECTORS,
        "collector",
    )
    try:
        text = read_text(conf_path)
    except OSError as err:
        raise check.fail("slurm.conf", f"cannot read {conf_path}: {err.strerror or err}") from err
    conf_check = Checker(conf_path)
    try:
        parsed = slurmconf.parse(text)
    except slurmconf.SlurmConfError as err:
        raise conf_check.fail(f"line {err.line}", err.message) from err
    partitions_of: dict[str, list[str]] = {}
    for partition, members in parsed.partitions.items():
        for host in members:
            partitions_of.setdefault(host, []).append(partition)
    entries: list[tuple[EntrySpec, Checker, str]] = []
    for node in parsed.nodes:
        for name in node.hosts:
            if not _HOSTNAME_RE.match(name):
                raise conf_check.fail(f"line {node.line}", f"invalid host name {name!r}")
        key_path = f"line {node.line}"
        # Hosts of one NodeName line can sit in different partitions: split them.
        partitions = dict.fromkeys(tuple(partitions_of.get(host, ())) for host in node.hosts)
        for partition_set in partitions:
            names = tuple(h for h in node.hosts if tuple(partitions_of.get(h, ())) == partition_set)
            spec = EntrySpec(**{**template.__dict__, "names": names, "partitions": partition_set})
            if node.addresses:
                index = {h: a for h, a in zip(node.hosts, node.addresses, strict=True)}
                spec.per_host_addresses = tuple(index[h] for h in names)
            spec.cpus = node.cpus or template.cpus
            if node.gpu_count:
                spec.gpu_vendor = vendor or guess_vendor(node.gpu_type)
                spec.gpu_model = node.gpu_type or "unknown"
                spec.gpu_count = node.gpu_count
                if collector == "dcgm" and spec.gpu_vendor != "nvidia":
                    raise conf_check.fail(
                        key_path, f"dcgm needs NVIDIA GPUs, not {spec.gpu_vendor}"
                    )
                spec.gpu_collector = collector
            entries.append((spec, conf_check, key_path))
    return entries


def parse_monitoring(check: Checker, raw: Any, file: str) -> Monitoring:
    monitoring = check.mapping(raw, "monitoring")
    check.known_keys(monitoring, MONITORING_KEYS, "monitoring")
    shards = check.integer(monitoring.get("shards", 1), "monitoring.shards", 1)
    replicas = check.integer(monitoring.get("replicas", 1), "monitoring.replicas", 1)
    sharding = check.choice(
        monitoring.get("sharding", "balanced"), "monitoring.sharding", SHARDING_MODES, "mode"
    )
    max_imbalance = check.number(
        monitoring.get("max_imbalance", DEFAULT_MAX_IMBALANCE), "monitoring.max_imbalance", 1
    )
    rebalance_margin = check.number(
        monitoring.get("rebalance_margin", DEFAULT_REBALANCE_MARGIN),
        "monitoring.rebalance_margin",
        0,
    )
    pins: dict[str, int] = {}
    for expression, shard in check.mapping(monitoring.get("pin", {}), "monitoring.pin").items():
        key_path = f"monitoring.pin.{expression}"
        names = check.hostlist(expression, key_path)
        if not is_int(shard) or not 0 <= shard < shards:
            raise check.fail(
                key_path, f"shard {describe(shard)} does not exist (shards are 0..{shards - 1})"
            )
        pins.update(dict.fromkeys(names, int(shard)))
    host_lists = {
        key: check.hostlist(monitoring[key], f"monitoring.{key}")
        for key in MONITORING_HOST_KEYS
        if key in monitoring
    }
    prometheus_hosts = host_lists.get("prometheus_hosts", ())
    if prometheus_hosts and len(set(prometheus_hosts)) < replicas:
        raise check.fail(
            "monitoring.prometheus_hosts",
            f"names {len(set(prometheus_hosts))} host(s), but replicas: {replicas} needs "
            f"at least {replicas} (two replicas of one shard never share a host)",
        )
    if "global_hosts" in host_lists and shards == 1:
        raise check.fail("monitoring.global_hosts", "the global tier exists only with shards > 1")
    if shards > 1 and prometheus_hosts and "global_hosts" not in host_lists:
        raise check.fail(
            "monitoring.global_hosts", f"required with shards: {shards} (the global tier)"
        )
    return Monitoring(
        shards=shards,
        replicas=replicas,
        sharding=sharding,
        max_imbalance=max_imbalance,
        rebalance_margin=rebalance_margin,
        pin=pins,
        shard_lock=lock_path(check, monitoring, file),
        **host_lists,
    )


def check_defined(
    check: Checker, key_path: str, names: tuple[str, ...], defined: Mapping[str, Host]
) -> None:
    for name in names:
        if name not in defined:
            raise check.fail(key_path, f"host {name!r} is not defined in nodes or servers")


def read_file_text(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def lock_path(check: Checker, monitoring: Mapping[str, Any], file: str) -> str:
    """``monitoring.shard_lock`` resolved against the node list's directory, or ""."""
    if "shard_lock" not in monitoring:
        return ""
    value = check.string(monitoring["shard_lock"], "monitoring.shard_lock")
    if os.path.dirname(value) in ("", ".") and not os.path.basename(value).startswith("."):
        raise check.fail(
            "monitoring.shard_lock",
            f"{value!r} sits next to the node list, where Ansible would read it as an inventory "
            "source; use a hidden name such as '.shards.lock'",
        )
    return os.path.join(os.path.dirname(file), value)


def load_shard_lock(
    path: str, cluster: str, read_text: Callable[[str], str] = read_file_text
) -> ShardLock | None:
    """Read and validate a shard lock; None if the file does not exist (yet)."""
    try:
        text = read_text(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise NodeListError(path, "", f"cannot read: {err.strerror or err}") from err
    try:
        lock = parse_lock(text, path)
    except LockError as err:
        raise NodeListError(path, err.key_path, err.message) from err
    if lock.cluster != cluster:
        raise NodeListError(
            path, "cluster", f"the lock is for cluster {lock.cluster!r}, not {cluster!r}"
        )
    return lock


def parse_node_list(
    data: Any, file: str, read_text: Callable[[str], str] = read_file_text
) -> NodeList:
    """Validate the loaded YAML of a node list. ``file`` names it in errors."""
    check = Checker(file)
    if not isinstance(data, Mapping):
        raise check.fail("", f"must be a YAML mapping, got {type_name(data)}")
    check.known_keys(data, TOP_LEVEL_KEYS, "")
    if data.get("plugin") != PLUGIN_NAME:
        raise check.fail("plugin", f"must be {PLUGIN_NAME!r}, got {describe(data.get('plugin'))}")
    if "cluster" not in data:
        raise check.fail("cluster", "required")
    cluster = check.string(data["cluster"], "cluster", _NAME_TOKEN_RE)
    if "nodes" not in data:
        raise check.fail("nodes", "required (a list of entries)")
    sections: list[tuple[str, str, Any]] = [("nodes", "node", data["nodes"])]
    if "servers" in data:
        sections.append(("servers", "server", data["servers"]))
    entries: list[tuple[EntrySpec, Checker, str]] = []
    for section, role, raw in sections:
        if not isinstance(raw, list):
            raise check.fail(section, f"must be a list of entries, got {type_name(raw)}")
        for index, raw_entry in enumerate(raw):
            key_path = f"{section}[{index}]"
            entries.append((parse_entry(check, raw_entry, key_path, role), check, key_path))
    slurm = check.mapping(data.get("slurm", {}), "slurm")
    check.known_keys(slurm, SLURM_KEYS, "slurm")
    if "conf" in slurm:
        entries.extend(slurm_entries(check, slurm, file, read_text))
    hosts = collect_hosts(entries, cluster)
    if not hosts:
        raise check.fail("nodes", "defines no host")
    by_name = {host.name: host for host in hosts}
    monitoring = parse_monitoring(check, data.get("monitoring", {}), file)
    for key in MONITORING_HOST_KEYS:
        check_defined(check, f"monitoring.{key}", getattr(monitoring, key), by_name)
    for name in monitoring.pin:
        check_defined(check, f"monitoring.pin.{name}", (name,), by_name)
    controllers = (
        check.hostlist(slurm["controller_hosts"], "slurm.controller_hosts")
        if "controller_hosts" in slurm
        else ()
    )
    check_defined(check, "slurm.controller_hosts", controllers, by_name)
    lock = None
    if monitoring.shard_lock:
        lock = load_shard_lock(monitoring.shard_lock, cluster, read_text)
    return NodeList(
        file=file,
        cluster=cluster,
        hosts=tuple(hosts),
        monitoring=monitoring,
        slurm_controller_hosts=controllers,
        lock=lock,
    )


def entry_key(key_path: str, key: str) -> str:
    """``nodes[3]`` + ``hosts`` -> ``nodes[3].hosts``; a slurm.conf ``line 12`` stays as is."""
    return key_path if key_path.startswith("line ") else f"{key_path}.{key}"


def collect_hosts(entries: list[tuple[EntrySpec, Checker, str]], cluster: str) -> list[Host]:
    """Expand entries into hosts; host names and addresses must be unique across all."""
    hosts: list[Host] = []
    name_owner: dict[str, str] = {}
    address_owner: dict[str, tuple[str, str]] = {}
    for spec, check, key_path in entries:
        where = key_path if check.file == entries[0][1].file else f"{check.file} {key_path}"
        for host in build_hosts(check, spec, key_path, cluster):
            if host.name in name_owner:
                raise check.fail(
                    entry_key(key_path, "hosts"),
                    f"duplicate host {host.name!r} (already defined by {name_owner[host.name]})",
                )
            name_owner[host.name] = where
            owner = address_owner.get(host.address)
            if owner:
                raise check.fail(
                    entry_key(key_path, "address"),
                    f"address {host.address} of {host.name} duplicates that of "
                    f"{owner[0]} ({owner[1]})",
                )
            address_owner[host.address] = (host.name, where)
            hosts.append(host)
    return hosts


def load_node_list(path: str, read_text: Callable[[str], str] = read_file_text) -> NodeList:
    """Read and validate a node list file (the CLI's entry point; the plugin reads via Ansible)."""
    try:
        text = read_text(path)
    except OSError as err:
        raise NodeListError(path, "", f"cannot read: {err.strerror or err}") from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise NodeListError(path, where, f"invalid YAML: {problem}") from err
    return parse_node_list(data, path, read_text)
