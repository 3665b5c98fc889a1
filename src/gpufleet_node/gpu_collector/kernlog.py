"""The kernel's own XID records: origin checked, grammar anchored to the driver's layout.

A kernel log record is one printk: its message may hold several lines (the driver's
"fallen off the bus" message is one printk of three). The NVIDIA driver starts every
record it prints with "NVRM: ", and an XID record reads

    NVRM: Xid (PCI:dddd:bb:dd): N, <free text>

so only a record that *starts* with that counts. Text anywhere else in a record is
not the driver's: the kernel prints user-chosen strings inside its own messages (the
cgroup path in "fork rejected by pids controller in <path>", a task name in an OOM
report), and such a record must never count, whatever it holds. A record must also
come from the kernel itself: journald and /dev/kmsg say so (facility 0, which /dev/kmsg
writers in user space cannot get); the FILE source cannot and is trusted as given.

Records that hold XID-like text but do not count are counted by reason
(node_gpu_xid_records_rejected_total): not_kernel (another origin), unanchored (the
text is not at the start of the record), malformed (a record that starts like an XID
but does not fit the grammar).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

REJECT_REASONS = ("not_kernel", "unanchored", "malformed")
PCI = r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?" + PCI + r"\): ([0-9]{1,4}),(?: |$)")
FALLEN_SINGLE_RE = re.compile(r"NVRM: GPU " + PCI + r": GPU has fallen off the bus\.")
FALLEN_HEAD_RE = re.compile(r"NVRM: The NVIDIA GPU " + PCI + r"[ \t]*")
FALLEN_TAIL = "NVRM: fallen off the bus and is not responding"
FALLEN_SPAN = 2  # records after a head that may carry its tail (files: one line each)
MARKERS = ("NVRM: Xid", "fallen off the bus")
DRIVER_PREFIX = "NVRM: "

# FILE source lines: an optional syslog head ending in the "kernel: " tag, then an
# optional dmesg time stamp (and caller id), then the record. Nothing else precedes it.
_SYSLOG_TIME = (
    r"(?:[A-Z][a-z]{2} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2}"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{8,20}(?:Z|[+-][0-9]{2}:?[0-9]{2})?)"
)
FILE_PREFIX_RE = re.compile(
    r"(?:" + _SYSLOG_TIME + r" [^ ]{1,255} kernel: )?"
    r"(?:\[ *[0-9]{1,10}\.[0-9]{1,9}\] (?:\[ *[TC][0-9]{1,10}\] )?)?"
)
KMSG_ESCAPE_RE = re.compile(r"\\x([0-9a-fA-F]{2})")


class KernelRecord(NamedTuple):
    message: str  # the whole record; several lines for one multi-line printk
    kernel: bool  # the source says the kernel itself logged it (or cannot tell: FILE)


class XidParse(NamedTuple):
    events: list[tuple[str, int]]  # (normalised PCI id, XID) in order
    rejected: dict[str, int]  # REJECT_REASONS -> records


def normalize_pci_id(raw: str) -> str:
    """'PCI:0000:3b:00', '00000000:3B:00.0' -> '0000:3b:00' (join key for XID lines)."""
    text = raw.strip().lower()
    text = text[4:] if text.startswith("pci:") else text
    parts = text.split(".")[0].split(":")
    if len(parts) != 3:
        return text
    try:
        domain, bus, device = (int(p, 16) for p in parts)
    except ValueError:
        return text
    return f"{domain:04x}:{bus:02x}:{device:02x}"


def record_event(first: str) -> tuple[str, int] | None:
    """The XID of a record's first line: an Xid record, or the single-line
    "fallen off the bus" (XID 79); None for anything else."""
    match = XID_RE.match(first)
    if match:
        return normalize_pci_id(match.group(1)), int(match.group(2))
    match = FALLEN_SINGLE_RE.match(first)
    return (normalize_pci_id(match.group(1)), 79) if match else None


def fallen_head(first: str) -> str | None:
    match = FALLEN_HEAD_RE.fullmatch(first)
    return normalize_pci_id(match.group(1)) if match else None


def rejection(record: KernelRecord, first: str) -> str | None:
    """Why a record that did not count holds XID-like text; None if it holds none or
    is the driver's own (it starts with "NVRM: ")."""
    if not any(marker in record.message for marker in MARKERS):
        return None
    if not record.kernel:
        return "not_kernel"
    if first.startswith(MARKERS[0]):
        return "malformed"
    return None if first.startswith(DRIVER_PREFIX) else "unanchored"


def parse_records(records: Iterable[KernelRecord]) -> XidParse:
    """Kernel records -> XID events and the rejected lookalikes by reason."""
    events: list[tuple[str, int]] = []
    rejected = dict.fromkeys(REJECT_REASONS, 0)
    head, left = "", 0  # a "fallen off the bus" head waiting for its tail
    for record in records:
        lines = record.message.split("\n")
        first, left = lines[0], left - 1
        if record.kernel:
            event = record_event(first)
            pci = fallen_head(first)
            if pci and any(line.startswith(FALLEN_TAIL) for line in lines[1:]):
                event = (pci, 79)
            elif pci:
                head, left = pci, FALLEN_SPAN
                continue
            elif left >= 0 and head and first.startswith(FALLEN_TAIL):
                event = (head, 79)
            if event is not None:
                events.append(event)
                head, left = "", 0
                continue
        reason = rejection(record, first)
        if reason:
            rejected[reason] += 1
    return XidParse(events, rejected)


def file_record(line: str) -> KernelRecord:
    """One line of a kernel log file: the record after its fixed syslog/dmesg head."""
    prefix = FILE_PREFIX_RE.match(line)
    return KernelRecord(line[prefix.end() if prefix else 0 :], True)


def parse_xid_lines(lines: Iterable[str]) -> list[tuple[str, int]]:
    """Kernel log file lines -> [(normalised pci id, xid)] in order."""
    return parse_records(file_record(line) for line in lines).events


def kmsg_record(record: str) -> tuple[int, KernelRecord] | None:
    """'<prio>,<seq>,<usec>,<flags>[,...];<message>' (/dev/kmsg) -> (seq, record).

    The kernel escapes the message's control bytes and backslashes as \\xHH; they are
    unescaped, so a multi-line printk is one record of several lines. Facility 0 is the
    kernel's own: user space writing to /dev/kmsg never gets it.
    """
    head, sep, message = record.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3:
        return None
    if not re.fullmatch(r"[0-9]{1,4}", fields[0]) or not re.fullmatch(r"[0-9]{1,19}", fields[1]):
        return None
    text = KMSG_ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), message.split("\n", 1)[0])
    return int(fields[1]), KernelRecord(text, int(fields[0]) >> 3 == 0)


def journal_text(value: Any) -> str | None:
    """A journal JSON field: a string, or an array of byte values (not valid UTF-8 or
    not printable); None for anything else (a repeated field, null)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value).decode("utf-8", "replace")
    return None


def journal_entry(line: str) -> tuple[str | None, KernelRecord | None]:
    """One line of `journalctl -o json` -> (cursor, record); the kernel's own records
    are _TRANSPORT=kernel with SYSLOG_FACILITY=0 (journald's own fields)."""
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return None, None  # the first line of a cut backlog
    if not isinstance(entry, dict):
        return None, None
    cursor = entry.get("__CURSOR")
    message = journal_text(entry.get("MESSAGE"))
    kernel = entry.get("_TRANSPORT") == "kernel" and entry.get("SYSLOG_FACILITY") == "0"
    record = None if message is None else KernelRecord(message, kernel)
    return (cursor if isinstance(cursor, str) else None), record
