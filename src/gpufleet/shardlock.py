"""The shard lock: the applied host -> shard plan, read back so that the next plan is sticky.

Written only by ``gpufleet plan --write-lock``; the inventory plugin only reads it. Format
(YAML, version 1)::

    # gpufleet shard lock ...
    version: 1
    cluster: hpc-a
    shards: 4
    hosts:
      gpu001: 0
      gpu002: 3

Pure functions, no I/O: :func:`parse_lock` raises :class:`LockError` (key path, message)
and the caller adds the file name.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpufleet import strictyaml
from gpufleet.limits import MAX_SHARDS

LOCK_VERSION = 1
LOCK_KEYS = ("version", "cluster", "shards", "hosts")
HEADER = """\
# gpufleet shard lock: the applied host -> Prometheus shard plan. Hosts listed here keep
# their shard when the node list changes. Written by `gpufleet plan --write-lock`; review
# with `gpufleet plan --diff`, commit it next to the node list, do not edit by hand.
"""


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Quotes a host name that either YAML 1.1 or the strict loader would type (``010``,
    ``1e3``), so the lock reads back as the names written."""


strictyaml.add_resolvers(_Dumper)


class LockError(ValueError):
    """A malformed lock: key path and message (the caller names the file)."""

    def __init__(self, key_path: str, message: str) -> None:
        self.key_path = key_path
        self.message = message
        super().__init__(f"{key_path}: {message}" if key_path else message)


@dataclass(frozen=True)
class ShardLock:
    file: str
    cluster: str
    shards: int
    hosts: Mapping[str, int] = field(default_factory=dict)


def short(value: Any, quote: bool = True, width: int = 60) -> str:
    """``repr`` (or ``str``) of a value for messages, cut when long."""
    if isinstance(value, int) and abs(value) >= 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value) if quote else str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def is_count(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def parse_lock(text: str, file: str) -> ShardLock:
    """Validate a lock file's text. A shard index may exceed the node list's shard count
    (shards were removed since): that is for the planner to handle, not an error."""
    try:
        data = strictyaml.load(text)
    except strictyaml.YamlProblem as err:
        raise LockError(err.where, err.problem) from None
    if not isinstance(data, Mapping):
        raise LockError("", "must be a YAML mapping (a gpufleet shard lock)")
    for key in data:
        if key not in LOCK_KEYS:
            close = difflib.get_close_matches(str(key)[:100], LOCK_KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" ({', '.join(LOCK_KEYS)})"
            raise LockError(short(key, quote=False), f"unknown key{hint}")
    for key in LOCK_KEYS:
        if key not in data:
            raise LockError(key, "required")
    if data["version"] != LOCK_VERSION:
        raise LockError(
            "version", f"unsupported lock format {short(data['version'])} (this gpufleet reads 1)"
        )
    cluster = data["cluster"]
    if not isinstance(cluster, str) or not cluster:
        raise LockError("cluster", f"must be a non-empty string, got {short(cluster)}")
    shards = data["shards"]
    if not is_count(shards, 1):
        raise LockError("shards", f"must be an integer >= 1, got {short(shards)}")
    if shards > MAX_SHARDS:
        raise LockError("shards", f"must be at most {MAX_SHARDS}, got {short(shards)}")
    hosts = data["hosts"] if data["hosts"] is not None else {}
    if not isinstance(hosts, Mapping):
        raise LockError("hosts", "must be a mapping of host name -> shard")
    seen: dict[str, str] = {}
    for host, shard in hosts.items():
        if not isinstance(host, str):
            raise LockError("hosts", f"host names must be strings, got {short(host)}")
        other = seen.setdefault(host.lower().rstrip("."), host)
        if other != host:
            raise LockError(
                f"hosts.{short(host, quote=False)}",
                f"host {short(host)} and host {short(other)} differ only in case: one host",
            )
        if not is_count(shard, 0) or shard >= shards:
            raise LockError(
                f"hosts.{short(host, quote=False)}",
                f"shard must be an integer in 0..{shards - 1}, got {short(shard)}",
            )
    return ShardLock(file=file, cluster=cluster, shards=shards, hosts=dict(hosts))


def format_lock(cluster: str, shards: int, assignment: Mapping[str, int]) -> str:
    """The lock file text for a plan; hosts sorted by name, so diffs stay small."""
    body = {
        "version": LOCK_VERSION,
        "cluster": cluster,
        "shards": shards,
        "hosts": {host: assignment[host] for host in sorted(assignment)},
    }
    text: str = yaml.dump(body, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
    return HEADER + text
