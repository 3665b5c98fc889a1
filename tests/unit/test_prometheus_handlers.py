"""Which Prometheus instances the handlers restart or reload.

A shard and the global tier often share a host: a change to one must not interrupt
the other. These evaluate the handlers' own loop expressions with the facts the
tasks leave behind.
"""

from __future__ import annotations

import yaml
from render_role import ROLES, template_value

HANDLERS = {
    h["name"]: h for h in yaml.safe_load((ROLES / "prometheus/handlers/main.yml").read_text())
}
INSTANCES = [
    {"name": "shard-0", "mode": "shard", "shard": 0},
    {"name": "shard-1", "mode": "shard", "shard": 1},
    {"name": "global", "mode": "global", "shard": None},
]


def units(*absent: str) -> dict:
    """What the handlers' unit lookup registers: every unit there but the absent ones."""
    results = [{"item": i, "stat": {"exists": i["name"] not in absent}} for i in INSTANCES]
    return {"results": results}


def names(handler: str, **facts) -> list[str]:
    values = {
        "prometheus_instances": INSTANCES,
        "__prometheus_started": {"results": []},
        "__prometheus_unit_files": units(),
        **facts,
    }
    loop = template_value("prometheus", HANDLERS[handler]["loop"], "mon03", values)
    return [instance["name"] for instance in loop]


def started(*fresh: str) -> dict:
    return {"results": [{"item": i, "changed": i["name"] in fresh} for i in INSTANCES]}


def test_a_changed_unit_restarts_only_its_instance():
    assert names(
        "Restart the Prometheus instances whose unit changed",
        __prometheus_restart_names=["shard-1"],
    ) == ["shard-1"]


def test_changed_configuration_reloads_only_its_instances():
    reload = "Reload the Prometheus instances whose configuration or rules changed"
    assert names(reload, __prometheus_reload_names=["global"]) == ["global"]
    assert names(reload, __prometheus_reload_names=[]) == []


def test_an_instance_restarted_in_this_run_is_not_reloaded_too():
    reload = "Reload the Prometheus instances whose configuration or rules changed"
    facts = {
        "__prometheus_reload_names": ["shard-0", "global"],
        "__prometheus_restart_names": ["shard-0"],
        "__prometheus_restarted_some": {"changed": True},
    }
    assert names(reload, **facts) == ["global"]


def test_instances_started_in_this_run_are_left_alone():
    facts = {
        "__prometheus_started": started("shard-1"),
        "__prometheus_restart_names": ["shard-1", "global"],
    }
    assert names("Restart the Prometheus instances whose unit changed", **facts) == ["global"]
    assert names("Restart every Prometheus instance", **facts) == ["shard-0", "global"]


def test_a_new_binary_restarts_every_running_instance_and_nothing_else_runs():
    assert names("Restart every Prometheus instance") == ["shard-0", "shard-1", "global"]
    for name in (
        "Restart the Prometheus instances whose unit changed",
        "Reload the Prometheus instances whose configuration or rules changed",
    ):
        assert "__prometheus_restarted_all is not defined" in HANDLERS[name]["when"]


def test_instances_without_a_unit_are_neither_restarted_nor_reloaded():
    # --tags prometheus_install on a fresh host: the new binary notifies the restart,
    # but the configure tasks that write the units were skipped.
    facts = {
        "__prometheus_unit_files": units("shard-0", "shard-1", "global"),
        "__prometheus_restart_names": ["global"],
        "__prometheus_reload_names": ["global"],
    }
    for handler in HANDLERS:
        if "loop" in HANDLERS[handler] and "systemd_service" in str(HANDLERS[handler]):
            assert names(handler, **facts) == [], handler
    assert names("Restart every Prometheus instance", __prometheus_unit_files=units("shard-1")) == [
        "shard-0",
        "global",
    ]
    lookup = HANDLERS["Look for the Prometheus instances' units"]
    assert list(HANDLERS).index("Look for the Prometheus instances' units") < list(HANDLERS).index(
        "Restart every Prometheus instance"
    )
    restarts = {"restart prometheus", "restart prometheus instances", "reload prometheus"}
    assert set(lookup["listen"]) == restarts
