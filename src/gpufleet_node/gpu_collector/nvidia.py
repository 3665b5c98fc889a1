"""nvidia-smi: the queried fields and the CSV parser for GPUs and compute apps."""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Optional

from .model import (
    MAX_COMPUTE_APPS,
    MAX_FIELD_CHARS,
    MAX_GPUS,
    MAX_LINE_CHARS,
    MIB,
    CollectorError,
    GpuData,
    Sample,
)
from .values import (
    clean_label,
    is_not_applicable,
    parse_bool,
    parse_number,
    parse_pstate,
    parse_recovery_action,
)

Parser = Callable[[Optional[str]], Optional[float]]


class FieldSpec(NamedTuple):
    fields: tuple[str, ...]  # candidates, first present value wins
    metric: str
    parse: Parser
    scale: float = 1.0
    labels: tuple[tuple[str, str], ...] = ()


# nvidia-smi reports MiB, MHz and percent; the metric names carry base units.
UNIT_SCALES = (("_bytes", MIB), ("_hertz", 1e6), ("_ratio", 0.01))


def unit_scale(metric: str) -> float:
    return next((scale for suffix, scale in UNIT_SCALES if metric.endswith(suffix)), 1.0)


def _read(parse: Parser, metrics: dict[str, str]) -> tuple[FieldSpec, ...]:
    """nvidia-smi field -> metric, each value read by parse and scaled to base units."""
    return tuple(
        FieldSpec((field,), metric, parse, unit_scale(metric)) for field, metric in metrics.items()
    )


def _by_label(metric: str, label: str, **fields: str) -> tuple[FieldSpec, ...]:
    """One family read from several fields, one field per value of its label."""
    return tuple(
        FieldSpec((field,), metric, parse_number, labels=((label, value),))
        for value, field in fields.items()
    )


FIELD_SPECS: tuple[FieldSpec, ...] = (
    *_read(
        parse_number,
        {
            "memory.total": "memory_total_bytes",
            "memory.used": "memory_used_bytes",
            "memory.free": "memory_free_bytes",
            "memory.reserved": "memory_reserved_bytes",
            "utilization.gpu": "utilization_percent",
            "utilization.memory": "memory_utilization_ratio",
            "utilization.encoder": "encoder_utilization_ratio",
            "utilization.decoder": "decoder_utilization_ratio",
            "temperature.gpu": "temperature_celsius",
            "temperature.memory": "memory_temperature_celsius",
            "temperature.gpu.tlimit": "temperature_tlimit_margin_celsius",
            "power.draw": "power_draw_watts",
            "power.limit": "power_limit_watts",
            "enforced.power.limit": "power_enforced_limit_watts",
            "power.default_limit": "power_default_limit_watts",
            "power.max_limit": "power_max_limit_watts",
            "clocks.current.sm": "sm_clock_hertz",
            "clocks.max.sm": "sm_clock_max_hertz",
            "clocks.current.graphics": "graphics_clock_hertz",
            "clocks.current.memory": "memory_clock_hertz",
            "clocks.max.memory": "memory_clock_max_hertz",
        },
    ),
    # gpucurrent replaces the deprecated .current; old drivers only know .current
    FieldSpec(
        ("pcie.link.gen.gpucurrent", "pcie.link.gen.current"), "pcie_link_generation", parse_number
    ),
    *_read(
        parse_number,
        {
            "pcie.link.gen.max": "pcie_link_generation_max",
            "pcie.link.width.current": "pcie_link_width_lanes",
            "pcie.link.width.max": "pcie_link_width_max_lanes",
            "fan.speed": "fan_speed_ratio",
        },
    ),
    *_read(parse_pstate, {"pstate": "performance_state"}),
    *_read(
        parse_bool,
        {"ecc.mode.current": "ecc_mode_enabled", "ecc.mode.pending": "ecc_mode_pending_enabled"},
    ),
    *_by_label(
        "ecc_corrected_errors_total",
        "scope",
        volatile="ecc.errors.corrected.volatile.total",
        aggregate="ecc.errors.corrected.aggregate.total",
    ),
    *_by_label(
        "ecc_uncorrected_errors_total",
        "scope",
        volatile="ecc.errors.uncorrected.volatile.total",
        aggregate="ecc.errors.uncorrected.aggregate.total",
    ),
    *_by_label(
        "retired_pages",
        "cause",
        single_bit_ecc="retired_pages.single_bit_ecc.count",
        double_bit_ecc="retired_pages.double_bit.count",
    ),
    *_read(parse_bool, {"retired_pages.pending": "retired_pages_pending"}),
    *_by_label(
        "remapped_rows",
        "cause",
        correctable="remapped_rows.correctable",
        uncorrectable="remapped_rows.uncorrectable",
    ),
    *_read(
        parse_bool,
        {
            "remapped_rows.pending": "remapped_rows_pending",
            "remapped_rows.failure": "remapped_rows_failure",
        },
    ),
    *_read(parse_recovery_action, {"gpu_recovery_action": "recovery_action"}),
    *_read(
        parse_bool,
        {
            "mig.mode.current": "mig_mode_enabled",
            "mig.mode.pending": "mig_mode_pending_enabled",
            "persistence_mode": "persistence_mode_enabled",
        },
    ),
)

