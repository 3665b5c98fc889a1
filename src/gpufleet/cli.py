"""``gpufleet`` command: review the shard plan before a rollout; job and idle-GPU reports.

    gpufleet plan INVENTORY [--shards N] [--lock FILE] [--json]
    gpufleet plan --write-lock INVENTORY [--lock FILE] [--json]
    gpufleet plan --diff OLD NEW [--shards N] [--lock FILE] [--json]
    gpufleet jobstats JOBID [--prometheus URL | -i INVENTORY | --summary FILE] [--json]
    gpufleet report idle --since 7d [--threshold 5] (--prometheus URL | -i INVENTORY) [--json]

INVENTORY, OLD and NEW are node list files or inventory directories holding one. The
shard lock is ``monitoring.shard_lock`` of the node list (of OLD with --diff), or FILE.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpufleet import hostlist
from gpufleet.inventory import plan_shards, shard_table
from gpufleet.jobstats import command as jobstats_command
from gpufleet.nodelist import (
    Checker,
    NodeList,
    NodeListError,
    check_shard_count,
    find_node_list,
    load_node_list,
    load_shard_lock,
)
from gpufleet.sharding import diff_assignments, imbalance
from gpufleet.shardlock import format_lock
from gpufleet.sizing import DEFAULT_MAX_SERIES_PER_SHARD, PROMETHEUS_2_MAX_SERIES_PER_SHARD
from gpufleet_node.numbers import strict_dumps

EXIT_OK = 0
EXIT_INVALID = 2
EXIT_BROKEN_PIPE = 128 + 13  # as if killed by SIGPIPE, like other tools in `... | head`


def load(path: str, shards: int | None, lock_file: str | None = None) -> NodeList:
    """The node list; ``lock_file`` replaces its ``monitoring.shard_lock``."""
    node_list = load_node_list(find_node_list(path))
    if lock_file:
        lock = load_shard_lock(lock_file, node_list.cluster)
        monitoring = replace(node_list.monitoring, shard_lock=lock_file)
        node_list = replace(node_list, monitoring=monitoring, lock=lock)
    if shards is None:
        return node_list
    if shards < 1:
        raise NodeListError(path, "--shards", f"must be >= 1, got {shards}")
    check_shard_count(Checker(path), shards, len(node_list.hosts), "--shards")
    out_of_range = {host: s for host, s in node_list.monitoring.pin.items() if s >= shards}
    if out_of_range:
        host, shard = next(iter(out_of_range.items()))
        raise NodeListError(path, f"monitoring.pin.{host}", f"shard {shard} does not exist")
    return replace(node_list, monitoring=replace(node_list.monitoring, shards=shards))


def plan_report(node_list: NodeList) -> dict[str, Any]:
    shard_of = plan_shards(node_list)
    rows = shard_table(node_list, shard_of)
    monitoring = node_list.monitoring
    return {
        "cluster": node_list.cluster,
        "file": node_list.file,
        "hosts": len(node_list.hosts),
        "gpus": sum(host.gpu_count for host in node_list.hosts),
        "series": sum(host.expected_series for host in node_list.hosts),
        "shards": monitoring.shards,
        "replicas": monitoring.replicas,
        "sharding": monitoring.sharding,
        "max_imbalance": monitoring.max_imbalance,
        "imbalance": round(imbalance(row["series"] for row in rows), 4),
        "max_series_per_shard": monitoring.max_series_per_shard,
        "over_budget": [
            row["shard"] for row in rows if row["series"] > monitoring.max_series_per_shard
        ],
        "max_gpus_per_shard": monitoring.max_gpus_per_shard,
        "over_gpu_limit": [
            row["shard"] for row in rows if row["gpus"] > monitoring.max_gpus_per_shard
        ],
        "shard_table": rows,
        "lock": lock_summary(node_list, shard_of),
        "assignment": shard_of,
    }


def lock_summary(node_list: NodeList, shard_of: dict[str, int]) -> dict[str, Any] | None:
    """The configured lock, and how many of its entries the plan would change."""
    path = node_list.monitoring.shard_lock
    if not path:
        return None
    lock = node_list.lock
    if lock is None:
        return {"file": path, "present": False}
    hosts = lock.hosts
    outdated = sum(1 for host, shard in shard_of.items() if hosts.get(host) != shard)
    outdated += sum(1 for host in hosts if host not in shard_of)
    if lock.shards != node_list.monitoring.shards:
        outdated = max(outdated, 1)
    return {"file": path, "present": True, "hosts": len(hosts), "outdated": outdated}


def format_lock_line(lock: dict[str, Any] | None) -> list[str]:
    if lock is None:
        return []
    if not lock["present"]:
        return [f"lock: {lock['file']} missing: stateless plan (--write-lock creates it)"]
    if "changed" in lock:
        state = f"written, {lock['changed']:,} entries changed"
    elif lock["outdated"]:
        state = f"{lock['outdated']:,} entries to update (--write-lock)"
    else:
        state = "up to date"
    return [f"lock: {lock['file']}: {lock['hosts']:,} hosts, {state}"]


def format_plan(report: dict[str, Any]) -> str:
    lines = [
        f"cluster {report['cluster']}: {report['hosts']} hosts, {report['gpus']} GPUs, "
        f"{report['series']:,} expected series",
        f"{report['shards']} shard(s) x {report['replicas']} replica(s), "
        f"sharding: {report['sharding']}",
        *format_lock_line(report["lock"]),
        "",
        f"{'shard':>5}  {'hosts':>6}  {'gpus':>6}  {'series':>11}  {'share':>6}",
    ]
    total = report["series"] or 1
    for row in report["shard_table"]:
        lines.append(
            f"{row['shard']:>5}  {row['hosts']:>6}  {row['gpus']:>6}  {row['series']:>11,}  "
            f"{100 * row['series'] / total:>5.1f}%"
        )
    verdict = "ok" if report["imbalance"] <= report["max_imbalance"] + 1e-9 else "OVER LIMIT"
    lines += [
        "",
        f"imbalance: {report['imbalance']:.3f} (heaviest shard / mean; limit "
        f"{report['max_imbalance']:.2f}, {verdict})",
        *format_budget_lines(report),
    ]
    return "\n".join(lines)


def format_budget_lines(report: dict[str, Any]) -> list[str]:
    """One line per shard whose estimate passes ``monitoring.max_series_per_shard``."""
    budget = report["max_series_per_shard"]
    heaviest = max((row["series"] for row in report["shard_table"]), default=0)
    lines = [f"series budget per shard: {budget:,} (heaviest shard {heaviest / budget:.0%})"]
    if budget == DEFAULT_MAX_SERIES_PER_SHARD:
        # The default is sized for the 3.x the role installs; a 2.x server holds less.
        lines.append(
            "  (the Prometheus 3.x default; servers on 2.x: "
            f"max_series_per_shard: {PROMETHEUS_2_MAX_SERIES_PER_SHARD})"
        )
    for shard in report["over_budget"]:
        series = report["shard_table"][shard]["series"]
        lines.append(
            f"WARNING: shard {shard} expects {series:,} series, over the budget of {budget:,} "
            "(monitoring.max_series_per_shard): add shards, or raise the budget for bigger servers"
        )
    for shard in report["over_gpu_limit"]:
        gpus = report["shard_table"][shard]["gpus"]
        lines.append(
            f"WARNING: shard {shard} holds {gpus:,} GPUs, over the limit of "
            f"{report['max_gpus_per_shard']:,} (monitoring.max_gpus_per_shard, the largest "
            "shard whose rule evaluation was measured): add shards"
        )
    return lines


def diff_report(old: NodeList, new: NodeList) -> dict[str, Any]:
    """Both plans start from OLD's shard lock (the one in force), if any."""
    monitoring = replace(new.monitoring, shard_lock=old.monitoring.shard_lock)
    new = replace(new, monitoring=monitoring, lock=old.lock)
    old_report, new_report = plan_report(old), plan_report(new)
    moves = diff_assignments(old_report["assignment"], new_report["assignment"])
    moved = [m for m in moves if m.old_shard is not None and m.new_shard is not None]
    kept_hosts = sum(1 for host in old_report["assignment"] if host in new_report["assignment"])
    return {
        "old": {k: v for k, v in old_report.items() if k != "assignment"},
        "new": {k: v for k, v in new_report.items() if k != "assignment"},
        "moved": [{"host": m.host, "from": m.old_shard, "to": m.new_shard} for m in moved],
        "added": [{"host": m.host, "to": m.new_shard} for m in moves if m.old_shard is None],
        "removed": [{"host": m.host, "from": m.old_shard} for m in moves if m.new_shard is None],
        "moved_fraction": round(len(moved) / kept_hosts, 4) if kept_hosts else 0.0,
        "lock": old.lock.file if old.lock else None,
    }


