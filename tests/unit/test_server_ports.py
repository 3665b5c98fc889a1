"""The servers' ports are declared once (servers_registry, roles/_exporters) and every
client reads them from the server host's own port variable, as Prometheus reads an
exporter's: Grafana's datasources, Alloy's push URLs, the exporter firewall, the global
tier's shard targets and the job summary's Prometheus URLs.

What runs for real: gpufleet.server_ports on hand-made host variables; the grafana,
alloy and exporter_firewall roles' templates and variables rendered by Ansible's own
Templar (render_role) for one hand-made inventory whose Loki host sets loki_http_port
3200 and whose Prometheus host sets prometheus_port_base 9190; the roles' preflight
conditions on the removed settings.
"""

from __future__ import annotations

import copy
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.plugins.loader import filter_loader
from render_role import ROLES, ROOT, evaluate, example_inventory, render, template_value
from test_exporter_firewall_role import rule_list, server_inventory
from test_grafana_role import MAIN_ORG, SECRETS, by_uid
from test_loki_alloy_roles import river_strings

from gpufleet import inventory, scrape_targets, server_ports
from gpufleet.server_ports import (
    checked_servers,
    server_address,
    server_port,
    server_urls,
    servers,
)
from gpufleet.sizing import RegistryError

filter_loader.add_directory(str(ROOT / "plugins" / "filter"))

REGISTRY_FILE = ROLES / "_exporters" / "defaults" / "main.yml"
LOADED = yaml.safe_load(REGISTRY_FILE.read_text())
SERVERS = LOADED["servers_registry"]
LOKI = SERVERS["loki"]
PROMETHEUS = SERVERS["prometheus"]
SHARD_1 = {"name": "shard-1", "mode": "shard", "shard": 1, "replica": 0}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


# --- declared once ---------------------------------------------------------------------


def test_every_server_port_is_declared_once() -> None:
    assert set(SERVERS) == {
        "prometheus",
        "alertmanager",
        "alertmanager_gossip",
        "loki",
        "loki_grpc",
        "victoriametrics",
    }
    # The strict loader (gpufleet's Python) reads what Ansible reads.
    assert servers() == SERVERS
    variables = [entry["port_variable"] for entry in SERVERS.values()]
    assert len(variables) == len(set(variables)), "two entries name one port variable"


@pytest.mark.parametrize("name", sorted(SERVERS))
def test_each_role_default_and_playbook_equals_the_registry(name: str) -> None:
    """A role's default cannot read another host, so it keeps its literal: this makes a
    second spelling that differs fail."""
    entry = SERVERS[name]
    role = entry["role"]
    assert load(ROLES / role / "defaults" / "main.yml")[entry["port_variable"]] == entry["port"]
    spec = load(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]["main"]
    assert spec["options"][entry["port_variable"]]["default"] == entry["port"]
    play = load(ROOT / "playbooks" / f"{role}.yml")[0]
    assert play["hosts"] == entry["group"], f"{name}: the playbook runs on {play['hosts']}"


def test_alertmanagers_port_is_the_exporter_registrys_own() -> None:
    scraped = LOADED["exporters_registry"]["alertmanager"]
    for key in ("role", "group", "port_variable", "port"):
        assert SERVERS["alertmanager"][key] == scraped[key], key
    # One spelling in the file: the servers' entry aliases the exporter's values.
    text = REGISTRY_FILE.read_text()
    assert len(re.findall(r"^\s+port: (?:&\w+ )?9093$", text, re.M)) == 1


def test_pythons_prometheus_default_is_the_registrys() -> None:
    assert PROMETHEUS["port"] == inventory.PROMETHEUS_PORT_BASE


# The clients' files: no server port spelled out there any more.
CLIENT_FILES = [
    ROLES / "grafana" / "templates" / "datasources.yml.j2",
    ROLES / "grafana" / "defaults" / "main.yml",
    ROLES / "alloy" / "defaults" / "main.yml",
    ROLES / "alloy" / "vars" / "main.yml",
    ROLES / "exporter_firewall" / "vars" / "main.yml",
    ROOT / "src" / "gpufleet" / "scrape_targets.py",
]