# NVML clock event (throttle) reason bits, nvmlClocksEventReason*.
CLOCK_EVENT_BITS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clocks_setting", 0x100),
)
CLOCK_EVENT_COUNTERS = (
    "sw_power_cap",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
IDENTITY_FIELDS = ("index", "uuid", "driver_version", "vbios_version")
# nvidia-smi does not quote CSV values, and the product name is the only free
# text we query. Asked for last, a comma in it only adds trailing columns, which
# parse_csv joins back into the name; the PCI bus id asked for just before it
# proves that nothing earlier was shifted (else the row is a bad_row).
TEXT_TAIL = ("pci.bus_id", "name")
PCI_BUS_ID_RE = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")
SPECIAL_FIELDS = (
    "clocks_event_reasons.supported",
    "clocks_event_reasons.active",
    *tuple(f"clocks_event_reasons_counters.{r}" for r in CLOCK_EVENT_COUNTERS),
)
# Field names drivers before the clocks_event rename (~R535) use instead.
FIELD_ALIASES = {f: f.replace("clocks_event_", "clocks_throttle_") for f in SPECIAL_FIELDS}
FIELD_GROUPS = (tuple(f for f in SPECIAL_FIELDS if "_counters." in f),)
COMPUTE_APPS_FIELDS = ("gpu_uuid", "pid", "used_memory")
INVALID_FIELD_RE = re.compile(r'Field "([^"]+)" is not a valid field to query')


def all_query_fields() -> list[str]:
    """Every field the collector asks for, in a stable order, without duplicates."""
    fields: list[str] = list(IDENTITY_FIELDS)
    for spec in FIELD_SPECS:
        fields.extend(spec.fields)
    fields.extend(SPECIAL_FIELDS)
    fields.extend(TEXT_TAIL)
    return list(dict.fromkeys(fields))


def effective_fields(removed: Iterable[str], aliased: Iterable[str]) -> list[str]:
    gone, alias = set(removed), set(aliased)
    return [FIELD_ALIASES[f] if f in alias else f for f in all_query_fields() if f not in gone]


def canonical_field(header: str) -> str:
    """'power.draw [W]' -> 'power.draw'; old 'clocks_throttle_reasons.x' -> new name."""
    name = header.strip()
    unit = name.rfind("[")
    if name.endswith("]") and unit >= 0 and "]" not in name[unit:-1]:
        name = name[:unit].rstrip()  # no regex: linear on any input
    return name.replace("clocks_throttle_", "clocks_event_")


class CsvTable(NamedTuple):
    header: list[str]
    rows: list[dict[str, str]]
    skipped: int  # message lines between rows (no separator), e.g. for a lost GPU


FIELD_NAME_RE = re.compile(r"[A-Za-z0-9_.]+")


def parse_csv(
    text: str,
    max_rows: int,
    too_many: str = "too_many_gpus",
    join_tail: bool = False,
    expected: Sequence[str] | None = None,
) -> CsvTable:
    """nvidia-smi CSV (header with or without units) -> CsvTable.

    The header is the line whose fields are exactly the ``expected`` ones, the fields
    asked for (find_header); lines before it are messages (an infoROM warning), skipped
    and counted. A line without any comma is a message nvidia-smi prints between rows (e.g.
    "Unable to determine the device handle for GPU...: Unknown Error" for a lost
    GPU): skipped and counted. Any other line that does not fit the header fails
    the whole parse (CollectorError bad_row or parse_error), as do more than
    ``max_rows`` rows (CollectorError ``too_many``). With ``join_tail``, the
    extra columns a comma in the name made are joined back (see TEXT_TAIL).
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise CollectorError("parse_error", "empty output")
    start = find_header(lines, expected)
    header = list(csv_header(lines[start]))
    rows: list[dict[str, str]] = []
    skipped = start  # message lines before the header (an infoROM warning)
    for number, line in enumerate(lines[start + 1 :], start=start + 2):
        if len(header) > 1 and "," not in line:
            skipped += 1
            continue
        if len(rows) >= max_rows:
            raise CollectorError(too_many, f"more than {max_rows} rows")
        values = csv_fields(line, "bad_row")
        rows.append(
            csv_row(header, join_text_tail(header, values) if join_tail else values, number)
        )
    return CsvTable(header, rows, skipped)


# Fields nvidia-smi prints under another name than the one asked for (its help lists
# both: "used_gpu_memory" or "used_memory").
HEADER_ALIASES = {"used_gpu_memory": "used_memory"}


def header_key(name: str) -> str:
    """A header or query field name -> the one name both are compared by."""
    canonical = canonical_field(name)
    return HEADER_ALIASES.get(canonical, canonical)


def find_header(lines: list[str], expected: Sequence[str] | None) -> int:
    """Index of the header: the first line whose fields are ``expected`` (compared by
    header_key), or without ``expected`` the first line that is a header at all.
    CollectorError parse_error when there is none."""
    want = None if expected is None else tuple(header_key(f) for f in expected)
    for index, line in enumerate(lines):
        try:
            header = csv_header(line)
        except CollectorError:
            continue
        if want is None or header == want:
            return index
    raise CollectorError("parse_error", "no CSV header" if want is None else "no expected header")


@functools.lru_cache(maxsize=16)
def csv_header(line: str) -> tuple[str, ...]:
    """A header line -> canonical field names; the loop sees the same line every cycle."""
    header = tuple(header_key(h) for h in csv_fields(line, "parse_error"))
    if not header or not all(FIELD_NAME_RE.fullmatch(h) for h in header):
        raise CollectorError("parse_error", "no CSV header")
    return header


def csv_fields(line: str, reason: str) -> list[str]:
    """One line -> stripped fields. Lines are split first, so an unterminated
    quote cannot swallow the rows after it."""
    if len(line) > MAX_LINE_CHARS:
        raise CollectorError(reason, f"a line of {len(line)} characters")
    try:
        values = next(csv.reader([line], skipinitialspace=True), [])
    except csv.Error as exc:  # e.g. a field over csv.field_size_limit()
        raise CollectorError("parse_error", f"CSV: {exc}") from exc
    return list(map(str.strip, values))


def join_text_tail(header: list[str], values: list[str]) -> list[str]:
    width = len(header)
    if len(values) <= width or header[-2:] != list(TEXT_TAIL):
        return values
    if not PCI_BUS_ID_RE.fullmatch(values[width - 2]):
        return values  # something before the name had the comma: leave it a bad row
    return [*values[: width - 1], ", ".join(values[width - 1 :])]


def csv_row(header: list[str], values: list[str], number: int) -> dict[str, str]:
    width = len(header)
    if len(values) != width:
        raise CollectorError("bad_row", f"line {number}: {len(values)} fields, header has {width}")
    if width and max(map(len, values)) > MAX_FIELD_CHARS:
        raise CollectorError("bad_row", f"line {number}: a field over {MAX_FIELD_CHARS} characters")
    return {name: values[i] for i, name in enumerate(header)}


def clock_event_values(row: dict[str, str]) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    out: list[tuple[str, tuple[tuple[str, str], ...], float]] = []
    active = special_outcome(row.get("clocks_event_reasons.active"))[0]
    supported = special_outcome(row.get("clocks_event_reasons.supported"))[0]
    if active is not None:
        for reason, bit in CLOCK_EVENT_BITS:
            if supported is None or int(supported) & bit:
                out.append(
                    (
                        "clock_event_reason_active",
                        (("reason", reason),),
                        float(bool(int(active) & bit)),
                    )
                )
    for reason in CLOCK_EVENT_COUNTERS:
        micros = special_outcome(row.get(f"clocks_event_reasons_counters.{reason}"))[0]
        if micros is not None:
            out.append(("clock_event_reason_seconds_total", (("reason", reason),), micros * 1e-6))
    return out


# The loop parses mostly the same text every cycle (memory sizes, limits, modes, [N/A]):
# what a field's text parses to is kept, bounded, instead of parsed again.
PARSE_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=PARSE_CACHE_SIZE)
def spec_outcome(index: int, raws: tuple[str | None, ...]) -> tuple[float | None, bool]:
    """FIELD_SPECS[index] over its candidates' text: (scaled value, unreadable).

    The first candidate that parses wins; with none, the field is unreadable when
    any candidate holds something other than a "not applicable" token.
    """
    spec = FIELD_SPECS[index]
    for raw in raws:
        value = spec.parse(raw)
        if value is not None:
            return value * spec.scale, False
    return None, any(not is_not_applicable(raw) for raw in raws)


@functools.lru_cache(maxsize=PARSE_CACHE_SIZE)
def special_outcome(raw: str | None) -> tuple[float | None, bool]:
    """A SPECIAL_FIELDS value: (number, unreadable)."""
    value = parse_number(raw)
    return value, value is None and not is_not_applicable(raw)


def field_values(
    row: dict[str, str],
) -> tuple[list[tuple[str, tuple[tuple[str, str], ...], float]], int]:
    """(metric, labels, value) of every field that has a value, and the count of
    fields answered with an error token or a value their parser rejects."""
    out: list[tuple[str, tuple[tuple[str, str], ...], float]] = []
    unreadable = 0
    for index, spec in enumerate(FIELD_SPECS):
        value, bad = spec_outcome(index, tuple(map(row.get, spec.fields)))
        if value is not None:
            out.append((spec.metric, spec.labels, value))
        unreadable += bad
    for field in SPECIAL_FIELDS:
        unreadable += special_outcome(row.get(field))[1]
    return out + clock_event_values(row), unreadable


INDEX_RE = re.compile(r"[0-9]{1,4}")
PID_RE = re.compile(r"[0-9]{1,10}")


def nvidia_row_to_gpu(row: dict[str, str]) -> GpuData:
    index = row.get("index", "")
    if not INDEX_RE.fullmatch(index):
        raise CollectorError("bad_row", f"GPU index {index[:40]!r} is not a number")
    info = {
        "model": clean_label(row.get("name")),
        "pci_bus_id": clean_label(row.get("pci.bus_id")),
        "driver_version": clean_label(row.get("driver_version")),
        "vbios_version": clean_label(row.get("vbios_version")),
    }
    uuid = clean_label(row.get("uuid"))
    values, unreadable = field_values(row)
    return GpuData(str(int(index)), uuid, "nvidia", info, values, unreadable)


class NvidiaParse(NamedTuple):
    gpus: list[GpuData]  # sorted by index, first row of a duplicated index only
    skipped: int  # message lines between the rows
    duplicates: int  # rows whose index an earlier row had


def parse_nvidia_output(text: str, expected: Sequence[str] | None = None) -> NvidiaParse:
    table = parse_csv(text, MAX_GPUS, "too_many_gpus", join_tail=True, expected=expected)
    if "index" not in table.header:
        raise CollectorError("parse_error", "no index column")
    gpus: dict[str, GpuData] = {}
    duplicates = 0
    for row in table.rows:
        gpu = nvidia_row_to_gpu(row)
        duplicates += gpu.gpu in gpus
        gpus.setdefault(gpu.gpu, gpu)
    return NvidiaParse(sorted(gpus.values(), key=lambda g: int(g.gpu)), table.skipped, duplicates)


def nvidia_gpus_and_notes(
    text: str, expected: Sequence[str] | None = None
) -> tuple[list[GpuData], list[Sample]]:
    """GPUs plus the parse's health series; duplicate indices fail the cycle:
    which of two rows for one GPU is right cannot be known. ``expected``: the
    --query-gpu fields (the header to look for)."""
    parsed = parse_nvidia_output(text, expected)
    notes = [
        Sample("collector_skipped_lines", (), float(parsed.skipped)),
        Sample("collector_duplicate_gpu_rows", (), float(parsed.duplicates)),
    ]
    if parsed.duplicates:
        raise CollectorError("duplicate_gpu", f"{parsed.duplicates} rows repeat an index", notes)
    return parsed.gpus, notes


def parse_nvidia_gpus(text: str, expected: Sequence[str] | None = None) -> list[GpuData]:
    return nvidia_gpus_and_notes(text, expected)[0]


class ComputeApp(NamedTuple):
    gpu_uuid: str
    pid: int
    used_bytes: float | None


def parse_compute_apps(text: str, expected: Sequence[str] | None = None) -> list[ComputeApp]:
    apps = []
    table = parse_csv(text, MAX_COMPUTE_APPS, "too_many_processes", expected=expected)
    if "pid" not in table.header:
        raise CollectorError("parse_error", "no pid column")
    for row in table.rows:
        pid = row.get("pid", "")
        if not PID_RE.fullmatch(pid):
            continue
        mem = parse_number(row.get("used_memory", row.get("used_gpu_memory")))
        apps.append(
            ComputeApp(row.get("gpu_uuid", ""), int(pid), None if mem is None else mem * MIB)
        )
    return apps


def invalid_fields(output: str) -> list[str]:
    return INVALID_FIELD_RE.findall(output)
