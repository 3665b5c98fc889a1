"""The multi-host cluster: shards, federation, long-term storage, alert delivery.

Runs on the controller (the Prometheus side of the network) and talks to the test
hosts over HTTP; hosts are reached with testinfra where a service must change.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from functools import cache
from pathlib import Path

import pytest
import testinfra
import yaml
from testbed_helpers import eventually

from gpufleet.inventory_json import plain

SCENARIO = Path(os.environ["MOLECULE_SCENARIO_DIRECTORY"])
REPO = SCENARIO.parents[1]
INVENTORY = SCENARIO / "inventory"
MOLECULE_INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
WEBHOOK_LOG = "/var/log/gpufleet-test-webhook.jsonl"
SSH_ARGS = "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no"


EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])


@cache
def web_access() -> dict:
    """The TLS and basic auth settings prepare.yml gave Prometheus and Alertmanager."""
    return yaml.safe_load((EPHEMERAL / "web-access.yml").read_text())


def tls_context() -> ssl.SSLContext:
    return ssl.create_default_context(cadata=web_access()["prometheus_tls_ca"])


def login(service: str = "prometheus") -> str:
    password = web_access()[f"{service}_basic_auth_users"]["gpufleet"]
    return "Basic " + base64.b64encode(f"gpufleet:{password}".encode()).decode()


def http_json(url: str, timeout: float = 10) -> dict:
    """GET a Prometheus or Alertmanager API over TLS, verified, with gpufleet's login."""
    service = "alertmanager" if ":9093/" in url else "prometheus"
    request = urllib.request.Request(url, headers={"Authorization": login(service)})
    with urllib.request.urlopen(request, timeout=timeout, context=tls_context()) as response:
        return json.load(response)


@cache
def inventory() -> dict:
    result = subprocess.run(
        ["ansible-inventory", "-i", str(INVENTORY), "--list"],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg")),
    )
    return json.loads(result.stdout)


def hostvar(host: str, name: str):
    return plain(inventory()["_meta"]["hostvars"][host][name])


def group(name: str) -> set[str]:
    return set(inventory().get(name, {}).get("hosts", []))


def instance_base(host: str, instance: dict) -> str:
    port = 9090 if instance["mode"] != "shard" else 9091 + instance["shard"]
    return f"https://{hostvar(host, 'ansible_host')}:{port}"


def instance_url(mode: str, shard: int | None = None) -> str:
    """Base URL of the first instance of mode (and shard) the inventory placed."""
    for host in sorted(group("prometheus")):
        for instance in hostvar(host, "gpufleet_prometheus_instances"):
            if instance["mode"] == mode and (shard is None or instance["shard"] == shard):
                return instance_base(host, instance)
    raise AssertionError(f"no {mode} instance {shard} in the inventory")


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?query={urllib.parse.quote(promql)}"
    return http_json(url)["data"]["result"]


def scraped_nodes(base: str, job: str = "node") -> dict[str, dict]:
    targets = http_json(f"{base}/api/v1/targets?state=active")["data"]["activeTargets"]
    return {t["labels"]["node"]: t for t in targets if t["labels"].get("job") == job}


def host(name: str):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={MOLECULE_INVENTORY}")


def major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def binary_install(host: str, component: str) -> bool:
    """True where the role's default upstream binary path ran (host_vars say package)."""
    method = inventory()["_meta"]["hostvars"][host].get(f"{component}_install_method")
    return plain(method or "binary") == "binary"


def test_both_prometheus_majors_and_both_install_paths_run():
    """cl-mon01 runs sid's releases through the roles' binary path (Prometheus 3,
    Alertmanager 0.33+, node_exporter 1.11+; sid floats, so majors and floors are
    checked, not exact versions); cl-mon02 runs Debian 13's packages (Prometheus 2)."""
    majors = set()
    for name in sorted(group("prometheus")):
        for instance in hostvar(name, "gpufleet_prometheus_instances"):
            base = instance_base(name, instance)
            version = http_json(f"{base}/api/v1/status/buildinfo")["data"]["version"]
            want = 3 if binary_install(name, "prometheus") else 2
            assert major_minor(version)[0] == want, (name, instance, version)
            majors.add(want)
    assert majors == {2, 3}
    for name in sorted(group("alertmanager")):
        status = http_json(f"https://{hostvar(name, 'ansible_host')}:9093/api/v2/status")
        floor = (0, 33) if binary_install(name, "alertmanager") else (0, 25)
        assert major_minor(status["versionInfo"]["version"]) >= floor, (name, status)
    for shard in (0, 1):
        for sample in query(instance_url("shard", shard), "node_exporter_build_info"):
            name = sample["metric"]["node"]
            floor = (1, 11) if binary_install(name, "node_exporter") else (1, 5)
            assert major_minor(sample["metric"]["version"]) >= floor, sample["metric"]


