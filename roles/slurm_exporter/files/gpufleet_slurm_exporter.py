#!/usr/bin/env python3
"""gpufleet Slurm exporter: Slurm state as Prometheus metrics, GPU allocation per job.

Standard library only (runs on the Slurm controller's system python3). Slurm is read through
its commands (sinfo, squeue, scontrol, sdiag, sshare) in a background thread every
``--collect-interval`` seconds, each command bounded by ``--command-timeout`` (its whole
process group is killed on timeout). A scrape of ``/metrics`` only serves the latest
snapshot, so a hung slurmctld never blocks a scrape. A Prometheus shard asks for its own
nodes only (``/metrics?shard=K``, nodes from ``--node-map-file``); one shard also for the
cluster-level series (``&cluster=1``); no query serves everything.

Metric names follow SckyzO/slurm_exporter (which kept the vpenso names) so existing Slurm
dashboards work; the additions (per-job GPU allocation and indices, node reasons, exporter
health) are documented in docs/slurm-exporter.md.

Layout: pure parse functions (one per command output) -> build_families() (pure) ->
render() (pure); the subprocess runner, the collector thread and the HTTP server are the glue.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import errno
import hashlib
import io
import itertools
import json
import logging
import math
import os
import re
import select
import signal
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, TypeVar

__version__ = "0.1.0"

_T = TypeVar("_T")
LOG = logging.getLogger("gpufleet_slurm_exporter")

# The exact command lines. tests/fixtures/slurm/capture.sh runs the same ones.
# -O "Field:|" = no minimum width (no truncation) and "|" as suffix; Reason is last because
# a node reason is free text and may itself contain "|".
SINFO_NODES_FIELDS = (
    "NodeList:|,PartitionName:|,StateLong:|,CPUsState:|,AllocMem:|,Memory:|,"
    "Gres:|,GresUsed:|,Timestamp:|,Reason:"
)
SQUEUE_FORMAT = "%A|%i|%T|%P|%u|%a|%C|%D|%r"
SSHARE_FIELDS = "Account,User,RawShares,NormShares,RawUsage,NormUsage,FairShare"
COMMANDS: dict[str, list[str]] = {
    "sinfo_version": ["sinfo", "--version"],
    "sinfo_nodes": ["sinfo", "-h", "-N", "-O", SINFO_NODES_FIELDS],
    "squeue": ["squeue", "-h", "-a", "-r", "--states=all", "-o", SQUEUE_FORMAT],
    "scontrol_jobs": ["scontrol", "show", "job", "-d", "-o"],
    "sdiag": ["sdiag"],
    "sshare": ["sshare", "-a", "-P", "-n", "-o", SSHARE_FIELDS],
}
# How job records are read (--job-source). "text" is the scontrol_jobs line above, read by a
# parser that knows the record's fixed layout (parse_scontrol_jobs); "json" is Slurm's
# data_parser output, where user text is a quoted JSON string and cannot add fields.
# "auto" takes json from JSON_MIN_VERSION on (checked on 24.11) and text before (22.05 has no
# `scontrol --json`).
JOB_JSON_COMMAND = ["scontrol", "show", "job", "-d", "--json"]
JOB_SOURCES = ("auto", "json", "text")
JSON_MIN_VERSION = (24, 11)
# Commands whose success means slurmctld answered (slurm_up).
UP_COMMANDS = ("sinfo_nodes", "squeue")
# Results of these are not served once they are older than --max-stale; per-job series
# (from scontrol_jobs) are never served stale: a job may have ended since.
NEVER_STALE = ("scontrol_jobs",)

# vpenso/SckyzO node state buckets, matched on the state's prefix (sinfo StateLong).
NODE_STATE_BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("alloc", ("alloc",)),
    ("comp", ("comp",)),
    ("down", ("down",)),
    ("drain", ("drain",)),
    ("err", ("err",)),
    ("fail", ("fail",)),
    ("idle", ("idle",)),
    ("inval", ("inval",)),
    ("maint", ("maint",)),
    ("mix", ("mix",)),
    ("planned", ("planned",)),
    ("resv", ("reserved", "resv")),
)
NODE_STATE_NAMES = (*(name for name, _ in NODE_STATE_BUCKETS), "other")
# Node states whose GPUs cannot be given to new jobs (counted as "other" GPUs when idle).
UNAVAILABLE_PREFIXES = ("down", "drain", "fail", "err", "maint", "inval", "unknown", "future")

# Job states as squeue %T prints them -> the SckyzO metric suffix.
JOB_STATES: dict[str, str] = {
    "PENDING": "pending",
    "RUNNING": "running",
    "SUSPENDED": "suspended",
    "CANCELLED": "cancelled",
    "COMPLETING": "completing",
    "COMPLETED": "completed",
    "CONFIGURING": "configuring",
    "FAILED": "failed",
    "TIMEOUT": "timeout",
    "PREEMPTED": "preempted",
    "NODE_FAIL": "node_fail",
    "OUT_OF_MEMORY": "out_of_memory",
    "BOOT_FAIL": "boot_fail",
    "DEADLINE": "deadline",
}

MISSING = ("", "(null)", "N/A", "n/a", "none", "None", "Unknown")

# Bounds on what one collection may expand or export, whatever Slurm (or a user's text in it)
# says. A hostlist expression is refused before it is expanded.
MAX_HOSTS_PER_EXPRESSION = 65536  # hosts one hostlist expression may name
MAX_HOSTS_PER_SCRAPE = 262144  # hosts all job hostlists of one collection may name together
MAX_GRES_INDICES = 1024  # GPU indices in one IDX:... list
MAX_GRES_INDEX = 65535  # largest GPU index
MAX_GPU_COUNT = 65536  # GPUs in one GRES token
MAX_RECORD_TOKENS = 100000  # Key=value tokens read from one scontrol record
DEFAULT_MAX_JOB_SERIES = 5000
DEFAULT_MAX_GPU_INDEX_SERIES = 40000
# Job states squeue prints for jobs that no longer hold resources.
TERMINAL_STATES = frozenset(
    (
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    )
)
# Why a job record was left out of the per-job series (slurm_exporter_job_records_rejected).
REJECT_REASONS = (
    "malformed",  # not a record of the known layout
    "ambiguous",  # free text holds a second complete record head: no way to tell which is real
    "duplicate",  # the same job id twice (a line break in free text can forge a record)
    "bounds",  # hostlist or GRES indices beyond the bounds above
    "not_in_squeue",  # text records only: squeue does not list the job as alive
    "user_mismatch",  # text records only: squeue names another user
)


# ---------------------------------------------------------------------------------------
# Data model
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gres:
    """One GRES token, e.g. ``gpu:a100:2(IDX:0-1)``."""

    name: str
    type: str | None
    count: int
    indices: tuple[int, ...] = ()

    @property
    def gres_type(self) -> str:
        """SckyzO's ``gres_type`` label: ``gpu`` or ``gpu:<model>``."""
        return f"{self.name}:{self.type}" if self.type else self.name


@dataclass(frozen=True)
class NodeRow:
    """One line of ``sinfo -N -O`` (a node appears once per partition)."""

    node: str
    partition: str
    state: str
    cpu_alloc: int
    cpu_idle: int
    cpu_other: int
    cpu_total: int
    mem_alloc: float
    mem_total: float
    gres: tuple[Gres, ...]
    gres_used: tuple[Gres, ...]
    reason_timestamp: float | None
    reason: str | None


@dataclass(frozen=True)
class QueueRow:
    """One line of ``squeue -r --states=all -o %A|%i|%T|%P|%u|%a|%C|%D|%r``."""

    job_id: str
    job_id_display: str
    state: str
    partitions: tuple[str, ...]
    user: str
    account: str
    cpus: int
    nodes: int
    reason: str


@dataclass(frozen=True)
class NodeAlloc:
    """GPUs one job holds on one node (from a ``Nodes=... GRES=...`` detail segment)."""

    node: str
    gpus: int
    indices: tuple[int, ...]


@dataclass(frozen=True)
class JobDetail:
    """One job record (``scontrol show job -d -o`` or ``--json``).

    ``allocations`` are filled for RUNNING jobs only: no other job's GPUs are exported.
    """

    job_id: str
    state: str
    user: str
    account: str
    partition: str
    array_job_id: str | None
    allocations: tuple[NodeAlloc, ...]

    @property
    def gpus(self) -> int:
        return sum(a.gpus for a in self.allocations)


class JobList(list):
    """Parsed job records plus what was left out and why (a list, for the generic code)."""

    def __init__(self, jobs: Iterable[JobDetail] = (), source: str = "text") -> None:
        super().__init__(jobs)
        self.source = source
        self.rejected: Counter = Counter()

    @property
    def unusable(self) -> bool:
        """Output with records, none of them in a known layout (a format change, not an attack)."""
        return (
            not self
            and self.rejected["malformed"] > 0
            and sum(self.rejected.values()) == self.rejected["malformed"]
        )


@dataclass
class Sdiag:
    """The parts of ``sdiag`` the exporter publishes."""

    values: dict[str, float] = field(default_factory=dict)
    rpc_by_type: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    rpc_by_user: dict[str, tuple[float, float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class ShareRow:
    """One line of ``sshare -a -P -n`` (user empty for an account line)."""

    account: str
    user: str
    raw_shares: float | None
    norm_shares: float | None
    raw_usage: float | None
    norm_usage: float | None
    fairshare: float | None


# ---------------------------------------------------------------------------------------
# Small parsing helpers
# ---------------------------------------------------------------------------------------


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses and brackets: ``a(IDX:0,3),b[1,2]``."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (s.strip() for s in parts) if p]


class BoundExceeded(ValueError):
    """The input asks for more than the exporter's bounds allow (MAX_* above)."""


class HostBudget:
    """How many hosts the hostlist expansions of one collection may still produce."""

    def __init__(self, limit: int = MAX_HOSTS_PER_SCRAPE) -> None:
        self.remaining = limit

    def take(self, count: int) -> None:
        if count > self.remaining:
            raise BoundExceeded(f"{count} more hosts exceed this collection's bound")
        self.remaining -= count


_NUMBER_RE = re.compile(r"[0-9]{1,9}")


def _range_bounds(part: str) -> tuple[int, int, int]:
    """``07-12`` -> (7, 12, 2), ``3`` -> (3, 3, 1): at most 9 digits, low <= high."""
    lo, sep, hi = part.partition("-")
    if not _NUMBER_RE.fullmatch(lo) or (sep and not _NUMBER_RE.fullmatch(hi)):
        raise ValueError(f"bad range {part!r}")
    a = int(lo)
    b = int(hi) if sep else a
    if b < a:
        raise ValueError(f"bad range {part!r}")
    return a, b, len(lo)


def expand_ranges(
    text: str, limit: int = MAX_GRES_INDICES, max_value: int = MAX_GRES_INDEX
) -> list[int]:
    """``0-1,3`` -> [0, 1, 3]. ValueError on anything else or beyond the bounds."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        a, b, _ = _range_bounds(part)
        if b > max_value or len(out) + (b - a + 1) > limit:
            raise BoundExceeded(f"range {part!r} beyond the bounds")
        out.extend(range(a, b + 1))
    return out


def _hostlist_item(item: str) -> list:
    """One hostlist item split into literals and bracket ranges:
    ``gpu[01-02,7]x`` -> ["gpu", [(1, 2, 2), (7, 7, 1)], "x"]."""
    parts: list = []
    pos = 0
    while True:
        open_at = item.find("[", pos)
        close_at = item.find("]", pos)
        if open_at < 0:
            if close_at >= 0:
                raise ValueError(f"bad hostlist {item!r}")
            parts.append(item[pos:])
            return parts
        if close_at < open_at:
            raise ValueError(f"bad hostlist {item!r}")
        parts.append(item[pos:open_at])
        inner = item[open_at + 1 : close_at]
        if "[" in inner or not inner:
            raise ValueError(f"bad hostlist {item!r}")
        parts.append([_range_bounds(r.strip()) for r in inner.split(",")])
        pos = close_at + 1


def expand_hostlist(
    text: str, budget: HostBudget | None = None, limit: int = MAX_HOSTS_PER_EXPRESSION
) -> list[str]:
    """Expand a Slurm hostlist: ``gpu[01-03,07],vm`` or ``r[1-2]n[1-2]``.

    The size is computed first: an expression naming more than ``limit`` hosts, or more
    than ``budget`` has left, raises BoundExceeded without expanding anything.
    """
    items = [_hostlist_item(item) for item in split_top_level(text)]
    total = 0
    for parts in items:
        size = 1
        for part in parts:
            if isinstance(part, list):
                size *= sum(b - a + 1 for a, b, _ in part)
                if size > limit:
                    raise BoundExceeded(f"hostlist {text[:80]!r} names more than {limit} hosts")
        total += size
        if total > limit:
            raise BoundExceeded(f"hostlist {text[:80]!r} names more than {limit} hosts")
    if budget is not None:
        budget.take(total)
    hosts: list[str] = []
    for parts in items:
        choices = [
            [f"{n:0{w}d}" for a, b, w in part for n in range(a, b + 1)]
            if isinstance(part, list)
            else [part]
            for part in parts
        ]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


_PAREN_RE = re.compile(r"^(.*)\(([^()]*)\)$")
_COUNT_RE = re.compile(r"^([0-9]{1,12})([KMGTP]?)$")
_MULT = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def parse_gres(spec: str) -> tuple[Gres, ...]:
    """Parse a GRES list as sinfo Gres/GresUsed or scontrol ``GRES=`` print it.

    Handles ``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gpu:a100:2(IDX:0-1)``, ``gpu:a100:0(IDX:N/A)``,
    ``gpu:(null):0(IDX:N/A)``, ``gpu(IDX:0-1)`` (count from the indices), MIG types with dots,
    several types separated by commas, and ``(null)``/empty (no GRES).
    """
    spec = spec.strip()
    if spec in MISSING:
        return ()
    out: list[Gres] = []
    for token in split_top_level(spec):
        paren = ""
        m_paren = _PAREN_RE.match(token)
        if m_paren and m_paren.group(2) != "null":
            token, paren = m_paren.group(1), m_paren.group(2)
        parts = token.split(":")
        name = parts[0]
        if not name:
            raise ValueError(f"bad gres token {token!r}")
        gtype: str | None = None
        count: int | None = None
        rest = parts[1:]
        if rest:
            m = _COUNT_RE.match(rest[-1])
            if m:
                count = int(m.group(1)) * _MULT[m.group(2)]
                rest = rest[:-1]
            if rest:
                gtype = ":".join(rest)
                if gtype in MISSING:
                    gtype = None
        indices: tuple[int, ...] = ()
        if paren.startswith("IDX:"):
            idx = paren[4:]
            if idx not in MISSING:
                indices = tuple(expand_ranges(idx))
        if count is None:
            count = len(indices) if indices else 1
        if name == "gpu" and count > MAX_GPU_COUNT:
            raise BoundExceeded(f"gres token {token[:80]!r}: more than {MAX_GPU_COUNT} GPUs")
        out.append(Gres(name=name, type=gtype, count=count, indices=indices))
    return tuple(out)


def gpu_count(gres: Iterable[Gres]) -> int:
    return sum(g.count for g in gres if g.name == "gpu")


def _float(text: str) -> float | None:
    text = text.strip()
    if text in MISSING:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _int(text: str) -> int:
    value = _float(text)
    return int(value) if value is not None else 0


def parse_slurm_time(text: str) -> float | None:
    """``2026-11-22T02:15:56`` (SLURM_TIME_FORMAT=standard, controller local time) -> epoch."""
    text = text.strip()
    if text in MISSING:
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


# ---------------------------------------------------------------------------------------
# Parse functions, one per command output. Pure: text in, data out.
# Malformed lines are skipped and counted (returned as ``bad``), never raised.
# ---------------------------------------------------------------------------------------


def parse_version(text: str) -> str | None:
    """``slurm 22.05.8`` / ``slurm-wlm 22.05.8`` -> ``22.05.8``."""
    m = re.search(r"\b(\d+\.\d+(?:\.\d+)?(?:-\w+)?)\b", text)
    return m.group(1) if m else None


def _pipe_records(
    lines: Iterable[str], width: int, *, last_takes_rest: bool = True
) -> Iterator[tuple[str, ...] | None]:
    """The non-blank lines as ``width`` "|"-separated, stripped fields; None for a line
    with fewer (or, unless the last field takes the rest of the line, more)."""
    for line in lines:
        if not line.strip():
            continue
        fields = line.split("|", width - 1) if last_takes_rest else line.split("|")
        yield tuple(f.strip() for f in fields) if len(fields) == width else None


def parse_sinfo_nodes(text: str) -> tuple[list[NodeRow], int]:
    """Parse ``sinfo -h -N -O NodeList:|,PartitionName:|,...,Reason:``."""
    rows: list[NodeRow] = []
    bad = 0
    for fields in _pipe_records(text.splitlines(), 10):
        if fields is None:
            bad += 1
            continue
        node, part, state, cpus, amem, mem, gres, gres_used, ts, reason = fields
        cpu_parts = cpus.split("/")
        if not node or len(cpu_parts) != 4:
            bad += 1
            continue
        try:
            c_alloc, c_idle, c_other, c_total = (int(c) for c in cpu_parts)
            g_total = parse_gres(gres)
            g_used = parse_gres(gres_used)
        except ValueError:
            bad += 1
            continue
        rows.append(
            NodeRow(
                node=node,
                partition=part.rstrip("*"),
                state=state.lower(),
                cpu_alloc=c_alloc,
                cpu_idle=c_idle,
                cpu_other=c_other,
                cpu_total=c_total,
                mem_alloc=float(_int(amem)),
                mem_total=float(_int(mem)),
                gres=g_total,
                gres_used=g_used,
                reason_timestamp=parse_slurm_time(ts),
                reason=None if reason in MISSING else reason,
            )
        )
    return rows, bad


def parse_squeue(text: str) -> tuple[list[QueueRow], int]:
    """Parse ``squeue -h -a -r --states=all -o '%A|%i|%T|%P|%u|%a|%C|%D|%r'``.

    Lines are split on ``\n`` only (squeue's separator), not on the other characters
    ``str.splitlines`` knows, which a user's account string may contain.
    """
    rows: list[QueueRow] = []
    bad = 0
    for fields in _pipe_records(text.split("\n"), 9):
        if fields is None:
            bad += 1
            continue
        job_id, display, state, parts, user, account, cpus, nodes, reason = fields
        if not job_id or not state or not cpus.isdigit():
            bad += 1
            continue
        rows.append(
            QueueRow(
                job_id=job_id,
                job_id_display=display,
                state=state.upper(),
                partitions=tuple(p for p in parts.split(",") if p) or ("",),
                user=user,
                account="" if account in MISSING else account,
                cpus=int(cpus),
                nodes=_int(nodes),
                reason=reason,
            )
        )
    return rows, bad


def _user_name(value: str) -> str:
    """``root(0)`` -> ``root``; an unresolvable uid prints as ``4294967294(4294967294)``."""
    m = re.match(r"^([^()]*)\((\d+)\)$", value)
    return m.group(1) if m and m.group(1) else value


# --- scontrol show job -d -o ------------------------------------------------------------
#
# A record is one line of "Key=value" tokens in a fixed order (slurm_sprint_job_info):
#
#   JobId=N [ArrayJobId=N ArrayTaskId=S [ArrayTaskThrottle=N] | HetJobId=N HetJobOffset=N]
#   JobName=<free text>
#   UserId=u(uid) GroupId=g(gid) MCS_label=.. Priority=.. Account=.. .. JobState=.. ..
#   Partition=.. .. NodeList=.. .. JOB_GRES=..   Nodes=<hostlist> CPU_IDs=.. Mem=.. GRES=..
#   [  Nodes=.. CPU_IDs=.. Mem=.. GRES=..]... MinCPUsNode=..
#   MinMemory..= .. Features=.. .. Command=<free> WorkDir=<free> [Comment=<free>]
#   StdErr=<free> StdIn=<free> StdOut=<free> ...
#
# Values are not quoted or escaped, so user text (JobName, WorkDir, Comment, StdOut, ...) can
# hold " Key=value" and even a line break. Everything read here comes from the prefix up to
# JobName= and from the "head": the run of tokens from UserId= to MinCPUsNode=, which Slurm
# fills from its own data (user and group names, numbers, states, hostlists, GRES strings):
# none of its values has a space. The tail after MinCPUsNode= is never read.
#
# The head starts after JobName's free text, at a " UserId=" - but the name may itself contain
# " UserId=...". So every " UserId=" is tried as a start, and a start counts only if from there
# space-separated Key=value tokens, each key at most once (the per-node
# Nodes/CPU_IDs/Mem/GRES group excepted), lead to MinCPUsNode=. A start inside the job name
# runs into the real " UserId=" (a repeated key) unless the name holds a whole forged head; a
# start inside later free text needs the same. So a record has exactly one head unless free
# text forges a complete one: then it is "ambiguous" and left out (only its owner loses
# series). The per-node GRES groups are read only inside the head, after JOB_GRES=.
#
# A line break in free text can make the rest of that text a line of its own, a whole forged
# record. Such a record either repeats the id of a real record, readable or not (all records
# of that id are dropped: "duplicate"), or names a job that does not exist; text records are
# therefore exported only for jobs squeue lists, alive and for the same user (verify_jobs).

_JOB_START_RE = re.compile(
    r"JobId=([0-9]{1,10}) "
    r"(?:ArrayJobId=([0-9]{1,10}) ArrayTaskId=\S+ (?:ArrayTaskThrottle=[0-9]+ )?"
    r"|HetJobId=[0-9]{1,10} HetJobOffset=[0-9]+ )?"
    r"JobName="
)
_TOKEN_RE = re.compile(r"([A-Za-z][A-Za-z0-9_:/]*)=(\S*)")
# scrontab jobs print the one quoted value with spaces: a cron time spec, which has no "=".
_CRONTAB_RE = re.compile(r'(CrontabSpec)="([^"=]*)"')
_DETAIL_KEYS = ("Nodes", "CPU_IDs", "Mem", "GRES")
_HEAD_REQUIRED = ("Account", "JobState", "Partition")
_HEAD_START = " UserId="


@dataclass(frozen=True)
class _Head:
    fields: dict[str, str]
    segments: tuple[tuple[str, str], ...]  # (hostlist, GRES) of each per-node group


def _scan_head(line: str, pos: int) -> _Head | None:
    """The record head starting at ``pos`` (at "UserId="), or None if none starts there."""
    fields: dict[str, str] = {}
    segments: list[tuple[str, str]] = []
    detail = 0  # index in _DETAIL_KEYS of the next key of a per-node group; 0 = outside one
    seg_nodes = ""
    spaces = 1
    n = len(line)
    for _ in range(MAX_RECORD_TOKENS):
        m = _TOKEN_RE.match(line, pos)
        if m is not None and m.group(1) == "CrontabSpec" and m.group(2).startswith('"'):
            m = _CRONTAB_RE.match(line, pos)
        if m is None:
            return None
        key, value = m.group(1), m.group(2)
        if not fields and key != "UserId":
            return None
        if detail:
            if key != _DETAIL_KEYS[detail] or spaces != 1:
                return None
            if key == "GRES":
                segments.append((seg_nodes, value))
                detail = 0
            else:
                detail += 1
        elif key == "Nodes":
            if "JOB_GRES" not in fields or spaces < 2:
                return None
            seg_nodes, detail = value, 1
        elif key in _DETAIL_KEYS or key in fields:
            return None
        else:
            fields[key] = value
            if key == "MinCPUsNode":
                if any(k not in fields for k in _HEAD_REQUIRED):
                    return None
                return _Head(fields, tuple(segments))
        pos = m.end()
        start = pos
        while pos < n and line[pos] == " " and pos - start < 8:
            pos += 1
        spaces = pos - start
        if spaces == 0:
            return None
    return None


def _gpu_alloc(gres_value: str) -> tuple[int, tuple[int, ...]] | None:
    """(GPU count, indices) of one node's GRES string, None without GPUs."""
    gres = [g for g in parse_gres(gres_value) if g.name == "gpu"]
    if not gres:
        return None
    indices = tuple(sorted({i for g in gres for i in g.indices}))
    if len(indices) > MAX_GRES_INDICES:
        raise BoundExceeded("too many GPU indices on one node")
    return sum(g.count for g in gres), indices


def _job_allocations(
    segments: Iterable[tuple[str, str]], budget: HostBudget
) -> tuple[NodeAlloc, ...]:
    """NodeAllocs of per-node groups (hostlist, GRES); hostlists bounded by ``budget``."""
    allocs: list[NodeAlloc] = []
    for hostlist, gres_value in segments:
        gpus = _gpu_alloc(gres_value)
        if gpus is None:
            continue
        for node in expand_hostlist(hostlist, budget):
            allocs.append(NodeAlloc(node=node, gpus=gpus[0], indices=gpus[1]))
    return tuple(allocs)


def _dedupe(jobs: list[JobDetail], result: JobList, seen: Counter | None = None) -> None:
    """Append ``jobs`` to ``result`` except ids seen more than once (all of those are dropped).

    ``seen`` counts the ids of every record, also of those left out for another reason: a
    forged record must not pass because the real one of its id was unreadable.
    """
    seen = seen if seen is not None else Counter(j.job_id for j in jobs)
    for job in jobs:
        if seen[job.job_id] > 1:
            result.rejected["duplicate"] += 1
        else:
            result.append(job)


def parse_scontrol_jobs(text: str) -> tuple[JobList, int]:
    """Parse ``scontrol show job -d -o`` (see the layout above); bad = records left out.

    A per-node group is ``Nodes=<hostlist> CPU_IDs=... Mem=... GRES=<gres>``; its hostlist
    may name several nodes that share the same CPU ids and GRES indices. Finished jobs keep
    their groups with an empty ``GRES=``. Only RUNNING jobs get their GPUs read.
    """
    result = JobList(source="text")
    budget = HostBudget()
    parsed: list[JobDetail] = []
    starts: Counter = Counter()  # job ids of all lines that start a record
    # "\n" only: scontrol ends records with it; str.splitlines would also split on
    # characters (\x1c, \u2028, ...) that a job name may contain.
    for raw in text.split("\n"):
        line = raw.rstrip(" \r")
        if not line or line.startswith("No jobs in the system"):
            continue
        start = _JOB_START_RE.match(line)
        if start is None:
            result.rejected["malformed"] += 1
            continue
        starts[start.group(1)] += 1
        heads = []
        pos = line.find(_HEAD_START, start.end() - 1)
        while pos >= 0:
            head = _scan_head(line, pos + 1)
            if head is not None:
                heads.append(head)
                if len(heads) > 1:
                    break
            pos = line.find(_HEAD_START, pos + 1)
        if len(heads) != 1:
            result.rejected["ambiguous" if heads else "malformed"] += 1
            continue
        fields = heads[0].fields
        job_id = start.group(1)
        state = fields["JobState"].upper()
        try:
            allocs = _job_allocations(heads[0].segments, budget) if state == "RUNNING" else ()
        except BoundExceeded:
            result.rejected["bounds"] += 1
            continue
        except ValueError:
            result.rejected["malformed"] += 1
            continue
        account = fields["Account"]
        array_id = start.group(2)
        parsed.append(
            JobDetail(
                job_id=job_id,
                state=state,
                user=_user_name(fields["UserId"]),
                account="" if account in MISSING else account,
                partition=fields["Partition"],
                array_job_id=array_id if array_id and array_id != job_id else None,
                allocations=allocs,
            )
        )
    _dedupe(parsed, result, starts)
    return result, sum(result.rejected.values())


# --- scontrol show job -d --json (data_parser) --------------------------------------------
#
# Read tolerantly across schema versions: v0.0.38 (22.05 squeue --json) prints plain numbers
# and job_state "RUNNING"; v0.0.40+ print {"set", "infinite", "number"} and job_state
# ["RUNNING", <flags>]. gres_detail holds one GRES string per allocated node: the node is
# job_resources.nodes.allocation[i].name (v0.0.42, 24.11), else the i-th host of the job's
# hostlist (scontrol pairs them that way when it prints the text form).

# job_state flags that scontrol's text form prints instead of the base state, in its order.
_JSON_STATE_FLAGS = ("COMPLETING", "CONFIGURING", "STOPPED", "SIGNALING")


def _json_number(value: object) -> int | None:
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _json_text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _json_state(value: object) -> str:
    if isinstance(value, str):
        return value.upper()
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        states = [v.upper() for v in value]
        return next((f for f in _JSON_STATE_FLAGS if f in states), states[0])
    raise ValueError("job_state is neither a string nor a list of strings")


def _json_hosts(job: Mapping, budget: HostBudget) -> list[str]:
    """The job's allocated nodes in gres_detail order.

    v0.0.42 lists them as job_resources.nodes.allocation[i].name; older schemas give a
    hostlist (job_resources.nodes, else nodes), expanded in order.
    """
    resources = job.get("job_resources")
    nodes = resources.get("nodes") if isinstance(resources, dict) else None
    allocation = nodes.get("allocation") if isinstance(nodes, dict) else None
    if isinstance(allocation, list) and allocation:
        if len(allocation) > MAX_HOSTS_PER_EXPRESSION:
            raise BoundExceeded("job_resources.nodes.allocation beyond the hostlist bound")
        names = [a.get("name") if isinstance(a, dict) else None for a in allocation]
        if not all(isinstance(n, str) and n for n in names):
            raise ValueError("job_resources.nodes.allocation without node names")
        budget.take(len(names))
        return names  # type: ignore[return-value]
    if isinstance(nodes, dict):
        nodes = nodes.get("list")
    hostlist = nodes if isinstance(nodes, str) and nodes else _json_text(job.get("nodes"))
    return expand_hostlist(hostlist, budget)


def _json_job(job: object, budget: HostBudget) -> JobDetail:
    if not isinstance(job, dict):
        raise ValueError("a job is not an object")
    job_id = _json_number(job.get("job_id"))
    if job_id is None or job_id <= 0:
        raise ValueError("no job_id")
    state = _json_state(job.get("job_state"))
    user = _json_text(job.get("user_name"))
    if not user:
        uid = _json_number(job.get("user_id"))
        user = str(uid) if uid is not None else ""
    allocs: tuple[NodeAlloc, ...] = ()
    detail = job.get("gres_detail")
    if state == "RUNNING" and detail:
        if not isinstance(detail, list) or not all(isinstance(d, str) for d in detail):
            raise ValueError("gres_detail is not a list of strings")
        if len(detail) > MAX_HOSTS_PER_EXPRESSION:
            raise BoundExceeded("gres_detail longer than the hostlist bound")
        hosts = _json_hosts(job, budget)
        found = []
        for i, gres_value in enumerate(detail[: len(hosts)]):
            gpus = _gpu_alloc(gres_value)
            if gpus is not None:
                found.append(NodeAlloc(node=hosts[i], gpus=gpus[0], indices=gpus[1]))
        allocs = tuple(found)
    account = _json_text(job.get("account"))
    array_id = _json_number(job.get("array_job_id"))
    return JobDetail(
        job_id=str(job_id),
        state=state,
        user=user,
        account="" if account in MISSING else account,
        partition=_json_text(job.get("partition")),
        array_job_id=str(array_id) if array_id and array_id != job_id else None,
        allocations=allocs,
    )


def parse_scontrol_jobs_json(text: str) -> tuple[JobList, int]:
    """Parse ``scontrol show job -d --json``; bad = jobs left out (or 1 for unusable output)."""
    result = JobList(source="json")
    try:
        doc = json.loads(text)
    except ValueError:
        result.rejected["malformed"] += 1
        return result, 1
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        result.rejected["malformed"] += 1
        return result, 1
    budget = HostBudget()
    parsed: list[JobDetail] = []
    for job in jobs:
        try:
            parsed.append(_json_job(job, budget))
        except BoundExceeded:
            result.rejected["bounds"] += 1
        except (ValueError, TypeError, AttributeError):
            result.rejected["malformed"] += 1
    _dedupe(parsed, result)
    return result, sum(result.rejected.values())


def verify_jobs(jobs: JobList, queue: list[QueueRow] | None) -> tuple[list[JobDetail], Counter]:
    """The jobs whose GPUs may be exported, and why others were left out (this snapshot).

    JSON records are taken as they are. A text record with GPUs is kept only if squeue lists
    its job id as alive (not in a terminal state) for the same user: a forged record (a line
    break in free text) names a job id squeue does not have, or one that is then a duplicate.
    """
    rejected: Counter = Counter()
    if jobs.source != "text":
        return list(jobs), rejected
    alive = {row.job_id: row.user for row in (queue or ()) if row.state not in TERMINAL_STATES}
    kept = []
    for job in jobs:
        if job.allocations:
            user = alive.get(job.job_id)
            if user is None:
                rejected["not_in_squeue"] += 1
                continue
            if user != job.user:
                rejected["user_mismatch"] += 1
                continue
        kept.append(job)
    return kept, rejected


_SDIAG_TOP = {
    "Server thread count": "threads",
    "Agent queue size": "queue_size",
    "Agent count": "agent_count",
    "Agent thread count": "agent_thread_count",
    "DBD Agent queue size": "dbd_queue_size",
    "Jobs submitted": "jobs_submitted",
    "Jobs started": "jobs_started",
    "Jobs completed": "jobs_completed",
    "Jobs canceled": "jobs_canceled",
    "Jobs failed": "jobs_failed",
    "Jobs pending": "jobs_pending",
    "Jobs running": "jobs_running",
}
_SDIAG_MAIN = {
    "Last cycle": "last_cycle",
    "Max cycle": "max_cycle",
    "Total cycles": "total_cycles",
    "Mean cycle": "mean_cycle",
    "Mean depth cycle": "mean_depth_cycle",
    "Cycles per minute": "cycle_per_minute",
    "Last queue length": "last_queue_length",
}
_SDIAG_BACKFILL = {
    "Total backfilled jobs (since last slurm start)": "backfilled_jobs_since_start",
    "Total backfilled jobs (since last stats cycle start)": "backfilled_jobs_since_cycle",
    "Total backfilled heterogeneous job components": "backfilled_heterogeneous",
    "Total cycles": "backfill_total_cycles",
    "Last cycle": "backfill_last_cycle",
    "Max cycle": "backfill_max_cycle",
    "Mean cycle": "backfill_mean_cycle",
    "Last depth cycle": "backfill_last_depth_cycle",
    "Depth Mean": "backfill_depth_mean",
    "Last queue length": "backfill_last_queue_length",
    "Queue length mean": "backfill_queue_length_mean",
}
# sdiag's section headings (lower case, as a line starts) and the section each opens.
_SDIAG_SECTIONS = (
    ("main schedule statistics", "main"),
    ("backfilling stats", "backfill"),
    ("remote procedure call statistics by message type", "rpc_type"),
    ("remote procedure call statistics by user", "rpc_user"),
    ("pending rpc statistics", "other"),
    ("latency for", "other"),
)
_RPC_RE = re.compile(r"^\s*(\S+)\s*\(\s*(\d+)\)\s*count:(\d+)\s+ave_time:(\d+)\s+total_time:(\d+)")


def parse_sdiag(text: str) -> tuple[Sdiag, int]:
    """Parse plain ``sdiag`` (22.05 .. 25.x print the same ``Label: value`` lines)."""
    out = Sdiag()
    bad = 0
    section = "top"
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("*"):
            continue
        low = line.lower()
        heading = next((name for start, name in _SDIAG_SECTIONS if low.startswith(start)), None)
        if heading is not None:
            section = heading
            continue
        if section in ("rpc_type", "rpc_user"):
            m = _RPC_RE.match(line)
            if m:
                target = out.rpc_by_type if section == "rpc_type" else out.rpc_by_user
                target[m.group(1)] = (float(m.group(3)), float(m.group(4)), float(m.group(5)))
            continue
        if ":" not in line:
            continue
        label, _, value = line.partition(":")
        table = {"top": _SDIAG_TOP, "main": _SDIAG_MAIN, "backfill": _SDIAG_BACKFILL}.get(
            section, {}
        )
        key = table.get(label.strip())
        if key is None:
            continue
        number = _float(value.split()[0]) if value.split() else None
        if number is None:
            bad += 1
            continue
        out.values[key] = number
    return out, bad


def parse_sshare(text: str) -> tuple[list[ShareRow], int]:
    """Parse ``sshare -a -P -n -o Account,User,RawShares,NormShares,RawUsage,NormUsage,FairShare``.

    Without slurmdbd (no associations) sshare prints nothing and exits 0.
    """
    rows: list[ShareRow] = []
    bad = 0
    for fields in _pipe_records(text.splitlines(), 7, last_takes_rest=False):
        if fields is None:
            bad += 1
            continue
        account, user = fields[0], fields[1]
        if not account:
            bad += 1
            continue
        rows.append(
            ShareRow(
                account=account,
                user=user,
                raw_shares=_float(fields[2]),  # "parent" -> None
                norm_shares=_float(fields[3]),
                raw_usage=_float(fields[4]),
                norm_usage=_float(fields[5]),
                fairshare=_float(fields[6]),
            )
        )
    return rows, bad


PARSERS: dict[str, Callable[[str], tuple[object, int]]] = {
    "sinfo_version": lambda t: (parse_version(t), 0),
    "sinfo_nodes": parse_sinfo_nodes,
    "squeue": parse_squeue,
    "scontrol_jobs": parse_scontrol_jobs,
    "scontrol_jobs_json": parse_scontrol_jobs_json,
    "sdiag": parse_sdiag,
    "sshare": parse_sshare,
}


# ---------------------------------------------------------------------------------------
# Metric families and text exposition (pure)
# ---------------------------------------------------------------------------------------

Labels = tuple[tuple[str, str], ...]


@dataclass
class Family:
    name: str
    type: str
    help: str
    samples: dict[Labels, float] = field(default_factory=dict)

    def set(self, value: float, **labels: str) -> None:
        self.samples[tuple(sorted(labels.items()))] = float(value)

    def add(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.samples[key] = self.samples.get(key, 0.0) + float(value)


class Registry:
    """Ordered collection of families, created on first use."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}

    def family(self, name: str, help_text: str, mtype: str = "gauge") -> Family:
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = Family(name, mtype, help_text)
        return fam

    def gauge(self, name: str, help_text: str, value: float, **labels: str) -> None:
        self.family(name, help_text).set(value, **labels)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def render(families: Iterable[Family]) -> str:
    """Prometheus text exposition format 0.0.4."""
    out: list[str] = []
    for fam in families:
        out.append(f"# HELP {fam.name} {_escape_help(fam.help)}")
        out.append(f"# TYPE {fam.name} {fam.type}")
        for labels, value in fam.samples.items():
            if labels:
                body = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
                out.append(f"{fam.name}{{{body}}} {_format_value(value)}")
            else:
                out.append(f"{fam.name} {_format_value(value)}")
    return "\n".join(out) + "\n"


def node_state_bucket(state: str) -> str:
    base = state.lower().rstrip("*~#!%$@^-+")
    for name, prefixes in NODE_STATE_BUCKETS:
        if base.startswith(prefixes):
            return name
    return "other"


def node_unavailable(state: str) -> bool:
    return state.lower().startswith(UNAVAILABLE_PREFIXES) or state.endswith("*")


def _unique_nodes(rows: Iterable[NodeRow]) -> list[NodeRow]:
    seen: dict[str, NodeRow] = {}
    for row in rows:
        seen.setdefault(row.node, row)
    return list(seen.values())


# NodeRow's CPU counts (cpu_<kind>) and the word their metrics' help text uses.
CPU_COUNTS = (("alloc", "Allocated"), ("idle", "Idle"), ("other", "Other"), ("total", "Total"))


def _cpus(row: NodeRow, kind: str) -> int:
    return int(getattr(row, f"cpu_{kind}"))


def _gpu_split(rows: list[NodeRow]) -> tuple[int, int, int]:
    """GPUs (allocated, configured, unallocated on unavailable nodes) over ``rows``."""
    alloc = sum(gpu_count(r.gres_used) for r in rows)
    total = sum(gpu_count(r.gres) for r in rows)
    other = sum(
        max(0, gpu_count(r.gres) - gpu_count(r.gres_used))
        for r in rows
        if node_unavailable(r.state)
    )
    return alloc, total, other


def add_node_metrics(reg: Registry, rows: list[NodeRow]) -> None:
    """Node, partition, cluster CPU/memory/GPU metrics from sinfo -N rows."""
    for row in rows:
        lab = {"node": row.node, "status": row.state, "partition": row.partition}
        for kind, what in CPU_COUNTS:
            reg.gauge(f"slurm_node_cpu_{kind}", f"{what} CPUs per node", _cpus(row, kind), **lab)
        reg.gauge("slurm_node_mem_alloc", "Allocated memory per node (MB)", row.mem_alloc, **lab)
        reg.gauge("slurm_node_mem_total", "Total memory per node (MB)", row.mem_total, **lab)
        reg.gauge("slurm_node_status", "Node state per partition (always 1)", 1, **lab)
        used = {g.gres_type: g.count for g in row.gres_used}
        for g in row.gres:
            glab = {**lab, "gres_type": g.gres_type}
            reg.gauge("slurm_node_gres_total", "Configured GRES per node", g.count, **glab)
            reg.gauge(
                "slurm_node_gres_used", "Allocated GRES per node", used.get(g.gres_type, 0), **glab
            )

    part_names = sorted({r.partition for r in rows})
    for part in part_names:
        prows = [r for r in rows if r.partition == part]
        buckets = dict.fromkeys(NODE_STATE_NAMES, 0)
        for r in prows:
            buckets[node_state_bucket(r.state)] += 1
        for bucket, count in buckets.items():
            reg.gauge(f"slurm_nodes_{bucket}", f"Nodes in state {bucket}", count, partition=part)
        for kind, what in CPU_COUNTS:
            reg.gauge(
                f"slurm_partition_cpus_{what.lower()}",
                f"{what} CPUs for partition",
                sum(_cpus(r, kind) for r in prows),
                partition=part,
            )
        g_alloc, g_total, g_other = _gpu_split(prows)
        reg.gauge(
            "slurm_partition_gpus_allocated",
            "Allocated GPUs for partition",
            g_alloc,
            partition=part,
        )
        reg.gauge(
            "slurm_partition_gpus_idle",
            "Idle GPUs (on available nodes) for partition",
            max(0, g_total - g_alloc - g_other),
            partition=part,
        )

    nodes = _unique_nodes(rows)
    reg.gauge("slurm_nodes_total", "Total number of nodes", len(nodes))
    for kind, what in CPU_COUNTS:
        reg.gauge(f"slurm_cpus_{kind}", f"{what} CPUs", sum(_cpus(r, kind) for r in nodes))
    g_alloc, g_total, g_other = _gpu_split(nodes)
    reg.gauge("slurm_gpus_alloc", "Allocated GPUs", g_alloc)
    reg.gauge(
        "slurm_gpus_idle", "Idle GPUs on available nodes", max(0, g_total - g_alloc - g_other)
    )
    reg.gauge("slurm_gpus_other", "Unallocated GPUs on unavailable nodes", g_other)
    reg.gauge("slurm_gpus_total", "Total GPUs", g_total)
    reg.gauge(
        "slurm_gpus_utilization", "Allocated GPUs / total GPUs", g_alloc / g_total if g_total else 0
    )

    for row in nodes:
        if row.reason is None:
            continue
        reg.gauge(
            "slurm_node_state_reason_info",
            "Node with a reason set (drained, down, ...); always 1",
            1,
            node=row.node,
            state=row.state,
            reason=row.reason,
        )
        # Slurm 24.11 keeps the last reason on a resumed node (22.05 cleared it): a
        # drain reason is one only while the node cannot take jobs.
        if not node_unavailable(row.state):
            continue
        reg.gauge(
            "slurm_node_drain_reason_info",
            "Drain/down reason of a node; always 1",
            1,
            node=row.node,
            reason=row.reason,
        )
        if row.reason_timestamp is not None:
            reg.gauge(
                "slurm_node_drain_since_timestamp_seconds",
                "Unix time at which the node reason was set",
                row.reason_timestamp,
                node=row.node,
            )


def add_queue_metrics(reg: Registry, rows: list[QueueRow]) -> None:
    """Job counts by state, partition, user, account, pending reason (from squeue)."""
    totals = {suffix: 0 for suffix in JOB_STATES.values()}
    cores_running = cores_pending = 0
    for row in rows:
        suffix = JOB_STATES.get(row.state)
        if suffix is None:
            continue
        totals[suffix] += 1
        if suffix == "running":
            cores_running += row.cpus
        elif suffix == "pending":
            cores_pending += row.cpus
        for part in row.partitions:
            lab = {"user": row.user, "partition": part}
            if suffix == "pending":
                lab["reason"] = row.reason
            reg.family(f"slurm_queue_{suffix}", f"Jobs in state {suffix}").add(1, **lab)
            reg.family(f"slurm_cores_{suffix}", f"CPUs of jobs in state {suffix}").add(
                row.cpus, **lab
            )
            if suffix in ("pending", "running"):
                reg.family(
                    f"slurm_partition_jobs_{suffix}", f"{suffix.capitalize()} jobs for partition"
                ).add(1, partition=part)
        if suffix == "pending":
            reg.family("slurm_jobs_pending_by_reason", "Pending jobs by reason").add(
                1, reason=row.reason
            )
        if suffix in ("pending", "running", "suspended"):
            reg.family(
                f"slurm_account_jobs_{suffix}", f"{suffix.capitalize()} jobs for account"
            ).add(1, account=row.account)
            reg.family(f"slurm_user_jobs_{suffix}", f"{suffix.capitalize()} jobs for user").add(
                1, user=row.user
            )
        if suffix == "running":
            reg.family("slurm_account_cpus_running", "Running CPUs for account").add(
                row.cpus, account=row.account
            )
            reg.family("slurm_user_cpus_running", "Running CPUs for user").add(
                row.cpus, user=row.user
            )
    for suffix, count in totals.items():
        reg.gauge(f"slurm_jobs_{suffix}", f"Total jobs in state {suffix}", count)
    reg.gauge("slurm_jobs_cores_running", "Total CPUs of running jobs", cores_running)
    reg.gauge("slurm_jobs_cores_pending", "Total CPUs requested by pending jobs", cores_pending)


def add_job_gpu_metrics(
    reg: Registry,
    jobs: list[JobDetail],
    max_series: int,
    max_index_series: int = DEFAULT_MAX_GPU_INDEX_SERIES,
) -> tuple[int, int]:
    """Per running job per node GPU series, capped.

    Returns (job, node) pairs dropped by ``max_series`` and GPU index series dropped by
    ``max_index_series`` (those of dropped pairs are not counted again).
    """
    running = [j for j in jobs if j.state == "RUNNING" and j.allocations]
    running.sort(key=lambda j: (int(j.job_id), j.job_id))
    alloc_fam = reg.family("slurm_job_gpus_allocated", "GPUs allocated to a running job on a node")
    index_fam = reg.family(
        "slurm_job_gpu_index_info", "GPU index (Slurm gres.conf order) held by a job; always 1"
    )
    emitted = dropped = index_emitted = index_dropped = 0
    for job in running:
        reg.family("slurm_account_gpus_running", "Running GPUs for account").add(
            job.gpus, account=job.account
        )
        reg.family("slurm_user_gpus_running", "Running GPUs for user").add(job.gpus, user=job.user)
        for alloc in job.allocations:
            if emitted >= max_series:
                dropped += 1
                continue
            emitted += 1
            alloc_fam.set(
                alloc.gpus,
                job_id=job.job_id,
                user=job.user,
                account=job.account,
                partition=job.partition,
                node=alloc.node,
            )
            for idx in alloc.indices:
                if index_emitted >= max_index_series:
                    index_dropped += 1
                    continue
                index_emitted += 1
                index_fam.set(1, job_id=job.job_id, node=alloc.node, gpu=str(idx))
    reg.gauge("slurm_exporter_job_series", "Running (job, node) pairs exported", emitted)
    reg.gauge(
        "slurm_exporter_gpu_index_series", "slurm_job_gpu_index_info series exported", index_emitted
    )
    return dropped, index_dropped


def add_sdiag_metrics(reg: Registry, sd: Sdiag) -> None:
    v = sd.values
    # sdiag value -> help text; the metric is slurm_scheduler_<value> (counters: ..._total).
    gauges = {
        "threads": "Number of scheduler threads",
        "queue_size": "Length of the scheduler (agent) queue",
        "dbd_queue_size": "Length of the DBD agent queue",
        "last_cycle": "Last scheduler cycle time (microseconds)",
        "mean_cycle": "Mean scheduler cycle time (microseconds)",
        "cycle_per_minute": "Scheduler cycles per minute",
        "backfill_last_cycle": "Last backfill cycle time (microseconds)",
        "backfill_mean_cycle": "Mean backfill cycle time (microseconds)",
        "backfill_depth_mean": "Mean backfill depth",
        "jobs_submitted": "Jobs submitted since stats reset",
        "jobs_started": "Jobs started since stats reset",
        "jobs_completed": "Jobs completed since stats reset",
        "jobs_canceled": "Jobs canceled since stats reset",
        "jobs_failed": "Jobs failed since stats reset",
    }
    counters = {
        "backfilled_jobs_since_start": "Jobs started by backfill since slurmctld start",
        "backfilled_jobs_since_cycle": "Jobs started by backfill since the last stats cycle",
        "backfilled_heterogeneous": "Heterogeneous job components started by backfill",
    }
    for key, help_text in gauges.items():
        if key in v:
            reg.gauge(f"slurm_scheduler_{key}", help_text, v[key])
    for key, help_text in counters.items():
        if key in v:
            reg.family(f"slurm_scheduler_{key}_total", help_text, "counter").set(v[key])
    for op, (count, avg, total) in sorted(sd.rpc_by_type.items()):
        reg.gauge("slurm_rpc_stats", "RPC count by message type", count, operation=op)
        reg.gauge("slurm_rpc_stats_avg_time", "RPC average time (microseconds)", avg, operation=op)
        reg.gauge(
            "slurm_rpc_stats_total_time", "RPC total time (microseconds)", total, operation=op
        )
    for user, (count, avg, total) in sorted(sd.rpc_by_user.items()):
        reg.gauge("slurm_user_rpc_stats", "RPC count by user", count, user=user)
        reg.gauge("slurm_user_rpc_stats_avg_time", "RPC average time by user", avg, user=user)
        reg.gauge("slurm_user_rpc_stats_total_time", "RPC total time by user", total, user=user)


def add_sshare_metrics(reg: Registry, rows: list[ShareRow]) -> None:
    for row in rows:
        if row.raw_shares is None and row.fairshare is None:
            continue  # "parent" lines
        if row.user:
            prefix, lab = "slurm_user_fairshare", {"account": row.account, "user": row.user}
        else:
            prefix, lab = "slurm_account_fairshare", {"account": row.account}
        for suffix, value in (
            ("", row.fairshare),
            ("_raw_shares", row.raw_shares),
            ("_norm_shares", row.norm_shares),
            ("_raw_usage_cpu_seconds", row.raw_usage),
            ("_norm_usage", row.norm_usage),
        ):
            if value is not None:
                reg.gauge(
                    prefix + suffix, f"sshare {suffix.strip('_') or 'fairshare'}", value, **lab
                )


@dataclass
class CommandStatus:
    """What the exporter knows about one command, kept across cycles."""

    duration: float = 0.0
    success: bool = False
    last_success: float | None = None
    result: object = None
    errors: dict[str, int] = field(default_factory=dict)
    parse_errors: int = 0


def build_families(
    status: Mapping[str, CommandStatus],
    now: float,
    max_stale: float,
    max_job_series: int,
    dropped_total: int,
    last_collect: float | None,
    collect_duration: float,
    max_gpu_index_series: int = DEFAULT_MAX_GPU_INDEX_SERIES,
    index_dropped_total: int = 0,
) -> tuple[list[Family], int, int]:
    """All families for one snapshot.

    Returns (families, (job, node) pairs dropped, GPU index series dropped in this snapshot).
    """
    reg = Registry()

    def fresh(name: str) -> object:
        st = status.get(name)
        if st is None or st.result is None or st.last_success is None:
            return None
        if name in NEVER_STALE and not st.success:
            return None
        if now - st.last_success > max_stale:
            return None
        return st.result

    def add(name: str, kind: type, add_metrics: Callable[[Registry, Any], None]) -> object:
        """Add the metrics of command ``name``'s fresh result when it is a ``kind``."""
        result = fresh(name)
        if isinstance(result, kind):
            add_metrics(reg, result)
        return result

    up = all(status.get(c) is not None and status[c].success for c in UP_COMMANDS)
    reg.gauge("slurm_up", "1 if the last collection reached slurmctld (sinfo and squeue)", int(up))

    version = fresh("sinfo_version")
    if isinstance(version, str):
        reg.gauge("slurm_info", "Slurm version", 1, type="general", version=version)
    add("sinfo_nodes", list, add_node_metrics)
    queue = add("squeue", list, add_queue_metrics)
    dropped = index_dropped = 0
    jobs = fresh("scontrol_jobs")
    if isinstance(jobs, JobList):
        kept, rejected = verify_jobs(jobs, queue if isinstance(queue, list) else None)
        dropped, index_dropped = add_job_gpu_metrics(
            reg, kept, max_job_series, max_gpu_index_series
        )
        reg.gauge(
            "slurm_exporter_job_source_info",
            "How job records were read (text: scontrol -o, json: scontrol --json); always 1",
            1,
            source=jobs.source,
        )
        rejected.update(jobs.rejected)
        for reason in REJECT_REASONS:
            reg.gauge(
                "slurm_exporter_job_records_rejected",
                "Job records of the last collection left out of the per-job series, by reason",
                rejected[reason],
                reason=reason,
            )
    add("sdiag", Sdiag, add_sdiag_metrics)
    add("sshare", list, add_sshare_metrics)

    for name, st in sorted(status.items()):
        reg.gauge(
            "slurm_exporter_command_duration_seconds",
            "Wall time of the last run of a Slurm command",
            round(st.duration, 6),
            command=name,
        )
        reg.gauge(
            "slurm_exporter_command_success",
            "1 if the last run of a Slurm command succeeded",
            int(st.success),
            command=name,
        )
        if st.last_success is not None:
            reg.gauge(
                "slurm_exporter_command_last_success_timestamp_seconds",
                "Unix time of the last successful run of a Slurm command",
                st.last_success,
                command=name,
            )
        for reason, count in sorted(st.errors.items()):
            reg.family(
                "slurm_exporter_command_errors_total",
                "Failed runs of a Slurm command by reason",
                "counter",
            ).set(count, command=name, reason=reason)
        reg.family(
            "slurm_exporter_parse_errors_total",
            "Output lines of a Slurm command that could not be parsed",
            "counter",
        ).set(st.parse_errors, command=name)
    reg.family(
        "slurm_exporter_job_series_dropped_total",
        "Per-job (job, node) series not exported because of --max-job-series",
        "counter",
    ).set(dropped_total + dropped)
    reg.family(
        "slurm_exporter_gpu_index_series_dropped_total",
        "slurm_job_gpu_index_info series not exported because of --max-gpu-index-series",
        "counter",
    ).set(index_dropped_total + index_dropped)
    if last_collect is not None:
        reg.gauge(
            "slurm_exporter_last_collect_timestamp_seconds",
            "Unix time the last collection finished",
            last_collect,
        )
    reg.gauge(
        "slurm_exporter_collect_duration_seconds",
        "Wall time of the last collection",
        round(collect_duration, 6),
    )
    return list(reg.families.values()), dropped, index_dropped


# ---------------------------------------------------------------------------------------
# Per-shard selection (pure): which series the scrape of one Prometheus shard gets
# ---------------------------------------------------------------------------------------

# A sharded site scrapes /metrics?shard=K (the series of the nodes the node map gives to
# shard K) and exactly one shard adds cluster=1 (every series without a node label, and
# the nodes no shard owns). /metrics without a query serves everything (standalone).
# Shard ids are the inventory plugin's (0, 1, ...); the map is written by the
# slurm_exporter role from the same plan that picks each shard's node targets.
SHARD_ID = re.compile(r"[0-9]{1,6}")
MAX_NODE_MAP_BYTES = 32 * 1024 * 1024
MAX_NODE_MAP_SHARDS = 4096
MAX_NODE_MAP_NODES = MAX_HOSTS_PER_SCRAPE
MAX_NODE_NAME = 255
# Key of the cluster-level part in split_families(): series without a node label, and
# those of nodes the map gives to no shard (so nothing is lost).
CLUSTER_PART = ""


class NodeMapError(ValueError):
    """The node map file is unreadable or not in the expected shape."""


@dataclass(frozen=True)
class NodeMapData:
    """One version of the node map: node -> shard id, and every shard id it names."""

    node_shard: Mapping[str, str] = field(default_factory=dict)
    shards: frozenset[str] = frozenset()


def _valid_node_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_NODE_NAME
        and name.isprintable()
        and not any(c.isspace() for c in name)
    )


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are all different (a shard named twice is an error)."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key[:40]!r} given twice")
        out[key] = value
    return out


def parse_node_map(text: str) -> NodeMapData:
    """``{"shards": {"0": ["gpu001", ...], "1": [...]}}`` -> NodeMapData.

    Bounded: at most MAX_NODE_MAP_SHARDS shard ids (digits) and MAX_NODE_MAP_NODES node
    names of at most MAX_NODE_NAME printable characters; a node in two shards is an error.
    """
    if len(text) > MAX_NODE_MAP_BYTES:
        raise NodeMapError(f"larger than {MAX_NODE_MAP_BYTES} bytes")
    try:
        doc = json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise NodeMapError("not JSON: nested too deeply") from None
    except ValueError as exc:
        raise NodeMapError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"shards"}:
        raise NodeMapError('expected an object with the one key "shards"')
    shards = doc["shards"]
    if not isinstance(shards, dict):
        raise NodeMapError('"shards" must map shard ids to lists of node names')
    if len(shards) > MAX_NODE_MAP_SHARDS:
        raise NodeMapError(f"more than {MAX_NODE_MAP_SHARDS} shards")
    node_shard: dict[str, str] = {}
    total = 0
    for shard, nodes in shards.items():
        if not SHARD_ID.fullmatch(shard):
            raise NodeMapError(f"shard id {shard[:40]!r} is not 1 to 6 digits")
        if not isinstance(nodes, list):
            raise NodeMapError(f"shard {shard}: expected a list of node names")
        total += len(nodes)
        if total > MAX_NODE_MAP_NODES:
            raise NodeMapError(f"more than {MAX_NODE_MAP_NODES} nodes")
        for node in nodes:
            if not _valid_node_name(node):
                raise NodeMapError(f"shard {shard}: invalid node name {str(node)[:40]!r}")
            other = node_shard.setdefault(node, shard)
            if other != shard:
                raise NodeMapError(f"node {node!r} is in shards {other} and {shard}")
    return NodeMapData(node_shard, frozenset(shards))


@dataclass(frozen=True)
class Selection:
    """What one scrape asks for: the nodes of one shard, the cluster-level part, or both."""

    shard: str | None = None
    cluster: bool = False


def parse_selection(query: str) -> Selection | None:
    """A /metrics query string -> Selection, or None (everything) when it is empty.

    Only ``shard=<digits>`` and ``cluster=0|1``, each at most once; anything else is a
    ValueError (answered 400).
    """
    if not query:
        return None
    if len(query) > 256:
        raise ValueError("query too long")
    seen: dict[str, str] = {}
    for part in query.split("&"):
        key, sep, value = part.partition("=")
        if not sep or key not in ("shard", "cluster"):
            raise ValueError("the only parameters are shard=<id> and cluster=0|1")
        if key in seen:
            raise ValueError(f"{key} given twice")
        seen[key] = value
    shard = seen.get("shard")
    if shard is not None and not SHARD_ID.fullmatch(shard):
        raise ValueError("shard must be 1 to 6 digits")
    cluster = seen.get("cluster", "0")
    if cluster not in ("0", "1"):
        raise ValueError("cluster must be 0 or 1")
    if shard is None and cluster == "0":
        raise ValueError("select a shard, the cluster part (cluster=1), or both")
    return Selection(shard=shard, cluster=cluster == "1")


def _node_of(labels: Labels) -> str | None:
    for key, value in labels:
        if key == "node":
            return value
    return None


Parts = dict[str, dict[str, dict[Labels, float]]]  # part -> family name -> samples


def split_families(families: Iterable[Family], node_shard: Mapping[str, str]) -> Parts:
    """Samples by part: a shard id for a node the map places, else CLUSTER_PART. O(samples)."""
    parts: Parts = {}
    for fam in families:
        for labels, value in fam.samples.items():
            node = _node_of(labels)
            part = CLUSTER_PART if node is None else node_shard.get(node, CLUSTER_PART)
            parts.setdefault(part, {}).setdefault(fam.name, {})[labels] = value
    return parts


def assemble(families: Iterable[Family], parts: Parts, selection: Selection) -> list[Family]:
    """The families of one selection, in the order of ``families``; empty ones left out."""
    wanted = []
    if selection.shard is not None:
        wanted.append(parts.get(selection.shard, {}))
    if selection.cluster:
        wanted.append(parts.get(CLUSTER_PART, {}))
    out = []
    for fam in families:
        samples: dict[Labels, float] = {}
        for part in wanted:
            samples.update(part.get(fam.name, {}))
        if samples:
            out.append(Family(fam.name, fam.type, fam.help, samples))
    return out


def select_families(
    families: list[Family], node_shard: Mapping[str, str], selection: Selection
) -> list[Family]:
    """The families one scrape gets (split_families + assemble)."""
    return assemble(families, split_families(families, node_shard), selection)


def node_map_families(data: NodeMapData, families: Iterable[Family]) -> list[Family]:
    """Cluster-level gauges about the node map: its shards, and Slurm nodes it leaves out."""
    reg = Registry()
    reg.gauge("slurm_exporter_node_map_shards", "Shards the node map names", len(data.shards))
    slurm_nodes: set[str] = set()
    for fam in families:
        if fam.name == "slurm_node_status":
            slurm_nodes.update(n for n in map(_node_of, fam.samples) if n is not None)
    reg.gauge(
        "slurm_exporter_unmapped_nodes",
        "Slurm nodes the node map gives to no shard (served with the cluster-level part)",
        len(slurm_nodes - data.node_shard.keys()),
    )
    return list(reg.families.values())


# ---------------------------------------------------------------------------------------
# Glue: running commands, the collector thread, the HTTP server
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommandResult:
    stdout: str
    duration: float
    error: str | None  # None on success; else timeout, not_found, exit_code, exec_error


def run_command(
    argv: list[str], timeout: float, env: Mapping[str, str] | None = None
) -> CommandResult:
    """Run a command in its own process group; kill the whole group on timeout."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=dict(env) if env is not None else None,
        )
    except FileNotFoundError:
        return CommandResult("", time.monotonic() - start, "not_found")
    except OSError as exc:
        LOG.warning("cannot run %s: %s", argv[0], exc)
        return CommandResult("", time.monotonic() - start, "exec_error")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:
            # A grandchild kept the pipes open outside the process group: give up on it.
            proc.kill()
        LOG.warning("%s timed out after %.1fs", " ".join(argv[:3]), timeout)
        return CommandResult("", time.monotonic() - start, "timeout")
    duration = time.monotonic() - start
    if proc.returncode != 0:
        LOG.warning(
            "%s exited %d: %s",
            " ".join(argv[:3]),
            proc.returncode,
            err.decode("utf-8", "replace").strip()[:300],
        )
        return CommandResult(out.decode("utf-8", "replace"), duration, "exit_code")
    return CommandResult(out.decode("utf-8", "replace"), duration, None)


Runner = Callable[[list[str], float], CommandResult]


def slurm_version_tuple(version: object) -> tuple[int, int] | None:
    """``24.11.5`` -> (24, 11); None when unknown."""
    m = re.match(r"([0-9]{1,4})\.([0-9]{1,2})", version) if isinstance(version, str) else None
    return (int(m.group(1)), int(m.group(2))) if m else None


class Collector:
    """Runs the Slurm commands concurrently and keeps the latest exposition snapshot."""

    def __init__(
        self,
        command_timeout: float = 10.0,
        max_job_series: int = DEFAULT_MAX_JOB_SERIES,
        max_stale: float = 300.0,
        bin_dir: str | None = None,
        runner: Runner | None = None,
        commands: Mapping[str, list[str]] | None = None,
        job_source: str = "auto",
        max_gpu_index_series: int = DEFAULT_MAX_GPU_INDEX_SERIES,
        node_map: NodeMap | None = None,
    ) -> None:
        if job_source not in JOB_SOURCES:
            raise ValueError(f"job source must be one of {JOB_SOURCES}")
        self.command_timeout = command_timeout
        self.max_job_series = max_job_series
        self.max_gpu_index_series = max_gpu_index_series
        self.max_stale = max_stale
        self.job_source = job_source
        self.commands = dict(commands or COMMANDS)
        json_command = list(JOB_JSON_COMMAND)
        if bin_dir:
            self.commands = {
                k: [os.path.join(bin_dir, v[0]), *v[1:]] for k, v in self.commands.items()
            }
            json_command[0] = os.path.join(bin_dir, json_command[0])
        self.job_commands = {"text": self.commands.get("scontrol_jobs", []), "json": json_command}
        # auto: set once `scontrol --json` failed where the text form worked (no data_parser
        # plugin, an unknown schema): the text form is used from then on.
        self.json_failed = False
        env = dict(os.environ)
        env["SLURM_TIME_FORMAT"] = "standard"
        self._env = env
        self.runner: Runner = runner or (lambda argv, t: run_command(argv, t, self._env))
        self.status: dict[str, CommandStatus] = {k: CommandStatus() for k in self.commands}
        self.dropped_total = 0
        self.index_dropped_total = 0
        self.last_collect: float | None = None
        self.collect_duration = 0.0
        self._lock = threading.Lock()
        self.node_map = node_map
        families = build_families(
            self.status, time.time(), max_stale, max_job_series, 0, None, 0.0
        )[0]
        self._snapshot = b""
        # What per-shard scrapes are cut from (None: no node map, only the whole snapshot),
        # and their bodies, rendered on first request, for this snapshot only.
        self._families: list[Family] = families
        self._parts: Parts | None = None
        self._shards: frozenset[str] = frozenset()
        self._generation = 0
        self._selected: dict[Selection, bytes] = {}
        self._selected_bytes = 0
        self._publish(families)

    def job_source_now(self) -> str:
        """The job source of the next collection: json or text."""
        if self.job_source != "auto":
            return self.job_source
        if self.json_failed:
            return "text"
        st = self.status.get("sinfo_version")
        version = slurm_version_tuple(st.result if st is not None else None)
        return "json" if version is not None and version >= JSON_MIN_VERSION else "text"

    def _attempt(
        self, name: str, argv: list[str], parser: str
    ) -> tuple[CommandResult, object, int]:
        """Run and parse one command: (result with its error, parsed value, bad lines)."""
        try:
            res = self.runner(argv, self.command_timeout)
        except Exception:  # the runner must never take the exporter down
            LOG.exception("running %s failed", name)
            res = CommandResult("", 0.0, "exec_error")
        if res.error is not None:
            return res, None, 0
        try:
            result, bad = PARSERS[parser](res.stdout)
        except Exception:
            LOG.exception("parsing %s output failed", name)
            return CommandResult("", res.duration, "parse"), None, 0
        unusable = (
            result.unusable
            if isinstance(result, JobList)
            else bool(bad) and isinstance(result, list) and not result  # no usable line
        )
        if unusable or (result is None and name == "sinfo_version"):
            return CommandResult("", res.duration, "parse"), result, bad
        return res, result, bad

    def _run_one(self, name: str) -> None:
        st = self.status[name]
        if name == "scontrol_jobs":
            source = self.job_source_now()
            parser = "scontrol_jobs_json" if source == "json" else "scontrol_jobs"
            res, result, bad = self._attempt(name, self.job_commands[source], parser)
            if (
                res.error in ("exit_code", "parse")
                and source == "json"
                and self.job_source == "auto"
            ):
                text = self._attempt(name, self.job_commands["text"], "scontrol_jobs")
                if text[0].error is None:
                    LOG.warning(
                        "scontrol --json failed (%s), the text form worked: using it from now on",
                        res.error,
                    )
                    self.json_failed = True
                    bad += text[2]
                    res, result = text[0], text[1]
        else:
            res, result, bad = self._attempt(name, self.commands[name], name)
        st.duration = res.duration
        st.parse_errors += bad
        if res.error is None:
            st.success = True
            st.last_success = time.time()
            st.result = result
        else:
            st.success = False
            st.errors[res.error] = st.errors.get(res.error, 0) + 1

    def collect(self) -> bytes:
        """One collection cycle; returns (and stores) the new snapshot. Never raises."""
        start = time.monotonic()
        names = list(self.commands)
        version = self.status.get("sinfo_version")
        if self.job_source == "auto" and version is not None and version.result is None:
            # The job source depends on the Slurm version: learn it first, once.
            self._run_one("sinfo_version")
            names.remove("sinfo_version")
        with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            list(pool.map(self._run_one, names))
        self.collect_duration = time.monotonic() - start
        self.last_collect = time.time()
        try:
            families, dropped, index_dropped = build_families(
                self.status,
                self.last_collect,
                self.max_stale,
                self.max_job_series,
                self.dropped_total,
                self.last_collect,
                self.collect_duration,
                self.max_gpu_index_series,
                self.index_dropped_total,
            )
            self.dropped_total += dropped
            self.index_dropped_total += index_dropped
            return self._publish(families)
        except Exception:
            LOG.exception("building metrics failed")
            body = b"# building metrics failed\nslurm_up 0\n"
            failed = Family("slurm_up", "gauge", "Slurm exporter failure", {(): 0.0})
            with self._lock:
                self._snapshot = body
                self._families, self._parts = [failed], {CLUSTER_PART: {"slurm_up": {(): 0.0}}}
                self._generation += 1
                self._selected, self._selected_bytes = {}, 0
            return body

    def _publish(self, families: list[Family]) -> bytes:
        """Store one snapshot: the whole body, and its parts by shard when a map is set."""
        parts: Parts | None = None
        shards: frozenset[str] = frozenset()
        if self.node_map is not None:
            data = self.node_map.current()
            families = families + node_map_families(data, families)
            parts = split_families(families, data.node_shard)
            shards = data.shards
        body = render(families).encode()
        with self._lock:
            self._snapshot = body
            self._families, self._parts, self._shards = families, parts, shards
            self._generation += 1
            self._selected, self._selected_bytes = {}, 0
        return body

    def snapshot(self) -> bytes:
        with self._lock:
            return self._snapshot

    def snapshot_for(self, selection: Selection) -> bytes:
        """The part of the latest snapshot one scrape asks for (parse_selection).

        UnknownShard when no node map is set or it does not name the shard. Bodies are
        kept for the rest of the snapshot (an HA pair asks twice) within a byte budget of
        twice the whole snapshot; beyond it they are rendered per request.
        """
        with self._lock:
            body = self._selected.get(selection)
            if body is not None:
                return body
            families, parts, shards = self._families, self._parts, self._shards
            generation, budget = self._generation, 2 * len(self._snapshot) + (1 << 20)
        if parts is None:
            raise UnknownShard("no node map is set (--node-map-file)")
        if selection.shard is not None and selection.shard not in shards:
            raise UnknownShard(f"the node map names no shard {selection.shard}")
        body = render(assemble(families, parts, selection)).encode()
        with self._lock:
            if self._generation == generation and self._selected_bytes + len(body) <= budget:
                self._selected[selection] = body
                self._selected_bytes += len(body)
        return body

    def loop(self, interval: float, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            self.collect()
            stop.wait(max(1.0, interval - (time.monotonic() - started)))


INDEX_HTML = b"""<html><head><title>gpufleet Slurm exporter</title></head>
<body><h1>gpufleet Slurm exporter</h1><p><a href="/metrics">Metrics</a></p></body></html>
"""
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# The HTTP server: a connection gets --web-read-timeout seconds in all for its TLS handshake,
# request line and headers, then WEB_WRITE_TIMEOUT for the response. At most
# --web-max-connections are open; when all are taken, a new connection replaces the oldest
# one still waiting for its request, so idle connections never lock a scrape out.
WEB_MAX_CONNECTIONS = 64
WEB_READ_TIMEOUT = 5.0
WEB_WRITE_TIMEOUT = 10.0
MAX_REQUEST_HEAD = 16384  # bytes of request line and headers
BCRYPT_MAX_PASSWORD = 72  # bytes; bcrypt >= 5 refuses longer passwords
_POLL_SLICE = 0.25  # seconds a waiting connection thread sleeps between checks
_EVICTION_WAIT = 2.0  # seconds to wait for evicted connections to close: a loaded host is slow


class UnknownShard(LookupError):
    """A scrape asked for a shard the node map does not name (answered 404)."""


class _ReloadedFile:
    """A file reread when it (or a file it names) changes, by ``current()``.

    A change that does not load keeps the last good version and is logged once.
    """

    path: Path | None
    what = "file"  # for the log
    load_error: type[Exception] = ValueError

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stamp: tuple | None = None

    @staticmethod
    def _stamp_of(names: Iterable[str]) -> tuple:
        stamps = []
        for name in names:
            try:
                st = os.stat(name)
                stamps.append((name, st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                stamps.append((name, None))
        return tuple(stamps)

    def _file_stamp(self) -> tuple:
        return self._stamp_of([str(self.path)])

    def _load(self) -> None:
        raise NotImplementedError

    def _reload_if_changed(self) -> None:
        """Reload after a change; the caller holds ``self._lock``."""
        if self._file_stamp() != self._stamp:
            try:
                self._load()
                LOG.info("%s %s reloaded", self.what, self.path)
            except self.load_error as exc:
                self._stamp = self._file_stamp()  # log once per change, not per use
                LOG.error("keeping the previous %s: %s", self.what, exc)


class NodeMap(_ReloadedFile):
    """The node map file (--node-map-file), reread at each collection when it changed.

    A changed file that does not load keeps the last good map (and is logged); at start
    it is an error.
    """

    what = "node map"
    load_error = NodeMapError

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = Path(path)
        self._data = NodeMapData()
        self._load()

    def _load(self) -> None:
        stamp = self._file_stamp()
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_NODE_MAP_BYTES + 1)
            data = parse_node_map(raw.decode("utf-8"))
        except (OSError, UnicodeDecodeError, NodeMapError) as exc:
            raise NodeMapError(f"{self.path}: {exc}") from None
        self._data, self._stamp = data, stamp

    def current(self) -> NodeMapData:
        with self._lock:
            self._reload_if_changed()
            return self._data


class WebConfigError(ValueError):
    """The web config file is unreadable or not in the expected shape."""


@dataclass(frozen=True)
class WebSettings:
    """What one version of the web config file asks for."""

    tls: ssl.SSLContext | None = None
    users: Mapping[str, str] = field(default_factory=dict)  # user -> bcrypt hash


def parse_web_config(text: str, base: Path) -> tuple[dict[str, str] | None, dict[str, str]]:
    """(tls_server_config as file paths, basic_auth_users) of a web config document.

    The shape is the Prometheus exporter-toolkit's web config (the one node_exporter
    reads), written as JSON so the standard library parses it: ``tls_server_config``
    (``cert_file``, ``key_file``, optional ``client_ca_file``, ``client_auth_type``,
    ``min_version``) and ``basic_auth_users`` (user -> bcrypt hash). Relative paths are
    relative to the file's directory, as in exporter-toolkit.
    """
    try:
        doc = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise WebConfigError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise WebConfigError("the document must be an object")
    unknown = set(doc) - {"tls_server_config", "basic_auth_users"}
    if unknown:
        raise WebConfigError(f"unknown keys {sorted(unknown)}")
    users = doc.get("basic_auth_users") or {}
    if not isinstance(users, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v.startswith("$2") for k, v in users.items()
    ):
        raise WebConfigError("basic_auth_users must map user names to bcrypt hashes")
    tls = doc.get("tls_server_config")
    if tls is None:
        return None, dict(users)
    if not isinstance(tls, dict):
        raise WebConfigError("tls_server_config must be an object")
    unknown = set(tls) - {
        "cert_file",
        "key_file",
        "client_ca_file",
        "client_auth_type",
        "min_version",
    }
    if unknown:
        raise WebConfigError(f"tls_server_config: unknown keys {sorted(unknown)}")
    if not tls.get("cert_file") or not tls.get("key_file"):
        raise WebConfigError("tls_server_config needs cert_file and key_file")
    if tls.get("min_version", "TLS12") not in TLS_VERSIONS:
        raise WebConfigError(f"tls_server_config.min_version must be one of {sorted(TLS_VERSIONS)}")
    auth_type = tls.get("client_auth_type", "NoClientCert")
    if auth_type not in CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"tls_server_config.client_auth_type must be one of {sorted(CLIENT_AUTH_TYPES)}"
        )
    if (auth_type != "NoClientCert") != bool(tls.get("client_ca_file")):
        raise WebConfigError(
            "client_ca_file and a client_auth_type other than NoClientCert go together"
        )
    paths = {
        key: str(base / value) for key, value in tls.items() if key.endswith("_file") and value
    }
    return {
        **tls,
        **paths,
        "min_version": tls.get("min_version", "TLS12"),
        "client_auth_type": auth_type,
    }, dict(users)


def tls_context(tls: Mapping[str, str]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls["min_version"]]
    try:
        context.load_cert_chain(tls["cert_file"], tls["key_file"])
        if tls.get("client_ca_file"):
            context.load_verify_locations(cafile=tls["client_ca_file"])
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"TLS certificate or key: {exc}") from exc
    context.verify_mode = CLIENT_AUTH_TYPES[tls["client_auth_type"]]
    return context


class WebConfig(_ReloadedFile):
    """The web config file, reread whenever it or a file it names changes.

    Like node_exporter's --web.config.file: a new certificate, key or user list takes
    effect on the next connection, with no restart. A changed file that does not load
    keeps the last good settings (and is logged); at start it is an error.
    """

    what = "web config"
    load_error = WebConfigError

    def __init__(self, path: str | None) -> None:
        super().__init__()
        self.path = Path(path) if path else None
        self._files: list[str] = []
        self._settings = WebSettings()
        if self.path is not None:
            self._load()

    def _file_stamp(self) -> tuple:
        return self._stamp_of([str(self.path), *self._files])

    def _load(self) -> None:
        assert self.path is not None
        # Each file is stat'ed before it is read: a change in between is seen next time.
        config_stamp = self._stamp_of([str(self.path)])
        try:
            text = self.path.read_text()
            tls, users = parse_web_config(text, self.path.parent)
            files = [v for k, v in (tls or {}).items() if k.endswith("_file")]
            files_stamp = self._stamp_of(files)
            context = tls_context(tls) if tls else None
            if users:
                bcrypt_module()  # fail now, not at the first scrape
        except OSError as exc:
            raise WebConfigError(f"{self.path}: {exc}") from exc
        except WebConfigError as exc:
            raise WebConfigError(f"{self.path}: {exc}") from exc
        self._files = files
        self._settings = WebSettings(tls=context, users=users)
        self._stamp = config_stamp + files_stamp

    def current(self) -> WebSettings:
        if self.path is None:
            return self._settings
        with self._lock:
            self._reload_if_changed()
            return self._settings


def bcrypt_module():
    try:
        import bcrypt  # only sites with basic auth need it
    except ImportError as exc:
        raise WebConfigError(
            "basic_auth_users needs the bcrypt module (Debian/EL package python3-bcrypt)"
        ) from exc
    return bcrypt


_BCRYPT_COST_RE = re.compile(r"^\$2[abxy]?\$([0-9]{2})\$")


class Authenticator:
    """Basic auth against bcrypt hashes, remembering credentials it already verified.

    bcrypt is deliberately slow (tens of milliseconds); Prometheus sends the same
    credentials with every scrape, so a verified (user, hash, password digest) is kept.
    An unknown user is checked against a dummy hash of the same cost, so the answer takes
    as long as for a known user and does not tell which user names exist. A password
    longer than bcrypt's 72 bytes is refused without a check (it cannot match; bcrypt >= 5
    raises on it).
    """

    def __init__(self) -> None:
        self._verified: set[tuple[str, str, bytes]] = set()
        self._dummies: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def _dummy_hash(self, users: Mapping[str, str]) -> bytes:
        """A hash of a random secret with the highest cost among ``users``' hashes."""
        costs = [int(m.group(1)) for m in map(_BCRYPT_COST_RE.match, users.values()) if m]
        rounds = min(max(max(costs, default=10), 4), 31)
        with self._lock:
            dummy = self._dummies.get(rounds)
        if dummy is None:
            dummy = bcrypt_module().hashpw(os.urandom(16), bcrypt_module().gensalt(rounds))
            with self._lock:
                self._dummies[rounds] = dummy
        return dummy

    @staticmethod
    def _checkpw(password: bytes, hashed: bytes) -> bool:
        try:
            return bool(bcrypt_module().checkpw(password, hashed))
        except ValueError:  # a malformed hash, a NUL byte: not a match
            return False

    def allowed(self, header: str | None, users: Mapping[str, str]) -> bool:
        if not users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, sep, password = (
                base64.b64decode(header[6:], validate=True).decode().partition(":")
            )
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return False
        secret = password.encode()
        if len(secret) > BCRYPT_MAX_PASSWORD:
            return False
        hashed = users.get(user) if sep else None
        if hashed is None:
            self._checkpw(secret, self._dummy_hash(users))  # same time as a known user
            return False
        key = (user, hashed, hashlib.sha256(secret).digest())
        with self._lock:
            if key in self._verified:
                return True
        if not self._checkpw(secret, hashed.encode()):
            return False
        with self._lock:
            if len(self._verified) > 1000:
                self._verified.clear()
            self._verified.add(key)
        return True


