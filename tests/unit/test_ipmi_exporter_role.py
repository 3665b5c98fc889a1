"""The ipmi_exporter role's restart and reload contract, offline.

A changed ipmi_exporter.yml reloads the exporter (SIGHUP through the unit's ExecReload:
it rereads --config.file); a changed unit or package restarts it. When the handlers act
is roles/_common's (test_common_service.py).
"""

from __future__ import annotations

import yaml
from render_role import ROLES, render

ROLE = ROLES / "ipmi_exporter"
HANDLERS = {h["name"]: h for h in yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())}
RESTART = "Restart ipmi_exporter"
RELOAD = "Reload ipmi_exporter"


def tasks(name: str) -> dict[str, dict]:
    return {t["name"]: t for t in yaml.safe_load((ROLE / "tasks" / name).read_text())}


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
    # roles/_common's handlers (test_common_service.py): the restart first, which makes
    # the reload skip.
    assert HANDLERS[RELOAD]["ansible.builtin.include_tasks"].endswith("_common/tasks/reload.yml")
    assert list(HANDLERS) == [RESTART, RELOAD]
