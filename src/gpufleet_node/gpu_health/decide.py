"""What the health program does with a verdict: pure functions, no Slurm call.

- ``fail``: drain (modes ``drain`` and ``drain+resume``) with a reason that starts with
  ``gpufleet:``, unless the node is drained already (by gpufleet: it drains once; by anyone
  else: their reason stays) or the safety valve is closed.
- every check passes (``ok`` or ``warn``): resume (mode ``drain+resume``), only a node
  whose current reason is gpufleet's, only after ``resume_after`` passing runs in a row, and
  at most ``max_resumes_per_day`` times a day: a flapping GPU stays out after that.
- ``unknown`` (collector failing, verdict stale or unreadable): nothing, ever.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ..gpu_collector.verdict import worst
from ..numbers import finite
from .slurmnode import NodeState

MODES = ("alert", "drain", "drain+resume")
STATES = ("ok", "warn", "fail", "unknown")
REASON_MAX_CHARS = 100
DAY = 86400.0


class Failure(NamedTuple):
    check: str
    gpu: str
    reason: str
    jobs: tuple[str, ...]


class Verdict(NamedTuple):
    state: str  # ok, warn, fail, unknown
    time: float
    failures: tuple[Failure, ...]
    why_unknown: str = ""


class Intent(NamedTuple):
    action: str  # none, drain, resume, blocked
    reason: str  # the drain reason, or why nothing is done


class Limits(NamedTuple):
    partition_share: float  # at most this share of a partition drained by gpufleet at once
    cluster_share: float


def unknown(why: str, now: float = 0.0) -> Verdict:
    return Verdict("unknown", now, (), why)


# What a check's fields may hold: the collector's own names and GPU indices, and a
# reason of printable text (it goes into Slurm's reason field and the journal).
CHECK_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
GPU_RE = re.compile(r"[0-9]{0,4}")
JOB_RE = re.compile(r"[0-9A-Za-z_.+-]{1,64}")
REASON_RE = re.compile(r"[ -~]{0,200}")
CLOCK_SKEW = 60.0  # seconds a verdict may be ahead of this clock


def parse_verdict(text: str | None, now: float, max_age: float) -> Verdict:
    """The collector's verdict document; unknown when absent, malformed, inconsistent,
    stale or from the future."""
    if text is None:
        return unknown("no verdict from the GPU collector yet")
    try:
        data: Any = json.loads(text)
    except (ValueError, RecursionError):
        return unknown("the verdict is not JSON")
    if not isinstance(data, dict) or type(data.get("version")) is not int or data["version"] != 1:
        return unknown("the verdict has an unknown version")
    stamp, state, checks = finite(data.get("time")), data.get("verdict"), data.get("checks")
    if stamp is None:
        return unknown("the verdict has no time")
    if state not in STATES or not isinstance(checks, list):
        return unknown("the verdict has no state")
    age = now - stamp
    if age > max_age:
        return unknown(f"the verdict is {age:.0f} s old (collector stopped?)", stamp)
    if age < -CLOCK_SKEW:
        return unknown(f"the verdict is {-age:.0f} s in the future", stamp)
    failures = []
    states = set()
    for check in checks:
        if not isinstance(check, dict):
            return unknown("a check of the wrong shape")
        name, gpu, reason, jobs = (check.get(k) for k in ("check", "gpu", "reason", "jobs"))
        if not (isinstance(name, str) and isinstance(gpu, str) and isinstance(reason, str)):
            return unknown("a check of the wrong shape")
        if not (
            CHECK_RE.fullmatch(name)
            and GPU_RE.fullmatch(gpu)
            and REASON_RE.fullmatch(reason)
            and check.get("state") in STATES
        ):
            return unknown("a check of the wrong shape")
        states.add(check["state"])
        if check["state"] == "fail":
            jobs = (
                [j for j in jobs if isinstance(j, str) and JOB_RE.fullmatch(j)]
                if isinstance(jobs, list)
                else []
            )
            failures.append(Failure(name, gpu, reason, tuple(jobs[:20])))
    if state != worst(states):
        return unknown(f"the verdict says {state}, its checks say {worst(states)}")
    return Verdict(state, stamp, tuple(failures))


def drain_reason(failures: Sequence[Failure], now: float) -> str:
    """``gpufleet: xid79 gpu3 (fallen off the bus) 2026-11-27T10:02Z``: the first failure,
    how many more, and the time; short enough for Slurm's reason field."""
    first = failures[0]
    where = f"gpu{first.gpu}" if first.gpu else "node"
    word, detail = first.check, first.reason
    if first.check == "xid" and " (" in first.reason:  # "xid79 (fallen off the bus)"
        word, _, detail = first.reason.partition(" (")
        detail = detail.rstrip(")")
    more = f" +{len(failures) - 1} more" if len(failures) > 1 else ""
    stamp = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(now))
    head = f"gpufleet: {word} {where}"
    tail = f"{more} {stamp}"
    room = REASON_MAX_CHARS - len(head) - len(tail) - 3
    detail = detail if len(detail) <= room else detail[: max(room - 3, 0)] + "..."
    text = f"{head} ({detail}){tail}"
    # Printable ASCII only, whatever the verdict held; never longer than the bound.
    return "".join(ch if " " <= ch <= "~" else "?" for ch in text)[:REASON_MAX_CHARS]


