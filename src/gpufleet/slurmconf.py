"""Read the node inventory out of a ``slurm.conf``: ``NodeName=`` and ``PartitionName=`` lines.

Only what gpufleet needs is interpreted: node names (hostlists), ``NodeAddr``, ``CPUs``,
``RealMemory``, ``Gres=gpu[:TYPE]:N`` and partition membership. ``NodeName=DEFAULT`` lines
set defaults for the node lines after them, as in Slurm. Keys are case-insensitive.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from gpufleet import hostlist

_GRES_GPU_RE = re.compile(r"^gpu(?::(?P<type>[^:()]+))?:(?P<count>[0-9]+)(?:\(.*\))?$", re.I)


class SlurmConfError(ValueError):
    """A problem in slurm.conf; ``line`` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


@dataclass(frozen=True)
class SlurmNodeLine:
    """One ``NodeName=`` line, with ``NodeName=DEFAULT`` values applied."""

    line: int
    hosts: tuple[str, ...]
    addresses: tuple[str, ...]
    cpus: int | None
    real_memory_mb: int | None
    gpu_type: str | None
    gpu_count: int


@dataclass(frozen=True)
class SlurmConf:
    nodes: tuple[SlurmNodeLine, ...]
    partitions: dict[str, tuple[str, ...]]


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Strip comments, join backslash continuations; keep the first physical line number."""
    result: list[tuple[int, str]] = []
    pending = ""
    pending_line = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            pending_line = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            result.append((pending_line, line))
    if pending.strip():
        result.append((pending_line, pending.strip()))
    return result


def parse_pairs(line_number: int, line: str) -> dict[str, str]:
    """``Key=Value Key2=Value2`` -> {lowercased key: value}."""
    try:
        tokens = shlex.split(line)
    except ValueError as err:
        raise SlurmConfError(line_number, f"cannot split line: {err}") from err
    pairs: dict[str, str] = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep:
            raise SlurmConfError(line_number, f"expected Key=Value, got {token!r}")
        pairs[key.lower()] = value
    return pairs


def parse_int(line_number: int, key: str, value: str) -> int:
    if not value.isdigit():
        raise SlurmConfError(line_number, f"{key}={value}: must be a non-negative integer")
    return int(value)


def parse_gres_gpu(line_number: int, gres: str) -> tuple[str | None, int]:
    """Sum the ``gpu`` entries of a ``Gres=`` value; return (type, count)."""
    gpu_type: str | None = None
    count = 0
    for item in hostlist.split_top_level(gres):
        item = item.strip()
        if not item.lower().startswith("gpu"):
            continue
        match = _GRES_GPU_RE.match(item)
        if not match:
            raise SlurmConfError(line_number, f"Gres={gres}: cannot read {item!r} as gpu[:TYPE]:N")
        item_type = match.group("type")
        if gpu_type and item_type and item_type != gpu_type:
            raise SlurmConfError(line_number, f"Gres={gres}: mixed GPU types are not supported")
        gpu_type = gpu_type or item_type
        count += int(match.group("count"))
    return gpu_type, count


def expand_or_raise(line_number: int, key: str, expression: str) -> list[str]:
    try:
        return hostlist.expand(expression)
    except hostlist.HostlistError as err:
        raise SlurmConfError(line_number, f"{key}={expression}: {err}") from err


def node_line(line_number: int, pairs: dict[str, str]) -> SlurmNodeLine:
    hosts = expand_or_raise(line_number, "NodeName", pairs["nodename"])
    addresses: list[str] = []
    if "nodeaddr" in pairs:
        addresses = expand_or_raise(line_number, "NodeAddr", pairs["nodeaddr"])
        if len(addresses) != len(hosts):
            raise SlurmConfError(
                line_number,
                f"NodeAddr names {len(addresses)} addresses for {len(hosts)} hosts",
            )
    cpus = parse_int(line_number, "CPUs", pairs["cpus"]) if "cpus" in pairs else None
    memory = pairs.get("realmemory")
    real_memory = parse_int(line_number, "RealMemory", memory) if memory else None
    gpu_type, gpu_count = parse_gres_gpu(line_number, pairs.get("gres", ""))
    return SlurmNodeLine(
        line=line_number,
        hosts=tuple(hosts),
        addresses=tuple(addresses),
        cpus=cpus,
        real_memory_mb=real_memory,
        gpu_type=gpu_type,
        gpu_count=gpu_count,
    )


def parse(text: str) -> SlurmConf:
    """Parse slurm.conf text. Raises :class:`SlurmConfError`."""
    node_defaults: dict[str, str] = {}
    nodes: list[SlurmNodeLine] = []
    partition_lines: list[tuple[int, str, str]] = []
    for line_number, line in logical_lines(text):
        head = line.split("=", 1)[0].strip().lower()
        if head not in ("nodename", "partitionname"):
            continue
        pairs = parse_pairs(line_number, line)
        if head == "nodename":
            if pairs["nodename"].upper() == "DEFAULT":
                node_defaults.update({k: v for k, v in pairs.items() if k != "nodename"})
                continue
            nodes.append(node_line(line_number, {**node_defaults, **pairs}))
        elif pairs["partitionname"].upper() != "DEFAULT" and "nodes" in pairs:
            partition_lines.append((line_number, pairs["partitionname"], pairs["nodes"]))
    known = {host for node in nodes for host in node.hosts}
    all_hosts = tuple(host for node in nodes for host in node.hosts)
    partitions: dict[str, tuple[str, ...]] = {}
    for line_number, name, expression in partition_lines:
        if expression.upper() == "ALL":
            members = all_hosts
        else:
            members = tuple(expand_or_raise(line_number, "Nodes", expression))
            unknown = [host for host in members if host not in known]
            if unknown:
                raise SlurmConfError(
                    line_number, f"partition {name} names undefined node {unknown[0]}"
                )
        partitions[name] = partitions.get(name, ()) + members
    return SlurmConf(nodes=tuple(nodes), partitions=partitions)
