"""The checks every gpufleet role that runs a service makes before it writes anything.

The shared preflight (roles/_common/tasks/preflight.yml) calls these through filters:
- every role variable written into a line-based file (a systemd unit, grafana.ini, an
  environment file, an apt source) is free of control characters, since one would end its
  line and start another, adding a setting the admin never wrote;
- the role's MemoryMax= and TasksMax= are values systemd parses: systemd ignores one it
  cannot parse with a warning in the journal, and the service would run unbounded.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping

# systemd's MemoryMax=: bytes with an optional K/M/G/T suffix, a share of the host's
# memory in 1..100 %, or infinity.
SYSTEMD_SIZE = re.compile(r"[1-9][0-9]*[KMGT]?|([1-9][0-9]?|100)%|infinity")
TASKS = re.compile(r"[1-9][0-9]*")


def has_control(value: object) -> bool:
    """Whether a value, or any key or item inside it, holds a control character (Cc)."""
    if isinstance(value, Mapping):
        return any(has_control(k) or has_control(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set)):
        return any(has_control(item) for item in value)
    if isinstance(value, str):
        return any(unicodedata.category(char) == "Cc" for char in value)
    return False


def control_names(values: Mapping[str, object]) -> list[str]:
    """The names, in order, of the values that hold a control character."""
    return [name for name, value in values.items() if has_control(value)]


def bounds_problems(
    role: str, memory_max: object, tasks_max: object, keywords: Iterable[str] = ()
) -> list[str]:
    """One message per refused bound of role; keywords are words accepted for memory."""
    problems = []
    memory = str(memory_max)
    if memory not in set(keywords) and not SYSTEMD_SIZE.fullmatch(memory):
        accepted = "".join(f", {word}" for word in keywords)
        problems.append(
            f"{role}_memory_max must be a systemd size such as 512M or 2G, a share of the "
            f"host's memory such as 25%, or infinity{accepted} (got {memory!r})"
        )
    if isinstance(tasks_max, bool) or not TASKS.fullmatch(str(tasks_max)):
        problems.append(f"{role}_tasks_max must be a positive number of tasks (got {tasks_max!r})")
    return problems
