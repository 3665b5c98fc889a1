"""Load and validate a gpufleet node list (``*.gpufleet.yml``) into frozen dataclasses.

Every problem raises :class:`NodeListError` naming the file, the key path and what is
wrong, on one line, e.g.
``nodes.gpufleet.yml: nodes[2].gpu.count: must be a non-negative integer, got -1``.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet import hostlist, slurmconf, strictyaml
from gpufleet.limits import (
    MAX_ADDRESS_PATTERN_LENGTH,
    MAX_CONSTRUCT_EVALUATIONS,
    MAX_CONSTRUCT_EXPRESSIONS,
    MAX_CPUS,
    MAX_EXPECTED_SERIES,
    MAX_GPUS,
    MAX_HOSTS,
    MAX_IMBALANCE,
    MAX_NUM_WIDTH,
    MAX_REBALANCE_MARGIN,
    MAX_REPLICAS,
    MAX_SHARDS,
    MAX_TOKEN_LENGTH,
    MAX_VALUE_DEPTH,
    MAX_VALUE_NODES,
    read_file_text,
)
from gpufleet.sharding import DEFAULT_MAX_IMBALANCE, DEFAULT_REBALANCE_MARGIN
from gpufleet.shardlock import LockError, ShardLock, parse_lock
from gpufleet.sizing import (
    DEFAULT_CPUS,
    DEFAULT_MAX_GPUS_PER_SHARD,
    DEFAULT_MAX_SERIES_PER_SHARD,
    HostShape,
    RegistryError,
    estimate_series,
)
from gpufleet.strictyaml import YamlProblem, one_line

PLUGIN_NAME = "gpufleet"
NODE_LIST_SUFFIXES = (".gpufleet.yml", ".gpufleet.yaml")  # the files the plugin claims
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
    "max_series_per_shard",
    "max_gpus_per_shard",
    *MONITORING_HOST_KEYS,
)
SLURM_KEYS = ("controller_hosts", "conf", "node_defaults")
SLURM_DEFAULT_KEYS = ("address", "rack", "gpu_vendor", "gpu_collector", "labels", "vars")

GPU_VENDORS = ("nvidia", "amd")
GPU_COLLECTORS = ("smi", "dcgm")
SHARDING_MODES = ("balanced", "rack")
# Labels Prometheus or gpufleet set themselves; a user label must not shadow them.
TARGET_LABELS = (
    "cluster", "rack", "partition", "gpu_model", "node", "metrics_path", "shard", "replica",
    "job", "instance",
)  # fmt: skip
# Labels gpufleet's rules group by, match on or set (an exporter's, a rule's or an
# alert's): a target label of that name would replace the exporter's (honor_labels is
# off) or be added to the rules' label lists twice (src/gpufleet/rule_labels.py).
# tests/unit/test_rule_labels.py derives them from the shipped rule files.
RULE_LABELS = (
    "gpu", "UUID", "minor", "minor_number", "xid", "critical", "reason", "check", "state",
    "mode", "scope", "sensor", "action", "file", "window_size_in_ms", "device", "mountpoint",
    "fstype", "job_id", "user", "account", "problem", "severity", "alertname", "alertstate",
    "DCGM_FI_DEV_MINOR_NUMBER", "DCGM_FI_DEV_GPU_MINOR_NUMBER", "name", "remote_name", "url",
)  # fmt: skip
RESERVED_LABELS = TARGET_LABELS + RULE_LABELS


_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_NAME_TOKEN_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_DOTTED_NUMBERS_RE = re.compile(r"^[0-9.]+$")
_PLAIN_KEY_RE = re.compile(r"^[A-Za-z0-9_.,*\[\]-]{1,60}$")


class NodeListError(ValueError):
    """One clear, one-line problem in a node list: file, key path, message."""

    def __init__(self, file: str, key_path: str, message: str) -> None:
        self.file = file
        self.key_path = key_path
        self.message = message
        text = f"{file}: {key_path}: {message}" if key_path else f"{file}: {message}"
        super().__init__(one_line(text))


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
    max_series_per_shard: int = DEFAULT_MAX_SERIES_PER_SHARD
    max_gpus_per_shard: int = DEFAULT_MAX_GPUS_PER_SHARD
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
    if is_int(value) and abs(value) >= 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def key_text(key: Any) -> str:
    """A mapping key as it appears in a key path: plain keys as they are, others quoted."""
    text = str(key)
    return text if _PLAIN_KEY_RE.match(text) else describe(text)


def type_name(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean"}.get(
        next((t for t in (bool, dict, list, str) if isinstance(value, t)), type(value)),
        type(value).__name__,
    )


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Checker:
    """Validation helpers bound to one file, so every error names it."""

    def __init__(self, file: str, budget: hostlist.Budget | None = None) -> None:
        self.file = file
        # One budget per node list: its YAML and its slurm.conf files share it.
        self.budget = budget or hostlist.Budget()

    def fail(self, key_path: str, message: str) -> NodeListError:
        return NodeListError(self.file, key_path, message)

    def mapping(self, value: Any, key_path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(key_path, f"must be a mapping, got {type_name(value)}")
        return value

    def known_keys(self, value: Mapping[str, Any], allowed: tuple[str, ...], key_path: str) -> None:
        for key in value:
            if key not in allowed:
                where = f"{key_path}.{key_text(key)}" if key_path else key_text(key)
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = (
                    f"; did you mean {close[0]!r}?"
                    if close
                    else f" (allowed: {', '.join(allowed)})"
                )
                raise self.fail(where, f"unknown key{hint}")

    def string(
        self,
        value: Any,
        key_path: str,
        pattern: re.Pattern[str] | None = None,
        max_length: int = MAX_TOKEN_LENGTH,
    ) -> str:
        if is_int(value) and abs(value) < 10**30:
            value = str(value)
        if not isinstance(value, str) or not value:
            raise self.fail(key_path, f"must be a non-empty string, got {describe(value)}")
        if len(value) > max_length:
            raise self.fail(key_path, f"longer than {max_length} characters: {describe(value)}")
        if pattern and not pattern.match(value):
            raise self.fail(
                key_path,
                f"invalid value {describe(value)} (allowed characters: A-Z a-z 0-9 _ . -)",
            )
        return str(value)

    def integer(self, value: Any, key_path: str, minimum: int, maximum: int) -> int:
        if not is_int(value) or not minimum <= value <= maximum:
            if minimum == 0 and (not is_int(value) or value < 0):
                what = "a non-negative integer"
            elif not is_int(value) or value < minimum:
                what = f"an integer >= {minimum}"
            else:
                what = f"at most {maximum:,}"
            raise self.fail(key_path, f"must be {what}, got {describe(value)}")
        return int(value)

    def number(self, value: Any, key_path: str, minimum: float, maximum: float) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(float(value) if abs(value) < 1e300 else math.inf)
            or not minimum <= value <= maximum
        ):
            raise self.fail(
                key_path,
                f"must be a number in {minimum:.1f}..{maximum:.1f}, got {describe(value)}",
            )
        return float(value)

    def choice(self, value: Any, key_path: str, choices: tuple[str, ...], what: str) -> str:
        if value not in choices:
            raise self.fail(
                key_path, f"unknown {what} {describe(value)} (choose one of: {', '.join(choices)})"
            )
        return str(value)

    def hostlist(self, value: Any, key_path: str, defines: bool = False) -> tuple[str, ...]:
        """A hostlist expression, or a YAML list of them. ``defines``: the names are new
        hosts (nodes, servers), counted against the node list's host limit."""
        expressions = value if isinstance(value, list) else [value]
        if not expressions:
            raise self.fail(key_path, "names no host")
        names: list[str] = []
        for expression in expressions:
            if not isinstance(expression, str):
                raise self.fail(key_path, f"must be a hostlist string, got {type_name(expression)}")
            try:
                names.extend(self.budget.expand(expression, defines))
            except hostlist.HostlistError as err:
                raise self.fail(key_path, str(err)) from err
        for name in names:
            if not _HOSTNAME_RE.match(name):
                raise self.fail(key_path, f"invalid host name {name!r}")
        return tuple(names)

    def labels(self, value: Any, key_path: str) -> dict[str, str]:
        result: dict[str, str] = {}
        for name, label_value in self.mapping(value, key_path).items():
            where = f"{key_path}.{key_text(name)}"
            if not isinstance(name, str) or not _LABEL_NAME_RE.match(name):
                raise self.fail(
                    where, "invalid Prometheus label name (must match [a-zA-Z_][a-zA-Z0-9_]*)"
                )
            if name.startswith("__"):
                raise self.fail(where, "label names starting with '__' are reserved for Prometheus")
            if name in TARGET_LABELS:
                raise self.fail(where, f"label {name!r} is set by gpufleet or Prometheus")
            if name in RULE_LABELS:
                raise self.fail(
                    where, f"label {name!r} is one gpufleet's rules group by, match on or set"
                )
            if isinstance(label_value, bool) or not isinstance(label_value, str | int | float):
                raise self.fail(
                    where, f"label value must be a string, got {type_name(label_value)}"
                )
            if is_int(label_value) and abs(label_value) >= 10**30:
                raise self.fail(where, f"label value is {describe(label_value)}")
            result[name] = str(label_value)
        return result

    def host_vars(self, value: Any, key_path: str) -> dict[str, Any]:
        result: dict[str, Any] = {}
        problem = size_problem(self.mapping(value, key_path))
        if problem:
            raise self.fail(key_path, problem)
        for name, var_value in value.items():
            where = f"{key_path}.{key_text(name)}"
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


