"""Handlers under tag-limited runs: nothing restarts a unit that is not there.

`--tags <role>_install` on a fresh host installs the program and notifies the restart,
but skips the configure task that writes the unit: restarting it would fail the run.
Every role that writes its own unit restarts it through roles/_common's handler, which
looks for the unit first and restarts or reloads only when it is there. (Prometheus,
with one unit per instance, is covered in test_prometheus_handlers.py; alloy, grafana
and victoriametrics run the package's own unit, which the install step brings.)
"""

from __future__ import annotations

import re

import pytest
import yaml
from render_role import ROLES
from role_tasks import tasks
from test_unit_bounds import SCENARIOS, systemd_templates

SYSTEMD_DIR = "/etc/systemd/system/"


def install_notifies(role: str) -> bool:
    """Whether a task of the role's install step (`--tags <role>_install`) notifies; an
    include by method (install_{{ method }}.yml) counts every method's file, and an
    include of _common's zipapp (roles/_common/tasks/zipapp.yml) counts when one of the
    role's _<role>_zipapps restarts, and one of _common's upstream_release
    (roles/_common/tasks/upstream_release.yml) when the role's _<role>_release notifies."""
    internal = ROLES / role / "vars" / "main.yml"
    declared = (yaml.safe_load(internal.read_text()) or {}) if internal.is_file() else {}
    restarts = any(app.get("restart") is True for app in declared.get(f"_{role}_zipapps") or [])
    release_notifies = bool((declared.get(f"_{role}_release") or {}).get("notify"))
    for step in yaml.safe_load((ROLES / role / "tasks" / "main.yml").read_text()):
        if f"{role}_install" not in step.get("tags", []):
            continue
        imported = step.get("ansible.builtin.import_tasks") or step.get(
            "ansible.builtin.include_tasks"
        )
        name = imported["file"] if isinstance(imported, dict) else str(imported)
        for path in (ROLES / role / "tasks").glob(re.sub(r"\{\{.*?\}\}", "*", name)):
            for task in tasks(yaml.safe_load(path.read_text())):
                if task.get("notify"):
                    return True
                include = task.get("ansible.builtin.include_role") or {}
                zipapp = include.get("name") == "_common" and include.get("tasks_from") == "zipapp"
                if zipapp and restarts:
                    return True
                release = include.get("name") == "_common" and (
                    include.get("tasks_from") == "upstream_release"
                )
                if release and release_notifies:
                    return True
    return False


def own_unit_roles() -> dict[str, str]:
    """role -> a host of the example inventory, for every role that writes a unit of its
    own (not only a drop-in) and whose install step notifies: derived, so a new role is
    covered without an edit here."""
    out: dict[str, str] = {}
    for scenario in SCENARIOS.values():  # a role's first scenario gives its host
        role = scenario.role
        dests = systemd_templates().get(role, {}).values()
        if role in out or role == "prometheus" or not any(".d/" not in d for d in dests):
            continue
        if install_notifies(role):
            out[role] = scenario.host
    return out


ROLES_WITH_OWN_UNIT = own_unit_roles()


def handlers(role: str) -> list[dict]:
    return yaml.safe_load((ROLES / role / "handlers" / "main.yml").read_text())


def topics(handler: dict) -> set[str]:
    listen = handler["listen"]
    return {listen} if isinstance(listen, str) else set(listen)


@pytest.mark.parametrize("role", sorted(ROLES_WITH_OWN_UNIT))
def test_the_restart_goes_through_the_shared_handler_that_looks_for_the_unit(role):
    # roles/_common/tasks/restart.yml looks for the unit first and leaves a missing one
    # alone (test_common_service.py); a handler of the role's own would not.
    restarts = [h for h in handlers(role) if f"restart {role}" in topics(h)]
    assert restarts, f"{role}: its install step notifies, but nothing listens"
    for handler in restarts:
        included = handler.get("ansible.builtin.include_tasks")
        assert included == "{{ role_path }}/../_common/tasks/restart.yml", handler["name"]


def role_main(role: str) -> list[dict]:
    return yaml.safe_load((ROLES / role / "tasks" / "main.yml").read_text())


@pytest.mark.parametrize(
    "role",
    # _common's preflight is the shared piece the roles include, not a role's own step.
    sorted(
        p.name
        for p in ROLES.iterdir()
        if (p / "tasks" / "preflight.yml").is_file() and not p.name.startswith("_")
    ),
)
def test_a_configure_run_checks_its_settings_first(role: str) -> None:
    """`--tags <role>_configure` writes the role's configuration: the checks of the
    settings it writes run first, not only in a whole-role run."""
    steps = role_main(role)
    tags = [set(step.get("tags", [])) for step in steps]
    assert any(f"{role}_configure" in t for t in tags), f"{role}: no {role}_configure step"
    preflight = [t for step, t in zip(steps, tags, strict=True) if step.get("name") == "Preflight"]
    assert preflight and f"{role}_configure" in preflight[0], (role, preflight)
