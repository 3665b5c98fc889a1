"""Reports as text (with bars, for a terminal) or JSON (for scripts)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from gpufleet.jobstats.report import JobReport
from gpufleet_node.job_summary.summary import MAX_TIME, Fault
from gpufleet_node.numbers import finite, in_range, strict_dumps

BAR_WIDTH = 20
GIB = 1024**3
MAX_FAULT_LINES = 20  # then a count; --json lists them all


def bar(fraction: float | None, width: int = BAR_WIDTH) -> str:
    """[#####...............] for 0.25; blanks when unknown (None, NaN, +/-Inf)."""
    known = finite(fraction)
    if known is None:
        return "[" + " " * width + "]"
    filled = round(min(max(known, 0.0), 1.0) * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _clock(ts: float) -> str:
    known = in_range(ts, 0, MAX_TIME - 1)
    return "-" if known is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(known))


def duration(seconds: float) -> str:
    known = in_range(seconds, 0, MAX_TIME)
    if known is None:
        return "-"
    minutes = int(known // 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    text = f"{hours}h {minutes:02d}m"
    return f"{days}d {text}" if days else text


def _num(value: float | None, fmt: str, unit: str = "") -> str:
    """A figure in ``fmt``; "-" when there is none (None, NaN, +/-Inf)."""
    known = finite(value)
    return "-" if known is None else f"{known:{fmt}}{unit}"


def _ratio(part: float | None, whole: float | None) -> float | None:
    """part / whole, or None where either is missing or zero (no 0/0, no inf/inf)."""
    top, bottom = finite(part), finite(whole)
    return top / bottom if top and bottom else None


def _gib(value: float | None) -> str:
    known = finite(value)
    return "-" if known is None else f"{known / GIB:.1f}"


def clean(text: str) -> str:
    """Label values come from Slurm users: no control characters reach the terminal."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)[:120]


def fault_line(fault: Fault) -> str:
    """GPU 1 on gpu01 faulted during the run: xid79 (fallen off the bus), first seen ..."""
    node = clean(fault.node)
    where = f"node {node}" if fault.gpu is None else f"GPU {clean(fault.gpu)} on {node}"
    seen = in_range(fault.first_seen, 0, MAX_TIME - 1)
    when = (
        "seen only between the query's steps (a brief fault)"
        if seen is None
        else "first seen " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seen))
    )
    return f"{where} faulted during the run: {clean(fault.reason or fault.check)}, {when}"


def job_text(report: JobReport) -> str:
    state = "running" if report.running else "ended"
    lines = [
        f"job {clean(report.job_id)}  user {clean(report.user) or '-'}  account "
        f"{clean(report.account) or '-'}  partition {clean(report.partition) or '-'}"
        + (f"  cluster {clean(report.cluster)}" if report.cluster else ""),
        f"{_clock(report.start)} -> {_clock(report.end)} ({duration(report.end - report.start)}"
        f", {state}); {len(report.gpus)} GPUs on {len(report.nodes)} nodes",
        "",
        f"{'GPU':<20} {'utilization mean':<{BAR_WIDTH + 10}} {'max':>5}  "
        f"{'memory max / total GiB':>22}  {'power mean':>10}",
    ]
    for g in report.gpus:
        mem_share = _ratio(g.mem_used_max, g.mem_total)
        lines.append(
            f"{clean(g.node) + ':' + g.gpu:<20} "
            f"{bar(_ratio(g.util_mean, 100.0))} "
            f"{_num(g.util_mean, '5.1f', ' %'):>7} {_num(g.util_max, '4.0f', '%'):>5}  "
            f"{_gib(g.mem_used_max):>7} / {_gib(g.mem_total):>6} {_num(mem_share, '4.0%'):>6}  "
            f"{_num(g.power_mean, '6.0f', ' W'):>10}"
        )
    lines += ["", f"{'node':<20} {'CPU mean':<{BAR_WIDTH + 17}} memory max"]
    for n in report.nodes:
        cpus = f" of {_num(n.cpus, '.0f')}" if finite(n.cpus) else ""
        total = f" of {_num(_ratio(n.mem_total, GIB), '.0f')} GiB" if finite(n.mem_total) else ""
        lines.append(
            f"{clean(n.node):<20} {bar(n.cpu_mean)} {_num(n.cpu_mean, '5.0%'):>6}{cpus:<8} "
            f"{bar(n.mem_max)} {_num(n.mem_max, '5.0%'):>6}{total}"
        )
    if report.faults:
        lines += ["", *(fault_line(f) for f in report.faults[:MAX_FAULT_LINES])]
        if len(report.faults) > MAX_FAULT_LINES:
            more = len(report.faults) - MAX_FAULT_LINES
            lines.append(f"... and {more} more faults (--json lists them all)")
    mean = _num(report.util_mean, ".1f", " %")
    lines += ["", f"verdict: {report.verdict} (mean GPU utilization {mean})"]
    lines += [f"  - {line}" for line in report.advice]
    if report.missing:
        lines += ["missing data:"] + [f"  - {line}" for line in report.missing]
    return "\n".join(line.rstrip() for line in lines)


def job_json(report: JobReport) -> str:
    """Strict JSON: NaN and infinities (a sample Prometheus holds) as null."""
    data = asdict(report)
    for gpu in data["gpus"]:
        peak = finite(gpu["util_max"])
        gpu["idle"] = peak is not None and peak < report.threshold
    return strict_dumps(data, indent=2)


def idle_text(result: dict[str, Any]) -> str:
    lines = [
        f"GPU-hours allocated at under {result['threshold']:g} % utilization, last "
        f"{result['since']} ({result['source']})",
    ]
    for key in ("user", "account"):
        rows = result[f"by_{key}"]
        total = sum(finite(row["gpu_hours"]) or 0.0 for row in rows)
        lines += ["", f"{key:<24} {'GPU-hours':>10}"]
        for row in rows:
            hours = row["gpu_hours"]
            lines.append(
                f"{clean(row[key]):<24} {_num(hours, '>10.1f')}  {bar(_ratio(hours, total))}"
            )
        if not rows:
            lines.append("(none)")
    return "\n".join(lines)
