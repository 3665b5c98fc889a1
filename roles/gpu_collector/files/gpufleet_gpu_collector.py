#!/usr/bin/env python3
"""gpufleet GPU textfile collector for node_exporter.

One stdlib-only file (runs on Python 3.9+). Each cycle it runs exactly one
``nvidia-smi --query-gpu=<fields> --format=csv,nounits`` and one
``nvidia-smi --query-compute-apps=...`` (or ``amd-smi``/``rocm-smi`` JSON on AMD
nodes), reads new NVIDIA XID lines from the kernel log, maps compute processes to
Slurm jobs through their cgroup, and writes ``node_gpu_*`` series atomically into
node_exporter's textfile directory.

The only extra ``nvidia-smi`` call ever made: when the driver answers
``Field "x" is not a valid field to query.`` (older drivers), the query is retried
ONCE in the same cycle without that field (or with its old alias), and the removal
is remembered (in memory and in the state directory) so later cycles make one call.

On failure the output file holds only the collector health series (plus the
inventory's expected GPU count and the XID counters, which come from the kernel log,
not from nvidia-smi), so GPU series disappear instead of looking current.

Everything a cycle reads is bounded: ``--timeout`` is one deadline for the whole
cycle (each command gets what is left), a command's output is read up to a byte
limit, at most MAX_GPUS GPU rows are accepted, and state files of the wrong shape
are ignored.

``--once`` runs one cycle (a systemd timer's oneshot service); without it the process
loops every ``--interval`` seconds (a Type=notify service) and tells systemd READY=1
after its first cycle and WATCHDOG=1 after each one, over $NOTIFY_SOCKET. See
docs/gpu-collector.md.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import errno
import faulthandler
import functools
import json
import math
import os
import pwd
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

PREFIX = "node_gpu_"
DEFAULT_OUTPUT = "gpufleet_gpu.prom"
DEFAULT_STATE_DIR = "/var/lib/gpufleet-gpu-collector"
MIB = 1048576.0

# Bounds of one cycle (docs/gpu-collector.md). More GPU rows than MAX_GPUS, or
# more output than a limit, fails the cycle with its own reason.
MAX_GPUS = 64  # GPUs on one node; the largest servers have 8 to 20
MAX_COMPUTE_APPS = 4096  # compute-process rows (64 GPUs x 64 processes)
NVIDIA_MAX_BYTES = 1 << 20  # one nvidia-smi answer; 8 GPUs need about 10 KiB
AMD_MAX_BYTES = 4 << 20  # one amd-smi/rocm-smi JSON document
STDERR_MAX_BYTES = 64 << 10
JOURNAL_MAX_BYTES = 8 << 20  # journalctl: the newest 8 MiB of a backlog are read
XID_FILE_MAX_BYTES = 8 << 20  # --xid-source FILE: bytes read per cycle
STATE_MAX_BYTES = 4 << 20  # state files and the previous .prom file
MAX_LINE_CHARS = 64 << 10  # one CSV line
MAX_FIELD_CHARS = 1024  # one CSV field (names, UUIDs and numbers are far shorter)
KILL_GRACE_SECONDS = 0.5  # of a command's budget, kept for killing and reaping it
JOURNAL_RESERVE_SECONDS = 2.0  # of the cycle's deadline, kept for journalctl

# --------------------------------------------------------------------------- model


class Sample(NamedTuple):
    name: str  # without PREFIX
    labels: tuple[tuple[str, str], ...]
    value: float


class GpuData(NamedTuple):
    """One GPU as parsed from a vendor tool: identity plus label-less values."""

    gpu: str
    uuid: str
    vendor: str
    info: dict[str, str]
    # (metric name, extra labels, value); base labels are added by to_samples()
    values: list[tuple[str, tuple[tuple[str, str], ...], float]]
    unreadable: int | None = None  # fields answered with an error (NVIDIA only)


class CommandResult(NamedTuple):
    rc: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    truncated: bool = False  # stdout was over its byte limit


class CollectorError(Exception):
    """A cycle failure; ``reason`` is one of a small fixed set (label value).

    ``samples`` are health series the failure still reports (e.g. the number of
    duplicate GPU rows that made the cycle fail).
    """

    def __init__(self, reason: str, detail: str = "", samples: list[Sample] | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.samples = samples or []


ERROR_REASONS = (
    "not_found",
    "exec_error",
    "timeout",
    "exit_code",
    "invalid_field",
    "parse_error",  # not CSV/JSON at all (no header, a csv module error, empty)
    "bad_row",  # a row that does not fit the header, or whose GPU index is not a number
    "duplicate_gpu",  # two rows with the same GPU index
    "too_many_gpus",  # more than MAX_GPUS rows
    "output_too_large",  # the vendor tool printed more than its byte limit
    "no_vendor_tool",
    "internal_error",  # a bug in the collector; the log has the exception
)

# name -> (type, help). Every emitted family must be listed here.
FAMILIES: dict[str, tuple[str, str]] = {
    "info": (
        "gauge",
        "GPU identity (model, uuid, PCI bus id, driver, VBIOS, device minor); value is 1.",
    ),
    "devices": ("gauge", "Number of GPUs the vendor tool reported in this cycle."),
    "unreadable_fields": (
        "gauge",
        "Queried fields nvidia-smi answered with an error (ERR!, [Unknown Error], "
        "[GPU is lost]...) or an unparseable value; those series are absent.",
    ),
    "expected_devices": ("gauge", "Number of GPUs this node must have, from the inventory."),
    "memory_total_bytes": ("gauge", "Total framebuffer memory in bytes."),
    "memory_used_bytes": ("gauge", "Used framebuffer memory in bytes."),
    "memory_free_bytes": ("gauge", "Free framebuffer memory in bytes."),
    "memory_reserved_bytes": ("gauge", "Framebuffer memory reserved by the driver in bytes."),
    "utilization_percent": ("gauge", "GPU utilization (percent of time a kernel ran), 0-100."),
    "memory_utilization_ratio": ("gauge", "Memory controller busy ratio, 0-1."),
    "encoder_utilization_ratio": ("gauge", "Video encoder utilization ratio, 0-1."),
    "decoder_utilization_ratio": ("gauge", "Video decoder utilization ratio, 0-1."),
    "temperature_celsius": ("gauge", "GPU core (AMD: edge, else hotspot) temperature in celsius."),
    "memory_temperature_celsius": ("gauge", "GPU memory (HBM) temperature in celsius."),
    "hotspot_temperature_celsius": ("gauge", "GPU junction/hotspot temperature in celsius."),
    "temperature_tlimit_margin_celsius": (
        "gauge",
        "Degrees below the GPU's T.Limit (max operating) temperature; lower is hotter.",
    ),
    "temperature_slowdown_threshold_celsius": (
        "gauge",
        "Temperature at which the GPU slows down, per sensor, in celsius.",
    ),
    "temperature_shutdown_threshold_celsius": (
        "gauge",
        "Temperature at which the GPU shuts down, per sensor, in celsius.",
    ),
    "power_draw_watts": ("gauge", "Current power draw in watts."),
    "power_limit_watts": ("gauge", "Software power limit in watts."),
    "power_enforced_limit_watts": ("gauge", "Power limit actually enforced in watts."),
    "power_default_limit_watts": ("gauge", "Default power limit in watts."),
    "power_max_limit_watts": ("gauge", "Maximum settable power limit in watts."),
    "sm_clock_hertz": ("gauge", "Current SM (AMD: sclk) clock in hertz."),
    "sm_clock_max_hertz": ("gauge", "Maximum SM clock in hertz."),
    "graphics_clock_hertz": ("gauge", "Current graphics clock in hertz."),
    "memory_clock_hertz": ("gauge", "Current memory clock in hertz."),
    "memory_clock_max_hertz": ("gauge", "Maximum memory clock in hertz."),
    "pcie_link_generation": ("gauge", "Current PCIe link generation."),
    "pcie_link_generation_max": ("gauge", "Maximum PCIe link generation of GPU and system."),
    "pcie_link_width_lanes": ("gauge", "Current PCIe link width in lanes."),
    "pcie_link_width_max_lanes": ("gauge", "Maximum PCIe link width in lanes."),
    "fan_speed_ratio": ("gauge", "Intended fan speed as a ratio of maximum, 0-1 (may exceed 1)."),
    "performance_state": ("gauge", "Performance state number (P0=0 fastest .. P12=12)."),
    "clock_event_reason_active": (
        "gauge",
        "1 if this clock event (throttle) reason is active, else 0 (from the bitmask).",
    ),
    "clock_event_reason_seconds_total": (
        "counter",
        "Time this clock event (throttle) reason has been active, in seconds.",
    ),
    "ecc_mode_enabled": ("gauge", "1 if ECC is enabled."),
    "ecc_mode_pending_enabled": ("gauge", "1 if ECC will be enabled after the next reset."),
    "ecc_corrected_errors_total": (
        "counter",
        "Corrected ECC errors (scope volatile: since driver load; aggregate: lifetime).",
    ),
    "ecc_uncorrected_errors_total": (
        "counter",
        "Uncorrected ECC errors (scope volatile: since driver load; aggregate: lifetime).",
    ),
    "retired_pages": ("gauge", "Retired framebuffer pages by cause (pre-Ampere)."),
    "retired_pages_pending": ("gauge", "1 if pages are pending retirement at the next reboot."),
    "remapped_rows": ("gauge", "Remapped memory rows by cause (Ampere and later)."),
    "remapped_rows_pending": ("gauge", "1 if a row remap is pending (reset the GPU)."),
    "remapped_rows_failure": ("gauge", "1 if a row remap has failed (replace the GPU)."),
    "recovery_action": (
        "gauge",
        "Recovery action the driver asks for: 0 none, 1 GPU reset, 2 node reboot, "
        "3 drain P2P, 4 drain and reset.",
    ),
    "mig_mode_enabled": ("gauge", "1 if MIG mode is enabled."),
    "mig_mode_pending_enabled": ("gauge", "1 if MIG mode will be enabled after the next reset."),
    "persistence_mode_enabled": ("gauge", "1 if persistence mode is enabled."),
    "compute_processes": ("gauge", "Number of compute processes on the GPU."),
    "compute_processes_used_memory_bytes": (
        "gauge",
        "GPU memory used by compute processes in bytes.",
    ),
    "slurm_job_info": (
        "gauge",
        "A Slurm job has a compute process on this GPU (label sluid: Slurm 26.05+ "
        "job cgroup name); value is 1.",
    ),
    "xid_errors_total": (
        "counter",
        "NVIDIA XID errors read from the kernel log, by GPU and XID code.",
    ),
    "collector_success": ("gauge", "1 if the last collection succeeded, else 0."),
    "collector_error_info": ("gauge", "Reason of the last collection failure; value is 1."),
    "collector_last_success_timestamp_seconds": (
        "gauge",
        "Unix time of the last successful collection.",
    ),
    "collector_duration_seconds": ("gauge", "Wall time of the last collection in seconds."),
    "collector_compute_apps_success": ("gauge", "1 if the compute-process query succeeded."),
    "collector_xid_success": ("gauge", "1 if the kernel log could be read for XID errors."),
    "collector_skipped_lines": (
        "gauge",
        "Lines of nvidia-smi output that were messages, not GPU rows (e.g. a lost GPU).",
    ),
    "collector_duplicate_gpu_rows": (
        "gauge",
        "GPU rows that repeated an earlier row's index (the cycle then fails: duplicate_gpu).",
    ),
}

# ------------------------------------------------------------------ value parsing

# Tokens nvidia-smi/amd-smi print instead of a value; any "[...]" token counts too.
ABSENT_TOKENS = frozenset({"", "n/a", "na", "not supported", "unknown error", "none reported"})
BOOL_TRUE = frozenset({"enabled", "yes", "active", "on", "true"})
BOOL_FALSE = frozenset({"disabled", "no", "not active", "off", "false"})
MAX_NUMBER_CHARS = 64  # longer text is not a number (and NUMBER_RE is not linear)
NUMBER_RE = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z%/°]*)")
RECOVERY_ACTIONS = {
    "none": 0.0,
    "gpu reset": 1.0,
    "reset": 1.0,
    "node reboot": 2.0,
    "reboot": 2.0,
    "drain p2p": 3.0,
    "drain and reset": 4.0,
}


def is_absent(raw: str | None) -> bool:
    if raw is None:
        return True
    text = raw.strip()
    if text.startswith("[") and text.endswith("]"):
        return True
    return text.lower() in ABSENT_TOKENS


def parse_number(raw: str | None) -> float | None:
    """'69.85 W' / '69.85' / '0x1F' / '81559 MiB' -> float; sentinels -> None."""
    if raw is None or len(raw) > MAX_NUMBER_CHARS or is_absent(raw):
        return None
    text = raw.strip().strip("()")
    if text[:2].lower() == "0x":
        try:
            return float(int(text, 16))
        except ValueError:
            return None
    match = NUMBER_RE.fullmatch(text)
    if not match:
        return None
    value = float(match.group(1))
    return value if math.isfinite(value) else None


def parse_bool(raw: str | None) -> float | None:
    if raw is None or is_absent(raw):
        return None
    text = raw.strip().lower()
    if text in BOOL_TRUE:
        return 1.0
    if text in BOOL_FALSE:
        return 0.0
    return None


def parse_pstate(raw: str | None) -> float | None:
    match = re.fullmatch(r"\s*P(\d{1,2})\s*", raw or "")
    return float(match.group(1)) if match else None


def parse_recovery_action(raw: str | None) -> float | None:
    if raw is None or is_absent(raw):
        return None
    return RECOVERY_ACTIONS.get(raw.strip().lower())


def clean_label(raw: Any) -> str:
    """Info labels: sentinel text becomes empty (= label absent in Prometheus)."""
    text = "" if raw is None else raw if isinstance(raw, str) else str(raw)
    return "" if is_absent(text) else text.strip()[:MAX_FIELD_CHARS]


# What nvidia-smi prints for a value this GPU does not have: not an error. Any
# other value a field's parser rejects (ERR!, [Unknown Error], [GPU is lost],
# [Insufficient Permissions], NaN, garbage) counts in node_gpu_unreadable_fields.
NOT_APPLICABLE = frozenset(
    {
        "",
        "n/a",
        "na",
        "not supported",
        "not available",
        "none reported",
        "function not found",
        "requested functionality has been deprecated",
    }
)


def is_not_applicable(raw: str | None) -> bool:
    if raw is None:
        return True
    text = raw.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1].strip()
    return text.lower() in NOT_APPLICABLE


# ------------------------------------------------------------------ NVIDIA fields


class FieldSpec(NamedTuple):
    fields: tuple[str, ...]  # candidates, first present value wins
    metric: str
    parse: Callable[[str | None], float | None]
    scale: float = 1.0
    labels: tuple[tuple[str, str], ...] = ()


def _n(*fields: str) -> tuple[str, ...]:
    return fields


FIELD_SPECS: tuple[FieldSpec, ...] = (
    FieldSpec(_n("memory.total"), "memory_total_bytes", parse_number, MIB),
    FieldSpec(_n("memory.used"), "memory_used_bytes", parse_number, MIB),
    FieldSpec(_n("memory.free"), "memory_free_bytes", parse_number, MIB),
    FieldSpec(_n("memory.reserved"), "memory_reserved_bytes", parse_number, MIB),
    FieldSpec(_n("utilization.gpu"), "utilization_percent", parse_number),
    FieldSpec(_n("utilization.memory"), "memory_utilization_ratio", parse_number, 0.01),
    FieldSpec(_n("utilization.encoder"), "encoder_utilization_ratio", parse_number, 0.01),
    FieldSpec(_n("utilization.decoder"), "decoder_utilization_ratio", parse_number, 0.01),
    FieldSpec(_n("temperature.gpu"), "temperature_celsius", parse_number),
    FieldSpec(_n("temperature.memory"), "memory_temperature_celsius", parse_number),
    FieldSpec(_n("temperature.gpu.tlimit"), "temperature_tlimit_margin_celsius", parse_number),
    FieldSpec(_n("power.draw"), "power_draw_watts", parse_number),
    FieldSpec(_n("power.limit"), "power_limit_watts", parse_number),
    FieldSpec(_n("enforced.power.limit"), "power_enforced_limit_watts", parse_number),
    FieldSpec(_n("power.default_limit"), "power_default_limit_watts", parse_number),
    FieldSpec(_n("power.max_limit"), "power_max_limit_watts", parse_number),
    FieldSpec(_n("clocks.current.sm"), "sm_clock_hertz", parse_number, 1e6),
    FieldSpec(_n("clocks.max.sm"), "sm_clock_max_hertz", parse_number, 1e6),
    FieldSpec(_n("clocks.current.graphics"), "graphics_clock_hertz", parse_number, 1e6),
    FieldSpec(_n("clocks.current.memory"), "memory_clock_hertz", parse_number, 1e6),
    FieldSpec(_n("clocks.max.memory"), "memory_clock_max_hertz", parse_number, 1e6),
    # gpucurrent replaces the deprecated .current; old drivers only know .current
    FieldSpec(
        _n("pcie.link.gen.gpucurrent", "pcie.link.gen.current"),
        "pcie_link_generation",
        parse_number,
    ),
    FieldSpec(_n("pcie.link.gen.max"), "pcie_link_generation_max", parse_number),
    FieldSpec(_n("pcie.link.width.current"), "pcie_link_width_lanes", parse_number),
    FieldSpec(_n("pcie.link.width.max"), "pcie_link_width_max_lanes", parse_number),
    FieldSpec(_n("fan.speed"), "fan_speed_ratio", parse_number, 0.01),
    FieldSpec(_n("pstate"), "performance_state", parse_pstate),
    FieldSpec(_n("ecc.mode.current"), "ecc_mode_enabled", parse_bool),
    FieldSpec(_n("ecc.mode.pending"), "ecc_mode_pending_enabled", parse_bool),
    FieldSpec(
        _n("ecc.errors.corrected.volatile.total"),
        "ecc_corrected_errors_total",
        parse_number,
        labels=(("scope", "volatile"),),
    ),
    FieldSpec(
        _n("ecc.errors.corrected.aggregate.total"),
        "ecc_corrected_errors_total",
        parse_number,
        labels=(("scope", "aggregate"),),
    ),
    FieldSpec(
        _n("ecc.errors.uncorrected.volatile.total"),
        "ecc_uncorrected_errors_total",
        parse_number,
        labels=(("scope", "volatile"),),
    ),
    FieldSpec(
        _n("ecc.errors.uncorrected.aggregate.total"),
        "ecc_uncorrected_errors_total",
        parse_number,
        labels=(("scope", "aggregate"),),
    ),
    FieldSpec(
        _n("retired_pages.single_bit_ecc.count"),
        "retired_pages",
        parse_number,
        labels=(("cause", "single_bit_ecc"),),
    ),
    FieldSpec(
        _n("retired_pages.double_bit.count"),
        "retired_pages",
        parse_number,
        labels=(("cause", "double_bit_ecc"),),
    ),
    FieldSpec(_n("retired_pages.pending"), "retired_pages_pending", parse_bool),
    FieldSpec(
        _n("remapped_rows.correctable"),
        "remapped_rows",
        parse_number,
        labels=(("cause", "correctable"),),
    ),
    FieldSpec(
        _n("remapped_rows.uncorrectable"),
        "remapped_rows",
        parse_number,
        labels=(("cause", "uncorrectable"),),
    ),
    FieldSpec(_n("remapped_rows.pending"), "remapped_rows_pending", parse_bool),
    FieldSpec(_n("remapped_rows.failure"), "remapped_rows_failure", parse_bool),
    FieldSpec(_n("gpu_recovery_action"), "recovery_action", parse_recovery_action),
    FieldSpec(_n("mig.mode.current"), "mig_mode_enabled", parse_bool),
    FieldSpec(_n("mig.mode.pending"), "mig_mode_pending_enabled", parse_bool),
    FieldSpec(_n("persistence_mode"), "persistence_mode_enabled", parse_bool),
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
    text: str, max_rows: int, too_many: str = "too_many_gpus", join_tail: bool = False
) -> CsvTable:
    """nvidia-smi CSV (header with or without units) -> CsvTable.

    A line without any comma is a message nvidia-smi prints between rows (e.g.
    "Unable to determine the device handle for GPU...: Unknown Error" for a lost
    GPU): skipped and counted. Any other line that does not fit the header fails
    the whole parse (CollectorError bad_row or parse_error), as do more than
    ``max_rows`` rows (CollectorError ``too_many``). With ``join_tail``, the
    extra columns a comma in the name made are joined back (see TEXT_TAIL).
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise CollectorError("parse_error", "empty output")
    header = list(csv_header(lines[0]))
    rows: list[dict[str, str]] = []
    skipped = 0
    for number, line in enumerate(lines[1:], start=2):
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