@pytest.mark.parametrize("shard", [0, 1])
def test_each_shard_scrapes_exactly_its_assigned_hosts(shard):
    base = instance_url("shard", shard)
    expected = group(f"prometheus_shard_{shard}")
    assert expected, "the plugin assigned no host to this shard"

    def all_assigned_and_up():
        nodes = scraped_nodes(base)
        healthy = all(target["health"] == "up" for target in nodes.values())
        return nodes if set(nodes) == expected and healthy else None

    nodes = eventually(all_assigned_and_up, timeout=60)
    assert nodes, (
        f"shard {shard} scrapes {sorted(scraped_nodes(base))}, expected {sorted(expected)}"
    )
    for name, target in nodes.items():
        labels = target["labels"]
        for key, value in hostvar(name, "gpufleet_target_labels").items():
            assert labels[key] == value, (name, key)
        assert labels["cluster"] == "testbed"


def test_global_holds_both_shards_aggregates_and_no_raw_series():
    base = instance_url("global")
    shards = eventually(
        lambda: (
            {
                r["metric"].get("shard")
                for r in query(base, "count by (shard) (cluster:nodes:count)")
            }
            >= {"0", "1"}
        ),
        timeout=120,
    )
    assert shards, query(base, "count by (shard) (cluster:nodes:count)")
    assert query(base, 'count({__name__=~"node_.+"})') == []
    assert query(base, 'count({job="node"})') == []
    raw = sum(
        float(query(instance_url("shard", k), 'count({__name__=~".+"})')[0]["value"][1])
        for k in (0, 1)
    )
    held = float(query(base, 'count({__name__=~".+", job="federate"})')[0]["value"][1])
    assert held < raw / 2, f"global holds {held} series of the shards' {raw}"


def test_global_tier_writes_to_victoriametrics_and_watches_it():
    """The global tier remote_writes to VictoriaMetrics on cl-mon02 and scrapes it (job
    victoriametrics, exporters_registry). Stopped, it raises VictoriaMetricsDown and the
    global's PrometheusRemoteWriteFailing (after 10 s here: testbed.yml); started again, it
    is scraped and written to again."""
    address = hostvar("cl-mon02", "ansible_host")
    victoria = f"http://{address}:8428"
    result = eventually(lambda: query(victoria, 'count({__name__=~"cluster:.+"})'), timeout=90)
    assert result and float(result[0]["value"][1]) > 0
    base = instance_url("global")

    def up() -> dict[str, str]:
        found = query(base, 'up{job="victoriametrics"}')
        return {r["metric"]["instance"]: r["value"][1] for r in found}

    def firing() -> set[str]:
        found = query(base, 'ALERTS{alertstate="firing", alertname=~".*(Victoria|RemoteWrite).*"}')
        return {r["metric"]["alertname"] for r in found}

    assert eventually(lambda: up() == {f"{address}:8428": "1"}, timeout=60), up()
    assert firing() == set()
    newest = 'timestamp(cluster:nodes:count{shard="0"})'
    server = host("cl-mon02")
    server.check_output("systemctl stop victoria-metrics")
    try:
        both = {"VictoriaMetricsDown", "PrometheusRemoteWriteFailing"}
        assert eventually(lambda: firing() == both, timeout=150, interval=5), firing()
    finally:
        server.check_output("systemctl start victoria-metrics")
    restarted = time.time()
    assert eventually(lambda: up() == {f"{address}:8428": "1"}, timeout=60), up()
    # Written to again: samples newer than the restart (VictoriaMetrics shows a sample
    # 30 s after its timestamp, -search.latencyOffset).
    fresh = eventually(
        lambda: [r for r in query(victoria, newest) if float(r["value"][1]) > restarted],
        timeout=120,
        interval=5,
    )
    assert fresh, query(victoria, newest)


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel, PromQL) of every Prometheus panel query gpufleet provisions."""
    result = subprocess.run(
        [sys.executable, str(REPO / "roles/grafana/files/dashboards/generate.py"), "--queries"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    return [(board, panel, expr) for board, panel, source, expr in rows if source == "prometheus"]


def concrete(expr: str) -> str:
    """A panel query with Grafana's variables replaced as "All" would."""
    for name, value in (("__rate_interval", "1m"), ("__interval", "30s"), ("__range", "1h")):
        expr = expr.replace("$" + name, value).replace("${" + name + "}", value)
    expr = re.sub(r"vector\(\$\{?[a-z_]+\}?\)", "vector(1)", expr)  # constant variables
    return re.sub(r"\$\{?[a-z_]+\}?", ".*", expr)


