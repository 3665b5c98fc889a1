"""Read the node inventory out of a ``slurm.conf``: ``NodeName=`` and ``PartitionName=`` lines.

Only what gpufleet needs is interpreted: node names (hostlists), ``NodeAddr``, ``CPUs``,
``RealMemory``, ``Gres=gpu[:TYPE]:N`` and partition membership. ``NodeName=DEFAULT`` lines
set defaults for the node lines after them, as in Slurm. Keys are case-insensitive.

``Include FILE`` lines are followed as Slurm does: the file's lines count as if written in
place of the ``Include`` line; a relative path is relative to the directory of the file
holding the ``Include``; ``%c`` stands for the ``ClusterName`` (lower case) set above it.
Nesting depth, the number of files and their total size are bounded (``gpufleet.limits``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from gpufleet import hostlist
from gpufleet.limits import (
    MAX_CPUS,
    MAX_FILE_BYTES,
    MAX_GPUS,
    MAX_INCLUDE_DEPTH,
    MAX_INCLUDE_FILES,
    MAX_NUMBER_DIGITS,
    read_file_text,
)

_GRES_GPU_RE = re.compile(r"^gpu(?::(?P<type>[^:()]+))?(?::(?P<count>[0-9]+))?(?:\(.*\))?$", re.I)
# A slurm.conf token: runs of non-blanks and "double-quoted text" (which may hold blanks).
# Slurm gives no meaning to an apostrophe: "it's" is a value like any other.
_TOKEN_RE = re.compile(r'(?:"[^"]*"|[^\s"]|"(?=[^"]*$))+')
_INCLUDE_RE = re.compile(r"^include\s+(?P<path>\S+)(?P<rest>.*)$", re.I | re.S)
MAX_REAL_MEMORY_MB = 10**12


class SlurmConfError(ValueError):
    """A problem in slurm.conf; ``line`` is 1-based, ``file`` the file holding it ("" for
    the text given to :func:`parse`, when it has no name)."""

    def __init__(self, line: int, message: str, file: str = "") -> None:
        super().__init__(message)
        self.line = line
        self.message = message
        self.file = file


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
    file: str = ""  # the file holding the line (slurm.conf or one it includes)


@dataclass(frozen=True)
class SlurmConf:
    nodes: tuple[SlurmNodeLine, ...]
    partitions: dict[str, tuple[str, ...]]
    files: tuple[str, ...] = ()  # every file read, the top one first


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Strip comments, join backslash continuations; keep the first physical line number."""
    result: list[tuple[int, str]] = []
    pending: list[str] = []
    pending_line = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            pending_line = number
        if line.endswith("\\"):
            pending.append(line[:-1] + " ")
            continue
        line = ("".join(pending) + line).strip()
        pending = []
        if line:
            result.append((pending_line, line))
    rest = "".join(pending).strip()
    if rest:
        result.append((pending_line, rest))
    return result


def parse_pairs(line_number: int, line: str) -> dict[str, str]:
    """``Key=Value Key2="a value"`` -> {lowercased key: value}, as Slurm splits a line:
    blanks separate pairs, double quotes keep blanks in a value and are removed."""
    pairs: dict[str, str] = {}
    for token in _TOKEN_RE.findall(line):
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise SlurmConfError(line_number, f"expected Key=Value, got {hostlist.shown(token)}")
        pairs[key.lower()] = value.replace('"', "") if value.count('"') % 2 == 0 else value
    return pairs


def parse_int(line_number: int, key: str, value: str, maximum: int) -> int:
    if not value.isdigit() or not value.isascii() or len(value) > MAX_NUMBER_DIGITS:
        raise SlurmConfError(
            line_number, f"{key}={hostlist.shown(value)[1:-1]}: must be a non-negative integer"
        )
    if int(value) > maximum:
        raise SlurmConfError(line_number, f"{key}={value}: must be at most {maximum:,}")
    return int(value)


