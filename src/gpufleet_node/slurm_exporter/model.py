"""The Slurm commands the exporter runs, its bounds, and the parsed data model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

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
# JSON failures after which auto tries the text form (and keeps it).
JOB_FALLBACK_ERRORS = ("exit_code", "parse", "output_limit")
# Bytes of job records read per collection. They are parsed as they arrive and never held,
# so this bounds a runaway command, not memory: 30,000 jobs are ~250 MiB of JSON.
JOB_MAX_OUTPUT = 4 * 1024 * 1024 * 1024
# Job ids with several text records asked for one by one per collection, at most.
MAX_JOB_REQUERIES = 32
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
    "ambiguous",  # free text holds more record heads that squeue agrees with: which is real?
    "duplicate",  # the same job id twice, squeue agrees with more than one (a line break in
    # free text can forge a record; the collector asks scontrol for that job alone first)
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


# The per-job rows are NamedTuples, not frozen dataclasses: several times cheaper to build
# (a frozen dataclass sets each field through object.__setattr__), and a collection builds
# one per job (bench/slurm_jobs_bench.py: 30,000 jobs read from JSON in half the time).


class QueueRow(NamedTuple):
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


class NodeAlloc(NamedTuple):
    """GPUs one job holds on one node (from a ``Nodes=... GRES=...`` detail segment)."""

    node: str
    gpus: int
    indices: tuple[int, ...]


class JobDetail(NamedTuple):
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


class JobList(list[JobDetail]):
    """Parsed job records plus what was left out and why (a list, for the generic code)."""

    def __init__(self, jobs: Iterable[JobDetail] = (), source: str = "text") -> None:
        super().__init__(jobs)
        self.source = source
        self.rejected: Counter[str] = Counter()
        # Text form: job id -> its records, each the jobs its heads describe, where that is
        # not exactly one record with one head (free text forged a head or a record).
        self.unresolved: dict[str, list[tuple[JobDetail, ...]]] = {}

    @property
    def unusable(self) -> bool:
        """Output with records, none of them in a known layout (a format change, not an attack)."""
        return (
            not self
            and not self.unresolved
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
