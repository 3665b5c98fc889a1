"""Slurm's view of nodes, from ``scontrol show node[s] --json`` (Slurm 22.05 to 26.05).

22.05 writes ``"state": "idle"`` and ``"state_flags": ["DRAIN"]``; 23.02 and later write
``"state": ["IDLE", "DRAIN"]``. Times are a number, or ``{"set", "infinite", "number"}``
from 23.11 on. Any other shape is an error: the health program then acts on nothing.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

OURS = "gpufleet:"  # every reason gpufleet writes starts so; only these does it resume
OUT_OF_SERVICE = frozenset({"DRAIN", "DOWN", "FAIL", "FAILING", "MAINTENANCE", "REBOOT_REQUESTED"})


class SlurmShapeError(ValueError):
    """scontrol's answer is not the JSON this module knows."""


class NodeState(NamedTuple):
    name: str
    flags: frozenset[str]  # upper case: IDLE, ALLOCATED, DRAIN, DOWN, ...
    reason: str
    reason_time: int  # Unix time the reason was set; 0 when none
    partitions: tuple[str, ...]

    @property
    def drained(self) -> bool:
        """Draining or drained: Slurm starts no new job on it."""
        return "DRAIN" in self.flags

    @property
    def drained_by_us(self) -> bool:
        return self.drained and self.reason.startswith(OURS)

    @property
    def out_of_service(self) -> bool:
        """Drained, down or failed: a node gpufleet must not re-reason (an admin's DOWN
        node would otherwise become gpufleet's drain, and later be resumed)."""
        return bool(self.flags & OUT_OF_SERVICE)


def _time(value: Any) -> int:
    if isinstance(value, dict):
        if not value.get("set") or value.get("infinite"):
            return 0
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        raise SlurmShapeError(f"a time of {type(value).__name__}")
    return int(value)


def _strings(value: Any, what: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise SlurmShapeError(f"{what} is not text or a list of text")


def node_state(record: Any) -> NodeState:
    if not isinstance(record, dict) or not isinstance(record.get("name"), str):
        raise SlurmShapeError("a node record without a name")
    flags = _strings(record.get("state", []), "state")
    flags += _strings(record.get("state_flags", []), "state_flags")
    reason = record.get("reason") or ""
    if not isinstance(reason, str):
        raise SlurmShapeError("reason is not text")
    partitions = _strings(record.get("partitions") or [], "partitions")
    return NodeState(
        name=record["name"],
        flags=frozenset(flag.upper() for flag in flags),
        reason=reason,
        reason_time=_time(record.get("reason_changed_at", 0)),
        partitions=tuple(partitions),
    )


def parse_nodes(text: str) -> list[NodeState]:
    """Every node record of a ``scontrol show node[s] --json`` answer."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise SlurmShapeError(f"not JSON: {err}") from err
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise SlurmShapeError("no 'nodes' list")
    return [node_state(record) for record in data["nodes"]]