def test_dashboard_queries_return_data_from_the_live_prometheus():
    base = instance_url("shard", 0)
    present = set(http_json(f"{base}/api/v1/label/__name__/values")["data"])
    empty = []
    for board, panel, expr in dashboard_queries():
        result = http_json(f"{base}/api/v1/query?query={urllib.parse.quote(concrete(expr))}")
        assert result["status"] == "success", (board, panel, expr)
        names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{", expr)) - {"label_replace"}
        # Event panels (a comparison filter) and panels on exporters this cluster does not
        # run (Slurm, DCGM) may legitimately be empty; everything else must show data.
        filtered = re.search(r"(==|!=|>=|<=|>|<) ?[0-9]", expr)
        if names <= present and not filtered and not result["data"]["result"]:
            empty.append(f"{board}: {panel}")
    assert not empty, f"panels without data on a live cluster: {empty}"


def test_exporter_firewall_lets_only_the_prometheus_hosts_in():
    """exporter_firewall_enabled is on here: the shard tests above scrape through it."""
    url = f"http://{hostvar('cl-gpu01', 'ansible_host')}:9100/metrics"
    fetch = f"curl -sS -o /dev/null -w '%{{http_code}}' --max-time 3 {url}"
    assert "cl-cpu01" not in group("prometheus") | group("prometheus_global")
    assert host("cl-mon02").run(fetch).stdout == "200"
    assert host("cl-cpu01").run(fetch).rc == 28, "cl-cpu01 reached cl-gpu01's node_exporter"


def status_of(url: str, **headers: str) -> int:
    """The HTTP status an anonymous (or differently logged-in) client gets."""
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=tls_context()) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def server_urls() -> list[str]:
    urls = [
        instance_base(name, instance)
        for name in sorted(group("prometheus") | group("prometheus_global"))
        for instance in hostvar(name, "gpufleet_prometheus_instances")
    ]
    for name in sorted(group("alertmanager")):
        urls.append(f"https://{hostvar(name, 'ansible_host')}:9093")
    return urls


def test_prometheus_and_alertmanager_want_tls_and_a_login():
    """Every instance and Alertmanager serves HTTPS with a certificate the CA verifies
    (every other test reads them that way) and answers 401 without gpufleet's login."""
    wrong = "Basic " + base64.b64encode(b"gpufleet:not-the-password").decode()
    for url in server_urls():
        assert status_of(f"{url}/-/ready") == 401, url
        assert status_of(f"{url}/-/ready", Authorization=wrong) == 401, url
        # Go answers plain HTTP on a TLS port "Client sent an HTTP request to an HTTPS server".
        assert status_of(url.replace("https://", "http://") + "/-/ready") == 400, url


def test_alertmanager_gossips_only_on_the_cluster_address():
    for name in sorted(group("alertmanager")):
        address = hostvar(name, "ansible_host")
        sockets = host(name).run("ss -Hlntu '( sport = :9094 )'").stdout.split("\n")
        local = sorted({line.split()[4] for line in sockets if line.strip()})
        assert local == [f"{address}:9094"], (name, local)
        status = http_json(f"https://{address}:9093/api/v2/status")["cluster"]
        assert status["status"] == "ready", status
        peers = sorted(peer["address"] for peer in status["peers"])
        assert peers == sorted(f"{hostvar(n, 'ansible_host')}:9094" for n in group("alertmanager"))