@pytest.mark.parametrize("path", CLIENT_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_client_spells_a_servers_port(path: Path) -> None:
    ports = {entry["port"] for entry in SERVERS.values()}
    ports |= {PROMETHEUS["port"] + 1}  # shard 0
    found = {int(n) for n in re.findall(r"(?<![\w.])(\d{4,5})(?![\w.])", path.read_text())}
    assert not found & ports, f"{path.name} spells {sorted(found & ports)}"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("servers_registry: [loki]\n", "servers_registry: must be a mapping"),
        ("servers_registry:\n  loki: 3100\n", "servers_registry.loki: must be a mapping"),
        (
            "servers_registry:\n  loki: {role: loki, group: loki, port: 3100}\n",
            "servers_registry.loki.port_variable: is missing",
        ),
        (
            "servers_registry:\n  loki: {role: loki, group: loki, port_variable: '', port: 3100}\n",
            "servers_registry.loki.port_variable: must be a name",
        ),
        (
            "servers_registry:\n  loki: {role: loki, group: loki, port_variable: p, port: 70000}\n",
            "servers_registry.loki.port: 70000 is not a TCP port",
        ),
    ],
)
def test_a_bad_registry_entry_is_named(text: str, problem: str) -> None:
    with pytest.raises(RegistryError, match=re.escape(f"main.yml: {problem}")):
        checked_servers(yaml.safe_load(text), "main.yml")


# --- the helper -------------------------------------------------------------------------


def test_the_hosts_own_variable_wins_else_the_registrys_default() -> None:
    hostvars = {"a": {"loki_http_port": 3200}, "b": {"loki_http_port": " 3300 "}, "c": {}}
    assert [server_port(h, hostvars, LOKI) for h in "abc"] == [3200, 3300, 3100]


