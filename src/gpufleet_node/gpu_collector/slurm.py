"""Slurm attribution: compute processes to jobs through their cgroup and environment."""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Callable, Iterable
from typing import NamedTuple

from .files import read_regular, read_text
from .model import STATE_MAX_BYTES
from .nvidia import ComputeApp

#
# A GPU process's Slurm job comes from its cgroup path, which slurmstepd (root)
# creates and the job's user cannot choose. One line of /proc/PID/cgroup is
# "hierarchy-id:controllers:path". Only the hierarchy and the position slurmd
# creates count, from the root of the hierarchy (or --slurm-cgroup-root, the cgroup
# a containerised slurmd runs under, as the collector sees it):
#   cgroup v1, a controller line (freezer, memory, ... never a "name=" hierarchy):
#       /slurm[_<node>]/uid_<uid>/job_<id>[/...]           (22.05, 24.11)
#       24.11 in a private cgroupns: "4:freezer:/slurm_<node>/uid_1000/job_3/step_batch"
#   cgroup v2, the "0::" line:
#       /system.slice/[<node>_]slurmstepd.scope/job_<id>[/step_<s>[/user/task_<n>]...]
#   Slurm 26.05+ (v2) names the job directory by its SLUID instead of job_<id>
#       (.../slurmstepd.scope/sEKNKTV3WPV500/step_0/...) unless cgroup.conf has
#       CgroupJobIdPaths=yes (26.05.2+).
# Below the job directory anything goes: only root and the job's own processes can
# create cgroups there, and they are that job's. The same fragments anywhere else
# (under user@<uid>.service/app.slice, a rootless container's cgroup, any other depth)
# are cgroups a user made: not a job. Lines are split on "\n" only: a cgroup name
# may hold "\r" or U+2028, never "\n" (the kernel refuses it).
# A SLUID is "s" + 13 Crockford base32 digits of a 64-bit number made of a
# cluster id, a millisecond timestamp and a sequence number (Slurm's
# src/common/sluid.c): the job id cannot be computed from it. The collector
# then reads SLURM_JOB_ID from the environment of one process of that job
# (bounded: ENVIRON_MAX_BYTES per read, ENVIRON_MAX_READS per cycle, one success
# per SLUID). The environment is the job owner's to change, so that job_id is
# only as trustworthy as the job's user; the sluid label (from the path) and the
# user label (from the kernel's uid) are not. Without an answer (no such
# variable, e.g. an ssh session adopted into step_extern; unreadable) the SLUID
# itself is the job_id.

SLURM_V1_ROOT_RE = re.compile(r"slurm(?:_[A-Za-z0-9._-]{1,200})?")
SLURM_V2_SCOPE_RE = re.compile(r"(?:[A-Za-z0-9._-]{1,200}_)?slurmstepd\.scope")
JOB_DIR_RE = re.compile(r"job_([1-9][0-9]{0,9})")
JOB_ID_RE = re.compile(r"([1-9][0-9]{0,9})")
UID_DIR_RE = re.compile(r"uid_([0-9]{1,10})")
HIERARCHY_RE = re.compile(r"[0-9]{1,10}")
# 's' + 13 digits of "0123456789ABCDEFGHJKMNPQRSTVWXYZ"; the first carries 4 bits.
SLUID_RE = re.compile(r"s[0-9A-F][0-9A-HJKMNP-TV-Z]{12}", re.IGNORECASE)
MAX_JOB_ID = 0xFFFFFFFD  # 0xFFFFFFFE/0xFFFFFFFF are Slurm's NO_VAL/INFINITE
MAX_UID = 0xFFFFFFFE  # (uid_t)-1 is not a user
CGROUP_MAX_BYTES = 64 << 10  # /proc/PID/cgroup and /proc/PID/status
MAX_CGROUP_LINE = 8192  # the kernel's cgroup paths are at most PATH_MAX (4096)
ENVIRON_MAX_BYTES = 512 << 10  # ARG_MAX-sized environments are cut, never the answer
ENVIRON_MAX_READS = 32