@functools.lru_cache(maxsize=16)
def csv_header(line: str) -> tuple[str, ...]:
    """A header line -> canonical field names; the loop sees the same line every cycle."""
    header = tuple(canonical_field(h) for h in csv_fields(line, "parse_error"))
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


def parse_nvidia_output(text: str) -> NvidiaParse:
    table = parse_csv(text, MAX_GPUS, "too_many_gpus", join_tail=True)
    if "index" not in table.header:
        raise CollectorError("parse_error", "no index column")
    gpus: dict[str, GpuData] = {}
    duplicates = 0
    for row in table.rows:
        gpu = nvidia_row_to_gpu(row)
        duplicates += gpu.gpu in gpus
        gpus.setdefault(gpu.gpu, gpu)
    return NvidiaParse(sorted(gpus.values(), key=lambda g: int(g.gpu)), table.skipped, duplicates)


def nvidia_gpus_and_notes(text: str) -> tuple[list[GpuData], list[Sample]]:
    """GPUs plus the parse's health series; duplicate indices fail the cycle:
    which of two rows for one GPU is right cannot be known."""
    parsed = parse_nvidia_output(text)
    notes = [
        Sample("collector_skipped_lines", (), float(parsed.skipped)),
        Sample("collector_duplicate_gpu_rows", (), float(parsed.duplicates)),
    ]
    if parsed.duplicates:
        raise CollectorError("duplicate_gpu", f"{parsed.duplicates} rows repeat an index", notes)
    return parsed.gpus, notes


