"""``scontrol show job -d``: job records (text or JSON) and their check against squeue."""

from __future__ import annotations

import codecs
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet_node.hostlist import (
    MAX_HOSTS_PER_EXPRESSION,
    BoundExceeded,
    HostBudget,
    expand_hostlist,
)
from gpufleet_node.slurm_exporter.model import (
    MAX_GRES_INDICES,
    MAX_RECORD_TOKENS,
    MISSING,
    TERMINAL_STATES,
    JobDetail,
    JobList,
    NodeAlloc,
    QueueRow,
)
from gpufleet_node.slurm_exporter.parsers.common import parse_gres


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
#   Partition=.. .. NodeList=.. .. JOB_GRES=.. Nodes=<hostlist> CPU_IDs=.. Mem=.. GRES=..
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
# start inside later free text needs the same. The per-node GRES groups are read only inside
# the head, after JOB_GRES=.
#
# Free text can still forge a whole head (a record then offers several), and a line break in
# it can make the rest of that text a line of its own: a whole forged record, maybe with
# another job's id. Text alone cannot tell the real one, so such ids stay unresolved here and
# are settled by sources without user text (issue 26 finding 2): the collector asks scontrol
# for an id with several records alone (its real record starts that output), and
# verify_jobs keeps only heads that agree with squeue's user, state, account and partition.
# What still has two such heads (its owner cloned their own head) is left out and counted,
# and text records with GPUs are exported only for jobs squeue lists alive for that user.

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
            # The per-node groups follow JOB_GRES= (three spaces before them up to 24.11,
            # one from 26.05).
            if "JOB_GRES" not in fields:
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


def _dedupe(jobs: list[JobDetail], result: JobList, seen: Counter[str] | None = None) -> None:
    """Append ``jobs`` to ``result`` except ids seen more than once (all of those are dropped).

    ``seen`` counts the ids of every record, also of those left out for another reason.
    """
    seen = seen if seen is not None else Counter[str](j.job_id for j in jobs)
    for job in jobs:
        if seen[job.job_id] > 1:
            result.rejected["duplicate"] += 1
        else:
            result.append(job)


# How many heads one text record may offer before it is refused outright, and how long a
# line may grow before it is (a record is a few KB; a job on thousands of nodes a few MB).
MAX_RECORD_HEADS = 4
MAX_LINE_CHARS = 64 * 1024 * 1024


def _record_heads(line: str) -> tuple[str, str | None, list[_Head]] | None:
    """(job id, array job id, every head the line offers) or None if no record starts."""
    start = _JOB_START_RE.match(line)
    if start is None:
        return None
    heads: list[_Head] = []
    pos = line.find(_HEAD_START, start.end() - 1)
    while pos >= 0 and len(heads) <= MAX_RECORD_HEADS:
        head = _scan_head(line, pos + 1)
        if head is not None:
            heads.append(head)
        pos = line.find(_HEAD_START, pos + 1)
    return start.group(1), start.group(2), heads


def _head_job(job_id: str, array_id: str | None, head: _Head, budget: HostBudget) -> JobDetail:
    """The JobDetail one head describes (BoundExceeded, ValueError: not readable)."""
    fields = head.fields
    state = fields["JobState"].upper()
    allocs = _job_allocations(head.segments, budget) if state == "RUNNING" else ()
    account = fields["Account"]
    return JobDetail(
        job_id=job_id,
        state=state,
        user=_user_name(fields["UserId"]),
        account="" if account in MISSING else account,
        partition=fields["Partition"],
        array_job_id=array_id if array_id and array_id != job_id else None,
        allocations=allocs,
    )