class CgroupJob(NamedTuple):
    job_id: str  # Slurm job id; "" when the cgroup names the job by its SLUID
    uid: int | None  # from a cgroup v1 uid_<N> component
    sluid: str = ""  # Slurm 26.05+ job directory name, upper case


def parse_slurm_cgroup(text: str, root: str = "") -> CgroupJob | None:
    """/proc/PID/cgroup text -> the Slurm job its lines name; None when no line names
    one, or two lines name different jobs (which of them is true cannot be known)."""
    jobs = {slurm_job_of_line(line, root) for line in text.split("\n")}
    jobs.discard(None)
    return jobs.pop() if len(jobs) == 1 else None


def looks_like_slurm_job(text: str) -> bool:
    """Whether any /proc/PID/cgroup line has a component shaped like slurmd's own
    (job_<id>, [<node>_]slurmstepd.scope): when parse_slurm_cgroup found no job there,
    the cgroup was made outside slurmd's hierarchy (a user, a container), or slurmd runs
    under a cgroup root the collector was not given (--slurm-cgroup-root)."""
    return any(
        JOB_DIR_RE.fullmatch(name) or SLURM_V2_SCOPE_RE.fullmatch(name)
        for line in text.split("\n")
        for name in cgroup_line_path(line).split("/")
    )


def cgroup_line_path(line: str) -> str:
    """'12:freezer:/slurm/uid_1/job_3' or '0::/system.slice/...' -> the path, else ''."""
    parts = line.split(":", 2)
    if len(line) > MAX_CGROUP_LINE or len(parts) != 3 or not HIERARCHY_RE.fullmatch(parts[0]):
        return ""
    return parts[2] if parts[2].startswith("/") else ""


def slurm_job_of_line(line: str, root: str = "") -> CgroupJob | None:
    """One /proc/PID/cgroup line -> its Slurm job, only at the position slurmd creates
    in the hierarchy it uses (v2 form on the "0::" line, v1 form on a controller line)."""
    names = names_below(cgroup_line_path(line), root)
    if names is None:
        return None
    hierarchy, controllers = line.split(":", 2)[:2]
    if hierarchy == "0" and controllers == "":
        return v2_job(names)
    if controllers and not controllers.startswith("name="):
        return v1_job(names)
    return None


def names_below(path: str, root: str) -> list[str] | None:
    """'/a/b/c' below root '/a' -> ['b', 'c']; None if not below it or an empty name
    (the kernel never writes '//' or a trailing '/' except for the root itself)."""
    if not path.startswith(root + "/"):
        return None
    names = path[len(root) + 1 :].split("/")
    return names if all(names) else None


def v1_job(names: list[str]) -> CgroupJob | None:
    """['slurm[_node]', 'uid_<n>', 'job_<n>', ...] -> CgroupJob."""
    if len(names) < 3 or not SLURM_V1_ROOT_RE.fullmatch(names[0]):
        return None
    uid = bounded_int(UID_DIR_RE, names[1], MAX_UID)
    return None if uid is None else job_dir(names[2], uid)


def v2_job(names: list[str]) -> CgroupJob | None:
    """['system.slice', '[node_]slurmstepd.scope', 'job_<n>' or SLUID, ...] -> CgroupJob."""
    if len(names) < 3 or names[0] != "system.slice":
        return None
    return job_dir(names[2], None) if SLURM_V2_SCOPE_RE.fullmatch(names[1]) else None


def valid_cgroup_root(root: str) -> bool:
    """--slurm-cgroup-root: '' (the hierarchy's root) or an absolute path without
    empty names, '.' or '..', and without a trailing '/'."""
    if root == "":
        return True
    names = root.split("/")
    return (
        names[0] == ""
        and len(root) <= MAX_CGROUP_LINE
        and all(n and n not in (".", "..") and "\n" not in n for n in names[1:])
    )


def job_dir(name: str, uid: int | None) -> CgroupJob | None:
    """'job_3' or 'sEKNKTV3WPV500' (the directory below the Slurm root) -> CgroupJob."""
    job_id = bounded_int(JOB_DIR_RE, name, MAX_JOB_ID)
    if job_id is not None:
        return CgroupJob(str(job_id), uid)
    if SLUID_RE.fullmatch(name):
        return CgroupJob("", uid, "s" + name[1:].upper())
    return None


