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


def names(handler: str, **facts) -> list[str]:
    values = {"prometheus_instances": INSTANCES, "__prometheus_started": {"results": []}, **facts}
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
