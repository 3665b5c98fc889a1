"""``scontrol show job -d``: job records (text or JSON) and their check against squeue."""

from __future__ import annotations

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
