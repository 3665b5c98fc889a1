"""Kernel-log sources of XID records: journald, /dev/kmsg, a file (the grammar: kernlog)."""

from __future__ import annotations

import errno
import os
from typing import Any

from .files import open_regular
from .health import count_xids
from .kernlog import (
    REJECT_REASONS,
    KernelRecord,
    file_record,
    journal_entry,
    kmsg_record,
    parse_records,
)
from .model import JOURNAL_MAX_BYTES, XID_FILE_MAX_BYTES, CollectorError
from .run import run_command
from .slurm import _read_text
from .state import log


def read_xid_file(path: str, state: dict[str, Any]) -> tuple[list[KernelRecord], dict[str, Any]]:
    """New complete lines since the stored offset (restart if rotated/truncated).

    At most XID_FILE_MAX_BYTES per cycle: a backlog is read over several cycles.
    """
    with open_regular(path) as handle:  # a FIFO is an error, never a hang
        st = os.fstat(handle.fileno())
        offset = file_offset(state, st.st_ino, st.st_size)
        handle.seek(offset)
        data = handle.read(XID_FILE_MAX_BYTES)
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) == XID_FILE_MAX_BYTES:  # one line longer than that: skip it
        return [], {"inode": st.st_ino, "offset": offset + len(data)}
    lines = data[:end].decode("utf-8", "replace").split("\n")[:-1]
    return [file_record(line) for line in lines], {"inode": st.st_ino, "offset": offset + end}


def file_offset(state: dict[str, Any], inode: int, size: int) -> int:
    """The stored offset when it is one of this file (same inode, 0 <= offset <= size),
    else 0: a rotated, truncated or corrupt position restarts at the file's beginning."""
    offset = state.get("offset", 0)
    if state.get("inode") != inode or not isinstance(offset, int) or not 0 <= offset <= size:
        return 0
    return offset


JOURNAL_ARGV = (
    "journalctl",
    "-k",  # _TRANSPORT=kernel; each record's origin is checked again (journal_entry)
    "-b",
    "-q",
    "--no-pager",
    "--all",
    "-o",
    "json",  # one record per line, its lines and origin fields intact
    "--output-fields=MESSAGE,_TRANSPORT,SYSLOG_FACILITY",
)


def read_xid_journald(
    state: dict[str, Any], timeout: float
) -> tuple[list[KernelRecord], dict[str, Any]]:
    argv = list(JOURNAL_ARGV)
    if state.get("cursor"):
        argv.append("--after-cursor=" + str(state["cursor"]))
    result = run_command(argv, timeout, JOURNAL_MAX_BYTES, keep_tail=True)
    if result.truncated:
        log(f"kernel log backlog over {JOURNAL_MAX_BYTES} bytes: only its newest lines are read")
    # journalctl -b exits 1 with no output when this boot has no kernel entries yet
    # (seen in containers): nothing new, not a failure.
    if result.returncode == 1 and not result.stdout.strip():
        # A cursor the journal no longer knows (vacuumed, new machine-id) is dropped.
        stale = "cursor" in result.stderr.lower()
        return [], {"cursor": None if stale else state.get("cursor")}
    if result.error is not None:
        raise CollectorError("exec_error", f"journalctl rc={result.returncode}")
    records, cursor = [], state.get("cursor")
    for line in result.stdout.split("\n"):  # not splitlines(): U+2028 stays inside
        entry_cursor, record = journal_entry(line)
        cursor = entry_cursor or cursor
        if record is not None:
            records.append(record)
    return records, {"cursor": cursor}


def parse_kmsg_record(record: str) -> tuple[int, KernelRecord] | None:
    """'6,1234,5678,-;NVRM: Xid ...' -> (1234, the kernel's record)."""
    return kmsg_record(record)


def read_xid_kmsg(
    state: dict[str, Any], device: str = "/dev/kmsg"
) -> tuple[list[KernelRecord], dict[str, Any]]:
    boot_id = (_read_text("/proc/sys/kernel/random/boot_id") or "").strip()
    last = int(state.get("seq", -1)) if state.get("boot_id") == boot_id else -1
    records, newest = [], last
    fd = os.open(device, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten; keep reading
                    continue
                raise
            if not chunk:
                break
            parsed = parse_kmsg_record(chunk.decode("utf-8", "replace"))
            if parsed and parsed[0] > last:
                newest = max(newest, parsed[0])
                records.append(parsed[1])
    finally:
        os.close(fd)
    return records, {"boot_id": boot_id, "seq": newest}


def collect_xids(source: str, state: dict[str, Any], timeout: float) -> tuple[dict[str, Any], bool]:
    """Read new kernel-log lines and add them to the counters: (new state, ok).

    The state (counts, read position, last known PCI -> GPU map) is persisted by
    the caller, so counters never reset between one-shot runs.
    """
    counts = {str(k): int(v) for k, v in dict(state.get("counts", {})).items()}
    position = dict(state.get("position", {})) if state.get("source") == source else {}
    try:
        if source == "journald":
            records, position = read_xid_journald(position, timeout)
        elif source == "kmsg":
            records, position = read_xid_kmsg(position)
        else:
            records, position = read_xid_file(source, position)
    except (OSError, CollectorError) as exc:
        log(f"XID source {source}: {exc}")
        return state, False
    parsed = parse_records(records)
    counts = count_xids(counts, parsed.events)
    rejected = add_rejected(state.get("rejected", {}), parsed.rejected)
    if any(parsed.rejected.values()):
        log(f"XID source {source}: XID-like records not counted: {parsed.rejected}")
    return {
        **state,
        "counts": counts,
        "rejected": rejected,
        "position": position,
        "source": source,
    }, True


def add_rejected(before: dict[str, int], new: dict[str, int]) -> dict[str, int]:
    """Counters of rejected records, kept in the state like the XID counts."""
    return {r: int(before.get(r, 0)) + int(new.get(r, 0)) for r in REJECT_REASONS}
