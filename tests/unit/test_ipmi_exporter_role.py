"""The ipmi_exporter role's restart and reload contract, offline.

A changed ipmi_exporter.yml reloads the exporter (SIGHUP through the unit's ExecReload:
it rereads --config.file); a changed unit or package restarts it. The handlers'
conditions are evaluated with what the tasks leave behind, including nothing at all (a
--tags run that skipped the service tasks).
"""

from __future__ import annotations

import pytest
import yaml
from render_role import ROLES, evaluate, render

ROLE = ROLES / "ipmi_exporter"
HANDLERS = {h["name"]: h for h in yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())}
RESTART = "Restart ipmi_exporter"
RELOAD = "Reload ipmi_exporter"
LOOKUP = "Look for the ipmi_exporter unit"
# What the lookup handler registers when the unit is there.
PRESENT = {"__ipmi_exporter_unit_present": {"stat": {"exists": True}}}


def tasks(name: str) -> dict[str, dict]:
    return {t["name"]: t for t in yaml.safe_load((ROLE / "tasks" / name).read_text())}


def runs(handler: str, **registered) -> bool:
    """Whether the handler's when: conditions all hold, given the registered results."""
    when = HANDLERS[handler]["when"]
    conditions = when if isinstance(when, list) else [when]
    values = {**PRESENT, **registered}
    return all(evaluate("ipmi_exporter", c, "gpu001", values) for c in conditions)


def test_the_unit_reloads_with_sighup():
    text = render("ipmi_exporter", "ipmi_exporter.service.j2", "gpu001")
    assert "\nExecReload=/bin/kill -HUP $MAINPID\n" in text


def test_the_configuration_reloads_and_the_unit_and_package_restart():
    configure = tasks("configure.yml")
    config = configure["Write the exporter configuration (the local BMC's collectors)"]
    assert config["notify"] == "reload ipmi_exporter"
    assert configure["Write the systemd unit"]["notify"] == "restart ipmi_exporter"
    install = tasks("install.yml")["Install the ipmi_exporter package (with FreeIPMI)"]
    assert install["notify"] == "restart ipmi_exporter"
    assert HANDLERS[RESTART]["listen"] == "restart ipmi_exporter"
    assert HANDLERS[RELOAD]["listen"] == "reload ipmi_exporter"
    assert HANDLERS[RELOAD]["ansible.builtin.systemd_service"]["state"] == "reloaded"
    # Handlers run in file order: the unit is looked for first (it is missing after a
    # --tags ipmi_exporter_install run on a fresh host), and the restart decides
    # whether a reload is needed.
    assert list(HANDLERS) == [LOOKUP, RESTART, RELOAD]


@pytest.mark.parametrize(
    ("registered", "restart", "reload"),
    [
        # --tags ipmi_exporter_configure: the service tasks were skipped, nothing registered.
        ({}, True, True),
        # Running before: a config change reloads.
        ({"__ipmi_exporter_started": {"changed": False}}, True, True),
        # First start in this run: it already read the new files.
        ({"__ipmi_exporter_started": {"changed": True}}, False, False),
        # Check mode on a fresh host: the start was skipped.
        ({"__ipmi_exporter_started": {"changed": False, "skipped": True}}, False, False),
    ],
)
def test_handlers_act_on_a_running_service_only(registered, restart, reload):
    assert runs(RESTART, **registered) is restart
    assert runs(RELOAD, **registered) is reload


def test_a_restart_in_this_run_makes_the_reload_redundant():
    started = {"changed": False}
    restarted = {"changed": True}
    assert not runs(RELOAD, __ipmi_exporter_started=started, __ipmi_exporter_restarted=restarted)
    skipped = {"changed": False, "skipped": True}
    assert runs(RELOAD, __ipmi_exporter_started=started, __ipmi_exporter_restarted=skipped)
