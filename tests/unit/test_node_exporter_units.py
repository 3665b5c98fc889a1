"""node_exporter's systemd collector reports the units that matter, not every unit: the
filter reaches the unit file as one word, and the preflight refuses what systemd would
rewrite."""

from __future__ import annotations

import re

import pytest
import yaml
from render_role import ROLES, evaluate, render

INVENTORY = ({"all": ["n1"]}, {"n1": {}})
FILTER = "node_exporter_systemd_unit_include"


def unit(overrides: dict | None = None) -> str:
    return render("node_exporter", "node_exporter.service.j2", "n1", overrides, INVENTORY)


def preflight_accepts(value: str) -> bool:
    tasks = yaml.safe_load((ROLES / "node_exporter/tasks/preflight.yml").read_text())
    (task,) = [t for t in tasks if t["name"] == "Check the systemd unit filter"]
    condition = task["ansible.builtin.assert"]["that"]
    return evaluate("node_exporter", condition, "n1", {FILTER: value}, INVENTORY) is True


def default_filter() -> str:
    return evaluate("node_exporter", FILTER, "n1", inventory=INVENTORY)


def test_default_filter_is_one_execstart_word() -> None:
    (line,) = [x for x in unit().splitlines() if "--collector.systemd.unit-include=" in x]
    assert line.split() == [f"--collector.systemd.unit-include={default_filter()}", "\\"]


@pytest.mark.parametrize(
    "name",
    [
        "gpufleet-gpu-collector.service",
        "gpufleet-gpu-collector.timer",
        "slurmd.service",
        "munge.service",
        "nvidia-persistenced.service",
        "nvidia-fabricmanager.service",
        "nvidia-dcgm.service",
        "ssh.service",
        "chrony.service",
        "prometheus-node-exporter.service",
        "node_exporter.service",
        "victoria-metrics.service",
    ],
)
def test_default_filter_keeps_the_units_admins_watch(name: str) -> None:
    assert re.fullmatch(default_filter(), name)


@pytest.mark.parametrize(
    "name", ["getty@tty1.service", "user@0.service", "dev-hugepages.mount", "cron.service"]
)
def test_default_filter_drops_the_rest(name: str) -> None:
    assert not re.fullmatch(default_filter(), name)


def test_empty_filter_or_no_systemd_collector_renders_no_flag() -> None:
    assert "unit-include" not in unit({FILTER: ""})
    assert "unit-include" not in unit({"node_exporter_enabled_collectors": []})


@pytest.mark.parametrize("value", ["a\\.service", "a b", "a%i", "$HOME", 'a"b', "a'b", "a\nb"])
def test_preflight_refuses_what_systemd_would_rewrite(value: str) -> None:
    assert not preflight_accepts(value)


def test_preflight_accepts_the_default_and_empty() -> None:
    assert preflight_accepts(default_filter())
    assert preflight_accepts("")
