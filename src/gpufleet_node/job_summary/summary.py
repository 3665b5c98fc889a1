"""The stored job summary: ``GF1:`` + base64 of zlib-compressed compact JSON.

Written by the slurmctld epilog (:mod:`gpufleet_node.job_summary.cli`) into the job's
AdminComment, read back by ``gpufleet jobstats`` once Prometheus no longer holds the
job. Both sides import this module: one definition of the format.

AdminComment is readable by every user (``sacct -o AdminComment``) and settable by any
Slurm admin, so :func:`decode` takes hostile text: bounded before and after inflating,
every field checked against the schema, errors are :class:`SummaryError` with one line.

Schema 1 (JSON, compact)::

    {"v": 1, "job": "4242", "user": ..., "account": ..., "partition": ..., "cluster": ...,
     "start": 1764115200, "end": 1764122400,      # Unix seconds, the series' span
     "nodes": [[node, gpus_allocated, cpu_mean, cpu_max, mem_max, mem_total, cpus], ...],
     "gpus": [[node, gpu, util_mean, util_max, mem_used_max, mem_total,
               power_mean, power_max], ...],      # NVML index; null where no data
     "dropped": 0,                                # GPU rows left out to fit MAX_ENCODED
     "down": ["shard-1"],                         # instances that did not answer
     "faults": [[node, gpu, check, reason, first_seen], ...],  # only if any
     "faults_dropped": 3}                         # only if any

Shares (cpu_*, mem_max) are 0..1, utilization percent, memory bytes, power watts.
``faults``: the GPU health checks that failed on the job's GPUs (``gpu``: NVML index) or
its nodes (``gpu`` null) during its span, first seen at ``first_seen`` (Unix seconds, or
null: between two query steps); at most MAX_FAULTS, the others counted in
``faults_dropped``. A summary without them reads as one without faults.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import zlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from gpufleet_node.numbers import in_range, strict_dumps

PREFIX = "GF1:"
VERSION = 1
# Slurm keeps AdminComment in slurmdbd's job table as a TEXT column (65,535 bytes).
# A 64-GPU job takes about 2 KB; a job too large for this loses GPU rows ("dropped").
MAX_ENCODED = 60000
MAX_JSON = 1024 * 1024  # inflated size accepted when reading
MAX_NODES = 20000
MAX_GPUS = 160000
MAX_TEXT = 128  # user, account, partition, cluster
MAX_VALUE = 1e18
MAX_DOWN = 64
MAX_FAULTS = 32  # stored; a job with more keeps the first seen ones
MAX_COUNT = 10**6  # faults_dropped

JOB_ID = re.compile(r"^[0-9]{1,12}$")
# Slurm job ids are uint32; 0xFFFFFFFE/0xFFFFFFFF are NO_VAL/INFINITE (as the GPU collector).
MAX_JOB_ID = 0xFFFFFFFD
MAX_TIME = 2**40  # seconds since the epoch: a Unix time in the summary, 36,800 years
SAFE_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
SAFE_GPU = re.compile(r"^[0-9]{1,4}$")
# How each figure is measured over the job's span: (per GPU or per node, figure) ->
# (range function, recording rule). gpufleet jobstats and the epilog both query these.
FIGURES = {
    ("gpu", "util_mean"): ("avg_over_time", "gpu:utilization_percent:max"),
    ("gpu", "util_max"): ("max_over_time", "gpu:utilization_percent:max"),
    ("gpu", "mem_used_max"): ("max_over_time", "gpu:memory_used_bytes:sum"),
    ("gpu", "mem_total"): ("max_over_time", "gpu:memory_total_bytes:sum"),
    ("gpu", "power_mean"): ("avg_over_time", "gpu:power_draw_watts:max"),
    ("gpu", "power_max"): ("max_over_time", "gpu:power_draw_watts:max"),
    ("node", "cpu_mean"): ("avg_over_time", "node:cpu_utilization:ratio"),
    ("node", "cpu_max"): ("max_over_time", "node:cpu_utilization:ratio"),
    ("node", "mem_max"): ("max_over_time", "node:memory_utilization:ratio"),
    ("node", "mem_total"): ("max_over_time", "node:memory_total_bytes:sum"),
    ("node", "cpus"): ("max_over_time", "node:cpus:count"),
}
MAX_GPUS_PER_NODE = 4096
# GPU faults: the GPU collector's health checks (src/gpufleet_node/gpu_collector/
# verdict.py) write node_gpu_health_check{gpu, check, state, reason} 1 every cycle for each
# check that is not ok; a check of the whole node has no gpu label.
HEALTH_SERIES = "node_gpu_health_check"
FAULT_STEP_S = 60  # resolution of a fault's first-seen time
MAX_FAULT_POINTS = 20_000  # subquery points per series: under VictoriaMetrics' 30,000

NODE_FIELDS = ("cpu_mean", "cpu_max", "mem_max", "mem_total", "cpus")
GPU_FIELDS = (
    "util_mean",
    "util_max",
    "mem_used_max",
    "mem_total",
    "power_mean",
    "power_max",
)
# Digits kept per figure: enough for a report, and the JSON compresses better.
# util_max decides the idle verdict (util_max < threshold): it is rounded down, so that
# for any threshold of up to 3 decimals the stored figure gives the live verdict (4.996
# rounded to 5.00 would have made an idle GPU busy).
ROUNDED_DOWN = {"util_max"}
DIGITS = {
    "cpu_mean": 4,
    "cpu_max": 4,
    "mem_max": 4,
    "mem_total": 0,
    "cpus": 0,
    "util_mean": 2,
    "util_max": 3,
    "mem_used_max": 0,
    "power_mean": 1,
    "power_max": 1,
}

Values = dict[str, Optional[float]]


def canonical_job_id(text: str) -> str:
    """A Slurm job id as Slurm writes it (and the exporter labels it): decimal, no leading
    zeros. ``0042`` is job 42, as ``scontrol show job 0042`` reads it; ValueError (one
    line) for anything that is not a job id (0, signs, spaces, more than 32 bits)."""
    if not JOB_ID.fullmatch(text) or not 0 < int(text) <= MAX_JOB_ID:
        raise ValueError(
            f"{text[:40]!r} is not a Slurm job id (a decimal number from 1 to {MAX_JOB_ID})"
        )
    return str(int(text))


def figure_value(value: float | None) -> float | None:
    """A figure as reports take it: a finite number in 0..MAX_VALUE, else None (no figure:
    NaN, +/-Inf, negative or absurd values from a Prometheus answer or a recording rule)."""
    return in_range(value, 0, MAX_VALUE)


def node_regex(nodes: Iterable[str]) -> str:
    """A PromQL regex matching exactly these nodes (names passed SAFE_NODE)."""
    return "|".join(node.replace(".", "\\\\.") for node in sorted(nodes))


@dataclass(frozen=True)
class Fault:
    """A health check that failed on one of a job's GPUs, or on one of its nodes."""

    node: str
    gpu: str | None  # NVML index; None: a check of the whole node (gpu_count, ...)
    check: str  # xid, ecc_uncorrectable, ...
    reason: str  # "xid79 (fallen off the bus)"; printable, at most MAX_TEXT characters
    first_seen: float | None  # Unix time, to the query's step; None: between two steps


