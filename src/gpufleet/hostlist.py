"""Slurm hostlist expressions: expand ``gpu[001-003,010]`` and compress host names back.

Grammar (as Slurm): a comma-separated list of terms, where commas inside brackets belong
to the bracket. A term is literal text with zero or more bracket groups; each group is a
comma-separated list of numbers or ``lo-hi`` ranges. The width of ``lo`` sets the zero
padding. Several groups expand as a cartesian product, leftmost group outermost.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_HOSTS = 1_000_000  # guards against a typo like gpu[0-99999999] eating all memory
_LITERAL_RE = re.compile(r"[A-Za-z0-9._-]*")
_NUMBER_RE = re.compile(r"[0-9]+")
_TRAILING_NUMBER_RE = re.compile(r"^(.*?)([0-9]+)([^0-9]*)$")


class HostlistError(ValueError):
    """A malformed hostlist expression; the message says what and where."""


def split_top_level(expression: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    terms: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(expression):
        if char == "[":
            if depth:
                raise HostlistError(f"nested '[' at position {index} in {expression!r}")
            depth = 1
        elif char == "]":
            if not depth:
                raise HostlistError(f"unmatched ']' at position {index} in {expression!r}")
            depth = 0
        elif char == "," and not depth:
            terms.append(expression[start:index])
            start = index + 1
    if depth:
        raise HostlistError(f"unclosed '[' in {expression!r}")
    terms.append(expression[start:])
    return terms


def expand_range_list(body: str, expression: str) -> list[str]:
    """Expand the inside of one bracket group, e.g. ``001-003,010``."""
    if not body.strip():
        raise HostlistError(f"empty range '[]' in {expression!r}")
    values: list[str] = []
    for item in body.split(","):
        item = item.strip()
        if not item:
            raise HostlistError(f"empty item in range '[{body}]' of {expression!r}")
        low, sep, high = item.partition("-")
        if not _NUMBER_RE.fullmatch(low) or (sep and not _NUMBER_RE.fullmatch(high)):
            raise HostlistError(f"invalid range {item!r} in {expression!r}")
        if not sep:
            values.append(low)
            continue
        first, last = int(low), int(high)
        if first > last:
            raise HostlistError(f"reversed range {item!r} in {expression!r}")
        if last - first + 1 > MAX_HOSTS:
            raise HostlistError(f"range {item!r} in {expression!r} exceeds {MAX_HOSTS} hosts")
        width = len(low)
        values.extend(f"{number:0{width}d}" for number in range(first, last + 1))
    return values


def expand_term(term: str, expression: str) -> list[str]:
    """Expand one top-level term (no top-level commas)."""
    if not term.strip():
        raise HostlistError(f"empty host name in {expression!r}")
    parts = re.split(r"\[([^\]]*)\]", term)
    # re.split alternates literal, group, literal, group, ..., literal
    names = [""]
    for index, part in enumerate(parts):
        if index % 2 == 0:
            if not _LITERAL_RE.fullmatch(part):
                bad = next(c for c in part if not _LITERAL_RE.fullmatch(c))
                raise HostlistError(f"invalid character {bad!r} in {expression!r}")
            names = [name + part for name in names]
        else:
            values = expand_range_list(part, expression)
            if len(names) * len(values) > MAX_HOSTS:
                raise HostlistError(f"{expression!r} expands to more than {MAX_HOSTS} hosts")
            names = [name + value for name in names for value in values]
    return names


def expand(expression: str) -> list[str]:
    """Expand a hostlist expression into host names, in Slurm order, duplicates kept."""
    if not isinstance(expression, str):
        raise HostlistError(f"expected a hostlist string, got {type(expression).__name__}")
    if not expression.strip():
        raise HostlistError("empty hostlist")
    names: list[str] = []
    for term in split_top_level(expression.strip()):
        names.extend(expand_term(term.strip(), expression))
    return names


def split_number(name: str) -> tuple[str, str, str] | None:
    """Split ``r1-gpu007x`` into (``r1-gpu``, ``007``, ``x``) at the last digit run."""
    match = _TRAILING_NUMBER_RE.match(name)
    return (match.group(1), match.group(2), match.group(3)) if match else None


def last_number(name: str) -> int | None:
    """The host's last numeric run as an integer (``gpu007`` -> 7), or None."""
    parts = split_number(name)
    return int(parts[1]) if parts else None


def _format_runs(numbers: list[int], width: int) -> str:
    runs: list[str] = []
    start = previous = numbers[0]
    for number in [*numbers[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        low, high = f"{start:0{width}d}", f"{previous:0{width}d}"
        runs.append(low if start == previous else f"{low}-{high}")
        if number is not None:
            start = previous = number
    return ",".join(runs)


def _width_groups(digit_strings: list[str]) -> dict[int, list[int]]:
    """Group digit strings by the zero padding that reproduces them exactly."""
    lengths = {len(digits) for digits in digit_strings}
    if len(lengths) == 1:
        return {lengths.pop(): [int(digits) for digits in digit_strings]}
    if not any(digits.startswith("0") for digits in digit_strings):
        return {0: [int(digits) for digits in digit_strings]}
    by_width: dict[int, list[int]] = {}
    for digits in digit_strings:
        by_width.setdefault(len(digits), []).append(int(digits))
    return by_width


def compress(names: Iterable[str]) -> str:
    """Compress host names into a hostlist expression (inverse of :func:`expand`).

    Names are grouped by the text around their last number; groups keep the order of
    their first appearance, numbers inside a group are sorted.
    """
    groups: dict[tuple[str, str] | str, list[str]] = {}
    for name in dict.fromkeys(names):
        parts = split_number(name)
        if parts is None:
            groups[name] = []
            continue
        prefix, digits, suffix = parts
        groups.setdefault((prefix, suffix), []).append(digits)
    terms: list[str] = []
    for key, digit_strings in groups.items():
        if isinstance(key, str):
            terms.append(key)
            continue
        prefix, suffix = key
        for width, numbers in _width_groups(digit_strings).items():
            unique = sorted(set(numbers))
            body = _format_runs(unique, width)
            terms.append(
                f"{prefix}{body}{suffix}" if len(unique) == 1 else f"{prefix}[{body}]{suffix}"
            )
    return ",".join(terms)