@pytest.mark.parametrize("bad", [0, 65536, -1, True, None, "", "http", "31a", 3100.5, [3100]])
def test_a_bad_port_is_refused_naming_host_and_variable(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^host mon03: loki_http_port .* is not a TCP port"):
        server_port("mon03", {"mon03": {"loki_http_port": bad}}, LOKI)


def test_a_prometheus_instance_listens_on_its_hosts_base() -> None:
    hostvars = {"mon01": {"prometheus_port_base": "9190"}, "mon02": {}}
    standalone = {"name": "standalone", "mode": "standalone", "shard": None}
    assert server_port("mon01", hostvars, PROMETHEUS, standalone) == 9190
    assert server_port("mon01", hostvars, PROMETHEUS, SHARD_1) == 9192
    assert server_port("mon02", hostvars, PROMETHEUS, SHARD_1) == 9092
    with pytest.raises(ValueError, match=r"prometheus_port_base 65535 .* shard-1 on port 65537"):
        server_port("mon01", {"mon01": {"prometheus_port_base": 65535}}, PROMETHEUS, SHARD_1)


def test_addresses_and_urls() -> None:
    hostvars = {
        "mon01": {"ansible_host": "10.0.0.1", "loki_http_port": 3200},
        "mon02": {"ansible_host": "fd00::2"},
        "mon03": {},
    }
    assert server_address("mon02", hostvars, LOKI) == "[fd00::2]:3100"
    assert server_address("mon03", hostvars, LOKI) == "mon03:3100"
    assert server_urls(["mon02", "mon01", "mon02"], hostvars, LOKI, path="/loki/api/v1/push") == [
        "http://[fd00::2]:3100/loki/api/v1/push",
        "http://10.0.0.1:3200/loki/api/v1/push",
    ]
    assert server_urls(["mon01"], hostvars, LOKI, "https") == ["https://10.0.0.1:3200"]
    with pytest.raises(ValueError, match="not an absolute URL path"):
        server_urls(["mon01"], hostvars, LOKI, path="loki")


def test_the_filters_are_the_helpers() -> None:
    path = ROOT / "plugins" / "filter" / "gpufleet_filters.py"
    spec = importlib.util.spec_from_file_location("gpufleet_filters_under_test", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    filters = module.FilterModule().filters()
    assert filters["gpufleet_server_port"] is server_ports.server_port
    assert filters["gpufleet_server_address"] is server_ports.server_address
    assert filters["gpufleet_server_urls"] is server_ports.server_urls


# --- federation and the job summary: each shard on its own host's base -------------------


def test_the_global_tier_reaches_each_shard_on_its_own_hosts_base() -> None:
    hostvars = {
        "mon01": {
            "ansible_host": "10.0.0.1",
            "prometheus_port_base": 9190,
            "gpufleet_prometheus_instances": [SHARD_1],
        },
        "mon02": {"ansible_host": "10.0.0.2", "gpufleet_prometheus_instances": [SHARD_1]},
    }
    # The caller's own base (the global host's) no longer stands in for the shard host's.
    for base in (None, 9090, 9190, 9500):
        found = scrape_targets.shard_targets(["mon02", "mon01"], hostvars, base)
        assert [group["targets"] for group in found] == [["10.0.0.1:9192"], ["10.0.0.2:9092"]]
    urls = scrape_targets.prometheus_urls(["mon01", "mon02"], hostvars)
    assert urls == [{"name": "shard-1", "urls": ["http://10.0.0.1:9192", "http://10.0.0.2:9092"]}]


# --- the clients, on one inventory whose servers moved -----------------------------------


def moved_inventory(
    loki: dict | None = None, prometheus: dict | None = None
) -> tuple[dict[str, list[str]], dict[str, dict]]:
    """The firewall tests' inventory (mon01: shards 0 and 1, the global tier, Loki,
    VictoriaMetrics and an Alertmanager; graf01: Grafana), Loki and Prometheus moved on
    mon01 by its own (host or group) variables."""
    groups, hostvars = copy.deepcopy(server_inventory())
    hostvars["mon01"].update({"loki_http_port": 3200, **(loki or {})})
    hostvars["mon01"].update({"prometheus_port_base": 9190, **(prometheus or {})})
    return groups, hostvars


def grafana_datasources(inventory: tuple[dict, dict], **overrides: Any) -> dict:
    values = {**SECRETS, "__grafana_target": MAIN_ORG, **overrides}
    return by_uid(
        yaml.safe_load(render("grafana", "datasources.yml.j2", "graf01", values, inventory))
    )


def test_grafana_reads_the_servers_own_ports() -> None:
    ds = grafana_datasources(moved_inventory())
    assert ds["gpufleet-prometheus"]["url"] == "http://10.0.0.1:9190"
    assert ds["gpufleet-prometheus-shard-0"]["url"] == "http://10.0.0.1:9191"
    assert ds["gpufleet-prometheus-shard-1"]["url"] == "http://10.0.0.1:9192"
    assert ds["gpufleet-loki"]["url"] == "http://10.0.0.1:3200"
    # Without the servers' variables: the registry's defaults.
    ds = grafana_datasources(server_inventory())
    assert ds["gpufleet-prometheus"]["url"] == "http://10.0.0.1:9090"
    assert ds["gpufleet-prometheus-shard-1"]["url"] == "http://10.0.0.1:9092"
    assert ds["gpufleet-loki"]["url"] == "http://10.0.0.1:3100"


def test_grafana_refuses_a_bad_server_port_naming_it() -> None:
    with pytest.raises(Exception, match=r"host mon01: loki_http_port 'x' is not a TCP port"):
        grafana_datasources(moved_inventory(loki={"loki_http_port": "x"}))


def test_alloy_pushes_to_each_lokis_own_port() -> None:
    groups, hostvars = moved_inventory()
    groups["loki"] = ["mon01", "mon02"]
    text = render("alloy", "config.alloy.j2", "gpu01", None, (groups, hostvars))
    assert river_strings(text, "url") == [
        "http://10.0.0.1:3200/loki/api/v1/push",
        "http://[fd00::2]:3100/loki/api/v1/push",
    ]
    # The site's own endpoints still win.
    site = {"alloy_loki_urls": ["https://loki.example/loki/api/v1/push"]}
    assert evaluate("alloy", "_alloy_loki_urls", "gpu01", site, (groups, hostvars)) == [
        "https://loki.example/loki/api/v1/push"
    ]


def test_the_firewall_opens_the_ports_the_clients_use() -> None:
    inventory = moved_inventory()
    found = rule_list("mon01", None, inventory)
    assert found["loki"]["tcp"] == [3200]
    assert found["prometheus"]["tcp"] == [9190, 9191, 9192]
    # Every port a client was given is one the Loki and Prometheus host lets in.
    ds = grafana_datasources(inventory)
    used = {
        int(url.rsplit(":", 1)[1])
        for uid, url in ((uid, d["url"]) for uid, d in ds.items())
        if uid.startswith(("gpufleet-prometheus", "gpufleet-loki"))
    }
    assert used <= set(found["loki"]["tcp"]) | set(found["prometheus"]["tcp"])


@pytest.mark.parametrize("name", sorted(SERVERS))
def test_the_firewalls_defaults_are_the_registrys(name: str) -> None:
    entry = SERVERS[name]
    table = load(ROLES / "exporter_firewall" / "vars" / "main.yml")["_exporter_firewall_servers"]
    # The firewall's services bear the registry's names.
    spec = table[name]
    assert spec["group"] == entry["group"]
    value = spec["tcp"][entry["port_variable"]]
    assert f"{entry['port_variable']} | default(servers_registry.{name}.port)" in value


# --- the removed client settings ----------------------------------------------------------


def preflight_task(role: str, name: str) -> dict:
    tasks = load(ROLES / role / "tasks" / "preflight.yml")
    (task,) = [t for t in tasks if t["name"] == name]
    return task


@pytest.mark.parametrize(
    ("variable", "instead"),
    [
        ("grafana_prometheus_port", "prometheus_port_base on the Prometheus hosts"),
        ("grafana_prometheus_shard_port_base", "prometheus_port_base on the Prometheus hosts"),
        ("grafana_loki_port", "loki_http_port on the Loki hosts"),
    ],
)
def test_grafana_refuses_a_removed_port_setting(variable: str, instead: str) -> None:
    task = preflight_task("grafana", "Check that no removed server port is left in the inventory")
    check = task["ansible.builtin.assert"]

    def outcome(values: dict) -> tuple[bool, str]:
        given = {**SECRETS, **values}
        removed = template_value("grafana", task["vars"]["__grafana_removed"], "mon03", given)
        given["__grafana_removed"] = removed
        return (
            evaluate("grafana", check["that"], "mon03", given),
            template_value("grafana", check["fail_msg"], "mon03", given),
        )

    assert outcome({}) == (True, "")
    # Other grafana_prometheus_ settings are not taken for removed ones.
    assert outcome({"grafana_prometheus_url": "http://p:1", "grafana_loki_url": "http://l:2"})[0]
    passed, message = outcome({variable: 9999})
    assert passed is False
    assert message.startswith(f"{variable} is no longer read: set {instead} instead")
    assert "\n" not in message


def test_alloy_refuses_the_removed_port_setting() -> None:
    task = preflight_task("alloy", "Check that no removed port setting is left in the inventory")
    check = task["ansible.builtin.assert"]
    assert evaluate("alloy", check["that"], "gpu001") is True
    assert evaluate("alloy", check["that"], "gpu001", {"alloy_loki_port": 3200}) is False
    message = " ".join(check["fail_msg"].split())
    assert message.startswith(
        "alloy_loki_port is no longer read: set loki_http_port on the Loki hosts instead"
    )


@pytest.mark.parametrize(
    ("role", "variables"),
    [
        (
            "grafana",
            ["grafana_prometheus_port", "grafana_prometheus_shard_port_base", "grafana_loki_port"],
        ),
        ("alloy", ["alloy_loki_port"]),
    ],
)
def test_the_removed_settings_are_gone_from_the_interface(role: str, variables: list[str]) -> None:
    defaults = load(ROLES / role / "defaults" / "main.yml")
    options = load(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]["main"][
        "options"
    ]
    for variable in variables:
        assert variable not in defaults and variable not in options, variable


def test_alertmanager_gossips_to_each_peer_on_its_own_port() -> None:
    """A peer that moved its gossip port (its own alertmanager_cluster_port) is reached
    there; the others on the registry's 9094."""
    groups, hostvars = copy.deepcopy(example_inventory())
    hostvars["mon02"]["alertmanager_cluster_port"] = 9194
    unit = render("alertmanager", "alertmanager.service.j2", "mon01", {}, (groups, hostvars))
    peers = sorted(re.findall(r"--cluster\.peer=(\S+)", unit))
    mon02, mon03 = (hostvars[h].get("ansible_host", h) for h in ("mon02", "mon03"))
    assert peers == sorted([f"{mon02}:9194", f"{mon03}:9094"]), unit
