"""Metric families from parsed Slurm data (pure)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet_node.exposition import Family, Registry
from gpufleet_node.slurm_exporter.model import (
    DEFAULT_MAX_GPU_INDEX_SERIES,
    JOB_STATES,
    NEVER_STALE,
    NODE_STATE_BUCKETS,
    NODE_STATE_NAMES,
    REJECT_REASONS,
    UNAVAILABLE_PREFIXES,
    UP_COMMANDS,
    JobDetail,
    JobList,
    NodeRow,
    QueueRow,
    Sdiag,
    ShareRow,
)
from gpufleet_node.slurm_exporter.parsers.common import gpu_count
from gpufleet_node.slurm_exporter.parsers.jobs import verify_jobs


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
