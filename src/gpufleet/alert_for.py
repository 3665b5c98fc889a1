"""The `for:` duration of gpufleet's shipped alerts, set per alert name (prometheus_alert_for).

The rule files stay static (promtool's tests in tests/rules test them as shipped); the
prometheus role passes each one through :func:`set_durations` (filter gpufleet_alert_for,
plugins/filter/gpufleet_filters.py) on its way to the host. The YAML parser finds each
alert rule and its `for:` (or `expr:`) by position, and only that value is replaced (or a
`for:` line inserted after the rule's `expr`): every other byte of the file, comments
included, stays as shipped. :func:`setting_problems` (filter gpufleet_alert_for_problems)
checks the whole setting once against every shipped file, so a name that matches no alert
(a typo) fails the play instead of changing nothing.

Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, cast

import yaml

VARIABLE = "prometheus_alert_for"
# Alerts whose duration has a variable of its own, which sets other rules too.
DEDICATED = {"SlurmJobGpuIdle": "prometheus_slurm_idle_gpu_duration"}
# Prometheus' own grammar (prometheus/common model.ParseDuration): each unit at most
# once, largest first; promtool refuses 1s1m and 1h1h.
DURATION = re.compile(
    r"(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?"
    r"(?:([0-9]+)s)?(?:([0-9]+)ms)?"
)
_SECOND = 10**9
UNIT_NANOSECONDS = (
    365 * 86400 * _SECOND, 7 * 86400 * _SECOND, 86400 * _SECOND, 3600 * _SECOND, 60 * _SECOND,
    _SECOND, _SECOND // 1000,
)  # fmt: skip
# Prometheus holds a duration in an int64 of nanoseconds (about 292 years).
MAX_NANOSECONDS = 2**63 - 1


class AlertRule(NamedTuple):
    """One alert rule of a file, as nodes of the composed YAML (their marks locate the text)."""

    name: str
    rule: yaml.MappingNode
    keys: dict[str, tuple[yaml.Node, yaml.Node]]


def _nanoseconds(text: str) -> int | None:
    """The duration's length in nanoseconds, or None if it is not a Prometheus duration."""
    match = DURATION.fullmatch(text)
    if not text or not match:
        return None
    return sum(
        int(count) * unit
        for count, unit in zip(match.groups(), UNIT_NANOSECONDS, strict=True)
        if count
    )


def duration_problem(name: str, value: object) -> str | None:
    """What is wrong with value as the `for:` of alert name, or None."""
    if not isinstance(value, str):
        return f"{VARIABLE}: {name}: {value!r} is not a duration string such as 30s, 2m or 1h30m"
    nanoseconds = _nanoseconds(value)
    if nanoseconds is None:
        return (
            f"{VARIABLE}: {name}: {value!r} is not a Prometheus duration (digits and units "
            "y w d h m s ms, largest first, each once: 30s, 2m, 1h30m)"
        )
    if nanoseconds == 0:
        return (
            f"{VARIABLE}: {name}: {value!r} is zero: the alert would fire on a single "
            "evaluation; give a positive duration, or remove the entry for the shipped one"
        )
    if nanoseconds > MAX_NANOSECONDS:
        return f"{VARIABLE}: {name}: {value!r} is longer than Prometheus can hold (292 years)"
    return None


def _overrides(overrides: object) -> Mapping[Any, Any]:
    """The setting as a mapping (None, a variable left empty, is no override)."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise ValueError(
            f"{VARIABLE} must be a mapping of alert name to duration, "
            f"got {type(overrides).__name__}"
        )
    return overrides


def entry_problems(overrides: object) -> list[str]:
    """What is wrong with the entries themselves: dedicated alerts, durations."""
    problems: list[str | None] = []
    for name, value in _overrides(overrides).items():
        if name in DEDICATED:
            problems.append(
                f"{VARIABLE}: {name} has a setting of its own: set {DEDICATED[name]} instead"
            )
        else:
            problems.append(duration_problem(str(name), value))
    return [problem for problem in problems if problem]


def _unique_keys(node: yaml.Node, filename: str) -> None:
    """Fails on a mapping that holds a key twice (PyYAML would keep the last silently)."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                if key.value in seen:
                    line = key.start_mark.line + 1
                    raise ValueError(f"{filename}:{line}: key {key.value!r} given twice")
                seen.add(key.value)
            _unique_keys(value, filename)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _unique_keys(item, filename)


def _mapping(node: yaml.Node, where: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise ValueError(f"{where} is not a mapping")
    keys: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode):
            raise ValueError(f"{where}: a key that is not a plain value")
        keys[key.value] = (key, value)
    return keys


def _sequence(node: yaml.Node, where: str) -> list[yaml.Node]:
    if not isinstance(node, yaml.SequenceNode):
        raise ValueError(f"{where} is not a list")
    return list(node.value)