def size_problem(value: Any) -> str | None:
    """Why ``value`` (YAML data) is too big to pass on, or None. A YAML alias counts once
    per use, so a "billion laughs" document is refused after a few thousand steps."""
    count = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > MAX_VALUE_NODES:
            return f"too large: more than {MAX_VALUE_NODES:,} values (a YAML alias counts each use)"
        if depth > MAX_VALUE_DEPTH:
            return f"nested more than {MAX_VALUE_DEPTH} levels deep"
        if isinstance(item, Mapping):
            stack.extend((child, depth + 1) for pair in item.items() for child in pair)
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
    return None


_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")
_NUM_SPEC_RE = re.compile(r"^num:(?:0([1-9])d?|d)$")
PLACEHOLDER_HELP = f"use {{name}}, {{num}} or {{num:0Nd}} with N in 1..{MAX_NUM_WIDTH}"


@dataclass(frozen=True)
class AddressTemplate:
    """An ``address`` value: literal text with ``{name}``, ``{num}`` and ``{num:0Nd}``.

    Deliberately not ``str.format``: no attribute or index lookups, conversions or
    arbitrary format specs (``{name!r:>999999999}`` would allocate gigabytes), and the
    result cannot be longer than a DNS name.
    """

    pattern: str
    parts: tuple[str | tuple[str, int], ...]  # literal text, or (field, zero-pad width)

    @property
    def fields(self) -> set[str]:
        return {part[0] for part in self.parts if isinstance(part, tuple)}

    @classmethod
    def parse(cls, pattern: str) -> AddressTemplate:
        """Raise ValueError (a one-line reason) for anything but the documented forms."""
        if len(pattern) > MAX_ADDRESS_PATTERN_LENGTH:
            raise ValueError(f"longer than {MAX_ADDRESS_PATTERN_LENGTH} characters")
        parts: list[str | tuple[str, int]] = []
        position = 0
        for match in _PLACEHOLDER_RE.finditer(pattern):
            cls._literal(pattern, position, match.start(), parts)
            parts.append(cls._placeholder(match.group(1)))
            position = match.end()
        cls._literal(pattern, position, len(pattern), parts)
        return cls(pattern, tuple(parts))

    @staticmethod
    def _literal(pattern: str, start: int, end: int, parts: list[str | tuple[str, int]]) -> None:
        text = pattern[start:end]
        for char in "{}":
            if char in text:
                at = start + text.index(char)
                what = "unclosed '{'" if char == "{" else "unmatched '}'"
                raise ValueError(f"{what} at position {at} ({PLACEHOLDER_HELP})")
        if text:
            parts.append(text)

    @staticmethod
    def _placeholder(body: str) -> tuple[str, int]:
        field_name = re.split(r"[!:.\[]", body, maxsplit=1)[0]
        if field_name not in ("name", "num"):
            raise ValueError(
                f"unknown placeholder {{{hostlist.shown(field_name)[1:-1]}}} "
                "(use {name} or {num})"
            )
        if body in ("name", "num"):
            return body, 0
        spec = _NUM_SPEC_RE.match(body)
        if not spec:
            shown = hostlist.shown(body)[1:-1]
            raise ValueError(f"placeholder {{{shown}}} is not supported ({PLACEHOLDER_HELP})")
        return "num", int(spec.group(1) or 0)

    def render(self, name: str) -> str:
        number = hostlist.last_number(name) if "num" in self.fields else None
        if "num" in self.fields and number is None:
            raise ValueError(f"host {name!r} has no number for {{num}}")
        pieces: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                pieces.append(part)
            elif part[0] == "name":
                pieces.append(name)
            else:
                pieces.append(f"{number:0{part[1]}d}")
        return "".join(pieces)


