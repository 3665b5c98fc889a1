"""``gpufleet jobstats JOBID`` and ``gpufleet report idle``: arguments and flow.

Missing data ends with one line on stderr and EXIT_NO_DATA: an unknown job (or one older
than the retention), a Prometheus, shard or global tier that does not answer. A report
with holes (a shard down while others hold the job) is printed, and exits EXIT_NO_DATA too.
A job Prometheus no longer holds is reported from the summary the slurmctld epilog stored
(:mod:`gpufleet.jobstats.stored`): read with sacct where it runs, or from ``--summary``.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.jobstats import idle, render, stored
from gpufleet.jobstats.access import Access, inventory_access
from gpufleet.jobstats.collect import Figures, collect
from gpufleet.jobstats.discover import JobPlace, check_job_id, find_job, slurm_seen
from gpufleet.jobstats.report import IDLE_THRESHOLD, build_report, missing_data
from gpufleet.jobstats.targets import (
    Instance,
    Topology,
    ask,
    ask_best,
    from_inventory,
    prometheus_hosts,
    single,
)
from gpufleet_node.job_summary.prom import PromClient, PromError
from gpufleet_node.job_summary.summary import MAX_FAULTS
from gpufleet_node.numbers import strict_dumps

EXIT_NO_DATA = 3
PASSWORD_ENV = "GPUFLEET_PROMETHEUS_PASSWORD"
RUNNING_SLACK_S = 180  # a job whose last sample is this recent is still running


class NoData(Exception):
    """The data to answer is missing; the message is one line."""


@dataclass
class Outcome:
    text: str  # stdout; empty on errors
    code: int = 0
    stderr: list[str] = field(default_factory=list)  # errors, holes in the data, query stats


def percent(text: str) -> float:
    """A threshold in 0..100 (argparse type)."""
    value = float(text)
    if not 0 <= value <= 100:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage in 0..100")
    return value


def seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds in (0, 3600]")
    return value


def add_source_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    where = parser.add_mutually_exclusive_group(required=required)
    where.add_argument("--prometheus", metavar="URL", help="the Prometheus to query")
    where.add_argument(
        "-i", "--inventory", metavar="INVENTORY", help="node list file or inventory directory"
    )
    parser.add_argument(
        "--ca-file", help="CA bundle for https (default with -i: the inventory's prometheus_tls_ca)"
    )
    parser.add_argument(
        "--user", help="basic auth user (default with -i: the inventory's, as the role's clients)"
    )
    parser.add_argument(
        "--password-file",
        help=f"file holding the basic auth password (or set {PASSWORD_ENV}); never on argv",
    )
    parser.add_argument("--timeout", type=seconds, default=30.0, help="seconds per query")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--stats", action="store_true", help="print Prometheus' query stats")


def add_parsers(commands: Any) -> None:
    jobstats = commands.add_parser("jobstats", help="GPU, CPU and memory use of a Slurm job")
    jobstats.add_argument("job_id", metavar="JOBID")
    # Without --prometheus/-i: the stored summary, from sacct or --summary.
    add_source_arguments(jobstats, required=False)
    jobstats.add_argument(
        "--summary",
        metavar="FILE",
        help="read the job's stored summary (its AdminComment text) from FILE, not Prometheus",
    )
    jobstats.add_argument(
        "--lookback", default="30d", help="how far back to look for the job (default 30d)"
    )
    jobstats.add_argument(
        "--threshold",
        type=percent,
        help="utilization (%%) under which a GPU is idle; default: the recording rules' "
        f"{idle.THRESHOLD_SERIES} (the site's), else {IDLE_THRESHOLD:g}",
    )
    report = commands.add_parser("report", help="cluster reports")
    kinds = report.add_subparsers(dest="report", required=True)
    idle_parser = kinds.add_parser("idle", help="GPU-hours allocated while idle, by user/account")
    add_source_arguments(idle_parser)
    idle_parser.add_argument("--since", default="7d", help="window (24h, 7d, 2w; default 7d)")
    idle_parser.add_argument(
        "--threshold",
        type=percent,
        help="utilization (%%) under which a GPU is idle; default: the recording rules' "
        "(the site's threshold)",
    )


def password(args: argparse.Namespace) -> str | None:
    if args.password_file:
        try:
            with open(args.password_file, encoding="utf-8") as handle:
                return handle.read(4096).strip("\r\n")
        except OSError as err:
            raise NoData(f"--password-file: {err.strerror or err}") from err
    return os.environ.get(PASSWORD_ENV)


def client_factory(args: argparse.Namespace, stats: list[dict[str, Any]], where: Topology) -> Any:
    access = where.access or Access()
    if args.user:
        username, secret = args.user, password(args)
    else:  # the inventory's login, if any
        username, secret = access.username or None, access.password or None
    ca_data = None if args.ca_file else access.ca or None

    def make(url: str) -> PromClient:
        client = PromClient(
            url,
            timeout=args.timeout,
            ca_file=args.ca_file,
            ca_data=ca_data,
            username=username,
            password=secret,
            want_stats=args.stats,
        )
        client.stats = stats
        return client

    return make


def topology(args: argparse.Namespace) -> Topology:
    if args.prometheus:
        return single(args.prometheus)
    # The same node list `gpufleet plan` reads.
    from gpufleet.nodelist import find_node_list, load_node_list

    node_list = load_node_list(find_node_list(args.inventory))
    access = inventory_access(node_list, prometheus_hosts(node_list))
    scheme = "https" if args.ca_file else access.scheme
    return replace(from_inventory(node_list, scheme, access.port_base), access=access)


def _find_on(
    instance: Instance, make: Any, job_id: str, lookback_s: int, now: float
) -> tuple[str, JobPlace] | str:
    """(answering URL, the job's part there), or why the instance gave nothing."""
    try:
        return ask_best(
            instance,
            make,
            lambda c: (c.url, find_job(c, job_id, lookback_s, now)),
            score=lambda found: coverage(found[1]),
        )
    except PromError as err:
        return str(err)


def coverage(place: JobPlace) -> float:
    """How much of the job a replica holds: its span, or -1 if it does not know the job."""
    return place.end - place.start if place.gpus_allocated else -1.0


def run_jobstats(args: argparse.Namespace) -> Outcome:
    """The live report; the stored summary when Prometheus does not hold the job."""
    job_id = check_job_id(args.job_id)
    if args.summary:
        if args.prometheus or args.inventory:
            raise ValueError("--summary reads no Prometheus: drop --prometheus/-i")
        found = _stored(lambda: stored.from_file(args.summary, job_id))
        return stored_report(args, found, f"the summary in {args.summary}")
    if not (args.prometheus or args.inventory):
        if not stored.sacct_available():
            raise ValueError("give --prometheus URL, -i INVENTORY or --summary FILE")
        return stored_report(args, _stored(lambda: stored.from_sacct(job_id)), SACCT_SOURCE)
    try:
        return live_jobstats(args, job_id)
    except NoData as err:
        if not stored.sacct_available():
            raise
        try:
            found = stored.from_sacct(job_id)
        except stored.NoSummary as why:
            raise NoData(f"{err}; no stored summary either: {why}") from err
        outcome = stored_report(args, found, SACCT_SOURCE)
        outcome.stderr.insert(0, f"gpufleet jobstats: {err}")
        return outcome


SACCT_SOURCE = "the summary stored at the job's end (its AdminComment, read with sacct)"


def _stored(read: Any) -> stored.Found:
    try:
        found: stored.Found = read()
    except stored.NoSummary as err:
        raise NoData(str(err)) from err
    return found


def stored_report(args: argparse.Namespace, found: stored.Found, source: str) -> Outcome:
    """The report from a stored summary: the same figures, verdict computed again."""
    summary, notes = found
    place, figures = stored.place_and_figures(summary)
    threshold = args.threshold
    if threshold is None:  # the site's, as stored; a summary from before it: the default
        threshold = IDLE_THRESHOLD if summary.threshold is None else summary.threshold
    report = build_report(place, figures, threshold, running=False)
    if summary.dropped:
        why = "GPU rows left out of the stored summary to fit AdminComment, or none known"
        report.missing = missing_data(place, report.gpus, report.nodes, why)
        report.missing.append(
            f"{summary.dropped} GPUs left out of the stored summary (AdminComment size limit)"
        )
    if summary.faults_dropped:
        report.missing.append(
            f"{summary.faults_dropped} GPU faults left out of the stored summary (it keeps "
            f"the first {MAX_FAULTS} seen, fewer past the AdminComment size limit)"
        )
    report.missing += [
        f"{name}: did not answer when the summary was stored (the job's nodes there are missing)"
        for name in summary.down
    ]
    report.sources = [source]
    # Holes exit EXIT_NO_DATA, as a live report with a shard down does.
    code = EXIT_NO_DATA if summary.down or summary.dropped or summary.faults_dropped else 0
    stderr = [f"gpufleet jobstats: {note}" for note in notes]
    if args.json:
        return Outcome(render.job_json(report), code, stderr)
    return Outcome(f"{render.job_text(report)}\nsource: {source}", code, stderr)


def live_jobstats(args: argparse.Namespace, job_id: str) -> Outcome:
    lookback_s = idle.parse_since(args.lookback, "--lookback")
    stats: list[dict[str, Any]] = []
    where = topology(args)
    make = client_factory(args, stats, where)
    now = time.time()
    with ThreadPoolExecutor(max_workers=8) as pool:
        found = list(
            pool.map(lambda inst: _find_on(inst, make, job_id, lookback_s, now), where.data)
        )
    down = [part for part in found if isinstance(part, str)]
    parts = [part for part in found if not isinstance(part, str) and part[1].gpus_allocated]
    if not parts:
        if down and not where.sharded:
            raise NoData(down[0])
        if down:
            raise NoData(f"job {job_id}: not on the shards that answer; {'; '.join(down)}")
        raise NoData(unknown_job(where, make, job_id, args.lookback, lookback_s, now))
    merged = JobPlace(job_id)
    for _, place in parts:
        merged = merged.merge(place)
    figures = Figures({}, {})
    for url, place in parts:
        part = collect(make(url), replace(place, start=merged.start, end=merged.end))
        figures = Figures(
            {**figures.gpus, **part.gpus},
            {**figures.nodes, **part.nodes},
            [*figures.faults, *part.faults],
        )
    running = merged.end >= now - RUNNING_SLACK_S
    threshold: float | None = args.threshold
    unset: list[str] = []
    if threshold is None:
        threshold, unset = idle.site_threshold(make(parts[0][0]), now)
    report = build_report(merged, figures, threshold, running)
    report.missing += [f"{line} (the job's nodes there are missing)" for line in down]
    report.sources = [url for url, _ in parts]
    text = render.job_json(report) if args.json else render.job_text(report)
    notes = [f"gpufleet jobstats: {line}" for line in down + unset] + stats_text(args, stats)
    return Outcome(text, EXIT_NO_DATA if down else 0, notes)


def unknown_job(
    where: Topology, make: Any, job_id: str, lookback: str, lookback_s: int, now: float
) -> str:
    seen = False
    for instance in where.data:
        try:
            seen = seen or ask(instance, make, lambda c: slurm_seen(c, lookback_s, now))
        except PromError:
            continue
    names = f"{len(where.data)} shards" if where.sharded else where.data[0].name
    if not seen:
        return (
            f"job {job_id}: no Slurm job series at all in the last {lookback} on {names}: is "
            "the gpufleet Slurm exporter scraped there?"
        )
    return (
        f"job {job_id}: unknown on {names} in the last {lookback} (wrong id, a job without "
        "GPUs, or it ended before the oldest data Prometheus keeps: raise --lookback or "
        "check the retention)"
    )


def run_report_idle(args: argparse.Namespace) -> Outcome:
    since_s = idle.parse_since(args.since)
    stats: list[dict[str, Any]] = []
    where = topology(args)
    make = client_factory(args, stats, where)
    now = time.time()
    if args.threshold is None:
        instance = where.rollups or where.data[0]
        totals, threshold, unset = ask(
            instance,
            make,
            lambda c: (idle.recorded(c, since_s, now), *idle.site_threshold(c, now)),
        )
        source = f"recording rules on {instance.name}"
    else:
        unset = []
        parts = [
            ask(inst, make, lambda c: idle.raw(c, since_s, now, args.threshold))
            for inst in where.data
        ]
        totals = idle.add(parts)
        names = ", ".join(inst.name for inst in where.data)
        source = f"per-GPU series at {idle.STEP_MIN}-minute steps on {names}"
        threshold = args.threshold
    result = {
        "since": args.since,
        "threshold": threshold,
        "source": source,
        "by_user": idle.rows(totals["user"], "user"),
        "by_account": idle.rows(totals["account"], "account"),
    }
    text = strict_dumps(result, indent=2) if args.json else render.idle_text(result)
    notes = [f"gpufleet report: {line}" for line in unset + idle.rejected_notes(totals)]
    return Outcome(text, 0, notes + stats_text(args, stats))


def stats_text(args: argparse.Namespace, stats: list[dict[str, Any]]) -> list[str]:
    """Summed query cost (``stats=all``): samples touched and Prometheus' own timings."""
    if not args.stats:
        return []
    samples = sum(s.get("samples", {}).get("totalQueryableSamples", 0) for s in stats)
    peak = max((s.get("samples", {}).get("peakSamples", 0) for s in stats), default=0)
    exec_s = sum(s.get("timings", {}).get("execTotalTime", 0.0) for s in stats)
    return [
        f"query stats: {len(stats)} queries, {samples:,} samples read, peak {peak:,} "
        f"samples in memory, {exec_s:.3f} s in Prometheus"
    ]


def run(args: argparse.Namespace) -> Outcome:
    """The subcommand; NoData/PromError/ValueError become one line and EXIT_NO_DATA."""
    try:
        if args.command == "jobstats":
            return run_jobstats(args)
        return run_report_idle(args)
    except (NoData, PromError) as err:
        return Outcome("", EXIT_NO_DATA, [f"gpufleet {args.command}: {err}"])
    except ValueError as err:  # bad arguments, a broken node list (NodeListError)
        return Outcome("", 2, [f"gpufleet {args.command}: {err}"])