def reaches(source: str, address: str, port: int) -> bool:
    """Whether a TCP connection from source's host to address:port opens (3 s)."""
    result = host(source).run(f"timeout 3 bash -c '</dev/tcp/{address}/{port}'")
    assert result.rc in (0, 1, 124), result.stderr  # 1: refused (nothing listens)
    return result.rc == 0


def test_firewall_gives_each_server_port_its_rightful_sources():
    """Prometheus to the shards (federation) and Alertmanager; peers to gossip; the
    controller (exporter_firewall_admin_sources) to the UIs; a GPU node to none."""
    mon01, mon02 = (hostvar(n, "ansible_host") for n in ("cl-mon01", "cl-mon02"))
    assert reaches("cl-mon01", mon02, 9092), "the global tier cannot federate shard 1"
    assert reaches("cl-mon02", mon01, 9093), "a Prometheus cannot send alerts"
    assert reaches("cl-mon02", mon01, 9094), "an Alertmanager peer cannot gossip"
    for port in (9090, 9091, 9093, 9094):
        assert not reaches("cl-gpu01", mon01, port), f"cl-gpu01 reached cl-mon01:{port}"
    assert not reaches("cl-cpu01", mon02, 8428), "cl-cpu01 reached VictoriaMetrics"
    assert reaches("cl-mon01", mon02, 8428), "the global tier cannot remote-write"


def prometheus_state(base: str) -> tuple[str, str]:
    """(process start time, last successful reload time) of an instance."""
    start = query(base, 'process_start_time_seconds{job="prometheus"}')[0]["value"][1]
    reload = query(base, "prometheus_config_last_reload_success_timestamp_seconds")[0]["value"][1]
    return start, reload


def site(*args: str, inventory_dir: Path = INVENTORY) -> subprocess.CompletedProcess:
    """site.yml as an admin reruns it, with the release pins and web settings prepare.yml wrote."""
    return subprocess.run(
        [
            "ansible-playbook",
            "-i",
            MOLECULE_INVENTORY,
            "-i",
            str(inventory_dir),
            "-e",
            f"@{EPHEMERAL / 'upstream-releases.yml'}",
            "-e",
            f"@{EPHEMERAL / 'web-access.yml'}",
            str(REPO / "site.yml"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, ANSIBLE_NOCOLOR="1"),
    )


def changed_tasks(output: str) -> dict[str, set[str]]:
    """host -> names of the tasks that reported changed, from the default callback."""
    changed: dict[str, set[str]] = {}
    task = ""
    for line in output.splitlines():
        if match := re.match(r"^(?:TASK|RUNNING HANDLER) \[(.+?)\]", line):
            task = match.group(1)
        elif match := re.match(r"^changed: \[([^\]]+)\]", line):
            changed.setdefault(match.group(1).split(" ")[0], set()).add(task)
    return changed


def test_bad_rule_from_the_inventory_fails_and_prometheus_keeps_serving(tmp_path):
    base = instance_url("shard", 0)
    before = prometheus_state(base)
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "prometheus_extra_rule_groups": [
                    {"name": "broken", "rules": [{"alert": "Broken", "expr": "sum(rate(x[5m]) by"}]}
                ]
            }
        )
    )
    result = site("--limit", "prometheus", "-e", f"@{bad}")
    assert result.returncode != 0
    output = " ".join((result.stdout + result.stderr).split())
    assert "failed to validate" in output.lower(), output[-2000:]
    assert prometheus_state(base) == before
    assert query(base, "up") != []
    assert (
        not host("cl-mon01")
        .file("/etc/gpufleet/prometheus/shard-0/rules/gpufleet-extra.rules.yml")
        .exists
    )


