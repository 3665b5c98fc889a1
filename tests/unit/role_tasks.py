"""Reading the roles' task files as data: the walkers the house-rule tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import yaml
from render_role import ROLES


def load(path: Path) -> object:
    """A YAML file's data, None where there is no such file."""
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def tasks(items: list | None) -> Iterator[dict]:
    """Tasks, the ones in blocks included."""
    for item in items or []:
        yield item
        for key in ("block", "rescue", "always"):
            yield from tasks(item.get(key))


def includes_common(task: dict, piece: str) -> bool:
    """Whether task includes roles/_common's tasks/<piece>.yml."""
    include = task.get("ansible.builtin.include_role") or {}
    return include.get("name") == "_common" and include.get("tasks_from") == piece


def common_includes(role: str, piece: str) -> list[tuple[str, dict]]:
    """(task file, task) for every include of _common's piece in the role's tasks."""
    return [
        (path.name, task)
        for path in sorted((ROLES / role / "tasks").glob("*.yml"))
        for task in tasks(load(path))  # type: ignore[arg-type]
        if includes_common(task, piece)
    ]


def declared(setting: str) -> dict[str, object]:
    """role -> its _<role>_<setting> (vars/main.yml), for every public role that has one."""
    out: dict[str, object] = {}
    for role in sorted(p.name for p in ROLES.iterdir() if not p.name.startswith("_")):
        internal = load(ROLES / role / "vars" / "main.yml") or {}
        if isinstance(internal, dict) and f"_{role}_{setting}" in internal:
            out[role] = internal[f"_{role}_{setting}"]
    return out
