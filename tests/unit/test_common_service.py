"""roles/_common's service piece: the Run step (service.yml) and the restart and reload
handlers (restart.yml, reload.yml).

The shared files are tested once: their `when:` conditions are evaluated with what the
tasks before them register, on a fresh host, a converged one, in check mode and in a
tag-limited run that registered nothing. Then a contract per role: a role that runs a
unit starts it through the shared Run step and restarts or reloads it through the
shared handlers, on the unit its vars name (_<role>_service), with no start or restart
of its own beside them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from render_role import ROLES, evaluate, template_value
from role_tasks import includes_common
from role_tasks import tasks as walk
from test_unit_bounds import SCENARIOS

COMMON = ROLES / "_common" / "tasks"
# One role's context is enough for the shared conditions: they read only what the role
# names in _<role>_service and what the run registered.
ROLE, HOST = "node_exporter", next(s.host for s in SCENARIOS.values() if s.role == "node_exporter")
UNIT = "node_exporter.service"
HANDLER_FILE = {"restart": "restart.yml", "reload": "reload.yml"}
# Units a role starts by hand, on purpose: Prometheus runs one unit per instance (its own
# handlers, test_prometheus_handlers.py); DCGM's host engine is not dcgm_exporter's unit.
BY_HAND = {
    "prometheus/tasks/service.yml",
    "prometheus/handlers/main.yml",
    "dcgm_exporter/tasks/install_package.yml",
}


def shared(name: str) -> dict[str, dict]:
    return {t["name"]: t for t in yaml.safe_load((COMMON / name).read_text())}


def runs(task: dict, **registered: object) -> bool:
    when = task.get("when", [])
    conditions = when if isinstance(when, list) else [when]
    values = {
        "role_name": ROLE,
        "ansible_parent_role_names": [ROLE],
        "ansible_check_mode": False,
        "__common_service": UNIT,
        **registered,
    }
    return all(evaluate(ROLE, c, HOST, values) for c in conditions)


def by_verb(name: str, verb: str) -> dict:
    (task,) = [t for n, t in shared(name).items() if n.startswith(verb)]
    return task


CHANGED, OK, SKIPPED = {"changed": True}, {"changed": False}, {"changed": False, "skipped": True}
FOUND, MISSING = {"rc": 0}, {"rc": 1}


def test_the_shared_files_name_the_unit_the_role_names() -> None:
    for name in ("service.yml", "restart.yml", "reload.yml"):
        for task in shared(name).values():
            expression = task["vars"]["__common_service"]
            context = {"role_name": ROLE, "ansible_parent_role_names": [ROLE]}
            assert template_value(ROLE, expression, HOST, context) == UNIT, name


@pytest.mark.parametrize(
    ("check_mode", "lookup", "starts"),
    [
        (False, SKIPPED, True),  # a real run starts whatever is there
        (True, MISSING, False),  # check mode on a fresh host: no unit file yet
        (True, FOUND, True),  # check mode on a converged host: asks systemd
    ],
)
def test_the_run_step_starts_the_unit_unless_check_mode_has_none(check_mode, lookup, starts):
    tasks = shared("service.yml")
    look = tasks["Look for the unit in check mode"]
    assert runs(look, ansible_check_mode=check_mode) is check_mode
    start = by_verb("service.yml", "Enable and start")
    assert start["ansible.builtin.systemd_service"] == {
        "name": "{{ __common_service }}",
        "state": "started",
        "enabled": True,
        "daemon_reload": True,
    }
    assert runs(start, ansible_check_mode=check_mode, __common_unit_found=lookup) is starts


@pytest.mark.parametrize(("start", "noted"), [(CHANGED, True), (SKIPPED, True), (OK, False)])
def test_a_unit_started_in_this_run_is_noted(start, noted):
    note = shared("service.yml")["Note that this run started it"]
    assert runs(note, __common_start=start) is noted
    value = note["ansible.builtin.set_fact"]["__common_started_units"]
    assert template_value(ROLE, value, HOST, {"__common_service": UNIT}) == [UNIT]


@pytest.mark.parametrize("verb", ["restart", "reload"])
@pytest.mark.parametrize(
    ("started", "restarted", "lookup", "acts"),
    [
        (None, None, FOUND, True),  # a --tags <role>_configure run: nothing registered
        ([], [], FOUND, True),  # a converged host whose files changed
        (None, None, MISSING, False),  # --tags <role>_install on a fresh host
        ([UNIT], [], FOUND, False),  # started in this run: already current
        ([], [UNIT], FOUND, False),  # restarted in this run: a reload is not needed
        (["other.service"], [], FOUND, True),  # another role's unit
    ],
)
def test_the_handlers_act_on_a_unit_that_is_there_and_not_current(
    verb, started, restarted, lookup, acts
):
    tasks = list(shared(HANDLER_FILE[verb]).values())
    registered = {
        k: v
        for k, v in {
            "__common_started_units": started,
            "__common_restarted_units": restarted,
        }.items()
        if v is not None
    }
    look, action = tasks[0], tasks[1]
    assert "systemctl" in look["ansible.builtin.command"]["argv"]
    assert look["check_mode"] is False and look["changed_when"] is False
    current = UNIT in (started or []) + (restarted or [])
    assert runs(look, **registered) is not current
    state = action["ansible.builtin.systemd_service"]["state"]
    assert state == {"restart": "restarted", "reload": "reloaded"}[verb]
    assert runs(action, __common_unit_found=lookup, **registered) is acts


@pytest.mark.parametrize(("restart", "noted"), [(CHANGED, [UNIT]), (SKIPPED, []), (OK, [])])
def test_a_restart_is_noted_so_that_the_reload_after_it_skips(restart, noted):
    note = shared("restart.yml")["Note that this run restarted it"]
    value = note["ansible.builtin.set_fact"]["__common_restarted_units"]
    overrides = {"__common_service": UNIT, "__common_restart": restart}
    assert template_value(ROLE, value, HOST, overrides) == noted


# The contract of each role.


def role_yaml(role: str, *parts: str) -> list[dict]:
    path = ROLES.joinpath(role, *parts)
    return yaml.safe_load(path.read_text()) if path.is_file() else []


def shared_handlers(role: str) -> dict[str, dict]:
    """verb -> the role's handler that includes the shared restart or reload file."""
    found = {}
    for handler in role_yaml(role, "handlers", "main.yml"):
        included = str(handler.get("ansible.builtin.include_tasks", ""))
        for verb, name in HANDLER_FILE.items():
            if included == "{{ role_path }}/../_common/tasks/" + name:
                found[verb] = handler
    return found