def _request_head_end(buf: bytes) -> int:
    """Length of a complete request line + headers at the start of ``buf``, else 0."""
    ends = [i + n for i, n in ((buf.find(b"\r\n\r\n"), 4), (buf.find(b"\n\n"), 2)) if i >= 0]
    return min(ends) if ends else 0


class _Conn:
    """One accepted connection: its socket (non-blocking), deadline and phase.

    Every wait is sliced (_POLL_SLICE) so that the deadline and an eviction by the
    accepting thread take effect within a fraction of a second.
    """

    def __init__(self, sock: socket.socket, address: tuple, deadline: float) -> None:
        self.sock = sock
        self.address = address
        self.accepted = time.monotonic()
        self.deadline = deadline
        self.phase = "read"  # "read": handshake/request head; "write": answering
        self.evicted = False
        self.head = b""

    def evict(self) -> None:
        """Called by the accepting thread: end this connection as soon as possible."""
        self.evicted = True
        with contextlib.suppress(OSError):  # wakes the connection's thread from its poll
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)

    def wait(self, for_write: bool) -> None:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLOUT if for_write else select.POLLIN)
        while True:
            if self.evicted:
                raise TimeoutError("replaced by a newer connection")
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.phase} deadline passed")
            if poller.poll(int(min(remaining, _POLL_SLICE) * 1000) + 1):
                return

    def handshake(self, context: ssl.SSLContext) -> None:
        tls = context.wrap_socket(self.sock, server_side=True, do_handshake_on_connect=False)
        self.sock = tls
        while True:
            try:
                tls.do_handshake()
                return
            except ssl.SSLWantReadError:
                self.wait(False)
            except ssl.SSLWantWriteError:
                self.wait(True)

    def _retry(self, blocked_for_write: bool, op: Callable[..., _T], *args: object) -> _T:
        """``op(*args)``, waiting each time the socket (or TLS) is not ready for it."""
        while True:
            try:
                return op(*args)
            except ssl.SSLWantReadError:
                self.wait(False)
            except ssl.SSLWantWriteError:
                self.wait(True)
            except BlockingIOError:
                self.wait(blocked_for_write)

    def recv(self, size: int) -> bytes:
        return self._retry(False, self.sock.recv, size)

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self._retry(True, self.sock.send, view) :]

    def read_head(self) -> bytes | None:
        """The request line and headers, or None if the peer closed or sent too much."""
        buf = b""
        while len(buf) <= MAX_REQUEST_HEAD:
            chunk = self.recv(4096)
            if not chunk:
                return None
            buf += chunk
            end = _request_head_end(buf)
            if end:
                return buf[:end]
        return None