def parse_nvidia_gpus(text: str) -> list[GpuData]:
    return nvidia_gpus_and_notes(text)[0]


class ComputeApp(NamedTuple):
    gpu_uuid: str
    pid: int
    used_bytes: float | None


def parse_compute_apps(text: str) -> list[ComputeApp]:
    apps = []
    table = parse_csv(text, MAX_COMPUTE_APPS, "too_many_processes")
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


# ------------------------------------------------------------------------- AMD


def _amd_value(node: Any) -> float | None:
    """amd-smi: {"value": 12, "unit": "W"} | 12 | "12 W" | "N/A"; rocm-smi: strings."""
    if isinstance(node, dict):
        node = node.get("value")
    if isinstance(node, bool):
        return None
    if isinstance(node, (int, float)):
        return float(node) if math.isfinite(node) else None
    if isinstance(node, str):
        return parse_number(node)
    return None


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _first(data: Any, *paths: tuple[str, ...]) -> float | None:
    for path in paths:
        value = _amd_value(_get(data, *path))
        if value is not None:
            return value
    return None


def _amd_entries(doc: Any) -> list[dict[str, Any]]:
    """amd-smi JSON top level is a list of per-GPU objects or {"gpu_data": [...]}."""
    if isinstance(doc, dict):
        doc = doc.get("gpu_data", [])
    return [e for e in doc if isinstance(e, dict)] if isinstance(doc, list) else []


# (metric, scale, candidate paths) for amd-smi metric --json
AMD_SMI_METRICS: tuple[tuple[str, float, tuple[tuple[str, ...], ...]], ...] = (
    ("utilization_percent", 1.0, (("usage", "gfx_activity"),)),
    ("memory_utilization_ratio", 0.01, (("usage", "umc_activity"),)),
    ("power_draw_watts", 1.0, (("power", "socket_power"), ("power", "average_socket_power"))),
    ("temperature_celsius", 1.0, (("temperature", "edge"), ("temperature", "hotspot"))),
    ("hotspot_temperature_celsius", 1.0, (("temperature", "hotspot"),)),
    ("memory_temperature_celsius", 1.0, (("temperature", "mem"),)),
    # amd-smi labels MiB as "MB" (MI300X total_vram 196592 "MB" = 192 GiB)
    ("memory_total_bytes", MIB, (("mem_usage", "total_vram"),)),
    ("memory_used_bytes", MIB, (("mem_usage", "used_vram"),)),
    ("memory_free_bytes", MIB, (("mem_usage", "free_vram"),)),
    ("sm_clock_hertz", 1e6, (("clock", "gfx_0", "clk"),)),
    ("memory_clock_hertz", 1e6, (("clock", "mem_0", "clk"),)),
    ("pcie_link_width_lanes", 1.0, (("pcie", "width"),)),
    ("fan_speed_ratio", 0.01, (("fan", "usage"),)),
)
AMD_SMI_STATIC: tuple[tuple[str, float, tuple[tuple[str, ...], ...]], ...] = (
    ("power_limit_watts", 1.0, (("limit", "socket_power"), ("limit", "max_power"))),
    ("power_max_limit_watts", 1.0, (("limit", "max_power"),)),
)
AMD_THRESHOLDS = (("edge", "edge"), ("hotspot", "hotspot"), ("vram", "memory"))


def _amd_threshold_values(
    static: dict[str, Any],
) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    out = []
    for kind in ("slowdown", "shutdown"):
        for key, sensor in AMD_THRESHOLDS:
            value = _amd_value(_get(static, "limit", f"{kind}_{key}_temperature"))
            if value is not None:
                out.append((f"temperature_{kind}_threshold_celsius", (("sensor", sensor),), value))
    return out


