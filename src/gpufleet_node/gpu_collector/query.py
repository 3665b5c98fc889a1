"""The vendor tools' runs: nvidia-smi (with its field memory), amd-smi, rocm-smi."""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any, NamedTuple

from .amd import parse_amd_smi, parse_rocm_smi
from .model import AMD_MAX_BYTES, MAX_GPUS, CollectorError, GpuData, Sample
from .nvidia import (
    COMPUTE_APPS_FIELDS,
    FIELD_ALIASES,
    FIELD_GROUPS,
    ComputeApp,
    all_query_fields,
    canonical_field,
    effective_fields,
    invalid_fields,
    parse_compute_apps,
    parse_nvidia_gpus,
)
from .run import Deadline, _checked, run_command
from .state import load_json, log, save_json


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


class NvidiaAnswer(NamedTuple):
    text: str  # the CSV nvidia-smi printed
    fields: list[str]  # the fields asked for: its header


def query_nvidia_gpus(nvidia_smi: str, memory: FieldMemory, deadline: Deadline) -> NvidiaAnswer:
    """One --query-gpu call; a second one only after an invalid-field error."""
    for attempt in (1, 2):
        fields = memory.fields()
        argv = [nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,nounits"]
        result = run_command(argv, deadline.left())
        stdout = _checked(result, "nvidia-smi --query-gpu")
        if result.error is None:
            return NvidiaAnswer(stdout, fields)
        bad = invalid_fields(stdout + result.stderr)
        if bad:
            if not any([memory.forget(b) for b in bad]) or attempt == 2:
                raise CollectorError("invalid_field", ", ".join(bad))
            continue
        if "No devices were found" in stdout + result.stderr:
            return NvidiaAnswer(", ".join(fields) + "\n", fields)
        if has_gpu_rows(stdout, fields):
            # partial answer (e.g. one GPU lost): keep the healthy ones
            return NvidiaAnswer(stdout, fields)
        detail = (stdout + result.stderr).strip().splitlines()[:1]
        raise CollectorError("exit_code", f"rc={result.returncode} {detail}")
    raise CollectorError("invalid_field")


def has_gpu_rows(text: str, fields: list[str]) -> bool:
    try:
        return bool(parse_nvidia_gpus(text, fields))
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
    if result.error is not None:
        raise CollectorError("exit_code", f"compute-apps rc={result.returncode}")
    return parse_compute_apps(stdout, COMPUTE_APPS_FIELDS)


def query_amd(args: argparse.Namespace, deadline: Deadline) -> list[GpuData]:
    if args.amd_smi_resolved:
        docs = []
        for sub in ("metric", "static"):
            argv = [args.amd_smi_resolved, sub, "--json"]
            result = run_command(argv, deadline.left(), AMD_MAX_BYTES)
            stdout = _checked(result, f"amd-smi {sub}")
            if result.error is not None:
                raise CollectorError("exit_code", f"amd-smi {sub} rc={result.returncode}")
            docs.append(_load_json_text(stdout))
        return checked_gpu_list(parse_amd_smi(docs[0], docs[1]))
    argv = [args.rocm_smi_resolved, *ROCM_SMI_ARGS]
    result = run_command(argv, deadline.left(), AMD_MAX_BYTES)
    stdout = _checked(result, "rocm-smi")
    if result.error is not None:
        raise CollectorError("exit_code", f"rocm-smi rc={result.returncode}")
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


# Lines before the document (amd-smi prints "[WARNING] ..." lines, and rocm-smi
# "WARNING: ..."): the document starts on the first of these lines that holds a whole
# JSON value followed by nothing but white space.
MAX_LEADING_LINES = 16
MAX_INT_DIGITS = 20  # a 64-bit counter; a longer integer is read as a float (inf: absent)


def bounded_int(text: str) -> int | float:
    """json's parse_int: no integer of thousands of digits (slow, and float() of it
    raises OverflowError); a longer one becomes a float, inf past 1e308."""
    digits = len(text.lstrip("-"))
    return int(text) if digits <= MAX_INT_DIGITS else float(text)


JSON_DECODER = json.JSONDecoder(parse_int=bounded_int)
LEADING_BLANKS_RE = re.compile(r"[ \t]*")


def _load_json_text(text: str) -> Any:
    """The JSON document of a tool's output, after any warning lines (None for empty
    output); CollectorError parse_error when no line within MAX_LEADING_LINES starts one."""
    if not text.strip():
        return None
    start, error = 0, "no JSON document"
    for _ in range(MAX_LEADING_LINES + 1):
        begin = LEADING_BLANKS_RE.match(text, start).end()  # type: ignore[union-attr]
        if text.startswith(("{", "["), begin):
            try:
                value, end = JSON_DECODER.raw_decode(text, begin)
            except (ValueError, RecursionError) as exc:
                error = f"bad JSON: {exc}"
            else:
                if not text[end:].strip():
                    return value
                error = "text after the JSON document"
        newline = text.find("\n", start)
        if newline < 0:
            break
        start = newline + 1
    raise CollectorError("parse_error", error)