def bounded_int(pattern: re.Pattern[str], text: str, maximum: int) -> int | None:
    match = pattern.fullmatch(text)
    value = int(match.group(1)) if match else None
    return value if value is not None and value <= maximum else None


def parse_status_uid(text: str) -> int | None:
    match = re.search(r"^Uid:\s+([0-9]{1,10})\s", text + "\n", re.MULTILINE)
    return int(match.group(1)) if match else None


def environ_job_id(data: bytes) -> str:
    """First SLURM_JOB_ID=<valid id> of /proc/PID/environ bytes, else ''.

    Entries end in NUL, so the last piece of a split is empty or was cut by the
    read limit: it is never used.
    """
    for entry in data.split(b"\0")[:-1]:
        if entry.startswith(b"SLURM_JOB_ID="):
            text = entry[len(b"SLURM_JOB_ID=") :].decode("ascii", "replace")
            job_id = bounded_int(JOB_ID_RE, text, MAX_JOB_ID)
            return "" if job_id is None else str(job_id)
    return ""


class SluidResolver:
    """SLUID -> job id for one cycle, from the environment of the job's processes."""

    def __init__(self, proc_root: str, max_reads: int = ENVIRON_MAX_READS) -> None:
        self.proc_root = proc_root
        self.reads_left = max_reads
        self.ids: dict[str, str] = {}

    def learn(self, sluid: str, pid: int) -> None:
        if sluid in self.ids or self.reads_left <= 0:
            return
        self.reads_left -= 1
        data = _read_bytes(os.path.join(self.proc_root, str(pid), "environ"), ENVIRON_MAX_BYTES)
        job_id = environ_job_id(data or b"")
        if job_id:
            self.ids[sluid] = job_id


def user_name(uid: int | None) -> str:
    if uid is None:
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def _read_bytes(path: str, limit: int) -> bytes | None:
    """A regular file's first ``limit`` bytes (files.read_regular: never blocks on a FIFO)."""
    return read_regular(path, limit)


def _read_text(path: str, limit: int = STATE_MAX_BYTES) -> str | None:
    return read_text(path, limit)


class JobRef(NamedTuple):
    job_id: str  # "" until a SLUID is resolved (see job_label)
    user: str
    sluid: str = ""


def job_of_pid(
    proc_root: str,
    pid: int,
    resolver: SluidResolver | None = None,
    cgroup_root: str = "",
    rejected: set[int] | None = None,
) -> JobRef | None:
    """The Slurm job of a GPU process; pid goes into ``rejected`` when its cgroup looks
    like a job's but is not one slurmd made (node_gpu_job_cgroups_rejected)."""
    pid_dir = os.path.join(proc_root, str(pid))
    text = _read_text(os.path.join(pid_dir, "cgroup"), CGROUP_MAX_BYTES) or ""
    parsed = parse_slurm_cgroup(text, cgroup_root)
    if parsed is None:
        if rejected is not None and looks_like_slurm_job(text):
            rejected.add(pid)
        return None
    uid = parsed.uid
    if uid is None:
        uid = parse_status_uid(_read_text(os.path.join(pid_dir, "status"), CGROUP_MAX_BYTES) or "")
    if parsed.sluid and resolver is not None:
        resolver.learn(parsed.sluid, pid)
    return JobRef(parsed.job_id, user_name(uid), parsed.sluid)


def job_label(job: JobRef, sluid_ids: dict[str, str]) -> str:
    """The job_id label: the id, the id learned for the SLUID, else the SLUID."""
    return job.job_id or sluid_ids.get(job.sluid, "") or job.sluid


def jobs_by_gpu(
    apps: Iterable[ComputeApp], lookup: Callable[[int], JobRef | None]
) -> dict[str, set[JobRef]]:
    """gpu uuid -> {JobRef}: one entry per (GPU, job), never per PID."""
    out: dict[str, set[JobRef]] = {}
    for app in apps:
        job = lookup(app.pid)
        if job is not None:
            out.setdefault(app.gpu_uuid, set()).add(job)
    return out