def parse_amd_smi(metric_doc: Any, static_doc: Any) -> list[GpuData]:
    statics = {str(e.get("gpu")): e for e in _amd_entries(static_doc)}
    gpus = []
    for entry in _amd_entries(metric_doc):
        index = str(entry.get("gpu", ""))
        if not INDEX_RE.fullmatch(index):
            continue
        static = statics.get(index, {})
        values = []
        for table, source in ((AMD_SMI_METRICS, entry), (AMD_SMI_STATIC, static)):
            for metric, scale, paths in table:
                value = _first(source, *paths)
                if value is not None:
                    values.append((metric, (), value * scale))
        values.extend(_amd_threshold_values(static))
        info = {
            "model": clean_label(str(_get(static, "asic", "market_name") or "")),
            "pci_bus_id": clean_label(str(_get(static, "bus", "bdf") or entry.get("bdf") or "")),
            "driver_version": clean_label(str(_get(static, "driver", "version") or "")),
            "vbios_version": clean_label(str(_get(static, "vbios", "version") or "")),
        }
        uuid = clean_label(str(_get(static, "asic", "asic_serial") or entry.get("uuid") or ""))
        gpus.append(GpuData(index, uuid, "amd", info, values))
    return sorted(gpus, key=lambda g: int(g.gpu))


ROCM_SMI_KEYS: tuple[tuple[str, float, tuple[str, ...]], ...] = (
    ("utilization_percent", 1.0, ("GPU use (%)",)),
    ("memory_utilization_ratio", 0.01, ("GPU memory use (%)",)),
    (
        "temperature_celsius",
        1.0,
        ("Temperature (Sensor edge) (C)", "Temperature (Sensor junction) (C)"),
    ),
    ("hotspot_temperature_celsius", 1.0, ("Temperature (Sensor junction) (C)",)),
    ("memory_temperature_celsius", 1.0, ("Temperature (Sensor memory) (C)",)),
    (
        "power_draw_watts",
        1.0,
        ("Average Graphics Package Power (W)", "Current Socket Graphics Package Power (W)"),
    ),
    ("power_limit_watts", 1.0, ("Max Graphics Package Power (W)",)),
    ("memory_total_bytes", 1.0, ("VRAM Total Memory (B)",)),
    ("memory_used_bytes", 1.0, ("VRAM Total Used Memory (B)",)),
    ("fan_speed_ratio", 0.01, ("Fan speed (%)",)),
)


def _rocm_clock(raw: Any) -> float | None:
    match = re.search(r"(\d+(?:\.\d+)?)\s*mhz", str(raw or "")[:MAX_NUMBER_CHARS], re.IGNORECASE)
    return float(match.group(1)) * 1e6 if match else None


def parse_rocm_smi(doc: Any) -> list[GpuData]:
    """``rocm-smi ... --json``: {"card0": {"GPU use (%)": "0", ...}, "system": {...}}."""
    if not isinstance(doc, dict):
        raise CollectorError("parse_error", "rocm-smi JSON is not an object")
    driver = clean_label(str(_get(doc, "system", "Driver version") or ""))
    gpus = []
    for key, card in doc.items():
        match = re.fullmatch(r"card([0-9]{1,4})", str(key))
        if not match or not isinstance(card, dict):
            continue
        values = []
        for metric, scale, names in ROCM_SMI_KEYS:
            value = next(
                (v for v in (_amd_value(card.get(n)) for n in names) if v is not None), None
            )
            if value is not None:
                values.append((metric, (), value * scale))
        for metric, key_name in (
            ("sm_clock_hertz", "sclk clock speed:"),
            ("memory_clock_hertz", "mclk clock speed:"),
        ):
            hertz = _rocm_clock(card.get(key_name))
            if hertz is not None:
                values.append((metric, (), hertz))
        info = {
            "model": clean_label(card.get("Card series") or card.get("Card model")),
            "pci_bus_id": clean_label(card.get("PCI Bus")),
            "driver_version": driver,
            "vbios_version": clean_label(card.get("VBIOS version")),
        }
        gpus.append(
            GpuData(match.group(1), clean_label(card.get("Unique ID")), "amd", info, values)
        )
    return sorted(gpus, key=lambda g: int(g.gpu))


# ------------------------------------------------------------------------- XID

XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?\): (\d+),"
)
FALLEN_SINGLE_RE = re.compile(
    r"NVRM: GPU ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?: GPU has fallen off"
)
FALLEN_HEAD_RE = re.compile(
    r"NVRM: The NVIDIA GPU ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
)
FALLEN_TAIL = "fallen off the bus and is not responding"
# gpu-metrics.md 5.2 "critical / drain GPU or node" tier. 63, 92, 94 are the
# "warning" tier there (remap recorded, SBE storm, contained error): not critical.
CRITICAL_XIDS = frozenset(
    {46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 154, 155, 158}
    | set(range(144, 151))
)


def normalize_pci_id(raw: str) -> str:
    """'PCI:0000:3b:00', '00000000:3B:00.0' -> '0000:3b:00' (join key for XID lines)."""
    text = raw.strip().lower()
    text = text[4:] if text.startswith("pci:") else text
    parts = text.split(".")[0].split(":")
    if len(parts) != 3:
        return text
    try:
        domain, bus, device = (int(p, 16) for p in parts)
    except ValueError:
        return text
    return f"{domain:04x}:{bus:02x}:{device:02x}"


def nvidia_pci_form(key: str) -> str:
    """'0000:3b:00' -> '00000000:3B:00.0', the form nvidia-smi and DCGM label with."""
    domain, bus, device = key.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{device.upper()}.0"


def parse_xid_lines(lines: Iterable[str]) -> list[tuple[str, int]]:
    """Kernel log lines -> [(normalised pci id, xid)] in order.

    The multi-line and single-line "fallen off the bus" messages (printed without
    an Xid line on some drivers) count as XID 79.
    """
    events: list[tuple[str, int]] = []
    pending_head: str | None = None
    for line in lines:
        match = XID_RE.search(line)
        if match:
            events.append((normalize_pci_id(match.group(1)), int(match.group(2))))
            continue
        match = FALLEN_SINGLE_RE.search(line)
        if match:
            events.append((normalize_pci_id(match.group(1)), 79))
            continue
        match = FALLEN_HEAD_RE.search(line)
        if match:
            pending_head = normalize_pci_id(match.group(1))
        elif pending_head and FALLEN_TAIL in line:
            events.append((pending_head, 79))
            pending_head = None
    return events


def count_xids(counts: dict[str, int], events: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Pure: returns new counts keyed 'pci|xid'."""
    out = dict(counts)
    for pci, xid in events:
        key = f"{pci}|{xid}"
        out[key] = out.get(key, 0) + 1
    return out


def xid_samples(counts: dict[str, int], pci_map: dict[str, list[str]]) -> list[Sample]:
    samples = []
    for key in sorted(counts):
        pci, xid = key.split("|")
        gpu, uuid = (pci_map.get(pci) or ["unknown", "unknown"])[:2]
        labels = (
            ("gpu", gpu),
            ("uuid", uuid),
            ("vendor", "nvidia"),
            ("pci_bus_id", nvidia_pci_form(pci)),
            ("xid", xid),
            ("critical", "true" if int(xid) in CRITICAL_XIDS else "false"),
        )
        samples.append(Sample("xid_errors_total", labels, float(counts[key])))
    return samples


def pci_map_of(gpus: Iterable[GpuData]) -> dict[str, list[str]]:
    return {
        normalize_pci_id(g.info["pci_bus_id"]): [g.gpu, g.uuid]
        for g in gpus
        if g.vendor == "nvidia" and g.info.get("pci_bus_id")
    }


# ----------------------------------------------------------- device minor number
# Slurm's GRES index (IDX) names a device file, /dev/nvidia<minor>, and the minor
# need not equal nvidia-smi's index (jobstats issue #34). No --query-gpu field has
# it; the driver's per-GPU file does, without another command:
# <proc-root>/driver/nvidia/gpus/<domain:bus:device.function>/information.
DRIVER_INFO_MAX_BYTES = 4096  # the file is about 400 bytes
MAX_MINOR = 254  # /dev/nvidia255 is nvidiactl
DEVICE_MINOR_RE = re.compile(r"^Device Minor:[ \t]*([0-9]{1,3})[ \t]*$", re.MULTILINE)


def driver_info_dir(pci_bus_id: str) -> str | None:
    """'00000000:3B:00.0' -> '0000:3b:00.0' (the driver's directory name); None if malformed."""
    if not PCI_BUS_ID_RE.fullmatch(pci_bus_id):
        return None
    head, function = pci_bus_id.rsplit(".", 1)
    domain, bus, device = (int(part, 16) for part in head.split(":"))
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"


def parse_device_minor(text: str) -> str | None:
    """The one 'Device Minor:' line's number, 0..MAX_MINOR; None if absent, repeated or too big."""
    found = DEVICE_MINOR_RE.findall(text)
    if len(found) != 1 or int(found[0]) > MAX_MINOR:
        return None
    return str(int(found[0]))


def read_device_minor(proc_root: str, pci_bus_id: str) -> str | None:
    name = driver_info_dir(pci_bus_id)
    if name is None:
        return None
    path = os.path.join(proc_root, "driver", "nvidia", "gpus", name, "information")
    data = _read_bytes(path, DRIVER_INFO_MAX_BYTES + 1)
    if data is None or len(data) > DRIVER_INFO_MAX_BYTES:
        return None
    return parse_device_minor(data.decode("ascii", "replace"))


def with_minor_numbers(gpus: list[GpuData], proc_root: str) -> list[GpuData]:
    """NVIDIA GPUs get info label minor_number; a minor two GPUs claim is left out on both
    (a join on it would be ambiguous)."""
    minors = {g.gpu: read_device_minor(proc_root, g.info.get("pci_bus_id", "")) for g in gpus}
    claimed = [m for m in minors.values() if m is not None]
    out = []
    for gpu in gpus:
        minor = minors[gpu.gpu]
        if gpu.vendor == "nvidia" and minor is not None and claimed.count(minor) == 1:
            gpu = gpu._replace(info={**gpu.info, "minor_number": minor})
        out.append(gpu)
    return out


# ------------------------------------------------------------ Slurm attribution
#
# A GPU process's Slurm job comes from its cgroup path, which slurmstepd (root)
# creates and the job's user cannot choose. One line of /proc/PID/cgroup is
# "hierarchy-id:controllers:path"; the path shapes (after any prefix, e.g. a
# container's cgroup namespace root):
#   cgroup v1 (22.05, 24.11): /slurm/uid_<uid>/job_<id>[/step_<s>[/task_<n>]]
#       /slurm_<node>/... when several slurmd run on the host; 24.11 in a private
#       cgroupns: "4:freezer:/slurm_<node>/uid_1000/job_3/step_batch"
#   cgroup v2 ("0::" line): /system.slice/slurmstepd.scope/job_<id>/step_<s>[/user/task_<n>]
#       /system.slice/<node>_slurmstepd.scope/... when several slurmd run
#   Slurm 26.05+ (v2) names the job directory by its SLUID instead of job_<id>
#       (.../slurmstepd.scope/sEKNKTV3WPV500/step_0/...) unless cgroup.conf has
#       CgroupJobIdPaths=yes (26.05.2+).
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


def parse_slurm_cgroup(text: str) -> CgroupJob | None:
    """/proc/PID/cgroup text -> the Slurm job of the first line that names one."""
    for line in text.splitlines():
        job = slurm_job_of_path(cgroup_line_path(line))
        if job is not None:
            return job
    return None


def cgroup_line_path(line: str) -> str:
    """'12:freezer:/slurm/uid_1/job_3' or '0::/system.slice/...' -> the path, else ''."""
    parts = line.split(":", 2)
    if len(line) > MAX_CGROUP_LINE or len(parts) != 3 or not HIERARCHY_RE.fullmatch(parts[0]):
        return ""
    return parts[2] if parts[2].startswith("/") else ""


def slurm_job_of_path(path: str) -> CgroupJob | None:
    parts = [*path.split("/"), "", ""]
    for i, part in enumerate(parts[:-2]):
        if SLURM_V2_SCOPE_RE.fullmatch(part):
            job = job_dir(parts[i + 1], None)
        elif SLURM_V1_ROOT_RE.fullmatch(part):
            uid = bounded_int(UID_DIR_RE, parts[i + 1], MAX_UID)
            job = job_dir(parts[i + 1 if uid is None else i + 2], uid)
        else:
            continue
        if job is not None:
            return job
    return None


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
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except OSError:
        return None


def _read_text(path: str, limit: int = STATE_MAX_BYTES) -> str | None:
    data = _read_bytes(path, limit)
    return None if data is None else data.decode("utf-8", "replace")


class JobRef(NamedTuple):
    job_id: str  # "" until a SLUID is resolved (see job_label)
    user: str
    sluid: str = ""


def job_of_pid(proc_root: str, pid: int, resolver: SluidResolver | None = None) -> JobRef | None:
    pid_dir = os.path.join(proc_root, str(pid))
    parsed = parse_slurm_cgroup(_read_text(os.path.join(pid_dir, "cgroup"), CGROUP_MAX_BYTES) or "")
    if parsed is None:
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


# ---------------------------------------------------------------- samples/render


def base_labels(gpu: GpuData) -> tuple[tuple[str, str], ...]:
    return (("gpu", gpu.gpu), ("uuid", gpu.uuid), ("vendor", gpu.vendor))


def to_samples(gpus: list[GpuData]) -> list[Sample]:
    samples = [Sample("devices", (), float(len(gpus)))]
    for gpu in gpus:
        base = base_labels(gpu)
        samples.append(Sample("info", base + tuple(sorted(gpu.info.items())), 1.0))
        samples.extend([Sample(name, base + extra, value) for name, extra, value in gpu.values])
        if gpu.unreadable is not None:
            samples.append(Sample("unreadable_fields", base, float(gpu.unreadable)))
    return samples


def compute_app_samples(
    gpus: list[GpuData],
    apps: list[ComputeApp],
    jobs: dict[str, set[JobRef]],
    sluid_ids: dict[str, str] | None = None,
) -> list[Sample]:
    samples = []
    for gpu in gpus:
        base = base_labels(gpu)
        mine = [a for a in apps if a.gpu_uuid == gpu.uuid]
        samples.append(Sample("compute_processes", base, float(len(mine))))
        known = [a.used_bytes for a in mine if a.used_bytes is not None]
        if known or not mine:
            samples.append(Sample("compute_processes_used_memory_bytes", base, float(sum(known))))
        samples.extend(job_samples(base, jobs.get(gpu.uuid, set()), sluid_ids or {}))
    return samples


def job_samples(
    base: tuple[tuple[str, str], ...], jobs: set[JobRef], sluid_ids: dict[str, str]
) -> list[Sample]:
    out = set()
    for job in jobs:
        labels = (*base, ("job_id", job_label(job, sluid_ids)), ("user", job.user))
        out.add(labels + ((("sluid", job.sluid),) if job.sluid else ()))
    return [Sample("slurm_job_info", labels, 1.0) for labels in sorted(out)]


def health_samples(
    success: bool,
    duration: float,
    last_success: float | None,
    reason: str | None = None,
) -> list[Sample]:
    samples = [
        Sample("collector_success", (), 1.0 if success else 0.0),
        Sample("collector_duration_seconds", (), round(duration, 6)),
    ]
    if last_success is not None:
        samples.append(
            Sample("collector_last_success_timestamp_seconds", (), round(last_success, 3))
        )
    if not success:
        samples.append(Sample("collector_error_info", (("reason", reason or "exec_error"),), 1.0))
    return samples


SERIES_CACHE_SIZE = 8192  # series names and values kept between cycles


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# Most values repeat from cycle to cycle (0, 1, sizes, limits).
@functools.lru_cache(maxsize=SERIES_CACHE_SIZE)
def format_value(value: float) -> str:
    value = float(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


FAMILY_HEADERS = {
    name: f"# HELP {PREFIX}{name} {help_text}\n# TYPE {PREFIX}{name} {kind}"
    for name, (kind, help_text) in FAMILIES.items()
}


# The loop writes the same series every cycle: their names, labels escaped, are kept.
@functools.lru_cache(maxsize=SERIES_CACHE_SIZE)
def series_text(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    """'node_gpu_<name>{label="value",...}' (no braces without labels)."""
    if not labels:
        return PREFIX + name
    text = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels)
    return f"{PREFIX}{name}{{{text}}}"


def render_metrics(samples: Iterable[Sample]) -> str:
    """Group samples by family (FAMILIES order) with # HELP / # TYPE lines."""
    by_name: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for sample in samples:
        if sample.name not in FAMILIES:
            raise KeyError(f"undeclared metric family {sample.name}")
        # one value per series, first wins
        by_name.setdefault(sample.name, {}).setdefault(sample.labels, sample.value)
    lines: list[str] = []
    for name, header in FAMILY_HEADERS.items():
        series = by_name.get(name)
        if series:
            lines.append(header)
            lines.extend(
                [
                    f"{series_text(name, labels)} {format_value(value)}"
                    for labels, value in series.items()
                ]
            )
    return "\n".join(lines) + "\n"


LAST_SUCCESS_RE = re.compile(
    r"^" + PREFIX + r"collector_last_success_timestamp_seconds\s+([0-9.eE+]+)\s*$", re.MULTILINE
)


def previous_last_success(text: str | None) -> float | None:
    match = LAST_SUCCESS_RE.search(text or "")
    try:
        value = float(match.group(1)) if match else None
    except ValueError:  # e.g. "1..2" in a hand-edited file
        return None
    return value if value is not None and math.isfinite(value) else None


# ------------------------------------------------------------------------- I/O


def write_atomic(path: str, text: str, durable: bool = True) -> None:
    """tmp file in the same directory + os.replace: readers never see half a file.

    ``durable`` also fsyncs file and directory, for state that must survive a crash
    (XID counters). The textfile is not: it is rewritten every cycle, and a new
    cycle starts seconds after a reboot. The tmp name does not end in .prom, so
    node_exporter's *.prom glob ignores it.
    """
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(fd, 0o644)  # whatever the umask
            if durable:
                os.fsync(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        with contextlib.suppress(OSError):
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


class BoundedBuffer:
    """Collects a stream up to ``limit`` bytes: the first bytes (head) or the last
    ones (tail, whole lines only). ``overflow`` tells that bytes were dropped."""

    def __init__(self, limit: int, tail: bool = False) -> None:
        self.limit = limit
        self.tail = tail
        self.data = bytearray()
        self.overflow = False
        self.mid_line = False  # tail: the kept bytes start inside a line

    def add(self, chunk: bytes) -> None:
        if self.tail:
            self.data += chunk
            if len(self.data) > 2 * self.limit:
                self._trim()
            return
        room = self.limit - len(self.data)
        self.data += chunk[: max(room, 0)]
        self.overflow = self.overflow or len(chunk) > room

    def _trim(self) -> None:
        cut = len(self.data) - self.limit
        self.mid_line = self.data[cut - 1] != ord("\n")
        del self.data[:cut]
        self.overflow = True

    def text(self) -> str:
        if self.tail and len(self.data) > self.limit:
            self._trim()
        start = self.data.find(b"\n") + 1 if self.mid_line else 0
        return bytes(self.data[start:]).decode("utf-8", "replace")


def run_command(
    argv: list[str], timeout: float, max_bytes: int = NVIDIA_MAX_BYTES, keep_tail: bool = False
) -> CommandResult:
    """Run with a hard timeout and a bound on the output read.

    On expiry, or when stdout passes ``max_bytes`` (unless ``keep_tail``: then
    only the newest ``max_bytes`` are kept), the whole process group is killed.
    The time to kill and reap it is part of ``timeout``: a process stuck in the
    driver (D state) cannot be reaped, and the collector must still write its
    failure file before systemd's TimeoutStartSec.
    """
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # the environment: see main()
        )
    except FileNotFoundError as exc:
        raise CollectorError("not_found", str(exc)) from exc
    except OSError as exc:
        raise CollectorError("exec_error", str(exc)) from exc
    grace = min(KILL_GRACE_SECONDS, max(timeout, 0.0) / 4)
    out, err = BoundedBuffer(max_bytes, keep_tail), BoundedBuffer(STDERR_MAX_BYTES)
    try:
        finished = _read_streams(proc, {proc.stdout: out, proc.stderr: err}, timeout - grace)
        rc = _reap(proc, finished, grace)
    finally:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return CommandResult(rc, out.text(), err.text(), out.overflow)


def _read_streams(
    proc: subprocess.Popen[bytes], buffers: dict[Any, BoundedBuffer], seconds: float
) -> bool:
    """Read until both pipes close (True), the time is up or stdout overflows (False)."""
    end = time.monotonic() + max(seconds, 0.01)
    stdout = buffers.get(proc.stdout)
    with selectors.DefaultSelector() as selector:
        for stream, buffer in buffers.items():
            selector.register(stream, selectors.EVENT_READ, buffer)
        while selector.get_map():
            left = end - time.monotonic()
            if left <= 0:
                return False
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                key.data.add(chunk)
            if stdout is not None and stdout.overflow and not stdout.tail:
                return False
    return True


def _reap(proc: subprocess.Popen[bytes], finished: bool, grace: float) -> int | None:
    """Exit status; None if the process was killed (or outlived its pipes)."""
    if finished:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=max(grace, 0.01))
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=max(grace, 0.01))
    return None


class Deadline:
    """One deadline for a whole cycle; every command gets what is left of it."""

    def __init__(self, seconds: float, end: float | None = None) -> None:
        self.end = time.monotonic() + seconds if end is None else end

    def left(self) -> float:
        return self.end - time.monotonic()

    def before(self, reserve: float) -> Deadline:
        """A deadline ``reserve`` seconds earlier (time kept for a later step)."""
        return Deadline(0.0, self.end - reserve)


def _checked(result: CommandResult, what: str) -> str:
    if result.truncated:
        raise CollectorError("output_too_large", f"{what} printed more than the byte limit")
    if result.rc is None:
        raise CollectorError("timeout", f"{what} killed at the timeout")
    return result.stdout


# ------------------------------------------------------------------- state files


def load_json(path: str | None) -> dict[str, Any]:
    """A state file's JSON object; {} if absent, unreadable, not JSON or not an object."""
    data = load_json_value(path)
    return data if isinstance(data, dict) else {}


def load_json_value(path: str | None) -> Any:
    """Any JSON value of a state file (bounded read); None if absent or not JSON."""
    text = _read_text(path) if path else None
    try:
        return json.loads(text) if text else None
    except (ValueError, RecursionError):
        return None


XID_KEY_RE = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\|[0-9]{1,6}")
POSITION_TYPES: dict[str, tuple[type, ...]] = {
    "inode": (int,),
    "offset": (int,),
    "seq": (int,),
    "boot_id": (str,),
    "cursor": (str, type(None)),
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _valid_counts(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and XID_KEY_RE.fullmatch(k) and _is_int(v) and 0 <= v < 2**53
        for k, v in value.items()
    )


def _valid_pci_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str)
        and isinstance(v, list)
        and len(v) == 2
        and all(isinstance(x, str) for x in v)
        for k, v in value.items()
    )