def parse_gres_gpu(line_number: int, gres: str) -> tuple[str | None, int]:
    """Sum the ``gpu`` entries of a ``Gres=`` value; return (type, count)."""
    gpu_type: str | None = None
    count = 0
    try:
        items = hostlist.split_top_level(gres)
    except hostlist.HostlistError as err:
        raise SlurmConfError(line_number, f"Gres={hostlist.shown(gres)[1:-1]}: {err}") from err
    for item in items:
        item = item.strip()
        if re.split(r"[:(]", item, maxsplit=1)[0].lower() != "gpu":
            continue  # another GRES (gpumem, mps, shard, ...)
        match = _GRES_GPU_RE.match(item)
        if not match or len(match.group("count") or "") > MAX_NUMBER_DIGITS:
            raise SlurmConfError(line_number, f"Gres={gres}: cannot read {item!r} as gpu[:TYPE]:N")
        item_type, item_count = match.group("type"), match.group("count")
        if item_count is None and item_type and item_type.isdigit():
            item_type, item_count = None, item_type  # gpu:4
        if item_type and len(item_type) > MAX_NUMBER_DIGITS and item_type.isdigit():
            raise SlurmConfError(line_number, f"Gres={gres}: cannot read {item!r} as gpu[:TYPE]:N")
        if gpu_type and item_type and item_type != gpu_type:
            raise SlurmConfError(line_number, f"Gres={gres}: mixed GPU types are not supported")
        gpu_type = gpu_type or item_type
        count += int(item_count or 1)  # Gres=gpu[:TYPE] is one GPU
    if count > MAX_GPUS:
        raise SlurmConfError(line_number, f"Gres={gres}: {count:,} GPUs, more than {MAX_GPUS:,}")
    return gpu_type, count


def expand_or_raise(
    line_number: int, key: str, expression: str, budget: hostlist.Budget, defines: bool = False
) -> list[str]:
    try:
        return budget.expand(expression, defines)
    except hostlist.HostlistError as err:
        shown = hostlist.shown(expression)[1:-1]
        raise SlurmConfError(line_number, f"{key}={shown}: {err}") from err


def node_line(line_number: int, pairs: dict[str, str], budget: hostlist.Budget) -> SlurmNodeLine:
    hosts = expand_or_raise(line_number, "NodeName", pairs["nodename"], budget, defines=True)
    addresses: list[str] = []
    if "nodeaddr" in pairs:
        addresses = expand_or_raise(line_number, "NodeAddr", pairs["nodeaddr"], budget)
        if len(addresses) != len(hosts):
            raise SlurmConfError(
                line_number,
                f"NodeAddr names {len(addresses)} addresses for {len(hosts)} hosts",
            )
    cpus = parse_int(line_number, "CPUs", pairs["cpus"], MAX_CPUS) if "cpus" in pairs else None
    memory = pairs.get("realmemory")
    real_memory = (
        parse_int(line_number, "RealMemory", memory, MAX_REAL_MEMORY_MB) if memory else None
    )
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


