"""Parse functions, one per Slurm command output. Pure: text in, data out."""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet_node.hostlist import (
    MAX_HOSTS_PER_EXPRESSION,
    BoundExceeded,
    HostBudget,
    expand_hostlist,
    expand_ranges,
    split_top_level,
)
from gpufleet_node.slurm_exporter.model import (
    MAX_GPU_COUNT,
    MAX_GRES_INDEX,
    MAX_GRES_INDICES,
    MAX_RECORD_TOKENS,
    MISSING,
    TERMINAL_STATES,
    Gres,
    JobDetail,
    JobList,
    NodeAlloc,
    NodeRow,
    QueueRow,
    Sdiag,
    ShareRow,
)

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
                indices = tuple(expand_ranges(idx, MAX_GRES_INDICES, MAX_GRES_INDEX))
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


def _dedupe(jobs: list[JobDetail], result: JobList, seen: Counter[str] | None = None) -> None:
    """Append ``jobs`` to ``result`` except ids seen more than once (all of those are dropped).

    ``seen`` counts the ids of every record, also of those left out for another reason: a
    forged record must not pass because the real one of its id was unreadable.
    """
    seen = seen if seen is not None else Counter[str](j.job_id for j in jobs)
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
    starts: Counter[str] = Counter()  # job ids of all lines that start a record
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


def verify_jobs(
    jobs: JobList, queue: list[QueueRow] | None
) -> tuple[list[JobDetail], Counter[str]]:
    """The jobs whose GPUs may be exported, and why others were left out (this snapshot).

    JSON records are taken as they are. A text record with GPUs is kept only if squeue lists
    its job id as alive (not in a terminal state) for the same user: a forged record (a line
    break in free text) names a job id squeue does not have, or one that is then a duplicate.
    """
    rejected: Counter[str] = Counter()
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