def new_test_host(name: str, address: str, inventory_dir: Path) -> None:
    """Start one more test bed host and tell Ansible how to reach it."""
    testbed = [sys.executable, str(REPO / "molecule" / "testbed" / "testbed.py")]
    subprocess.run(
        [*testbed, "up", "--network", "gpufleet-cluster", f"{name}={address}"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    key = subprocess.run([*testbed, "key"], check=True, capture_output=True, text=True).stdout
    (inventory_dir / "host_vars").mkdir(exist_ok=True)
    (inventory_dir / "host_vars" / f"{name}.yml").write_text(
        json.dumps(
            {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": key.strip(),
                "ansible_ssh_common_args": SSH_ARGS,
            }
        )
    )


def test_adding_a_node_rewrites_target_files_only(tmp_path):
    inventory_dir = tmp_path / "inventory"
    shutil.copytree(INVENTORY, inventory_dir)
    new_test_host("cl-cpu02", "10.203.15.32", inventory_dir)
    node_list = inventory_dir / "nodes.gpufleet.yml"
    node_list.write_text(
        node_list.read_text().replace(
            "  - hosts: cl-cpu01\n    address: 10.203.15.31\n",
            '  - hosts: cl-cpu[01-02]\n    address: "10.203.15.3{num}"\n',
        )
    )
    shard_of_new = json.loads(
        subprocess.run(
            ["ansible-inventory", "-i", str(inventory_dir), "--host", "cl-cpu02"],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg")),
        ).stdout
    )["gpufleet_shard"]
    bases = {k: instance_url("shard", k) for k in (0, 1)}
    before = {k: prometheus_state(b) for k, b in bases.items()}

    result = site(inventory_dir=inventory_dir)
    assert result.returncode == 0, result.stdout[-4000:]
    for name in ("cl-mon01", "cl-mon02"):
        tasks = changed_tasks(result.stdout).get(name, set())
        assert all("Write the scrape targets" in task for task in tasks), tasks
    assert {k: prometheus_state(b) for k, b in bases.items()} == before  # no restart, no reload
    started = time.monotonic()
    scraped = eventually(
        lambda: scraped_nodes(bases[shard_of_new]).get("cl-cpu02", {}).get("health") == "up",
        timeout=60,
        interval=1,
    )
    assert scraped, "the new node was not scraped"
    print(f"new node scraped {time.monotonic() - started:.1f}s after the rerun")


def notifications() -> list[dict]:
    content = host("cl-cpu01").run(f"cat {WEBHOOK_LOG} 2>/dev/null").stdout
    return [json.loads(line)["payload"] for line in content.splitlines() if line.strip()]


def alerts_for(node: str, status: str | None = None) -> list[tuple[str, str]]:
    """(alertname, status) of every alert about node in every notification."""
    return [
        (a["labels"]["alertname"], a["status"])
        for n in notifications()
        for a in n["alerts"]
        if a["labels"].get("node") == node and (status is None or a["status"] == status)
    ]


def node_down_receivers(node: str) -> list[tuple[str, str]]:
    """(receiver, site label) of each firing NodeDown notification about node."""
    return [
        (n["receiver"], a["labels"].get("site", ""))
        for n in notifications()
        for a in n["alerts"]
        if a["labels"]["alertname"] == "NodeDown"
        and a["labels"].get("node") == node
        and a["status"] == "firing"
    ]


def alertmanager_api(path: str, body: list | None = None) -> list | dict:
    """GET (or POST body to) the first Alertmanager's API v2, verified, logged in."""
    first = sorted(group("alertmanager"))[0]
    request = urllib.request.Request(
        f"https://{hostvar(first, 'ansible_host')}:9093/api/v2/{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": login("alertmanager"), "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10, context=tls_context()) as response:
        raw = response.read()
    return json.loads(raw) if raw.strip() else {}


def gpu_fault(cluster: str, node: str, ends_in: float) -> dict:
    """A GpuXidCritical as Prometheus would send it, marked as this test's own."""
    now = time.time()
    stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))  # noqa: E731
    return {
        "labels": {
            "alertname": "GpuXidCritical",
            "cluster": cluster,
            "node": node,
            "gpu": "0",
            "severity": "critical",
            "gpufleet_test": "inhibition",
        },
        "annotations": {"summary": "posted by the cluster scenario's inhibition test"},
        "startsAt": stamp(now - 1),
        "endsAt": stamp(now + ends_in),
    }


def posted_fault_states() -> dict[str, dict]:
    """node -> Alertmanager's status of the test's own GpuXidCritical on that node."""
    query = urllib.parse.quote('gpufleet_test="inhibition"')
    alerts = alertmanager_api(f"alerts?filter={query}&inhibited=true&silenced=true")
    return {a["labels"]["node"]: a["status"] for a in alerts}


def test_node_down_is_delivered_once_inhibits_its_gpu_alerts_and_survives_an_alertmanager():
    gpu_node, cpu_node = host("cl-gpu02"), host("cl-cpu01")
    gpu_node.run("systemctl stop node_exporter")
    try:
        fired = eventually(
            lambda: ("NodeDown", "firing") in alerts_for("cl-gpu02"), timeout=330, interval=5
        )
        assert fired, notifications()
        # With node_exporter down no GPU alert of the node can fire by itself (its series
        # come through node_exporter), so a critical GPU fault is posted as Prometheus would
        # post it, for the down node and, as the control, for a node that is up. Only the
        # first may be inhibited; the second must reach the webhook.
        cluster = next(
            a["labels"]["cluster"]
            for n in notifications()
            for a in n["alerts"]
            if a["labels"]["alertname"] == "NodeDown" and a["labels"].get("node") == "cl-gpu02"
        )
        alertmanager_api(
            "alerts", [gpu_fault(cluster, "cl-gpu02", 300), gpu_fault(cluster, "cl-gpu01", 300)]
        )
        states = posted_fault_states()
        assert states["cl-gpu02"]["state"] == "suppressed", states
        assert states["cl-gpu02"]["inhibitedBy"], states
        assert states["cl-gpu01"]["state"] == "active", states
        delivered = eventually(
            lambda: ("GpuXidCritical", "firing") in alerts_for("cl-gpu01"), timeout=60, interval=2
        )
        assert delivered, "the control GPU fault on a node that is up was not delivered"
        time.sleep(30)  # time for a duplicate from the second Alertmanager to arrive
        assert alerts_for("cl-gpu02", "firing").count(("NodeDown", "firing")) == 1
        # The node list's custom label stays on the alert, and site a's route takes it.
        assert node_down_receivers("cl-gpu02") == [("site-a", "a")], notifications()
        others = {name for name, _ in alerts_for("cl-gpu02", "firing")} - {"NodeDown"}
        assert not others, f"alerts not inhibited by NodeDown: {others}"
        alertmanager_api(
            "alerts", [gpu_fault(cluster, "cl-gpu02", 0), gpu_fault(cluster, "cl-gpu01", 0)]
        )
    finally:
        gpu_node.run("systemctl start node_exporter")

    # One Alertmanager gone: the other still delivers.
    host("cl-mon02").run("systemctl stop gpufleet-alertmanager")
    cpu_node.run("systemctl stop node_exporter")
    try:
        delivered = eventually(
            lambda: ("NodeDown", "firing") in alerts_for("cl-cpu01"), timeout=330, interval=5
        )
        assert delivered, notifications()
        # Site b has no route of its own: the default receiver.
        assert ("test-webhook", "b") in node_down_receivers("cl-cpu01"), notifications()
        resolved = eventually(
            lambda: ("NodeDown", "resolved") in alerts_for("cl-gpu02"), timeout=120, interval=5
        )
        assert resolved, "NodeDown of cl-gpu02 did not resolve after node_exporter came back"
    finally:
        cpu_node.run("systemctl start node_exporter")
        host("cl-mon02").run("systemctl start gpufleet-alertmanager")


def test_a_node_alert_holds_back_its_gpus_alerts_and_severities_keep_their_pace():
    """The deployed configuration: severity routes with their own timing and the shipped
    templates loaded, and GpuDegradedOnNode (one alert per node and problem) suppressing
    the per-GPU alerts it sums up, on the node it names only (made-up nodes: the other
    tests read the webhook's log by node)."""
    status = alertmanager_api("status")
    config = yaml.safe_load(status["config"]["original"])
    assert config["templates"] == ["/etc/gpufleet/alertmanager/templates/gpufleet.tmpl"]
    severities = {
        r["matchers"][0]: r
        for r in config["route"]["routes"]
        if r.get("matchers", [""])[0].startswith("severity=")
    }
    assert set(severities) == {'severity="critical"', 'severity="warning"', 'severity="info"'}
    assert all(r["group_wait"] == "5s" for r in severities.values()), severities

    now = time.time()
    stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))  # noqa: E731

    def alert(name: str, node: str, ends_in: float, **labels: str) -> dict:
        return {
            "labels": {"alertname": name, "cluster": "testbed-node-alert", "node": node,
                       "severity": "warning", "gpufleet_test": "node-alert"} | labels,
            "startsAt": stamp(now - 1),
            "endsAt": stamp(now + ends_in),
        }  # fmt: skip

    hot = "GpuTemperatureNearLimit"
    posted = [alert("GpuDegradedOnNode", "na-node1", 120, problem=hot),
              alert(hot, "na-node1", 120, gpu="0"), alert(hot, "na-node1", 120, gpu="1"),
              alert(hot, "na-node2", 120, gpu="0")]  # fmt: skip
    alertmanager_api("alerts", posted)
    query = urllib.parse.quote('gpufleet_test="node-alert"')
    states = {
        (a["labels"]["alertname"], a["labels"]["node"], a["labels"].get("gpu", "")): a["status"]
        for a in alertmanager_api(f"alerts?filter={query}&inhibited=true&silenced=true")
    }
    assert {key: status["state"] for key, status in states.items()} == {
        ("GpuDegradedOnNode", "na-node1", ""): "active",
        (hot, "na-node1", "0"): "suppressed",
        (hot, "na-node1", "1"): "suppressed",
        (hot, "na-node2", "0"): "active",
    }, states
    alertmanager_api("alerts", [a | {"endsAt": stamp(time.time() - 1)} for a in posted])


