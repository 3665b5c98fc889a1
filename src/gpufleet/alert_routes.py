"""Alertmanager's routes by severity: each severity at its own pace, team routes inside.

A critical GPU fault should be repeated every 10 minutes, an info digest once a day: one
root repeat_interval cannot do both. :func:`severity_routes` builds one route per severity
(``severity="critical"``, ...) that carries the severity's receiver and timing; the site's
own routes (``alertmanager_routes``: a team per site, rack or account) are nested under
every severity route, so a route on ``site="berlin"`` pages that team at the severity's
pace, and repeated once more after them for alerts without a known severity.

The role's template renders the result (filter ``gpufleet_alertmanager_severity_routes`` of
plugins/filter/gpufleet_filters.py); :func:`timing_problems` is the preflight's check.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

TIMING_KEYS = ("group_wait", "group_interval", "repeat_interval")
# Alertmanager's duration grammar (prometheus/common model.ParseDuration), whole string.
_DURATION = re.compile(
    r"(?:[0-9]+y)?(?:[0-9]+w)?(?:[0-9]+d)?(?:[0-9]+h)?(?:[0-9]+m)?(?:[0-9]+s)?(?:[0-9]+ms)?"
)
# A severity becomes a matcher value: plain words only, nothing to escape.
_SEVERITY = re.compile(r"[a-z][a-z0-9_-]{0,31}")
# Most urgent first; other severities follow in name order.
_ORDER = ("critical", "warning", "info")


def _ordered(severities: Sequence[str]) -> list[str]:
    known = [name for name in _ORDER if name in severities]
    return known + sorted(name for name in severities if name not in _ORDER)


def timing_problems(timing: object, receivers: object) -> list[str]:
    """What is wrong with alertmanager_severity_timing and _severity_receivers (empty: fine)."""
    problems: list[str] = []
    if not isinstance(timing, Mapping):
        return ["alertmanager_severity_timing must be a map of severity to timing settings"]
    if not isinstance(receivers, Mapping):
        return ["alertmanager_severity_receivers must be a map of severity to receiver name"]
    for severity in sorted({*map(str, timing), *map(str, receivers)}):
        if not _SEVERITY.fullmatch(severity):
            problems.append(f"severity {severity!r} is not a plain lower-case word")
    for severity, settings in sorted(timing.items(), key=lambda item: str(item[0])):
        where = f"alertmanager_severity_timing.{severity}"
        if not isinstance(settings, Mapping):
            problems.append(f"{where} must be a map of {', '.join(TIMING_KEYS)}")
            continue
        for key, value in sorted(settings.items(), key=lambda item: str(item[0])):
            if key not in TIMING_KEYS:
                problems.append(f"{where}.{key} is not one of {', '.join(TIMING_KEYS)}")
            elif not isinstance(value, str) or value in ("", "0") or not _DURATION.fullmatch(value):
                problems.append(
                    f"{where}.{key} must be a duration such as 30s, 5m or 4h (got {value!r})"
                )
    return problems


def severity_routes(
    timing: Mapping[str, Mapping[str, str]],
    receivers: Mapping[str, str],
    default_receiver: str,
    team_routes: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The routes after the idle-GPU route: one per severity, then the team routes alone.

    A severity route names its receiver (the severity's, else the default) so a team route
    that does not match falls back to it; a timing key it leaves out is inherited from the
    root route. Team routes keep their own settings, which win over the severity's.
    """
    routes: list[dict[str, Any]] = []
    for severity in _ordered([*{*timing, *receivers}]):
        route: dict[str, Any] = {
            "matchers": [f'severity="{severity}"'],
            "receiver": receivers.get(severity, default_receiver),
        }
        own = timing.get(severity, {})
        route.update({key: own[key] for key in TIMING_KEYS if key in own})
        if team_routes:
            route["routes"] = [copy.deepcopy(dict(team)) for team in team_routes]
        routes.append(route)
    # Copies, not shared objects: YAML output would turn those into anchors and aliases.
    return routes + [copy.deepcopy(dict(team)) for team in team_routes]