PUBLIC = sorted(p.name for p in ROLES.iterdir() if p.is_dir() and not p.name.startswith("_"))


def task_files(role: str) -> list[Path]:
    files = sorted((ROLES / role / "tasks").glob("*.yml"))
    return [*files, ROLES / role / "handlers" / "main.yml"]


RUNNING = sorted(
    role
    for role in PUBLIC
    for path in task_files(role)[:-1]
    if any(includes_common(t, "service") for t in walk(role_yaml(role, "tasks", path.name)))
)


def test_every_role_that_runs_a_unit_is_covered() -> None:
    # Derived lists: a new role with a Run step is checked without an edit here.
    assert {"node_exporter", "slurm_exporter", "alertmanager", "grafana"} <= set(RUNNING)


@pytest.mark.parametrize("role", RUNNING)
def test_the_role_names_its_unit_and_uses_the_shared_handlers(role: str) -> None:
    host = next(s.host for s in SCENARIOS.values() if s.role == role)
    unit = evaluate(role, f"_{role}_service", host, {})
    assert Path(unit).suffix in (".service", ".timer"), unit
    handlers = shared_handlers(role)
    assert handlers, f"{role}: no handler includes _common's restart.yml or reload.yml"
    for verb, handler in handlers.items():
        assert handler["listen"] == f"{verb} {role}", handler["name"]
    if {"restart", "reload"} <= set(handlers):
        # Handlers run in file order: a restart in this run makes the reload skip.
        names = [h["name"] for h in role_yaml(role, "handlers", "main.yml")]
        assert names.index(handlers["restart"]["name"]) < names.index(handlers["reload"]["name"])


def started_by_hand(tasks: list[dict]) -> list[str]:
    """The tasks that start, restart or reload a unit with systemd_service directly."""
    states = {"started", "restarted", "reloaded"}
    return [
        t["name"]
        for t in walk(tasks)
        if (t.get("ansible.builtin.systemd_service") or {}).get("state") in states
    ]


@pytest.mark.parametrize("role", PUBLIC)
def test_no_role_starts_or_restarts_its_unit_by_hand(role: str) -> None:
    for path in task_files(role):
        if path.is_file() and str(path.relative_to(ROLES)) not in BY_HAND:
            assert started_by_hand(yaml.safe_load(path.read_text())) == [], path.name


def test_the_rule_finds_a_hand_made_restart() -> None:
    handlers = [
        {"name": "Restart x", "ansible.builtin.systemd_service": {"state": "restarted"}},
        {"name": "Forget x", "ansible.builtin.systemd_service": {"daemon_reload": True}},
        {
            "name": "A block",
            "block": [{"name": "Start y", "ansible.builtin.systemd_service": {"state": "started"}}],
        },
    ]
    assert started_by_hand(handlers) == ["Restart x", "Start y"]
