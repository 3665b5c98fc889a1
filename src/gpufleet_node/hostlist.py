"""Slurm hostlist and range expressions as Slurm prints them, expanded within bounds.

Lenient where the controller's gpufleet.hostlist is strict: this reads what Slurm
prints (GRES index lists, job node lists), not what an operator types; see
docs/slurm-exporter.md (Node-side package).
"""

from __future__ import annotations

import itertools
import re
from typing import Union

MAX_HOSTS_PER_EXPRESSION = 65536  # hosts one hostlist expression may name
MAX_HOSTS_PER_SCRAPE = 262144  # hosts all job hostlists of one collection may name together


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses and brackets: ``a(IDX:0,3),b[1,2]``."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (s.strip() for s in parts) if p]


class BoundExceeded(ValueError):
    """The input asks for more than the exporter's bounds allow (MAX_* above)."""


class HostBudget:
    """How many hosts the hostlist expansions of one collection may still produce."""

    def __init__(self, limit: int = MAX_HOSTS_PER_SCRAPE) -> None:
        self.remaining = limit

    def take(self, count: int) -> None:
        if count > self.remaining:
            raise BoundExceeded(f"{count} more hosts exceed this collection's bound")
        self.remaining -= count


_NUMBER_RE = re.compile(r"[0-9]{1,9}")


def _range_bounds(part: str) -> tuple[int, int, int]:
    """``07-12`` -> (7, 12, 2), ``3`` -> (3, 3, 1): at most 9 digits, low <= high."""
    lo, sep, hi = part.partition("-")
    if not _NUMBER_RE.fullmatch(lo) or (sep and not _NUMBER_RE.fullmatch(hi)):
        raise ValueError(f"bad range {part!r}")
    a = int(lo)
    b = int(hi) if sep else a
    if b < a:
        raise ValueError(f"bad range {part!r}")
    return a, b, len(lo)


def expand_ranges(text: str, limit: int, max_value: int) -> list[int]:
    """``0-1,3`` -> [0, 1, 3]. ValueError on anything else or beyond the bounds."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        a, b, _ = _range_bounds(part)
        if b > max_value or len(out) + (b - a + 1) > limit:
            raise BoundExceeded(f"range {part!r} beyond the bounds")
        out.extend(range(a, b + 1))
    return out


# A parsed hostlist item: literal text, and bracket groups as (low, high, width) ranges.
ItemPart = Union[str, list[tuple[int, int, int]]]


def _hostlist_item(item: str) -> list[ItemPart]:
    """One hostlist item split into literals and bracket ranges:
    ``gpu[01-02,7]x`` -> ["gpu", [(1, 2, 2), (7, 7, 1)], "x"]."""
    parts: list[ItemPart] = []
    pos = 0
    while True:
        open_at = item.find("[", pos)
        close_at = item.find("]", pos)
        if open_at < 0:
            if close_at >= 0:
                raise ValueError(f"bad hostlist {item!r}")
            parts.append(item[pos:])
            return parts
        if close_at < open_at:
            raise ValueError(f"bad hostlist {item!r}")
        parts.append(item[pos:open_at])
        inner = item[open_at + 1 : close_at]
        if "[" in inner or not inner:
            raise ValueError(f"bad hostlist {item!r}")
        parts.append([_range_bounds(r.strip()) for r in inner.split(",")])
        pos = close_at + 1


def expand_hostlist(
    text: str, budget: HostBudget | None = None, limit: int = MAX_HOSTS_PER_EXPRESSION
) -> list[str]:
    """Expand a Slurm hostlist: ``gpu[01-03,07],vm`` or ``r[1-2]n[1-2]``.

    The size is computed first: an expression naming more than ``limit`` hosts, or more
    than ``budget`` has left, raises BoundExceeded without expanding anything.
    """
    items = [_hostlist_item(item) for item in split_top_level(text)]
    total = 0
    for parts in items:
        size = 1
        for part in parts:
            if isinstance(part, list):
                size *= sum(b - a + 1 for a, b, _ in part)
                if size > limit:
                    raise BoundExceeded(f"hostlist {text[:80]!r} names more than {limit} hosts")
        total += size
        if total > limit:
            raise BoundExceeded(f"hostlist {text[:80]!r} names more than {limit} hosts")
    if budget is not None:
        budget.take(total)
    hosts: list[str] = []
    for parts in items:
        choices = [
            [f"{n:0{w}d}" for a, b, w in part for n in range(a, b + 1)]
            if isinstance(part, list)
            else [part]
            for part in parts
        ]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts
