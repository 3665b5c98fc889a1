"""Slurm hostlist expressions: expand ``gpu[001-003,010]`` and compress host names back.

Grammar (as Slurm): a comma-separated list of terms, where commas inside brackets belong
to the bracket. A term is literal text with zero or more bracket groups; each group is a
comma-separated list of numbers or ``lo-hi`` ranges. The width of ``lo`` sets the zero
padding. Several groups expand as a cartesian product, leftmost group outermost.

Expansion is bounded: an expression is counted before it is expanded, and a
:class:`Budget` caps what all expressions of one node list expand to together
(``gpufleet.limits``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from gpufleet.limits import MAX_HOSTS, MAX_NAME_LENGTH, MAX_NAMES, MAX_NUMBER_DIGITS

_LITERAL_RE = re.compile(r"[A-Za-z0-9._-]*")
_NUMBER_RE = re.compile(r"[0-9]+")
_TRAILING_NUMBER_RE = re.compile(r"^(.*?)([0-9]+)([^0-9]*)$")

# A parsed term: literal strings and bracket groups; a group is a list of (low, high)
# digit strings, high None for a single number.
Group = list[tuple[str, str | None]]
Term = list[str | Group]


class HostlistError(ValueError):
    """A malformed hostlist expression; the message says what and where."""


def shown(expression: str, width: int = 60) -> str:
    """``repr`` of an expression for messages, cut in the middle when long."""
    text = repr(expression)
    return text if len(text) <= width else f"{text[: width // 2 - 2]}...{text[-(width // 2 - 1) :]}"


def split_top_level(expression: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    terms: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(expression):
        if char == "[":
            if depth:
                raise HostlistError(f"nested '[' at position {index} in {shown(expression)}")
            depth = 1
        elif char == "]":
            if not depth:
                raise HostlistError(f"unmatched ']' at position {index} in {shown(expression)}")
            depth = 0
        elif char == "," and not depth:
            terms.append(expression[start:index])
            start = index + 1
    if depth:
        raise HostlistError(f"unclosed '[' in {shown(expression)}")
    terms.append(expression[start:])
    return terms


def parse_range_list(body: str, expression: str) -> Group:
    """Validate the inside of one bracket group, e.g. ``001-003,010``."""
    if not body.strip():
        raise HostlistError(f"empty range '[]' in {shown(expression)}")
    group: Group = []
    for item in body.split(","):
        item = item.strip()
        if not item:
            raise HostlistError(
                f"empty item in range {shown('[' + body + ']')} of {shown(expression)}"
            )
        low, sep, high = item.partition("-")
        if not _NUMBER_RE.fullmatch(low) or (sep and not _NUMBER_RE.fullmatch(high)):
            raise HostlistError(f"invalid range {shown(item)} in {shown(expression)}")
        if max(len(low), len(high)) > MAX_NUMBER_DIGITS:
            raise HostlistError(
                f"number with more than {MAX_NUMBER_DIGITS} digits in {shown(expression)}"
            )
        if sep and int(low) > int(high):
            raise HostlistError(f"reversed range {shown(item)} in {shown(expression)}")
        group.append((low, high if sep else None))
    return group


def parse_term(term: str, expression: str) -> Term:
    """Validate one top-level term (no top-level commas) without expanding it."""
    if not term.strip():
        raise HostlistError(f"empty host name in {shown(expression)}")
    parts = re.split(r"\[([^\]]*)\]", term)
    # re.split alternates literal, group, literal, group, ..., literal
    parsed: Term = []
    length = 0
    for index, part in enumerate(parts):
        if index % 2 == 0:
            if not _LITERAL_RE.fullmatch(part):
                bad = next(c for c in part if not _LITERAL_RE.fullmatch(c))
                raise HostlistError(f"invalid character {bad!r} in {shown(expression)}")
            parsed.append(part)
            length += len(part)
        else:
            group = parse_range_list(part, expression)
            parsed.append(group)
            length += max(max(len(low), len(high or "")) for low, high in group)
    if length > MAX_NAME_LENGTH:
        raise HostlistError(
            f"names longer than {MAX_NAME_LENGTH} characters in {shown(expression)}"
        )
    return parsed


def group_size(group: Group) -> int:
    return sum(1 if high is None else int(high) - int(low) + 1 for low, high in group)


def term_size(term: Term) -> int:
    return math.prod(group_size(part) for part in term if isinstance(part, list))


def parse(expression: str) -> list[Term]:
    """Validate a hostlist expression; :func:`size` and :func:`materialize` take the result."""
    if not isinstance(expression, str):
        raise HostlistError(f"expected a hostlist string, got {type(expression).__name__}")
    if not expression.strip():
        raise HostlistError("empty hostlist")
    return [parse_term(term.strip(), expression) for term in split_top_level(expression.strip())]


def size(terms: list[Term]) -> int:
    """How many names a parsed expression expands to (duplicates counted), without expanding."""
    return sum(term_size(term) for term in terms)


def group_values(group: Group) -> list[str]:
    values: list[str] = []
    for low, high in group:
        if high is None:
            values.append(low)
        else:
            width = len(low)
            values.extend(f"{number:0{width}d}" for number in range(int(low), int(high) + 1))
    return values


def materialize(terms: list[Term]) -> list[str]:
    """The names of a parsed expression, in Slurm order (leftmost group outermost)."""
    names: list[str] = []
    for term in terms:
        expanded = [""]
        for part in term:
            if isinstance(part, str):
                expanded = [name + part for name in expanded]
            else:
                values = group_values(part)
                expanded = [name + value for name in expanded for value in values]
        names.extend(expanded)
    return names


def expand(expression: str, limit: int = MAX_NAMES) -> list[str]:
    """Expand a hostlist expression into host names, in Slurm order, duplicates kept.

    Counts first: an expression of more than ``limit`` names is refused before any is made.
    """
    terms = parse(expression)
    if size(terms) > limit:
        raise HostlistError(f"{shown(expression)} expands to more than {limit:,} names")
    return materialize(terms)


class Budget:
    """What the hostlist expressions of one node list (its YAML and its slurm.conf files)
    may still expand to: ``MAX_HOSTS`` defined hosts and ``MAX_NAMES`` names in all."""

    def __init__(self, hosts: int = MAX_HOSTS, names: int = MAX_NAMES) -> None:
        self.max_hosts, self.hosts_left = hosts, hosts
        self.max_names, self.names_left = names, names

    def take(self, count: int, what: str, defines: bool = False) -> None:
        """Charge ``count`` names (hosts, if ``defines``) for ``what`` (used in messages)."""
        if defines and count > self.hosts_left:
            raise HostlistError(
                f"{what}: the node list would define more than {self.max_hosts:,} hosts "
                "(the limit for nodes, servers and slurm.conf together)"
            )
        if count > self.names_left:
            raise HostlistError(
                f"{what}: the node list's hostlists would expand to more than "
                f"{self.max_names:,} names (the limit for all its hostlists together)"
            )
        self.names_left -= count
        if defines:
            self.hosts_left -= count

    def expand(self, expression: str, defines: bool = False) -> list[str]:
        """:func:`expand`, charged to this budget; ``defines``: the names are new hosts."""
        terms = parse(expression)
        self.take(size(terms), shown(expression), defines)
        return materialize(terms)


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