def _valid_position(value: Any) -> bool:
    """{"inode", "offset"} (file), {"cursor"} (journald), {"boot_id", "seq"} (kmsg)."""
    if not isinstance(value, dict):
        return False
    for key, item in value.items():
        types = POSITION_TYPES.get(key, (object,))
        if isinstance(item, bool) or not isinstance(item, types):
            return False
        if _is_int(item) and item < -1:  # seq starts at -1
            return False
    return True


XID_STATE_CHECKS: tuple[tuple[str, Callable[[Any], bool]], ...] = (
    ("counts", _valid_counts),
    ("pci_map", _valid_pci_map),
    ("position", _valid_position),
    ("source", lambda value: isinstance(value, str)),
)


def xid_state_problem(data: Any) -> str:
    """'' if ``data`` has the shape the collector writes, else what is wrong."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key, valid in XID_STATE_CHECKS:
        if key in data and not valid(data[key]):
            return f"{key!r} has the wrong shape"
    return ""


def load_xid_state(path: str | None) -> dict[str, Any]:
    """The XID state; a file of any other shape counts as empty (one log line)."""
    if not path or not os.path.exists(path):
        return {}
    data = load_json_value(path)
    problem = xid_state_problem(data)
    if problem:
        log(f"ignoring XID state {path} ({problem}): XID counters start from zero")
        return {}
    return dict(data)


def save_json(path: str | None, data: dict[str, Any]) -> None:
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, json.dumps(data, sort_keys=True))
    except OSError as exc:
        log(f"cannot write state {path}: {exc}")


def log(message: str) -> None:
    print(f"gpufleet_gpu_collector: {message}", file=sys.stderr)


# ---------------------------------------------------------------------- NVIDIA I/O


def binary_identity(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def _str_list(value: Any) -> list[str]:
    ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    return list(value) if ok else []


class FieldMemory:
    """Fields the installed driver rejected; reset when the nvidia-smi binary changes."""

    def __init__(self, path: str | None, identity: str) -> None:
        self.path = path
        data = load_json(path)
        fresh = data.get("binary") == identity
        self.identity = identity
        self.removed: list[str] = _str_list(data.get("removed")) if fresh else []
        self.aliased: list[str] = _str_list(data.get("aliased")) if fresh else []

    def fields(self) -> list[str]:
        return effective_fields(self.removed, self.aliased)

    def forget(self, bad: str) -> bool:
        """Record a rejected field; False if it was not one we asked for.

        The clocks_event_* fields were renamed together, so one rejection switches
        them all to the old clocks_throttle_* names; a rejected field of a group
        (the counters) drops the whole group. This keeps the number of failing
        cycles on an old driver small.
        """
        canonical = canonical_field(bad)
        if canonical in FIELD_ALIASES and bad == canonical and canonical not in self.aliased:
            self.aliased.extend(f for f in FIELD_ALIASES if f not in self.aliased)
        elif canonical in all_query_fields() and canonical not in self.removed:
            group = next((g for g in FIELD_GROUPS if canonical in g), (canonical,))
            self.removed.extend(f for f in group if f not in self.removed)
        else:
            return False
        log(f"driver rejects field {bad!r}; not asking for it again")
        save_json(
            self.path, {"binary": self.identity, "removed": self.removed, "aliased": self.aliased}
        )
        return True


def query_nvidia_gpus(nvidia_smi: str, memory: FieldMemory, deadline: Deadline) -> str:
    """One --query-gpu call; a second one only after an invalid-field error."""
    for attempt in (1, 2):
        argv = [nvidia_smi, "--query-gpu=" + ",".join(memory.fields()), "--format=csv,nounits"]
        result = run_command(argv, deadline.left())
        stdout = _checked(result, "nvidia-smi --query-gpu")
        if result.rc == 0:
            return stdout
        bad = invalid_fields(stdout + result.stderr)
        if bad:
            if not any([memory.forget(b) for b in bad]) or attempt == 2:
                raise CollectorError("invalid_field", ", ".join(bad))
            continue
        if "No devices were found" in stdout + result.stderr:
            return "index\n"
        if has_gpu_rows(stdout):
            return stdout  # partial answer (e.g. one GPU lost): keep the healthy ones
        detail = (stdout + result.stderr).strip().splitlines()[:1]
        raise CollectorError("exit_code", f"rc={result.rc} {detail}")
    raise CollectorError("invalid_field")


def has_gpu_rows(text: str) -> bool:
    try:
        return bool(parse_nvidia_gpus(text))
    except CollectorError:
        return False


def query_compute_apps(nvidia_smi: str, deadline: Deadline) -> list[ComputeApp]:
    argv = [
        nvidia_smi,
        "--query-compute-apps=" + ",".join(COMPUTE_APPS_FIELDS),
        "--format=csv,nounits",
    ]
    result = run_command(argv, deadline.left())
    stdout = _checked(result, "nvidia-smi --query-compute-apps")
    if result.rc != 0:
        raise CollectorError("exit_code", f"compute-apps rc={result.rc}")
    return parse_compute_apps(stdout)


def query_amd(args: argparse.Namespace, deadline: Deadline) -> list[GpuData]:
    if args.amd_smi_resolved:
        docs = []
        for sub in ("metric", "static"):
            argv = [args.amd_smi_resolved, sub, "--json"]
            result = run_command(argv, deadline.left(), AMD_MAX_BYTES)
            stdout = _checked(result, f"amd-smi {sub}")
            if result.rc != 0:
                raise CollectorError("exit_code", f"amd-smi {sub} rc={result.rc}")
            docs.append(_load_json_text(stdout))
        return checked_gpu_list(parse_amd_smi(docs[0], docs[1]))
    argv = [args.rocm_smi_resolved, *ROCM_SMI_ARGS]
    result = run_command(argv, deadline.left(), AMD_MAX_BYTES)
    stdout = _checked(result, "rocm-smi")
    if result.rc != 0:
        raise CollectorError("exit_code", f"rocm-smi rc={result.rc}")
    return checked_gpu_list(parse_rocm_smi(_load_json_text(stdout)))


def checked_gpu_list(gpus: list[GpuData]) -> list[GpuData]:
    """The MAX_GPUS and duplicate-index checks for GPUs parsed from JSON."""
    if len(gpus) > MAX_GPUS:
        raise CollectorError("too_many_gpus", f"{len(gpus)} GPUs, at most {MAX_GPUS}")
    duplicates = len(gpus) - len({g.gpu for g in gpus})
    if duplicates:
        note = Sample("collector_duplicate_gpu_rows", (), float(duplicates))
        raise CollectorError("duplicate_gpu", f"{duplicates} repeated GPU indices", [note])
    return gpus


ROCM_SMI_ARGS = (
    "--showuse",
    "--showmemuse",
    "--showtemp",
    "--showpower",
    "--showmaxpower",
    "--showclocks",
    "--showfan",
    "--showmeminfo",
    "vram",
    "--showbus",
    "--showproductname",
    "--showvbios",
    "--showuniqueid",
    "--showdriverversion",
    "--json",
)


def _load_json_text(text: str) -> Any:
    # Some versions print a WARNING line before the JSON document.
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    try:
        return json.loads(text[start:]) if start >= 0 else None
    except (ValueError, RecursionError) as exc:
        raise CollectorError("parse_error", f"bad JSON: {exc}") from exc


# ------------------------------------------------------------------- XID sources


def read_xid_file(path: str, state: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """New complete lines since the stored offset (restart if rotated/truncated).

    At most XID_FILE_MAX_BYTES per cycle: a backlog is read over several cycles.
    """
    st = os.stat(path)
    offset = int(state.get("offset", 0))
    if state.get("inode") != st.st_ino or st.st_size < offset:
        offset = 0
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(XID_FILE_MAX_BYTES)
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) == XID_FILE_MAX_BYTES:  # one line longer than that: skip it
        return [], {"inode": st.st_ino, "offset": offset + len(data)}
    lines = data[:end].decode("utf-8", "replace").splitlines()
    return lines, {"inode": st.st_ino, "offset": offset + end}


def read_xid_journald(state: dict[str, Any], timeout: float) -> tuple[list[str], dict[str, Any]]:
    argv = ["journalctl", "-k", "-b", "-q", "--no-pager", "-o", "cat", "--show-cursor"]
    if state.get("cursor"):
        argv.append("--after-cursor=" + str(state["cursor"]))
    result = run_command(argv, timeout, JOURNAL_MAX_BYTES, keep_tail=True)
    if result.truncated:
        log(f"kernel log backlog over {JOURNAL_MAX_BYTES} bytes: only its newest lines are read")
    # journalctl -b exits 1 with no output when this boot has no kernel entries yet
    # (seen in containers): nothing new, not a failure.
    if result.rc == 1 and not result.stdout.strip():
        # A cursor the journal no longer knows (vacuumed, new machine-id) is dropped.
        stale = "cursor" in result.stderr.lower()
        return [], {"cursor": None if stale else state.get("cursor")}
    if result.rc is None or result.rc != 0:
        raise CollectorError("exec_error", f"journalctl rc={result.rc}")
    lines, cursor = [], state.get("cursor")
    for line in result.stdout.splitlines():
        if line.startswith("-- cursor: "):
            cursor = line[len("-- cursor: ") :].strip()
        else:
            lines.append(line)
    return lines, {"cursor": cursor}


def parse_kmsg_record(record: str) -> tuple[int, str] | None:
    """'6,1234,5678,-;NVRM: Xid ...' -> (1234, message)."""
    head, sep, message = record.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3 or not re.fullmatch(r"[0-9]{1,19}", fields[1]):
        return None
    return int(fields[1]), message.split("\n", 1)[0]


def read_xid_kmsg(
    state: dict[str, Any], device: str = "/dev/kmsg"
) -> tuple[list[str], dict[str, Any]]:
    boot_id = (_read_text("/proc/sys/kernel/random/boot_id") or "").strip()
    last = int(state.get("seq", -1)) if state.get("boot_id") == boot_id else -1
    lines, newest = [], last
    fd = os.open(device, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten; keep reading
                    continue
                raise
            if not chunk:
                break
            parsed = parse_kmsg_record(chunk.decode("utf-8", "replace"))
            if parsed and parsed[0] > last:
                newest = max(newest, parsed[0])
                lines.append(parsed[1])
    finally:
        os.close(fd)
    return lines, {"boot_id": boot_id, "seq": newest}


def collect_xids(source: str, state: dict[str, Any], timeout: float) -> tuple[dict[str, Any], bool]:
    """Read new kernel-log lines and add them to the counters: (new state, ok).

    The state (counts, read position, last known PCI -> GPU map) is persisted by
    the caller, so counters never reset between one-shot runs.
    """
    counts = {str(k): int(v) for k, v in dict(state.get("counts", {})).items()}
    position = dict(state.get("position", {})) if state.get("source") == source else {}
    try:
        if source == "journald":
            lines, position = read_xid_journald(position, timeout)
        elif source == "kmsg":
            lines, position = read_xid_kmsg(position)
        else:
            lines, position = read_xid_file(source, position)
    except (OSError, CollectorError) as exc:
        log(f"XID source {source}: {exc}")
        return state, False
    counts = count_xids(counts, parse_xid_lines(lines))
    return {**state, "counts": counts, "position": position, "source": source}, True


# ------------------------------------------------------------------------ cycle


def resolve_tools(args: argparse.Namespace) -> str:
    """Pick the vendor; fills args.*_resolved. Returns 'nvidia', 'amd' or ''."""
    args.nvidia_smi_resolved = args.nvidia_smi or shutil.which("nvidia-smi") or ""
    args.amd_smi_resolved = args.amd_smi or shutil.which("amd-smi") or ""
    args.rocm_smi_resolved = args.rocm_smi or shutil.which("rocm-smi") or ""
    if args.vendor == "nvidia" or (args.vendor == "auto" and args.nvidia_smi_resolved):
        return "nvidia"
    if args.vendor in ("amd", "auto") and (args.amd_smi_resolved or args.rocm_smi_resolved):
        return "amd"
    return ""


def state_file(args: argparse.Namespace, name: str) -> str | None:
    return os.path.join(args.state_dir, name) if args.state_dir else None


def collect_gpu_samples(
    args: argparse.Namespace,
    memory: FieldMemory | None,
    deadline: Deadline | None = None,
    vendor: str = "",
) -> tuple[list[Sample], list[GpuData], bool | None]:
    """The vendor part of a cycle: (samples, gpus, compute-apps ok or None).

    ``vendor``: what resolve_tools(args) answered before; looked up when empty.
    """
    deadline = deadline or Deadline(args.timeout)
    vendor = vendor or resolve_tools(args)
    if vendor == "amd":
        gpus = query_amd(args, deadline)
        return to_samples(gpus), gpus, None
    if vendor != "nvidia":
        raise CollectorError("no_vendor_tool", "no nvidia-smi, amd-smi or rocm-smi found")
    if memory is None:
        memory = FieldMemory(None, "")
    text = query_nvidia_gpus(args.nvidia_smi_resolved, memory, deadline)
    gpus, notes = nvidia_gpus_and_notes(text)
    gpus = with_minor_numbers(gpus, args.proc_root)
    samples = to_samples(gpus) + notes
    try:
        apps = query_compute_apps(args.nvidia_smi_resolved, deadline)
    except CollectorError as exc:
        log(f"compute apps: {exc}")
        return samples, gpus, False
    resolver = SluidResolver(args.proc_root)
    jobs = jobs_by_gpu(apps, lambda pid: job_of_pid(args.proc_root, pid, resolver))
    return samples + compute_app_samples(gpus, apps, jobs, resolver.ids), gpus, True


class Collector:
    """Holds what survives between cycles in loop mode (field memory, last success)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.output = os.path.join(args.textfile_dir, args.output_name)
        nvidia = args.nvidia_smi or shutil.which("nvidia-smi") or ""
        self.memory = FieldMemory(state_file(args, "nvidia_fields.json"), binary_identity(nvidia))
        self.last_success = previous_last_success(_read_text(self.output))
        self.xid_path = state_file(args, "xid_state.json")
        self.xid_state = load_xid_state(self.xid_path) if args.xid_source != "none" else {}
        if args.xid_source != "none" and not self.xid_path:
            log("no --state-dir: XID counters restart with every process")
        self.vendor = ""  # the tools found; searched on PATH again when one fails to run

    def journal_reserve(self) -> float:
        """Seconds of the cycle kept for journalctl after the vendor tool."""
        if self.args.xid_source != "journald":
            return 0.0
        return min(JOURNAL_RESERVE_SECONDS, self.args.timeout / 4)

    def update_xids(self, gpus: list[GpuData], ok: bool, deadline: Deadline) -> list[Sample]:
        state = dict(self.xid_state)
        if ok:  # keep GPUs that vanished: their XIDs (79) must still map to them
            state["pci_map"] = {**state.get("pci_map", {}), **pci_map_of(gpus)}
        state, xid_ok = collect_xids(self.args.xid_source, state, deadline.left())
        if state != self.xid_state:
            save_json(self.xid_path, state)
            self.xid_state = state
        samples = xid_samples(state.get("counts", {}), state.get("pci_map", {}))
        return [*samples, Sample("collector_xid_success", (), 1.0 if xid_ok else 0.0)]

    def collect(self, deadline: Deadline) -> tuple[list[Sample], list[GpuData], bool | None]:
        """collect_gpu_samples; any other exception becomes internal_error, so a
        bug can never leave the last cycle's success file in place."""
        if not self.vendor:
            self.vendor = resolve_tools(self.args)
        try:
            return collect_gpu_samples(self.args, self.memory, deadline, self.vendor)
        except CollectorError as exc:
            if exc.reason in ("not_found", "exec_error"):
                self.vendor = ""
            raise
        except Exception as exc:  # reported as reason internal_error
            raise CollectorError("internal_error", f"{type(exc).__name__}: {exc}") from exc

    def cycle(self) -> bool:
        args = self.args
        start = time.monotonic()
        deadline = Deadline(args.timeout)  # the whole cycle, journalctl included
        extra: list[Sample] = []
        if args.expected_gpus is not None:
            extra.append(Sample("expected_devices", (), float(args.expected_gpus)))
        try:
            samples, gpus, apps_ok = self.collect(deadline.before(self.journal_reserve()))
            error: CollectorError | None = None
        except CollectorError as exc:
            samples, gpus, apps_ok, error = [], [], None, exc
            extra.extend(exc.samples)
            log(str(exc))
        if args.xid_source != "none":
            extra.extend(self.update_xids(gpus, error is None, deadline))
        if apps_ok is not None:
            extra.append(Sample("collector_compute_apps_success", (), 1.0 if apps_ok else 0.0))
        if error is None:
            self.last_success = time.time()
        health = health_samples(
            error is None,
            time.monotonic() - start,
            self.last_success,
            error.reason if error else None,
        )
        write_atomic(self.output, render_metrics(samples + extra + health), durable=False)
        return error is None