class _ConnWriter(io.RawIOBase):
    """``wfile`` of a request: every write goes out within the connection's deadline."""

    def __init__(self, conn: _Conn) -> None:
        super().__init__()
        self._conn = conn

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        self._conn.sendall(bytes(data))
        return len(data)


def make_handler(
    collector: Collector, web: WebConfig, auth: Authenticator
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"gpufleet_slurm_exporter/{__version__}"

        def setup(self) -> None:
            # ``request`` is the _Conn whose request head the server has already read.
            conn: _Conn = self.request
            self.connection = conn.sock
            self.rfile = io.BytesIO(conn.head)
            self.wfile = _ConnWriter(conn)

        def do_GET(self) -> None:
            if not auth.allowed(self.headers.get("Authorization"), web.current().users):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="gpufleet"')
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", "13")
                self.end_headers()
                self.wfile.write(b"Unauthorized\n")
                return
            path, _, query = self.path.partition("?")
            if path == "/metrics":
                try:
                    selection = parse_selection(query)
                    body = (
                        collector.snapshot()
                        if selection is None
                        else collector.snapshot_for(selection)
                    )
                except ValueError as exc:
                    self._send(400, "text/plain; charset=utf-8", f"{exc}\n".encode())
                    return
                except UnknownShard as exc:
                    self._send(404, "text/plain; charset=utf-8", f"{exc}\n".encode())
                    return
                self._send(200, "text/plain; version=0.0.4; charset=utf-8", body)
            elif path == "/":
                self._send(200, "text/html; charset=utf-8", INDEX_HTML)
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            LOG.debug("%s " + format, self.address_string(), *args)

    return Handler


def parse_listen_address(addr: str) -> tuple[str, int]:
    """``:9341`` -> ("", 9341); ``127.0.0.1:9341``; ``[::1]:9341``."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"bad listen address {addr!r} (want host:port)")
    return host.strip("[]"), int(port)


def _fd_limit() -> int | None:
    try:
        import resource
    except ImportError:
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft > 0 else None


class ExporterServer(socketserver.TCPServer):
    """The HTTP server: one thread per connection, a bounded number of connections.

    The accepting thread only registers a connection; its thread does the TLS handshake and
    reads the request head within ``read_timeout`` seconds in all (a client that sends
    nothing, or a byte now and then, is dropped), then answers within ``write_timeout``.
    When ``max_connections`` are open, a new connection replaces the oldest one still in its
    read phase; if every open connection is being answered, the new one is closed.
    """

    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        web: WebConfig,
        max_connections: int = WEB_MAX_CONNECTIONS,
        read_timeout: float = WEB_READ_TIMEOUT,
        write_timeout: float = WEB_WRITE_TIMEOUT,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.web = web
        limit = _fd_limit()
        if limit is not None and 2 * max_connections + 32 > limit:
            clamped = max(1, (limit - 32) // 2)
            LOG.warning(
                "--web-max-connections %d lowered to %d: the open file limit is %d",
                max_connections,
                clamped,
                limit,
            )
            max_connections = clamped
        self.max_connections = max(1, max_connections)
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.refused = 0
        self._conns: set[_Conn] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, handler)

    def open_connections(self, phase: str | None = None) -> int:
        """Open connections, or only those in ``phase`` ("read" or "write")."""
        with self._conns_lock:
            return sum(1 for c in self._conns if phase is None or c.phase == phase)

    def _evict_oldest_reader(self) -> bool:
        readers = [c for c in self._conns if not c.evicted and c.phase == "read"]
        if not readers:
            return False
        min(readers, key=lambda c: c.accepted).evict()
        return True

    def get_request(self):
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # free a descriptor, do not spin
                with self._conns_lock:
                    self._evict_oldest_reader()
                time.sleep(_POLL_SLICE)
            raise

    def process_request(self, request, client_address) -> None:
        # Evicted connections end within milliseconds; open descriptors stay below twice
        # the limit. Should a burst reach that, wait a moment for them instead of refusing.
        give_up = time.monotonic() + _EVICTION_WAIT
        while True:
            with self._conns_lock:
                if len(self._conns) < 2 * self.max_connections or time.monotonic() > give_up:
                    break
            time.sleep(0.01)
        conn = _Conn(request, client_address, time.monotonic() + self.read_timeout)
        with self._conns_lock:
            live = sum(1 for c in self._conns if not c.evicted)
            admit = len(self._conns) < 2 * self.max_connections and (
                live < self.max_connections or self._evict_oldest_reader()
            )
            if admit:
                self._conns.add(conn)
        if not admit:
            self.refused += 1
            LOG.debug("refused a connection from %s: all busy", client_address[0])
            self.shutdown_request(request)
            return
        try:
            threading.Thread(target=self._serve, args=(conn,), name="http", daemon=True).start()
        except RuntimeError as exc:  # no thread to be had: drop this connection
            LOG.warning("cannot serve %s: %s", client_address[0], exc)
            with self._conns_lock:
                self._conns.discard(conn)
            self.shutdown_request(request)

    def _serve(self, conn: _Conn) -> None:
        try:
            conn.sock.setblocking(False)
            context = self.web.current().tls
            if context is not None:
                conn.handshake(context)
            head = conn.read_head()
            if head is None:
                return
            conn.head = head
            conn.phase = "write"
            conn.deadline = time.monotonic() + self.write_timeout
            self.RequestHandlerClass(conn, conn.address, self)
        except (OSError, ValueError) as exc:  # timeouts, resets, broken pipes, TLS errors
            LOG.debug("connection from %s ended: %s", conn.address[0], exc or type(exc).__name__)
        except Exception as exc:
            LOG.error("request from %s failed: %r", conn.address[0], exc)
        finally:
            with self._conns_lock:
                self._conns.discard(conn)
            with contextlib.suppress(OSError):
                conn.sock.close()

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        LOG.debug("connection from %s failed: %r", client_address[0], exc)


def make_server(
    addr: str,
    collector: Collector,
    web: WebConfig | None = None,
    max_connections: int = WEB_MAX_CONNECTIONS,
    read_timeout: float = WEB_READ_TIMEOUT,
    write_timeout: float = WEB_WRITE_TIMEOUT,
) -> ExporterServer:
    host, port = parse_listen_address(addr)
    web = web or WebConfig(None)
    return ExporterServer(
        (host, port),
        make_handler(collector, web, Authenticator()),
        web,
        max_connections=max_connections,
        read_timeout=read_timeout,
        write_timeout=write_timeout,
    )


def _add_file_arguments(p: argparse.ArgumentParser, name: str, what: str) -> None:
    """--NAME-file (reread when it changes) and --check-NAME FILE (check it, then exit)."""
    p.add_argument(f"--{name}-file", default=None, help=f"{what}; reread when it changes")
    noun = name.replace("-", " ")
    p.add_argument(
        f"--check-{name}",
        metavar="FILE",
        default=None,
        help=f"only check that FILE loads as a {noun} (exit 0) or say why not (exit 2)",
    )


def _check_file(path: str, what: str, load: Callable[[str], object]) -> int:
    """Exit status of --check-*: 0 when ``load`` takes the file, else 2 with the reason."""
    try:
        load(path)
    except (WebConfigError, NodeMapError) as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen-address", default=":9341", help="host:port (default :9341)")
    p.add_argument("--collect-interval", type=float, default=30.0, help="seconds (default 30)")
    p.add_argument(
        "--command-timeout", type=float, default=10.0, help="per command, seconds (default 10)"
    )
    p.add_argument(
        "--max-job-series",
        type=int,
        default=DEFAULT_MAX_JOB_SERIES,
        help=f"cap on exported (running job, node) pairs (default {DEFAULT_MAX_JOB_SERIES})",
    )
    p.add_argument(
        "--max-gpu-index-series",
        type=int,
        default=DEFAULT_MAX_GPU_INDEX_SERIES,
        help="cap on exported slurm_job_gpu_index_info series"
        f" (default {DEFAULT_MAX_GPU_INDEX_SERIES})",
    )
    p.add_argument(
        "--job-source",
        choices=JOB_SOURCES,
        default="auto",
        help="how job records are read: json (scontrol --json), text (scontrol -o), or auto"
        " (json from Slurm {}.{:02d} on, else text; default auto)".format(*JSON_MIN_VERSION),
    )
    p.add_argument(
        "--max-stale",
        type=float,
        default=300.0,
        help="serve a failed command's last good values this long (default 300 s)",
    )
    p.add_argument("--slurm-bin-dir", default=None, help="directory of the Slurm commands")
    p.add_argument(
        "--web-max-connections",
        type=int,
        default=WEB_MAX_CONNECTIONS,
        help=f"open HTTP connections at most (default {WEB_MAX_CONNECTIONS})",
    )
    p.add_argument(
        "--web-read-timeout",
        type=float,
        default=WEB_READ_TIMEOUT,
        help="seconds a connection has for TLS handshake, request line and headers"
        f" (default {WEB_READ_TIMEOUT:g})",
    )
    _add_file_arguments(
        p, "web-config", "TLS and basic auth, in node_exporter's web config shape written as JSON"
    )
    _add_file_arguments(
        p,
        "node-map",
        'JSON {"shards": {"0": [node, ...], ...}}: which Prometheus shard owns which'
        " node, for /metrics?shard=K[&cluster=1]",
    )
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--version", action="version", version=__version__)
    args = p.parse_args(argv)
    for path, what, load in (
        (args.check_web_config, "web config", WebConfig),
        (args.check_node_map, "node map", NodeMap),
    ):
        if path is not None:
            return _check_file(path, what, load)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        node_map = NodeMap(args.node_map_file) if args.node_map_file else None
    except NodeMapError as exc:
        LOG.error("node map: %s", exc)
        return 2
    collector = Collector(
        command_timeout=args.command_timeout,
        max_job_series=args.max_job_series,
        max_stale=args.max_stale,
        bin_dir=args.slurm_bin_dir,
        job_source=args.job_source,
        max_gpu_index_series=args.max_gpu_index_series,
        node_map=node_map,
    )
    stop = threading.Event()
    thread = threading.Thread(
        target=collector.loop, args=(args.collect_interval, stop), name="collector", daemon=True
    )
    try:
        web = WebConfig(args.web_config_file)
    except WebConfigError as exc:
        LOG.error("web config: %s", exc)
        return 2
    try:
        server = make_server(
            args.listen_address,
            collector,
            web,
            max_connections=args.web_max_connections,
            read_timeout=args.web_read_timeout,
        )
    except (OSError, ValueError) as exc:
        LOG.error("cannot listen on %s: %s", args.listen_address, exc)
        return 2

    def _stop(signum: int, _frame: object) -> None:
        LOG.info("signal %d, shutting down", signum)
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    thread.start()
    LOG.info(
        "listening on %s (%s%s)",
        args.listen_address,
        "https" if web.current().tls else "http",
        ", basic auth" if web.current().users else "",
    )
    server.serve_forever()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