def grouped(
    items: list[dict[str, Any]], keys: tuple[str, ...]
) -> list[tuple[tuple[Any, ...], str]]:
    """Group hosts by the given keys and compress each group into a hostlist."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for item in items:
        groups.setdefault(tuple(item[k] for k in keys), []).append(item["host"])
    return [(key, hostlist.compress(hosts)) for key, hosts in sorted(groups.items())]


def shorten(text: str, width: int = 64) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def format_diff(report: dict[str, Any]) -> str:
    old, new = report["old"], report["new"]
    lines = [
        f"old: {old['hosts']} hosts on {old['shards']} shard(s), imbalance {old['imbalance']:.3f}",
        f"new: {new['hosts']} hosts on {new['shards']} shard(s), imbalance {new['imbalance']:.3f}",
        f"{len(report['moved'])} host(s) move ({100 * report['moved_fraction']:.1f}% of the hosts "
        f"in both), {len(report['added'])} added, {len(report['removed'])} removed",
    ]
    if report["lock"]:
        lines.insert(0, f"lock: {report['lock']} (both plans start from it)")
    if report["moved"]:
        lines += ["", "moves:"]
        for (source, target), hosts in grouped(report["moved"], ("from", "to")):
            lines.append(f"  shard {source} -> {target}: {shorten(hosts)}")
    if report["added"]:
        lines += ["", "added:"]
        for (target,), hosts in grouped(report["added"], ("to",)):
            lines.append(f"  -> shard {target}: {shorten(hosts)}")
    if report["removed"]:
        lines += ["", "removed:"]
        for (source,), hosts in grouped(report["removed"], ("from",)):
            lines.append(f"  shard {source} ->: {shorten(hosts)}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufleet", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="show the shard plan, or what a change would move")
    plan.add_argument("inventory", nargs="?", help="node list file or inventory directory")
    plan.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), help="compare two node lists")
    plan.add_argument("--shards", type=int, help="override the shard count (NEW with --diff)")
    plan.add_argument(
        "--lock", metavar="FILE", help="shard lock to use (and write) instead of the configured one"
    )
    plan.add_argument(
        "--write-lock", action="store_true", help="write the plan to the shard lock file"
    )
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    jobstats_command.add_parsers(commands)
    return parser


def run_plan(args: argparse.Namespace) -> str:
    if args.diff:
        if args.inventory:
            raise SystemExit("gpufleet plan: give either INVENTORY or --diff OLD NEW")
        if args.write_lock:
            raise SystemExit("gpufleet plan: --write-lock writes INVENTORY's plan, not a diff")
        old_path, new_path = args.diff
        report = diff_report(load(old_path, None, args.lock), load(new_path, args.shards))
        return strict_dumps(report, indent=2) if args.json else format_diff(report)
    if not args.inventory:
        raise SystemExit("gpufleet plan: INVENTORY is required (or --diff OLD NEW)")
    if args.write_lock:
        if args.shards is not None:
            raise SystemExit("gpufleet plan: --write-lock takes the node list's own shards")
        report = write_lock(load_for_writing(args.inventory, args.lock))
    else:
        report = plan_report(load(args.inventory, args.shards, args.lock))
    return strict_dumps(report, indent=2) if args.json else format_plan(report)


def load_for_writing(path: str, lock_file: str | None) -> NodeList:
    node_list = load(path, None, lock_file)
    if not node_list.monitoring.shard_lock:
        raise NodeListError(
            node_list.file,
            "monitoring.shard_lock",
            "not set; add e.g. 'shard_lock: .shards.lock' (or give --lock FILE)",
        )
    return node_list


def write_lock(node_list: NodeList) -> dict[str, Any]:
    """Write the plan (sticky to the current lock) to the lock file, atomically."""
    report = plan_report(node_list)
    path = node_list.monitoring.shard_lock
    text = format_lock(node_list.cluster, node_list.monitoring.shards, report["assignment"])
    temporary = f"{path}.tmp{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except OSError as err:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise NodeListError(path, "", f"cannot write: {err.strerror or err}") from err
    previous = report["lock"] or {}
    changed = previous.get("outdated", len(report["assignment"]))
    report["lock"] = {
        "file": path,
        "present": True,
        "hosts": len(report["assignment"]),
        "outdated": 0,
        "changed": changed,
    }
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code = EXIT_OK
    if args.command in ("jobstats", "report"):
        outcome = jobstats_command.run(args)
        output, code = outcome.text, outcome.code
        for line in outcome.stderr:
            print(line, file=sys.stderr)
        if not output:
            return code
    else:
        try:
            output = run_plan(args)
        except NodeListError as err:
            print(f"gpufleet: {err}", file=sys.stderr)
            return EXIT_INVALID
    try:
        print(output, flush=True)
    except BrokenPipeError:
        # The reader is gone (`gpufleet plan ... | head -1`): nothing to say, and nobody to
        # say it to. Point stdout at /dev/null so the interpreter's final flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    return code