# ---------------------------------------------------------------- systemd notify


def notify_address(value: str) -> bytes | None:
    """$NOTIFY_SOCKET -> an AF_UNIX address: a path, or '@name' in the abstract
    namespace (a leading NUL byte). Other forms (vsock:...) are not used."""
    if value.startswith("/"):
        return os.fsencode(value)
    if value.startswith("@") and len(value) > 1:
        return b"\0" + os.fsencode(value[1:])
    return None


class Notifier:
    """sd_notify(3): one datagram per message to systemd's socket; a no-op without one."""

    def __init__(self, address: bytes | None) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if address else None

    @classmethod
    def from_environ(cls) -> Notifier:
        # Taken out of the environment, as sd_notify does: the vendor tools inherit it.
        return cls(notify_address(os.environ.pop("NOTIFY_SOCKET", "")))

    def send(self, message: str) -> bool:
        if self.sock is None or self.address is None:
            return False
        try:
            self.sock.sendto(message.encode(), self.address)
        except OSError as exc:
            log(f"cannot notify systemd: {exc}")
            return False
        return True


class Stop(BaseException):
    """SIGTERM: the loop ends where it is (every file is replaced atomically)."""


def _stop(_signum: int, _frame: Any) -> None:
    raise Stop


def run_loop(collector: Collector, interval: float, notifier: Notifier) -> None:
    """A cycle every ``interval`` seconds until SIGTERM.

    systemd hears READY=1 after the first cycle (the output exists) and WATCHDOG=1
    after every cycle, failed ones too: a loop that stops completing cycles (a
    cycle itself ends within --timeout) is killed and restarted by its watchdog.
    """
    ready = "READY=1\n"
    next_run = time.monotonic()
    while True:
        collector.cycle()
        notifier.send(ready + "WATCHDOG=1")
        ready = ""
        # An overrun skips the missed ticks instead of bursting.
        next_run = max(next_run + interval, time.monotonic())
        time.sleep(max(next_run - time.monotonic(), 0.0))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvidia-smi", default="", help="path to nvidia-smi (default: PATH)")
    parser.add_argument("--amd-smi", default="", help="path to amd-smi (default: PATH)")
    parser.add_argument("--rocm-smi", default="", help="path to rocm-smi (default: PATH)")
    parser.add_argument("--vendor", choices=("auto", "nvidia", "amd"), default="auto")
    parser.add_argument("--textfile-dir", default="/var/lib/node_exporter/textfile_collector")
    parser.add_argument(
        "--output-name", default=DEFAULT_OUTPUT, help="file name, must end in .prom"
    )
    parser.add_argument(
        "--state-dir", default=DEFAULT_STATE_DIR, help="XID counters, field memory; '' disables"
    )
    parser.add_argument("--once", action="store_true", help="one collection, then exit")
    parser.add_argument(
        "--interval", type=float, default=15.0, help="seconds between cycles (loop mode)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="deadline of a whole cycle: vendor tool calls and journalctl",
    )
    parser.add_argument("--expected-gpus", type=int, default=None, help="GPUs this node must have")
    parser.add_argument(
        "--xid-source",
        default="none",
        help="journald, kmsg, none, or a FILE of kernel log lines (tests)",
    )
    parser.add_argument(
        "--proc-root",
        default="/proc",
        help="where /proc/PID/cgroup and /proc/driver/nvidia/gpus are read",
    )
    args = parser.parse_args(argv)
    if not args.output_name.endswith(".prom") or "/" in args.output_name:
        parser.error("--output-name must be a plain file name ending in .prom")
    if args.timeout <= 0 or args.interval <= 0:
        parser.error("--timeout and --interval must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The vendor tools inherit this environment; set once, not copied per command.
    os.environ["LC_ALL"] = "C"
    collector = Collector(args)
    if args.once:
        return 0 if collector.cycle() else 1
    faulthandler.enable()  # the watchdog's SIGABRT leaves where the loop hung in the log
    signal.signal(signal.SIGTERM, _stop)
    with contextlib.suppress(Stop):
        run_loop(collector, args.interval, Notifier.from_environ())
    return 0


if __name__ == "__main__":
    sys.exit(main())