def allowed(share: float, total: int, at_least_one: bool = False) -> int:
    """Nodes gpufleet may hold drained among ``total``: a share, rounded down. A partition
    (``at_least_one``) may always hold one, or a small partition could never lose a
    broken node; the cluster's share stays strict, and bounds many small partitions."""
    found = math.floor(share * total + 1e-9)
    return max(found, 1) if at_least_one and share > 0 else found


def valve_problem(me: NodeState, fleet: Iterable[NodeState], limits: Limits) -> str:
    """Why draining ``me`` now would pass the safety valve; '' when it would not."""
    others = [node for node in fleet if node.name != me.name]
    groups = [("the cluster", others, limits.cluster_share, False)]
    groups += [
        (f"partition {p}", [n for n in others if p in n.partitions], limits.partition_share, True)
        for p in me.partitions
    ]
    for name, members, share, one in groups:
        total = len(members) + 1
        ours = sum(1 for node in members if node.drained_by_us)
        if ours + 1 > allowed(share, total, one):
            return (
                f"{ours} of {total} nodes of {name} drained by gpufleet already; "
                f"the limit is {share:.0%}"
            )
    return ""


def over_valve(me: NodeState, fleet: Sequence[NodeState], limits: Limits) -> str:
    """After draining: why ``me`` must step back (nodes that drained at the same time
    passed the valve together). The earliest drains keep their place, ties by name."""
    drained = sorted(
        (n for n in fleet if n.drained_by_us or n.name == me.name),
        key=lambda n: (n.reason_time, n.name),
    )
    groups = [("the cluster", list(fleet), limits.cluster_share, False)]
    groups += [
        (f"partition {p}", [n for n in fleet if p in n.partitions], limits.partition_share, True)
        for p in me.partitions
    ]
    for name, members, share, one in groups:
        names = {n.name for n in members}
        ranked = [n.name for n in drained if n.name in names]
        if me.name in ranked and ranked.index(me.name) >= allowed(share, len(members), one):
            return (
                f"{len(ranked)} nodes of {name} drained by gpufleet at once; "
                f"the limit is {share:.0%}"
            )
    return ""


def intent(
    verdict: Verdict,
    mode: str,
    node: NodeState,
    passing_runs: int,
    resumes_today: int,
    resume_after: int,
    max_resumes_per_day: int,
    now: float,
) -> Intent:
    """What to do, before the safety valve (which only a drain asks)."""
    if verdict.state == "unknown":
        return Intent("none", f"verdict unknown: {verdict.why_unknown}")
    if verdict.state == "fail":
        if mode == "alert":
            return Intent("none", "failing; mode alert drains nothing")
        if node.drained_by_us:
            return Intent("none", "failing; drained by gpufleet already")
        if node.out_of_service:
            return Intent("none", f"failing; out of service by someone else ({node.reason!r})")
        return Intent("drain", drain_reason(verdict.failures, now))
    if mode != "drain+resume" or not node.drained_by_us:
        return Intent("none", "healthy")
    if passing_runs < resume_after:
        return Intent("none", f"healthy for {passing_runs} of {resume_after} runs before resume")
    if resumes_today >= max_resumes_per_day:
        return Intent(
            "none", f"healthy, but resumed {resumes_today} times today: flapping, left drained"
        )
    return Intent("resume", "every check passes")


def recent(stamps: Iterable[float], now: float) -> list[float]:
    return [stamp for stamp in stamps if now - DAY < stamp <= now]