class TextJobReader:
    """``scontrol show job -d -o`` read as it arrives (feed), whole at the end (finish).

    Every line that starts a record is kept as the tuple of jobs its heads describe. An id
    with exactly one record of exactly one head is a job; any other (a head forged in free
    text, a record forged by a line break in it) is left unresolved for verify_jobs, which
    keeps only the heads squeue agrees with, and for the collector, which asks scontrol for
    that one job (then the real record is the one at the start of the output).
    """

    def __init__(self) -> None:
        self.result = JobList(source="text")
        self._budget = HostBudget()
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending: list[str] = []
        self._pending_chars = 0
        self._records: dict[str, tuple[tuple[JobDetail, ...], ...]] = {}

    def feed(self, chunk: bytes) -> None:
        # "\n" only: scontrol ends records with it; str.splitlines would also split on
        # characters (\x1c, \u2028, ...) that a job name may contain.
        parts = self._decoder.decode(chunk).split("\n")
        for part in parts[:-1]:
            self._pending.append(part)
            self._line("".join(self._pending))
            self._pending, self._pending_chars = [], 0
        self._pending.append(parts[-1])
        self._pending_chars += len(parts[-1])
        if self._pending_chars > MAX_LINE_CHARS:
            self.result.rejected["bounds"] += 1
            self._pending, self._pending_chars = [""], 0  # the rest of that line is noise

    def finish(self) -> tuple[JobList, int]:
        self.feed(b"\n")
        result = self.result
        for job_id, records in self._records.items():
            if len(records) == 1 and len(records[0]) == 1:
                result.append(records[0][0])
            elif any(records):
                result.unresolved[job_id] = list(records)
        return result, sum(result.rejected.values())

    def adopt(self, job_id: str, text: str) -> None:
        """Replace the records of ``job_id`` with the first line of ``text`` (``scontrol show
        job -d -o ID``): the real record starts the output, forged ones follow a line break."""
        first = text.split("\n", 1)[0].rstrip(" \r")
        record = self._record(first)
        if record is None or record[0] != job_id:
            return
        self.result.unresolved.pop(job_id, None)
        if len(record[1]) == 1:
            self.result.append(record[1][0])
        elif record[1]:
            self.result.unresolved[job_id] = [record[1]]

    def _record(self, line: str) -> tuple[str, tuple[JobDetail, ...]] | None:
        """(job id, the jobs its heads describe); an unreadable record is counted here and
        gives no jobs (it still counts as a record of its id)."""
        found = _record_heads(line)
        if found is None:
            return None
        job_id, array_id, heads = found
        if len(heads) > MAX_RECORD_HEADS:
            self.result.rejected["ambiguous"] += 1
            return job_id, ()
        jobs = []
        for head in heads:
            try:
                jobs.append(_head_job(job_id, array_id, head, self._budget))
            except BoundExceeded:
                self.result.rejected["bounds"] += 1
                return job_id, ()
            except ValueError:
                continue
        if not jobs:
            self.result.rejected["malformed"] += 1
        return job_id, tuple(jobs)

    def _line(self, raw: str) -> None:
        line = raw.rstrip(" \r")
        if not line or line.startswith("No jobs in the system"):
            return
        record = self._record(line)
        if record is None:
            self.result.rejected["malformed"] += 1
            return
        self._records[record[0]] = (*self._records.get(record[0], ()), record[1])


def parse_scontrol_jobs(text: str) -> tuple[JobList, int]:
    """Parse ``scontrol show job -d -o`` (see the layout above); bad = records left out.

    A per-node group is ``Nodes=<hostlist> CPU_IDs=... Mem=... GRES=<gres>``; its hostlist
    may name several nodes that share the same CPU ids and GRES indices. Finished jobs keep
    their groups with an empty ``GRES=``. Only RUNNING jobs get their GPUs read.
    """
    reader = TextJobReader()
    reader.feed(text.encode())
    return reader.finish()


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


def _json_hosts(job: Mapping[str, Any], budget: HostBudget) -> list[str]:
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


# The document is read as it arrives: one job object at a time is decoded (a few KB each),
# never the whole (264 MiB at 27,000 jobs). A value longer than this is refused.
MAX_JSON_VALUE_CHARS = 64 * 1024 * 1024
_JSON_SPACE = " \t\r\n"
_DECODER = json.JSONDecoder()


