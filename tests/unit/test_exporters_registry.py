"""The exporter registry (roles/_exporters) is the one place that says which group runs an
exporter, on which port: the prometheus role's jobs and targets, the exporter_firewall
role's rules, the alertmanager role's inhibitions and the series estimate all follow it.

What runs for real: the roles' variables and templates rendered by Ansible's own Templar
for hosts of the example inventory (tests/golden/example-inventory.json), with the
registry as the roles load it (a meta dependency) or with a fake extra entry; the
rendered Alertmanager configuration checked by amtool where it is installed.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.plugins.loader import filter_loader
from render_role import ROLES, ROOT, evaluate, example_inventory, render

from gpufleet import sizing
from gpufleet.sizing import HostShape

filter_loader.add_directory(str(ROOT / "plugins" / "filter"))

REGISTRY = yaml.safe_load((ROLES / "_exporters" / "defaults" / "main.yml").read_text())[
    "exporters_registry"
]
STANDALONE = {"name": "standalone", "mode": "standalone", "shard": None, "replica": 0}
SHARD = {"name": "shard-0", "mode": "shard", "shard": 0, "replica": 0}
GLOBAL = {"name": "global", "mode": "global", "shard": None, "replica": 0}
# An exporter that exists only here: it must reach every consumer with no other edit.
FAKE = {
    "fake": {
        "role": "fake_exporter",
        "group": "gpu_nodes",
        "port_variable": "fake_exporter_port",
        "port": 9999,
        "modes": ["standalone", "shard"],
        "sharded": True,
        "firewall": True,
        "node_down_inhibits": ["FakeExporterDown", "FakeSensor.+"],
        "down_alert": "FakeExporterDown",
        "down_inhibits": ["FakeSensorStale"],
        "series": {"host": 11, "per_gpu": 3},
    }
}
WITH_FAKE = {"exporters_registry": {**REGISTRY, **FAKE}}


def load(path: Path):
    return yaml.safe_load(path.read_text())


def group_names(groups: dict, host: str) -> list[str]:
    return sorted(g for g, hosts in groups.items() if host in hosts and g != "all")


def inventory_with(host: str | None = None, **values) -> tuple[dict, dict]:
    """The example inventory, with values set as host_vars of host."""
    groups, hostvars = example_inventory()
    hostvars = copy.deepcopy(hostvars)
    if host:
        hostvars[host].update(values)
    return groups, hostvars


def targets(instance: dict, overrides: dict | None = None, inventory=None) -> dict:
    return evaluate(
        "prometheus",
        "_prometheus_targets",
        "mon01",
        {"_instance": instance, **(overrides or {})},
        inventory,
    )


def addresses(groups: list[dict]) -> dict[str, str]:
    return {group["labels"]["node"]: group["targets"][0] for group in groups}


# --- the registry itself -----------------------------------------------------------------


# Entries gpufleet runs a role for; the others name the site's daemon that serves them.
OWN = sorted(job for job, entry in REGISTRY.items() if "role" in entry)


@pytest.mark.parametrize("job", OWN)
def test_each_port_is_the_exporter_roles_default(job: str) -> None:
    entry = REGISTRY[job]
    defaults = load(ROLES / entry["role"] / "defaults" / "main.yml")
    assert entry["port_variable"].startswith(f"{entry['role']}_")
    assert defaults[entry["port_variable"]] == entry["port"]


@pytest.mark.parametrize("job", OWN)
def test_each_group_is_where_site_yml_runs_the_role(job: str) -> None:
    entry = REGISTRY[job]
    (play,) = load(ROOT / "playbooks" / f"{entry['role']}.yml")
    assert play["hosts"] == entry["group"]
    assert [r["role"] for r in play["roles"]] == [entry["role"]]
    site = [p["ansible.builtin.import_playbook"] for p in load(ROOT / "site.yml")]
    assert f"playbooks/{entry['role']}.yml" in site


def test_entries_are_complete() -> None:
    required = {"group", "port_variable", "port", "modes", "sharded", "firewall"}
    for job, entry in REGISTRY.items():
        assert required <= set(entry), job
        assert ("role" in entry) != ("served_by" in entry), f"{job}: role or served_by"
        # gpufleet's firewall rule names the role that opens the port.
        assert "role" in entry or not entry["firewall"], job
        assert set(entry["modes"]) <= {"standalone", "shard", "global"}, job
        assert ("down_inhibits" in entry) == ("down_alert" in entry), job
        assert set(entry.get("series") or {}) <= {"host", "per_cpu", "per_gpu"}, job


def test_python_reads_the_same_file() -> None:
    assert sizing.exporters() == REGISTRY


# --- prometheus: jobs and targets ---------------------------------------------------------


def test_jobs_of_each_mode_are_the_registrys() -> None:
    jobs = evaluate("prometheus", "_prometheus_jobs", "mon01", {"_instance": SHARD})
    assert jobs == {
        "standalone": [
            "node",
            "dcgm",
            "slurm",
            "alertmanager",
            "grafana",
            "loki",
            "victoriametrics",
            "ipmi",
            "slurmctld",
        ],
        "shard": ["node", "dcgm", "slurm", "ipmi"],
        "global": ["alertmanager", "grafana", "loki", "victoriametrics", "slurmctld"],
    }


def test_targets_follow_each_entrys_group_and_port() -> None:
    groups, _ = example_inventory()
    found = targets(STANDALONE)
    for job, entry in REGISTRY.items():
        hosts = addresses(found[job])
        assert sorted(hosts) == sorted(groups.get(entry["group"], [])), job
        assert {t.rsplit(":", 1)[1] for t in hosts.values()} <= {str(entry["port"])}, job
    # A shard scrapes the sharded exporters of its own hosts, every host of the others.
    shard = targets(SHARD)
    own = set(groups["prometheus_shard_0"])
    assert set(addresses(shard["ipmi"])) == own & set(groups["ipmi_exporter"])
    assert set(addresses(shard["slurm"])) == set(groups["slurm_controller"])


def test_an_overridden_port_is_scraped_on_that_host_only() -> None:
    inventory = inventory_with("gpu001", node_exporter_port=9102, ipmi_exporter_port="9391")
    node = addresses(targets(STANDALONE, inventory=inventory)["node"])
    ipmi = addresses(targets(STANDALONE, inventory=inventory)["ipmi"])
    _, hostvars = inventory
    assert node["gpu001"] == f"{hostvars['gpu001']['ansible_host']}:9102"
    assert ipmi["gpu001"] == f"{hostvars['gpu001']['ansible_host']}:9391"
    assert node["gpu002"].endswith(":9100") and ipmi["gpu002"].endswith(":9290")


def test_an_overridden_alertmanager_port_is_where_alerts_go() -> None:
    groups, _ = example_inventory()
    (first, *_rest) = sorted(groups["alertmanager"])
    inventory = inventory_with(first, alertmanager_port=9193)
    text = render("prometheus", "prometheus.yml.j2", "mon01", {"_instance": GLOBAL}, inventory)
    config = yaml.safe_load(text)
    (alerting,) = config["alerting"]["alertmanagers"]
    ports = [t.rsplit(":", 1)[1] for t in alerting["static_configs"][0]["targets"]]
    assert ports == ["9193"] + ["9093"] * (len(groups["alertmanager"]) - 1)


def test_a_new_entry_gets_a_job_and_targets() -> None:
    groups, _ = example_inventory()
    found = targets(STANDALONE, WITH_FAKE)
    assert sorted(addresses(found["fake"])) == sorted(groups["gpu_nodes"])
    assert all(t.endswith(":9999") for t in addresses(found["fake"]).values())
    text = render("prometheus", "prometheus.yml.j2", "mon01", {"_instance": SHARD, **WITH_FAKE})
    jobs = {job["job_name"]: job for job in yaml.safe_load(text)["scrape_configs"]}
    assert jobs["fake"]["file_sd_configs"] == [
        {"files": ["/etc/gpufleet/prometheus/shard-0/targets/fake.json"]}
    ]
    # prometheus_job_settings stays the hook for scheme, basic_auth and TLS.
    settings = {"prometheus_job_settings": {"fake": {"scheme": "https"}}}
    text = render(
        "prometheus", "prometheus.yml.j2", "mon01", {"_instance": SHARD, **WITH_FAKE, **settings}
    )
    jobs = {job["job_name"]: job for job in yaml.safe_load(text)["scrape_configs"]}
    assert jobs["fake"]["scheme"] == "https"


def test_the_removed_port_setting_is_refused() -> None:
    (task,) = [
        t
        for t in load(ROLES / "prometheus" / "tasks" / "preflight.yml")
        if "removed port setting" in t["name"]
    ]
    (condition,) = [task["ansible.builtin.assert"]["that"]]
    assert evaluate("prometheus", condition, "mon01", {"_instance": SHARD}) is True
    refused = {"_instance": SHARD, "prometheus_exporter_ports": {"node": 9102}}
    assert evaluate("prometheus", condition, "mon01", refused) is False


# --- exporter_firewall ---------------------------------------------------------------------


def firewall(host: str, overrides: dict | None = None, inventory=None) -> list[dict]:
    groups, _ = inventory or example_inventory()
    variables = {
        "exporter_firewall_enabled": True,
        "group_names": group_names(groups, host),
        **(overrides or {}),
    }
    return evaluate("exporter_firewall", "_exporter_firewall_rules", host, variables, inventory)


def exporter_ports(rules: list[dict]) -> list[int]:
    (rule,) = [r for r in rules if r["name"] == "exporter"]
    return rule["tcp"]


def test_the_firewall_protects_each_registry_exporter_of_the_host() -> None:
    groups, _ = example_inventory()
    for host in ("gpu001", "l40s01", "slurmctl01", "mon01"):
        expected = sorted(
            entry["port"]
            for entry in REGISTRY.values()
            if entry["firewall"] and (entry["group"] == "all" or host in groups[entry["group"]])
        )
        assert exporter_ports(firewall(host)) == expected, host


def test_the_firewall_opens_the_overridden_port() -> None:
    inventory = inventory_with("gpu001", node_exporter_port=9102)
    assert exporter_ports(firewall("gpu001", inventory=inventory)) == [9102, 9290, 9400]


def test_a_new_entry_is_protected_where_it_runs() -> None:
    assert 9999 in exporter_ports(firewall("gpu001", WITH_FAKE))
    assert 9999 not in exporter_ports(firewall("cpu01", WITH_FAKE))


# --- alertmanager: inhibitions --------------------------------------------------------------


def inhibitions(overrides: dict | None = None) -> list[dict]:
    text = render("alertmanager", "alertmanager.yml.j2", "mon01", overrides)
    return yaml.safe_load(text)["inhibit_rules"]


def test_node_down_silences_every_registry_exporters_node_alerts() -> None:
    (rule,) = [r for r in inhibitions() if r["source_matchers"] == ['alertname="NodeDown"']]
    (matcher,) = rule["target_matchers"]
    expected = [a for entry in REGISTRY.values() for a in entry.get("node_down_inhibits", [])]
    assert matcher == 'alertname=~"' + "|".join(expected) + '"'
    for alert in ("NodeExporterDown", "DcgmExporterDown", "Gpu.+", "SlurmNodeDown"):
        assert alert in expected
    assert rule["equal"] == ["cluster", "node"]


def test_an_exporter_down_silences_what_came_through_it() -> None:
    rules = {r["source_matchers"][0]: r for r in inhibitions()}
    rule = rules['alertname="NodeExporterDown"']
    assert rule["target_matchers"] == [
        'alertname=~"' + "|".join(REGISTRY["node"]["down_inhibits"]) + '"'
    ]


def test_a_new_entry_is_inhibited(tmp_path: Path) -> None:
    rules = inhibitions(WITH_FAKE)
    (node_down,) = [r for r in rules if r["source_matchers"] == ['alertname="NodeDown"']]
    assert node_down["target_matchers"][0].endswith('|FakeExporterDown|FakeSensor.+"')
    (own,) = [r for r in rules if r["source_matchers"] == ['alertname="FakeExporterDown"']]
    assert own["target_matchers"] == ['alertname=~"FakeSensorStale"']
    if shutil.which("amtool"):
        path = tmp_path / "alertmanager.yml"
        path.write_text(render("alertmanager", "alertmanager.yml.j2", "mon01", WITH_FAKE))
        check = subprocess.run(
            ["amtool", "check-config", str(path)], capture_output=True, text=True, check=False
        )
        assert check.returncode == 0, check.stdout + check.stderr


# --- sizing --------------------------------------------------------------------------------


def test_the_estimate_counts_a_new_entry_on_its_group() -> None:
    registry = WITH_FAKE["exporters_registry"]
    gpu = sizing.estimate_series(HostShape(64, 8, "smi", "node"), registry)
    assert gpu - sizing.estimate_series(HostShape(64, 8, "smi", "node")) == 11 + 3 * 8 + 5
    cpu = sizing.estimate_series(HostShape(64, 0, "", "node"), registry)
    assert cpu == sizing.estimate_series(HostShape(64, 0, "", "node"))


def test_the_inventory_estimate_is_the_registrys() -> None:
    """gpufleet_expected_series of the example inventory's hosts, from the registry."""
    _, hostvars = example_inventory()
    gpu001 = hostvars["gpu001"]
    expected = sizing.estimate_series(
        HostShape(
            gpu001["gpufleet_cpus"],
            gpu001["gpufleet_gpu_count"],
            gpu001["gpufleet_gpu_collector"],
        )
    )
    assert gpu001["gpufleet_expected_series"] == expected