class _Reader:
    """Walks slurm.conf and its Include files in order, within the limits."""

    def __init__(self, read_text: Callable[[str], str], budget: hostlist.Budget) -> None:
        self.read_text = read_text
        self.budget = budget
        self.files: list[str] = []
        self.bytes_read = 0
        self.cluster_name = ""
        self.node_defaults: dict[str, str] = {}
        self.partition_defaults: dict[str, str] = {}
        self.nodes: list[SlurmNodeLine] = []
        self.partition_lines: list[tuple[str, int, str, str]] = []

    def read_file(self, text: str, file: str, chain: tuple[str, ...]) -> None:
        self.files.append(file)
        self.bytes_read += len(text)
        if self.bytes_read > MAX_FILE_BYTES:
            total = f"{MAX_FILE_BYTES:,} bytes"
            raise SlurmConfError(
                0, f"slurm.conf and its Include files exceed {total} together", file
            )
        for line_number, line in logical_lines(text):
            try:
                self.read_line(line_number, line, file, chain)
            except SlurmConfError as err:
                if not err.file:
                    err.file = file
                raise

    def read_line(self, line_number: int, line: str, file: str, chain: tuple[str, ...]) -> None:
        include = _INCLUDE_RE.match(line)
        if include:
            self.include(line_number, include.group("path"), include.group("rest"), file, chain)
            return
        head = line.split("=", 1)[0].strip().lower()
        if head == "clustername" and "=" in line:
            self.cluster_name = "".join(line.split("=", 1)[1].split()[:1]).lower()
        if head not in ("nodename", "partitionname"):
            return
        pairs = parse_pairs(line_number, line)
        if head == "nodename":
            if pairs["nodename"].upper() == "DEFAULT":
                self.node_defaults.update({k: v for k, v in pairs.items() if k != "nodename"})
                return
            node = node_line(line_number, {**self.node_defaults, **pairs}, self.budget)
            self.nodes.append(SlurmNodeLine(**{**node.__dict__, "file": file}))
        elif pairs["partitionname"].upper() == "DEFAULT":
            self.partition_defaults.update({k: v for k, v in pairs.items() if k != "partitionname"})
        else:
            pairs = {**self.partition_defaults, **pairs}  # as Slurm: DEFAULT lines above
            if "nodes" in pairs:
                name, nodes = pairs["partitionname"], pairs["nodes"]
                self.partition_lines.append((file, line_number, name, nodes))

    def include(
        self, line_number: int, name: str, rest: str, file: str, chain: tuple[str, ...]
    ) -> None:
        shown = hostlist.shown(name)
        if rest.strip():
            raise SlurmConfError(line_number, f"Include {shown}: one file name only")
        if "%c" in name:
            if not self.cluster_name:
                raise SlurmConfError(line_number, f"Include {shown}: %c needs a ClusterName= above")
            name = name.replace("%c", self.cluster_name)
        path = os.path.join(os.path.dirname(file), name)
        if len(chain) > MAX_INCLUDE_DEPTH:  # chain: the top file and the Includes below it
            raise SlurmConfError(
                line_number, f"Include {shown}: nested more than {MAX_INCLUDE_DEPTH} deep"
            )
        if len(self.files) >= MAX_INCLUDE_FILES:
            raise SlurmConfError(
                line_number,
                f"Include {shown}: more than {MAX_INCLUDE_FILES} slurm.conf files in all",
            )
        real = os.path.realpath(path)
        if real in chain:
            raise SlurmConfError(line_number, f"Include {shown}: includes itself (a cycle)")
        try:
            text = self.read_text(path)
        except OSError as err:
            raise SlurmConfError(
                line_number, f"Include {shown}: cannot read {path}: {err.strerror or err}"
            ) from err
        self.read_file(text, path, (*chain, real))


def parse(
    text: str,
    file: str = "",
    read_text: Callable[[str], str] = read_file_text,
    budget: hostlist.Budget | None = None,
) -> SlurmConf:
    """Parse slurm.conf text (read from ``file``; Include paths are relative to its
    directory). Raises :class:`SlurmConfError` naming the file and line."""
    budget = budget or hostlist.Budget()
    reader = _Reader(read_text, budget)
    reader.read_file(text, file, (os.path.realpath(file),) if file else ())
    nodes = reader.nodes
    known = {host for node in nodes for host in node.hosts}
    all_hosts = tuple(host for node in nodes for host in node.hosts)
    members_of: dict[str, list[str]] = {}
    for line_file, line_number, name, expression in reader.partition_lines:
        try:
            if expression.upper() == "ALL":
                try:
                    budget.take(len(all_hosts), "Nodes=ALL")
                except hostlist.HostlistError as err:
                    raise SlurmConfError(line_number, str(err)) from err
                members: tuple[str, ...] | list[str] = all_hosts
            else:
                members = expand_or_raise(line_number, "Nodes", expression, budget)
        except SlurmConfError as err:
            err.file = line_file
            raise
        unknown = next((host for host in members if host not in known), None)
        if unknown is not None:
            raise SlurmConfError(
                line_number, f"partition {name} names undefined node {unknown}", line_file
            )
        members_of.setdefault(name, []).extend(members)
    partitions = {name: tuple(members) for name, members in members_of.items()}
    return SlurmConf(nodes=tuple(nodes), partitions=partitions, files=tuple(reader.files))
