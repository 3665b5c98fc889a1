"""Helpers the parsers share: GRES, numbers, times, pipe-separated records."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Iterator

from gpufleet_node.hostlist import (
    BoundExceeded,
    expand_ranges,
    split_top_level,
)
from gpufleet_node.slurm_exporter.model import (
    MAX_GPU_COUNT,
    MAX_GRES_INDEX,
    MAX_GRES_INDICES,
    MISSING,
    Gres,
)

_PAREN_RE = re.compile(r"^(.*)\(([^()]*)\)$")
_COUNT_RE = re.compile(r"^([0-9]{1,12})([KMGTP]?)$")
_MULT = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def parse_gres(spec: str) -> tuple[Gres, ...]:
    """Parse a GRES list as sinfo Gres/GresUsed or scontrol ``GRES=`` print it.

    Handles ``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gpu:a100:2(IDX:0-1)``, ``gpu:a100:0(IDX:N/A)``,
    ``gpu:(null):0(IDX:N/A)``, ``gpu(IDX:0-1)`` (count from the indices), MIG types with dots,
    several types separated by commas, and ``(null)``/empty (no GRES).
    """
    spec = spec.strip()
    if spec in MISSING:
        return ()
    out: list[Gres] = []
    for token in split_top_level(spec):
        paren = ""
        m_paren = _PAREN_RE.match(token)
        if m_paren and m_paren.group(2) != "null":
            token, paren = m_paren.group(1), m_paren.group(2)
        parts = token.split(":")
        name = parts[0]
        if not name:
            raise ValueError(f"bad gres token {token!r}")
        gtype: str | None = None
        count: int | None = None
        rest = parts[1:]
        if rest:
            m = _COUNT_RE.match(rest[-1])
            if m:
                count = int(m.group(1)) * _MULT[m.group(2)]
                rest = rest[:-1]
            if rest:
                gtype = ":".join(rest)
                if gtype in MISSING:
                    gtype = None
        indices: tuple[int, ...] = ()
        if paren.startswith("IDX:"):
            idx = paren[4:]
            if idx not in MISSING:
                indices = tuple(expand_ranges(idx, MAX_GRES_INDICES, MAX_GRES_INDEX))
        if count is None:
            count = len(indices) if indices else 1
        if name == "gpu" and count > MAX_GPU_COUNT:
            raise BoundExceeded(f"gres token {token[:80]!r}: more than {MAX_GPU_COUNT} GPUs")
        out.append(Gres(name=name, type=gtype, count=count, indices=indices))
    return tuple(out)


def gpu_count(gres: Iterable[Gres]) -> int:
    return sum(g.count for g in gres if g.name == "gpu")


def _float(text: str) -> float | None:
    text = text.strip()
    if text in MISSING:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _int(text: str) -> int:
    value = _float(text)
    return int(value) if value is not None else 0


def parse_slurm_time(text: str) -> float | None:
    """``2026-11-22T02:15:56`` (SLURM_TIME_FORMAT=standard, controller local time) -> epoch."""
    text = text.strip()
    if text in MISSING:
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


# ---------------------------------------------------------------------------------------
# Parse functions, one per command output. Pure: text in, data out.
# Malformed lines are skipped and counted (returned as ``bad``), never raised.
# ---------------------------------------------------------------------------------------


def parse_version(text: str) -> str | None:
    """``slurm 22.05.8`` / ``slurm-wlm 22.05.8`` -> ``22.05.8``."""
    m = re.search(r"\b(\d+\.\d+(?:\.\d+)?(?:-\w+)?)\b", text)
    return m.group(1) if m else None


def _pipe_records(
    lines: Iterable[str], width: int, *, last_takes_rest: bool = True
) -> Iterator[tuple[str, ...] | None]:
    """The non-blank lines as ``width`` "|"-separated, stripped fields; None for a line
    with fewer (or, unless the last field takes the rest of the line, more)."""
    for line in lines:
        if not line.strip():
            continue
        fields = line.split("|", width - 1) if last_takes_rest else line.split("|")
        yield tuple(f.strip() for f in fields) if len(fields) == width else None