def test_slurmctlds_own_metrics_are_one_job_of_five_endpoints() -> None:
    """Slurm 25.11+'s OpenMetrics, opt-in by group: each endpoint a target of the one job,
    on the controller's own SlurmctldPort, scraped once (standalone or the global tier)."""
    groups, hostvars = example_inventory()
    (ctl,) = groups["slurm_controller"][:1]
    groups = {**groups, "slurmctld_metrics": [ctl]}
    hostvars = {**hostvars, ctl: {**hostvars[ctl], "slurmctld_port": 6820}}
    found = targets(STANDALONE, inventory=(groups, hostvars))["slurmctld"]
    address = f"{hostvars[ctl].get('ansible_host', ctl)}:6820"
    assert [g["targets"] for g in found] == [[address]] * 5
    assert [g["labels"]["__metrics_path__"] for g in found] == REGISTRY["slurmctld"][
        "metrics_paths"
    ]
    assert all(g["labels"]["node"] == ctl for g in found)
    # Each endpoint its own series (up, scrape_*): a failing one is seen, not averaged.
    assert len({tuple(sorted(g["labels"].items())) for g in found}) == 5
    assert [g["labels"]["metrics_path"] for g in found] == REGISTRY["slurmctld"]["metrics_paths"]
    jobs = {
        mode: {
            j["job_name"]: j
            for j in yaml.safe_load(
                render(
                    "prometheus",
                    "prometheus.yml.j2",
                    "mon01",
                    {"_instance": instance},
                    (groups, hostvars),
                )
            )["scrape_configs"]
        }
        for mode, instance in (("standalone", STANDALONE), ("shard", SHARD), ("global", GLOBAL))
    }
    assert "slurmctld" not in jobs["shard"]  # cluster-wide gauges: never once per shard
    for mode in ("standalone", "global"):
        job = jobs[mode]["slurmctld"]
        assert (job["scrape_interval"], job["honor_labels"]) == ("60s", True)
        # A standby backup (26.05) answers 303 to the primary: followed, the primary's
        # series would come twice.
        assert job["follow_redirects"] is False
    # Without the group nothing is scraped, and the firewall never touches Slurm's port.
    assert targets(STANDALONE)["slurmctld"] == []
    assert 6817 not in exporter_ports(firewall(ctl, inventory=(groups, hostvars)))


def test_a_metrics_path_must_be_a_plain_absolute_path() -> None:
    paths = filter_loader.get("gpufleet_metrics_paths").j2_function
    group = {"targets": ["ctl:6817"], "labels": {"node": "ctl"}}
    assert paths([group], None) == [group]
    for bad in ("metrics/jobs", "/metrics?x=1", "/a b", 7):
        with pytest.raises(ValueError, match="not an absolute URL path"):
            paths([group], [bad])