def render_address(pattern: str, name: str) -> str:
    """Fill ``{name}`` and ``{num}`` (the host's last number, as an int) into ``pattern``."""
    return AddressTemplate.parse(pattern).render(name)


def address_problem(address: str) -> str | None:
    """Why ``address`` is not a usable IP or host name, or None."""
    if len(address) > 253:
        return f"{describe(address)} is longer than 253 characters"
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
    return bool(AddressTemplate.parse(pattern).fields)


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
    count = check.integer(gpu.get("count", 0), f"{key_path}.count", 0, MAX_GPUS)
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
    names = check.hostlist(entry["hosts"], f"{key_path}.hosts", defines=True)
    spec = EntrySpec(names=names, role=role)
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
        spec.address = check.string(
            entry["address"], f"{key_path}.address", max_length=MAX_ADDRESS_PATTERN_LENGTH
        )
        try:
            AddressTemplate.parse(spec.address)
        except ValueError as err:
            raise check.fail(
                f"{key_path}.address", f"pattern {describe(spec.address)}: {err}"
            ) from None
    if "rack" in entry:
        spec.rack = check.string(entry["rack"], f"{key_path}.rack", _NAME_TOKEN_RE)
    if "partition" in entry:
        spec.partitions = check.partitions(entry["partition"], f"{key_path}.partition")
    if "cpus" in entry:
        spec.cpus = check.integer(entry["cpus"], f"{key_path}.cpus", 1, MAX_CPUS)
    if "expected_series" in entry:
        spec.expected_series = check.integer(
            entry["expected_series"], f"{key_path}.expected_series", 1, MAX_EXPECTED_SERIES
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
        try:
            template = AddressTemplate.parse(spec.address)
            if not template.fields and len(spec.names) > 1:
                raise check.fail(
                    f"{key_path}.address",
                    f"{spec.address!r} would be the duplicate address of all "
                    f"{len(spec.names)} hosts; use {{num}} or {{name}}",
                )
            addresses = [template.render(name) for name in spec.names]
        except ValueError as err:
            if isinstance(err, NodeListError):
                raise
            raise check.fail(
                f"{key_path}.address", f"pattern {describe(spec.address)}: {err}"
            ) from err
    for name, address in zip(spec.names, addresses, strict=True):
        problem = address_problem(address)
        if problem:
            raise check.fail(f"{key_path}.address", f"{problem} (for host {name})")
    return addresses


# What every host of an entry has exactly as the entry wrote it.
SPEC_HOST_FIELDS = (
    "role",
    "rack",
    "partitions",
    "gpu_vendor",
    "gpu_model",
    "gpu_count",
    "gpu_collector",
    "labels",
    "vars",
)


def build_hosts(check: Checker, spec: EntrySpec, key_path: str, cluster: str) -> list[Host]:
    addresses = entry_addresses(check, spec, key_path)
    cpus = spec.cpus or DEFAULT_CPUS
    try:
        series = spec.expected_series or estimate_series(
            HostShape(cpus, spec.gpu_count, spec.gpu_collector, spec.role)
        )
    except RegistryError as err:  # the exporter registry, not the node list, is wrong
        raise NodeListError(err.file, err.key_path, err.message) from None
    shared = {name: getattr(spec, name) for name in SPEC_HOST_FIELDS}
    return [
        Host(
            name=name, address=address, cpus=cpus, expected_series=series, source=key_path, **shared
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
    conf_value = check.string(slurm["conf"], "slurm.conf", max_length=4096)
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
    try:
        parsed = slurmconf.parse(text, conf_path, read_text, check.budget)
    except slurmconf.SlurmConfError as err:
        where = f"line {err.line}" if err.line else ""
        raise Checker(err.file or conf_path).fail(where, err.message) from err
    partitions_of: dict[str, list[str]] = {}
    for partition, members in parsed.partitions.items():
        for host in members:
            partitions_of.setdefault(host, []).append(partition)
    checkers: dict[str, Checker] = {}
    entries: list[tuple[EntrySpec, Checker, str]] = []
    for node in parsed.nodes:
        conf_check = checkers.setdefault(node.file, Checker(node.file or conf_path, check.budget))
        for name in node.hosts:
            if not _HOSTNAME_RE.match(name):
                raise conf_check.fail(f"line {node.line}", f"invalid host name {name!r}")
        key_path = f"line {node.line}"
        address_of = dict(zip(node.hosts, node.addresses, strict=True)) if node.addresses else {}
        # Hosts of one NodeName line can sit in different partitions: split them.
        by_partitions: dict[tuple[str, ...], list[str]] = {}
        for host in node.hosts:
            by_partitions.setdefault(tuple(partitions_of.get(host, ())), []).append(host)
        for partition_set, same_partitions in by_partitions.items():
            names = tuple(same_partitions)
            spec = EntrySpec(**{**template.__dict__, "names": names, "partitions": partition_set})
            if address_of:
                spec.per_host_addresses = tuple(address_of[h] for h in names)
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


def check_shard_count(check: Checker, shards: int, host_count: int, key_path: str) -> None:
    """At most ``MAX_SHARDS`` shards, and no more shards than hosts."""
    if shards > MAX_SHARDS:
        raise check.fail(key_path, f"must be at most {MAX_SHARDS}, got {describe(shards)}")
    if shards > host_count:
        raise check.fail(
            key_path,
            f"{shards} shards, but the node list has {host_count} host(s) (one at least per shard)",
        )


def parse_monitoring(check: Checker, raw: Any, file: str, host_count: int) -> Monitoring:
    monitoring = check.mapping(raw, "monitoring")
    check.known_keys(monitoring, MONITORING_KEYS, "monitoring")
    shards = check.integer(monitoring.get("shards", 1), "monitoring.shards", 1, MAX_SHARDS)
    check_shard_count(check, shards, host_count, "monitoring.shards")
    replicas = check.integer(monitoring.get("replicas", 1), "monitoring.replicas", 1, MAX_REPLICAS)
    sharding = check.choice(
        monitoring.get("sharding", "balanced"), "monitoring.sharding", SHARDING_MODES, "mode"
    )
    max_imbalance = check.number(
        monitoring.get("max_imbalance", DEFAULT_MAX_IMBALANCE),
        "monitoring.max_imbalance",
        1.0,
        MAX_IMBALANCE,
    )
    rebalance_margin = check.number(
        monitoring.get("rebalance_margin", DEFAULT_REBALANCE_MARGIN),
        "monitoring.rebalance_margin",
        0.0,
        MAX_REBALANCE_MARGIN,
    )
    max_series_per_shard = check.integer(
        monitoring.get("max_series_per_shard", DEFAULT_MAX_SERIES_PER_SHARD),
        "monitoring.max_series_per_shard",
        1,
        MAX_EXPECTED_SERIES,
    )
    max_gpus_per_shard = check.integer(
        monitoring.get("max_gpus_per_shard", DEFAULT_MAX_GPUS_PER_SHARD),
        "monitoring.max_gpus_per_shard",
        1,
        MAX_GPUS * MAX_HOSTS,
    )
    pins: dict[str, int] = {}
    for expression, shard in check.mapping(monitoring.get("pin", {}), "monitoring.pin").items():
        key_path = f"monitoring.pin.{key_text(expression)}"
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
        max_series_per_shard=max_series_per_shard,
        max_gpus_per_shard=max_gpus_per_shard,
        **host_lists,
    )


def check_defined(
    check: Checker, key_path: str, names: tuple[str, ...], defined: Mapping[str, Host]
) -> None:
    for name in names:
        if name not in defined:
            raise check.fail(key_path, f"host {name!r} is not defined in nodes or servers")


def lock_path(check: Checker, monitoring: Mapping[str, Any], file: str) -> str:
    """``monitoring.shard_lock`` resolved against the node list's directory, or ""."""
    if "shard_lock" not in monitoring:
        return ""
    value = check.string(monitoring["shard_lock"], "monitoring.shard_lock", max_length=4096)
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
            path, "cluster", f"the lock is for cluster {describe(lock.cluster)}, not {cluster!r}"
        )
    return lock


def parse_node_list(
    data: Any, file: str, read_text: Callable[[str], str] = read_file_text
) -> NodeList:
    """Validate the loaded YAML of a node list. ``file`` names it in errors."""
    check = Checker(file)
    if data is None:
        raise check.fail("", "is empty (expected a YAML mapping with plugin: gpufleet)")
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
    monitoring = parse_monitoring(check, data.get("monitoring", {}), file, len(hosts))
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


def host_key(name: str) -> str:
    """What makes two host names one host to DNS: case and a trailing dot do not count."""
    return name.lower().rstrip(".")


def address_key(address: str) -> str:
    """One address however written: an IP in its compressed form (an IPv4-mapped IPv6
    address as the IPv4 one), a host name as :func:`host_key`."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return host_key(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def name_clash(name: str, owner: tuple[str, str] | None) -> str | None:
    """Why host ``name`` may not be defined again, given the owner of its key, or None."""
    if owner is None:
        return None
    other, where = owner
    if other == name:
        return f"duplicate host {name!r} (already defined by {where})"
    return f"host {name!r} and host {other!r} ({where}) differ only in case: one host to DNS"


def collect_hosts(entries: list[tuple[EntrySpec, Checker, str]], cluster: str) -> list[Host]:
    """Expand entries into hosts; host names and addresses must be unique across all,
    case and spelling aside (``GPU01``/``gpu01``, ``fe80::1``/``FE80:0::1``)."""
    hosts: list[Host] = []
    name_owner: dict[str, tuple[str, str]] = {}
    address_owner: dict[str, tuple[str, str, str]] = {}
    for spec, check, key_path in entries:
        where = key_path if check.file == entries[0][1].file else f"{check.file} {key_path}"
        for host in build_hosts(check, spec, key_path, cluster):
            clash = name_clash(host.name, name_owner.get(host_key(host.name)))
            if clash:
                raise check.fail(entry_key(key_path, "hosts"), clash)
            name_owner[host_key(host.name)] = (host.name, where)
            owner = address_owner.get(address_key(host.address))
            if owner:
                written = "" if owner[2] == host.address else f", written {owner[2]}"
                raise check.fail(
                    entry_key(key_path, "address"),
                    f"address {host.address} of {host.name} duplicates that of "
                    f"{owner[0]} ({owner[1]}{written})",
                )
            address_owner[address_key(host.address)] = (host.name, where, host.address)
            hosts.append(host)
    return hosts


def find_node_list(path: str) -> str:
    """A node list file, or the single ``*.gpufleet.yml`` inside a directory."""
    if not os.path.isdir(path):
        return path
    found = sorted(name for name in os.listdir(path) if name.endswith(NODE_LIST_SUFFIXES))
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise NodeListError(path, "", f"{what} *.gpufleet.yml files found; name one")
    return os.path.join(path, found[0])


def load_node_list(path: str, read_text: Callable[[str], str] = read_file_text) -> NodeList:
    """Read and validate a node list file (the CLI's entry point; the plugin reads via Ansible)."""
    try:
        text = read_text(path)
    except OSError as err:
        raise NodeListError(path, "", f"cannot read: {err.strerror or err}") from err
    try:
        data = load_yaml(text)
    except YamlProblem as err:
        raise NodeListError(path, err.where, err.problem) from None
    return parse_node_list(data, path, read_text)


def node_list_load_error(path: str, err: BaseException) -> NodeListError:
    """One line for a node list that Ansible's loader could not load: gpufleet's own YAML
    message (with the line) if the text is invalid YAML, else the loader's first line."""
    try:
        load_yaml(read_file_text(path))
    except YamlProblem as problem:
        return NodeListError(path, problem.where, problem.problem)
    except OSError as os_err:
        return NodeListError(path, "", f"cannot read: {os_err.strerror or os_err}")
    if isinstance(err, RecursionError):
        return NodeListError(path, "", "invalid YAML: nested too deeply")
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return NodeListError(path, "", f"cannot load: {first_line[:200]}")


def load_yaml(text: str) -> Any:
    """The strict loader (:mod:`gpufleet.strictyaml`), every failure a :class:`YamlProblem`."""
    return strictyaml.load(text)


def with_ansible_vars(strict: Any, loaded: Any) -> Any:
    """``strict`` (the node list as gpufleet read it) with each ``vars`` mapping taken from
    ``loaded`` (Ansible's loader: vault values, ``!unsafe`` and template trust intact).
    Everything else, identifiers above all, stays as the strict loader read it."""
    if not isinstance(strict, dict) or not isinstance(loaded, Mapping):
        return strict
    result = dict(strict)
    for section in ("nodes", "servers"):
        mine, theirs = strict.get(section), loaded.get(section)
        if isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs):
            result[section] = [_take_vars(a, b) for a, b in zip(mine, theirs, strict=True)]
    mine, theirs = strict.get("slurm"), loaded.get("slurm")
    if isinstance(mine, dict) and isinstance(theirs, Mapping):
        defaults = _take_vars(mine.get("node_defaults"), theirs.get("node_defaults"))
        result["slurm"] = {**mine, "node_defaults": defaults} if defaults is not None else mine
    return result


def _take_vars(mine: Any, theirs: Any) -> Any:
    if isinstance(mine, dict) and isinstance(theirs, Mapping) and "vars" in mine:
        return {**mine, "vars": theirs.get("vars")}
    return mine


def construct_problem(
    host_count: int, compose: Any, groups: Any, keyed_groups: Any
) -> tuple[str, str] | None:
    """(key, problem) if the constructed options would template too much, else None:
    at most MAX_CONSTRUCT_EXPRESSIONS expressions, and expressions x hosts at most
    MAX_CONSTRUCT_EVALUATIONS (checked before any is evaluated)."""
    sizes = {
        "compose": len(compose or {}),
        "groups": len(groups or {}),
        "keyed_groups": len(keyed_groups or []),
    }
    expressions = sum(sizes.values())
    biggest = max(sizes, key=lambda key: sizes[key])
    if expressions > MAX_CONSTRUCT_EXPRESSIONS:
        return biggest, (
            f"{expressions:,} compose/groups/keyed_groups expressions, "
            f"more than {MAX_CONSTRUCT_EXPRESSIONS:,}"
        )
    if expressions * host_count > MAX_CONSTRUCT_EVALUATIONS:
        return biggest, (
            f"{expressions:,} expressions x {host_count:,} hosts = "
            f"{expressions * host_count:,} template evaluations, "
            f"more than {MAX_CONSTRUCT_EVALUATIONS:,}"
        )
    return None