def fault_query(nodes: Iterable[str], start: float, end: float) -> str:
    """One instant query, at ``end``, for the failing health checks of ``nodes`` over the
    span [start, end]: per series, the first time a subquery step saw it; -1 for a series
    seen only between two steps (``max_over_time`` reads every sample: nothing is missed,
    and ``and`` keeps out a check that had stopped failing before the span)."""
    span = max(60, round(end - start))
    step = max(FAULT_STEP_S, -(-span // MAX_FAULT_POINTS))
    selector = f'{HEALTH_SERIES}{{state="fail",node=~"{node_regex(nodes)}"}}'
    present = f"max_over_time({selector}[{span}s])"
    first = f"min_over_time(timestamp({selector})[{span}s:{step}s])"
    return f"({first} and {present}) or ({present} * 0 - 1)"


def fault_order(fault: Fault) -> tuple[bool, float, str, int, str, str]:
    """First seen first (unknown times last), then node, the node's own checks, GPU, check."""
    seen = fault.first_seen
    gpu = -1 if fault.gpu is None else int(fault.gpu)
    return (seen is None, seen or 0.0, fault.node, gpu, fault.check, fault.reason)


def unique_faults(faults: Iterable[Fault]) -> list[Fault]:
    """In fault_order, the first seen of each (node, GPU, check): parts of one job (two
    shards that both scrape a node) may repeat one."""
    found: dict[tuple[str, str | None, str], Fault] = {}
    for fault in sorted(faults, key=fault_order):
        found.setdefault((fault.node, fault.gpu, fault.check), fault)
    return list(found.values())


def faults_of(
    samples: Iterable[tuple[dict[str, str], float]],
    gpus: Mapping[str, Collection[str]],
    start: float,
    end: float,
) -> list[Fault]:
    """The job's faults in an answer to :func:`fault_query`, sorted by :func:`fault_order`.

    ``gpus``: each of the job's nodes and its GPUs (NVML indices). A check of another GPU
    of the node is not the job's; a node's own check (no gpu label) is. One fault per
    (node, GPU, check): the first seen (its reason may change, as an ECC error count does).
    Label text is cleaned (printable, MAX_TEXT characters); a time outside the span is
    taken to its bounds (a check failing when the job started: its start).
    """
    found = []
    for labels, value in samples:
        node, gpu = labels.get("node", ""), labels.get("gpu", "")
        check = _clean(labels.get("check", ""))
        if node not in gpus or not check or labels.get("state") != "fail":
            continue
        if gpu and (gpu not in gpus[node] or not SAFE_GPU.fullmatch(gpu)):
            continue  # another job's GPU, or no GPU index
        seen = in_range(value, 0, MAX_TIME - 1)  # -1: seen between steps
        if seen is not None:
            seen = min(max(seen, start), end)
        found.append(Fault(node, gpu or None, check, _clean(labels.get("reason", "")), seen))
    return unique_faults(found)


class SummaryError(ValueError):
    """Text that is not a valid summary; the message is one line."""


@dataclass
class JobIdentity:
    """Whose job it was, where and when: what a live report's job and a summary share."""

    job_id: str
    user: str = ""
    account: str = ""
    partition: str = ""
    cluster: str = ""
    start: float = 0.0
    end: float = 0.0


@dataclass
class Summary(JobIdentity):
    nodes: dict[str, tuple[int, Values]] = field(default_factory=dict)  # node -> (GPUs, figures)
    gpus: dict[tuple[str, str], Values] = field(default_factory=dict)  # (node, gpu) -> figures
    dropped: int = 0
    down: list[str] = field(default_factory=list)  # instances that did not answer: nodes lost
    threshold: float | None = None  # the site's idle threshold (percent) when it was stored
    faults: list[Fault] = field(default_factory=list)  # in fault_order
    faults_dropped: int = 0


def _number(value: float | None, digits: int) -> float | None:
    """A figure as stored: rounded; None for what no figure can be (NaN, negative, huge)."""
    figure = figure_value(value)
    if figure is None:
        return None
    rounded = round(figure, digits)
    return int(rounded) if digits == 0 else rounded


def _unix_time(value: float, rounding: Callable[[float], int]) -> int:
    """A span end as stored; SummaryError for what is no Unix time (NaN, +/-Inf, huge)."""
    number = in_range(value, 0, MAX_TIME - 1)
    if number is None:
        raise SummaryError(f"the job's span is not a Unix time ({str(value)[:20]})")
    return rounding(number)


def _figure(values: Values, name: str) -> float | None:
    value = figure_value(values.get(name))  # before the scaling: 1e308 * 1000 is inf
    if name in ROUNDED_DOWN and value is not None:
        # round() first: 4.35 * 1000 is 4349.999..., whose floor would be 4.349.
        scale = 10 ** DIGITS[name]
        value = math.floor(round(value * scale, 6)) / scale
    return _number(value, DIGITS[name])


def _clean(text: str) -> str:
    """A label value as stored: printable and short (Prometheus labels may hold anything)."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)[:MAX_TEXT]


def _stored_faults(summary: Summary) -> list[Fault]:
    """The faults as decode reads them back: of a listed node, a GPU index or None, a check;
    text cleaned, times whole seconds; one per (node, GPU, check)."""
    faults = []
    for fault in summary.faults:
        seen = in_range(fault.first_seen, 0, MAX_TIME - 1)
        stored = Fault(
            fault.node,
            fault.gpu,
            _clean(fault.check),
            _clean(fault.reason),
            None if seen is None else math.floor(seen),
        )
        gpu_ok = stored.gpu is None or SAFE_GPU.fullmatch(stored.gpu)
        if stored.node in summary.nodes and gpu_ok and stored.check:
            faults.append(stored)
    return unique_faults(faults)


def to_json(
    summary: Summary, gpu_limit: int | None = None, fault_limit: int = MAX_FAULTS
) -> dict[str, Any]:
    gpus = sorted(summary.gpus.items(), key=lambda item: (item[0][0], int(item[0][1])))
    kept = gpus if gpu_limit is None else gpus[:gpu_limit]
    faults = _stored_faults(summary)
    extra: dict[str, Any] = {}
    if faults:  # a job without faults stores what it stored before faults were
        extra["faults"] = [
            [f.node, f.gpu, f.check, f.reason, f.first_seen] for f in faults[:fault_limit]
        ]
    dropped_faults = summary.faults_dropped + len(faults) - len(faults[:fault_limit])
    if dropped_faults:
        extra["faults_dropped"] = min(dropped_faults, MAX_COUNT)
    return {
        "v": VERSION,
        "job": summary.job_id,
        "user": _clean(summary.user),
        "account": _clean(summary.account),
        "partition": _clean(summary.partition),
        "cluster": _clean(summary.cluster),
        "start": _unix_time(summary.start, math.floor),
        "end": _unix_time(summary.end, math.ceil),
        "nodes": [
            [node, count] + [_number(values.get(f), DIGITS[f]) for f in NODE_FIELDS]
            for node, (count, values) in sorted(summary.nodes.items())
        ],
        "gpus": [
            [node, gpu] + [_figure(values, f) for f in GPU_FIELDS] for (node, gpu), values in kept
        ],
        "dropped": summary.dropped + len(gpus) - len(kept),
        "down": [_clean(name) for name in summary.down[:MAX_DOWN]],
        "threshold": _number(in_range(summary.threshold, 0, 100), 3),  # as decode reads it
        **extra,
    }


def _dump(document: dict[str, Any]) -> bytes:
    return strict_dumps(document, separators=(",", ":"), ensure_ascii=True).encode()


def _pack(raw: bytes) -> str:
    return PREFIX + base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def encode(summary: Summary, limit: int = MAX_ENCODED) -> str:
    """The AdminComment text, at most ``limit`` characters and MAX_JSON inflated: GPU rows
    are left out (the last ones, counted in ``dropped``) until it fits. What is returned
    passed the reader's checks (the text stored, not the whole document: a job too large
    for the reader's bounds still gets its summary, cut)."""
    keep, faults = len(summary.gpus), MAX_FAULTS
    while True:
        raw = _dump(to_json(summary, keep, faults))
        text = _pack(raw)
        if len(text) <= limit and len(raw) <= MAX_JSON:
            break
        if keep == 0 and faults:
            faults = 0  # the GPU rows went first; then the faults (counted)
            continue
        if keep == 0:
            raise SummaryError(f"job {summary.job_id}: summary exceeds {limit} characters")
        # Proportional first (a huge job would take many steps), then a tenth at a time.
        share = min(limit / len(text), MAX_JSON / len(raw))
        keep = min(keep * 9 // 10, int(keep * share))
    decode(text, summary.job_id, limit=limit)
    return text


def _text(document: dict[str, Any], key: str) -> str:
    value = document.get(key, "")
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise SummaryError(f"field {key!r} is not a short string")
    if not all(ch.isprintable() for ch in value):
        raise SummaryError(f"field {key!r} holds control characters")
    return value


def _time(document: dict[str, Any], key: str) -> float:
    value = document.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_TIME:
        raise SummaryError(f"field {key!r} is not a Unix time")
    return float(value)


def _values(row: list[Any], names: tuple[str, ...]) -> Values:
    values: Values = {}
    for name, value in zip(names, row):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SummaryError(f"{name} is not a number")
        if not (math.isfinite(value) and 0 <= value <= MAX_VALUE):
            raise SummaryError(f"{name} is out of range")
        values[name] = float(value)
    return values


def _rows(document: dict[str, Any], key: str, width: int, most: int) -> list[list[Any]]:
    rows = document.get(key)
    if not isinstance(rows, list) or len(rows) > most:
        raise SummaryError(f"field {key!r} is not a list of at most {most} rows")
    for row in rows:
        if not isinstance(row, list) or len(row) != width:
            raise SummaryError(f"a row of {key!r} is not a list of {width} values")
    return rows


def _inflate(text: str) -> bytes:
    try:
        packed = base64.b64decode(text[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError) as err:
        raise SummaryError("not base64") from err
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(packed, MAX_JSON)
    except zlib.error as err:
        raise SummaryError("not zlib data") from err
    if inflater.unconsumed_tail:
        raise SummaryError(f"inflates to more than {MAX_JSON} bytes")
    if not inflater.eof:
        raise SummaryError("truncated zlib data")
    return raw


def decode(text: str, job_id: str, limit: int | None = MAX_ENCODED) -> Summary:
    """The summary in ``text`` (an AdminComment), which must be ``job_id``'s."""
    text = text.strip()
    if not text.startswith(PREFIX):
        raise SummaryError(f"no gpufleet summary (text does not start with {PREFIX})")
    if limit is not None and len(text) > limit:
        raise SummaryError(f"longer than {limit} characters")
    try:
        document = json.loads(_inflate(text).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        # RecursionError: nesting deeper than the interpreter's stack ("[" * 200000).
        if isinstance(err, SummaryError):
            raise
        raise SummaryError("not JSON") from err
    if not isinstance(document, dict) or document.get("v") != VERSION:
        raise SummaryError(f"not a schema {VERSION} summary")
    if document.get("job") != job_id:
        found = str(document.get("job"))[:20]
        raise SummaryError(f"the summary is of job {found!r}, not {job_id}")
    summary = Summary(
        job_id=job_id,
        user=_text(document, "user"),
        account=_text(document, "account"),
        partition=_text(document, "partition"),
        cluster=_text(document, "cluster"),
        start=_time(document, "start"),
        end=_time(document, "end"),
    )
    if summary.start > summary.end:
        raise SummaryError("start is after end")
    dropped = document.get("dropped", 0)
    if isinstance(dropped, bool) or not isinstance(dropped, int) or not 0 <= dropped <= MAX_GPUS:
        raise SummaryError("field 'dropped' is not a count")
    summary.dropped = dropped
    down = document.get("down", [])
    if not isinstance(down, list) or len(down) > MAX_DOWN:
        raise SummaryError("field 'down' is not a short list")
    summary.down = [_text({"down": name}, "down") for name in down]
    threshold = document.get("threshold")
    if threshold is not None:
        number = not isinstance(threshold, bool) and isinstance(threshold, (int, float))
        if not (number and 0 <= threshold <= 100):  # NaN compares false
            raise SummaryError("field 'threshold' is not a percentage")
        summary.threshold = float(threshold)
    for row in _rows(document, "nodes", 2 + len(NODE_FIELDS), MAX_NODES):
        node, count = row[0], row[1]
        if not isinstance(node, str) or not SAFE_NODE.fullmatch(node):
            raise SummaryError("a node name is not a host name")
        if isinstance(count, bool) or not isinstance(count, int):
            raise SummaryError(f"{node}: GPU count is not a number")
        if not 0 <= count <= MAX_GPUS_PER_NODE or node in summary.nodes:
            raise SummaryError(f"{node}: GPU count out of range or node listed twice")
        summary.nodes[node] = (count, _values(row[2:], NODE_FIELDS))
    for row in _rows(document, "gpus", 2 + len(GPU_FIELDS), MAX_GPUS):
        node, gpu = row[0], row[1]
        if not isinstance(node, str) or node not in summary.nodes:
            raise SummaryError("a GPU row names a node the summary does not list")
        if not isinstance(gpu, str) or not SAFE_GPU.fullmatch(gpu) or (node, gpu) in summary.gpus:
            raise SummaryError(f"{node}: a GPU index is not a number or is listed twice")
        summary.gpus[(node, gpu)] = _values(row[2:], GPU_FIELDS)
    _read_faults(document, summary)
    return summary


def _read_faults(document: dict[str, Any], summary: Summary) -> None:
    dropped = document.get("faults_dropped", 0)
    if isinstance(dropped, bool) or not isinstance(dropped, int) or not 0 <= dropped <= MAX_COUNT:
        raise SummaryError("field 'faults_dropped' is not a count")
    summary.faults_dropped = dropped
    if "faults" not in document:
        return
    seen: set[tuple[str, str | None, str]] = set()
    for node, gpu, check, reason, first in _rows(document, "faults", 5, MAX_FAULTS):
        if not isinstance(node, str) or node not in summary.nodes:
            raise SummaryError("a fault names a node the summary does not list")
        if gpu is not None and (not isinstance(gpu, str) or not SAFE_GPU.fullmatch(gpu)):
            raise SummaryError(f"{node}: a fault's GPU index is not a number")
        fault = Fault(
            node,
            gpu,
            _text({"check": check}, "check"),
            _text({"reason": reason}, "reason"),
            None if first is None else _time({"first_seen": first}, "first_seen"),
        )
        if not fault.check or (node, gpu, fault.check) in seen:
            raise SummaryError(f"{node}: a fault without a check, or listed twice")
        seen.add((node, gpu, fault.check))
        summary.faults.append(fault)
    summary.faults.sort(key=fault_order)