def alert_rules(text: str, filename: str) -> list[AlertRule]:
    """Every alert rule of a Prometheus rule file, in file order."""
    try:
        document = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        raise ValueError(f"{filename}: not YAML: {error}".replace("\n", " ")) from error
    if document is None:
        raise ValueError(f"{filename}: empty")
    _unique_keys(document, filename)
    found: list[AlertRule] = []
    groups = _mapping(document, filename).get("groups")
    if groups is None:
        raise ValueError(f"{filename}: no groups")
    for g, group in enumerate(_sequence(groups[1], f"{filename}: groups")):
        rules = _mapping(group, f"{filename}: group {g}").get("rules")
        if rules is None:
            continue
        for r, rule in enumerate(_sequence(rules[1], f"{filename}: group {g} rules")):
            keys = _mapping(rule, f"{filename}: group {g} rule {r}")
            if "alert" in keys:
                # _mapping refused any node but a mapping.
                node = cast(yaml.MappingNode, rule)
                found.append(AlertRule(str(keys["alert"][1].value), node, keys))
    return found


def alert_names(text: str, filename: str) -> set[str]:
    return {rule.name for rule in alert_rules(text, filename)}


def _line_end(text: str, index: int) -> int:
    """The index just past the newline that ends the line holding index."""
    newline = text.find("\n", index)
    return len(text) if newline < 0 else newline + 1


def _edit(text: str, rule: AlertRule, duration: str, filename: str) -> tuple[int, int, str]:
    """(start, end, replacement) that sets the rule's `for:` to duration."""
    where = f"{filename}: alert {rule.name}"
    if rule.rule.flow_style or "<<" in rule.keys:
        raise ValueError(f"{where}: a flow mapping or merge key; cannot set its for: in place")
    start, end = rule.rule.start_mark.index, rule.rule.end_mark.index
    if "for" in rule.keys:
        value = rule.keys["for"][1]
        if not isinstance(value, yaml.ScalarNode) or not start <= value.start_mark.index < end:
            raise ValueError(f"{where}: its for: is not a value of its own block")
        return value.start_mark.index, value.end_mark.index, duration
    if "expr" not in rule.keys:
        raise ValueError(f"{where}: has no expr")
    key, value = rule.keys["expr"]
    last = len(text[: value.end_mark.index].rstrip()) - 1
    if not start <= last < end:
        raise ValueError(f"{where}: its expr is not a value of its own block")
    at = _line_end(text, last)
    newline = "" if text[:at].endswith("\n") else "\n"
    return at, at, f"{newline}{' ' * key.start_mark.column}for: {duration}\n"


def _check(shipped: str, text: str, filename: str, durations: Mapping[str, str]) -> None:
    """Fails unless text loads as the shipped rules with just those `for:` values set."""
    expected = yaml.safe_load(shipped)
    for group in expected["groups"]:
        for rule in group.get("rules") or []:
            if rule.get("alert") in durations:
                rule["for"] = durations[rule["alert"]]
    if yaml.safe_load(text) != expected:
        raise ValueError(f"{filename}: setting {VARIABLE} changed more than the for: values")


def set_durations(text: str, overrides: object, filename: str) -> str:
    """The rule file text with the `for:` of each alert named in overrides replaced.

    Names that are no alert of this file are left to :func:`setting_problems` (they may
    be alerts of another file); a bad duration or a dedicated alert fails here as well.
    """
    wanted = _overrides(overrides)
    if not wanted:
        return text
    problems = entry_problems(wanted)
    if problems:
        raise ValueError("; ".join(problems))
    rules = [rule for rule in alert_rules(text, filename) if rule.name in wanted]
    if not rules:
        return text
    edits = sorted(_edit(text, rule, str(wanted[rule.name]), filename) for rule in rules)
    shipped = text
    for start, end, replacement in reversed(edits):
        text = text[:start] + replacement + text[end:]
    _check(shipped, text, filename, {rule.name: str(wanted[rule.name]) for rule in rules})
    return text


def setting_problems(overrides: object, texts: Mapping[str, str]) -> list[str]:
    """What is wrong with the whole setting, checked against every shipped rule file
    (file name -> text): one line per problem, each naming prometheus_alert_for."""
    try:
        wanted = _overrides(overrides)
    except ValueError as error:
        return [str(error)]
    known: set[str] = set()
    for filename, text in texts.items():
        known |= alert_names(text, filename)
    problems = entry_problems(wanted)
    for name in wanted:
        if name not in known and name not in DEDICATED:
            problems.append(
                f"{VARIABLE}: {name} is no alert of gpufleet's rule files{_hint(name, known)}"
            )
    return problems


def _hint(name: object, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(name), sorted(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""