class JsonJobReader:
    """``scontrol show job -d --json`` read as it arrives (feed), checked at the end (finish).

    Only the top-level object's "jobs" array is read, element by element; other top-level
    values are decoded and dropped. A document that is not a whole such object yields no jobs
    (a cut-off job table would silently lose jobs): the collector then counts a parse error.
    """

    def __init__(self) -> None:
        self.result = JobList(source="json")
        self._budget = HostBudget()
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._buf = ""
        self._pos = 0
        self._state = "start"
        self._in_jobs = False
        self._seen_jobs = False
        self._need = 0  # characters to wait for before retrying an incomplete value
        self._parsed: list[JobDetail] = []
        self._ids: Counter[str] = Counter()

    def feed(self, chunk: bytes) -> None:
        if self._state in ("done", "failed"):
            return
        self._buf = self._buf[self._pos :] + self._decoder.decode(chunk)
        self._pos = 0
        if len(self._buf) >= self._need:
            self._advance(final=False)

    def finish(self) -> tuple[JobList, int]:
        self.feed(b"")
        self._buf += self._decoder.decode(b"", final=True)
        if self._state not in ("done", "failed"):
            self._advance(final=True)
        result = self.result
        if self._state != "done" or not self._seen_jobs:
            result.clear()
            result.rejected.clear()
            result.rejected["malformed"] = 1
            return result, 1
        _dedupe(self._parsed, result, self._ids)
        return result, sum(result.rejected.values())

    def _char(self) -> str | None:
        """The next non-blank character (not consumed), None at the end of the buffer."""
        buf, pos = self._buf, self._pos
        while pos < len(buf) and buf[pos] in _JSON_SPACE:
            pos += 1
        self._pos = pos
        return buf[pos] if pos < len(buf) else None

    def _value(self, final: bool) -> tuple[bool, object]:
        """(True, value) decoded at the position, (False, None) if it is not complete yet."""
        try:
            value, end = _DECODER.raw_decode(self._buf, self._pos)
        except ValueError:
            if final or len(self._buf) - self._pos > MAX_JSON_VALUE_CHARS:
                raise
            self._need = 2 * (len(self._buf) - self._pos)  # amortized: no re-scan per chunk
            return False, None
        if end == len(self._buf) and not final:  # a number may go on in the next chunk
            self._need = 0
            return False, None
        self._pos = end
        return True, value

    def _advance(self, final: bool) -> None:
        try:
            while self._step(final):
                pass
        except ValueError:
            self._state = "failed"

    def _step(self, final: bool) -> bool:
        """One step of the top-level grammar; False when more input is needed or it ended."""
        char = self._char()
        if char is None:
            return False
        state = self._state
        if state == "start":
            return self._expect(char, "{", "key_or_end")
        if state in ("key_or_end", "key"):
            if char == "}" and state == "key_or_end":
                self._pos += 1
                self._state = "done"
                return False
            done, key = self._value(final)
            if not done:
                return False
            if not isinstance(key, str):
                raise ValueError("a key is not a string")
            self._in_jobs = key == "jobs"
            self._state = "colon"
            return True
        if state == "colon":
            return self._expect(char, ":", "jobs_open" if self._in_jobs else "value")
        if state == "value":
            done, _ = self._value(final)
            if done:
                self._state = "after_value"
            return done
        if state == "after_value":
            if char == "}":
                self._pos += 1
                self._state = "done"
                return False
            return self._expect(char, ",", "key")
        if state == "jobs_open":
            self._seen_jobs = True
            return self._expect(char, "[", "job_or_end")
        if state in ("job_or_end", "job"):
            if char == "]" and state == "job_or_end":
                self._pos += 1
                self._state = "after_value"
                return True
            done, job = self._value(final)
            if done:
                self._job(job)
                self._state = "job_sep"
            return done
        if state == "job_sep":
            if char == "]":
                self._pos += 1
                self._state = "after_value"
                return True
            return self._expect(char, ",", "job")
        return False

    def _expect(self, char: str, want: str, then: str) -> bool:
        if char != want:
            raise ValueError(f"expected {want!r}")
        self._pos += 1
        self._state = then
        return True

    def _job(self, job: object) -> None:
        try:
            detail = _json_job(job, self._budget)
        except BoundExceeded:
            self.result.rejected["bounds"] += 1
            return
        except (ValueError, TypeError, AttributeError):
            self.result.rejected["malformed"] += 1
            return
        self._ids[detail.job_id] += 1
        self._parsed.append(detail)


def parse_scontrol_jobs_json(text: str) -> tuple[JobList, int]:
    """Parse ``scontrol show job -d --json``; bad = jobs left out (or 1 for unusable output)."""
    reader = JsonJobReader()
    reader.feed(text.encode())
    return reader.finish()


def _agrees(job: JobDetail, row: QueueRow) -> bool:
    """Whether squeue (no user text in its columns) says what this record's head says."""
    return (
        job.user == row.user
        and job.state == row.state
        and job.account == row.account
        and (job.partition in row.partitions or job.partition == ",".join(row.partitions))
    )


def _resolve(
    records: list[tuple[JobDetail, ...]], row: QueueRow | None
) -> tuple[JobDetail | None, str]:
    """The one job the records of an id describe that squeue agrees with, or why none.

    An unreadable record (no jobs) makes any other record of its id doubtful: the real one
    may be the unreadable one.
    """
    reason = "duplicate" if len(records) > 1 else "ambiguous"
    if row is None or not all(records):
        return None, reason
    heads = {job for record in records for job in record if _agrees(job, row)}
    if len(heads) != 1:
        return None, reason
    return heads.pop(), ""


def verify_jobs(
    jobs: JobList, queue: list[QueueRow] | None
) -> tuple[list[JobDetail], Counter[str]]:
    """The jobs whose GPUs may be exported, and why others were left out (this snapshot).

    JSON records are taken as they are. Text records whose id has several records or
    several heads are resolved through squeue first: only heads that agree with squeue's
    user, state, account and partition count, and exactly one must remain. A text record
    with GPUs is then kept only if squeue lists its job id as alive (not in a terminal
    state) for the same user: a forged record (a line break in free text) names a job id
    squeue does not have, or one that is then a duplicate.
    """
    rejected: Counter[str] = Counter()
    if jobs.source != "text":
        return list(jobs), rejected
    rows = {row.job_id: row for row in (queue or ())}
    candidates = list(jobs)
    for job_id, records in jobs.unresolved.items():
        job, reason = _resolve(records, rows.get(job_id))
        if job is None:
            rejected[reason] += 1
        else:
            candidates.append(job)
    alive = {job_id: row.user for job_id, row in rows.items() if row.state not in TERMINAL_STATES}
    kept = []
    for job in candidates:
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