def test_each_prometheus_runs_with_query_limits_and_logs_its_queries():
    """Every instance runs with the three --query.* flags, --query.max-samples sized from
    its unit's MemoryMax= (src/gpufleet/query_limits.py) through its bounds drop-in; a
    query it answers lands in its query log, and still does after logrotate copied and
    truncated the file."""
    from gpufleet.query_limits import max_samples

    def setting(name: str, variable: str, default):
        return plain(inventory()["_meta"]["hostvars"][name].get(variable, default))

    def logged(machine, path: str, marker: str) -> bool:
        return machine.run(f"grep -qF 'vector({marker})' {path}").rc == 0

    for name in sorted(group("prometheus") | group("prometheus_global")):
        machine = host(name)
        log_dir = setting(name, "prometheus_log_dir", "/var/log/gpufleet/prometheus")
        concurrency = int(setting(name, "prometheus_query_max_concurrency", 20))
        logs = {}
        for instance in hostvar(name, "gpufleet_prometheus_instances"):
            unit = f"gpufleet-prometheus-{instance['name']}.service"
            pid = machine.check_output(f"systemctl show -p MainPID --value {unit}").strip()
            argv = machine.check_output(f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()
            flags = dict(a.split("=", 1) for a in argv if a.startswith("--query."))
            memory = machine.check_output(f"systemctl show -p MemoryMax --value {unit}").strip()
            bound = None if memory == "infinity" else int(memory)
            assert flags == {
                "--query.max-concurrency": str(concurrency),
                "--query.timeout": str(setting(name, "prometheus_query_timeout", "2m")),
                "--query.max-samples": str(max_samples(bound, concurrency)),
            }, (name, unit, flags, memory)
            # The sample limit comes from the bounds drop-in (a restart-free daemon-reload).
            environment = machine.check_output(f"systemctl show -p Environment --value {unit}")
            assert f"GPUFLEET_QUERY_MAX_SAMPLES={flags['--query.max-samples']}" in environment
            path = f"{log_dir}/{instance['name']}/query.log"
            assert machine.file(path).exists, f"{name}: no {path}"
            owner = setting(name, "prometheus_system_user", "prometheus")
            assert machine.file(path).user == owner, f"{name}: {path} is not {owner}'s"
            logs[path] = instance_base(name, instance)
        result = machine.run("logrotate -d /etc/logrotate.d/gpufleet-prometheus")
        assert result.rc == 0, f"{name}: {result.stdout}{result.stderr}"
        # Before and after a forced rotation (its own state file: the daily run's is kept).
        for round_ in ("before", "after"):
            if round_ == "after":
                rotate = machine.run(
                    "logrotate -f -s /var/tmp/gpufleet-test-logrotate.state"
                    " /etc/logrotate.d/gpufleet-prometheus"
                )
                assert rotate.rc == 0, f"{name}: {rotate.stdout}{rotate.stderr}"
                for path in logs:
                    assert machine.file(f"{path}.1.gz").exists, f"{name}: {path} not rotated"
            for path, base in logs.items():
                marker = str(time.time_ns())
                query(base, f"vector({marker})")
                found = eventually(lambda m=machine, p=path, k=marker: logged(m, p, k), timeout=30)
                assert found, f"{name}: vector({marker}) not in {path} ({round_} rotation)"
