"""State files (XID counters, field memory) and the log."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..exposition import write_textfile
from .kernlog import REJECT_REASONS
from .slurm import _read_text


def load_json(path: str | None) -> dict[str, Any]:
    """A state file's JSON object; {} if absent, unreadable, not JSON or not an object."""
    data = load_json_value(path)
    return data if isinstance(data, dict) else {}


def load_json_value(path: str | None) -> Any:
    """Any JSON value of a state file (bounded read); None if absent or not JSON."""
    text = _read_text(path) if path else None
    try:
        return json.loads(text) if text else None
    except (ValueError, RecursionError):
        return None


XID_KEY_RE = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\|[0-9]{1,6}")
POSITION_TYPES: dict[str, tuple[type, ...]] = {
    "inode": (int,),
    "offset": (int,),
    "seq": (int,),
    "boot_id": (str,),
    "cursor": (str, type(None)),
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _valid_counts(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and XID_KEY_RE.fullmatch(k) and _is_int(v) and 0 <= v < 2**53
        for k, v in value.items()
    )


def _valid_pci_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str)
        and isinstance(v, list)
        and len(v) == 2
        and all(isinstance(x, str) for x in v)
        for k, v in value.items()
    )


# The range of each integer of a read position: a file offset or inode is never
# negative; a kmsg sequence number starts at -1 (nothing read yet).
POSITION_RANGES: dict[str, tuple[int, int]] = {
    "inode": (0, 2**64 - 1),
    "offset": (0, 2**63 - 1),
    "seq": (-1, 2**64 - 1),
}


def _valid_position(value: Any) -> bool:
    """{"inode", "offset"} (file), {"cursor"} (journald), {"boot_id", "seq"} (kmsg)."""
    if not isinstance(value, dict):
        return False
    for key, item in value.items():
        types = POSITION_TYPES.get(key, (object,))
        if isinstance(item, bool) or not isinstance(item, types):
            return False
        low, high = POSITION_RANGES.get(key, (0, 0))
        if _is_int(item) and not low <= item <= high:
            return False
    return True


def _valid_rejected(value: Any) -> bool:
    return isinstance(value, dict) and all(
        k in REJECT_REASONS and _is_int(v) and 0 <= v < 2**53 for k, v in value.items()
    )


XID_STATE_CHECKS: tuple[tuple[str, Callable[[Any], bool]], ...] = (
    ("counts", _valid_counts),
    ("rejected", _valid_rejected),
    ("pci_map", _valid_pci_map),
    ("source", lambda value: isinstance(value, str)),
)


def xid_state_problem(data: Any) -> str:
    """'' if ``data`` has the shape the collector writes, else what is wrong."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key, valid in XID_STATE_CHECKS:
        if key in data and not valid(data[key]):
            return f"{key!r} has the wrong shape"
    return ""


def load_xid_state(path: str | None) -> dict[str, Any]:
    """The XID state; a file of any other shape counts as empty (one log line)."""
    if not path or not os.path.exists(path):
        return {}
    data = load_json_value(path)
    problem = xid_state_problem(data)
    if problem:
        log(f"ignoring XID state {path} ({problem}): XID counters start from zero")
        return {}
    state = dict(data)
    if "position" in state and not _valid_position(state["position"]):
        # Only where to read from is lost: the counters stay, reading starts afresh.
        log(f"ignoring the read position of XID state {path} (wrong shape or range)")
        del state["position"]
    return state


def boot_id(proc_root: str = "/proc") -> str:
    """This boot's id; '' where the kernel does not say."""
    return (_read_text(os.path.join(proc_root, "sys/kernel/random/boot_id")) or "").strip()


def load_xid_baseline(path: str | None) -> tuple[str, dict[str, int]] | None:
    """(boot id, XID counts) the health verdict counts from; None when absent or of any
    other shape (the collector then takes a new one)."""
    data = load_json_value(path) if path else None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("boot_id"), str)
        or not _valid_counts(data.get("counts"))
    ):
        return None
    return data["boot_id"], dict(data["counts"])


def xid_baseline_document(boot: str, counts: dict[str, int]) -> dict[str, Any]:
    return {"boot_id": boot, "counts": dict(counts)}


def save_json(path: str | None, data: dict[str, Any]) -> None:
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_textfile(Path(path), json.dumps(data, sort_keys=True))
    except OSError as exc:
        log(f"cannot write state {path}: {exc}")


def log(message: str) -> None:
    print(f"gpufleet_gpu_collector: {message}", file=sys.stderr)
