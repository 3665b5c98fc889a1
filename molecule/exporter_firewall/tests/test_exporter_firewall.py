"""The exporter firewall on real hosts: who reaches the exporter, and how it persists.

fw-exporter runs node_exporter on an overridden port (node_exporter_port 9102), the
IPMI exporter (9290) and an unrelated HTTP service (8080) with the firewall on; fw-prom
runs a standalone Prometheus that scrapes them; fw-other and the controller are not in
the prometheus group. Tests that change the firewall put it back; the last one reboots
fw-exporter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import testinfra
from scenario_paths import CURL_TIMEOUT_RC, FIREWALL_UNIT, MOLECULE_INVENTORY, REPO, SCENARIO, TABLE
from testbed_helpers import converge, eventually, restart_host

RULES = "/etc/gpufleet/exporter-firewall.nft"


@cache
def inventory() -> dict:
    result = subprocess.run(
        [
            "ansible-inventory",
            "-i",
            MOLECULE_INVENTORY,
            "-i",
            str(SCENARIO / "inventory"),
            "--list",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout)


def address(name: str) -> str:
    return inventory()["_meta"]["hostvars"][name]["ansible_host"]


def host(name: str):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={MOLECULE_INVENTORY}")


EXPORTER, PROM, OTHER = host("fw-exporter"), host("fw-prom"), host("fw-other")
# The inventory's override of node_exporter_port, and the IPMI exporter's default.
NODE_PORT = 9102
IPMI_PORT = 9290


def fetch(source, port: int = NODE_PORT, path: str = "/metrics"):
    """curl from source to fw-exporter, without a login; a short timeout, since a drop
    never answers. The IPMI exporter serves TLS (inventory/hosts.yml)."""
    scheme = "https" if port == IPMI_PORT else "http"
    url = f"{scheme}://{address('fw-exporter')}:{port}{path}"
    return source.run(f"curl -sSk -o /dev/null -w '%{{http_code}}' --max-time 3 {url}")


def assert_enforced() -> None:
    assert fetch(PROM).stdout == "200"
    assert fetch(OTHER).rc == CURL_TIMEOUT_RC, "fw-other reached node_exporter"


def table() -> dict:
    """Sets and chains of gpufleet's table as nft lists them."""
    listed = json.loads(EXPORTER.check_output(f"nft -j list table inet {TABLE}"))["nftables"]
    sets = {i["set"]["name"]: i["set"].get("elem", []) for i in listed if "set" in i}
    chains = {i["chain"]["name"]: i["chain"] for i in listed if "chain" in i}
    return {"sets": sets, "chains": chains}


def table_loaded() -> bool:
    return EXPORTER.run(f"nft list table inet {TABLE}").rc == 0


def rerun(*extra_vars: str) -> subprocess.CompletedProcess:
    """A tag-limited rerun of the firewall on fw-exporter: its rules read the inventory
    alone (no other host's facts), and the whole converge is proven by molecule's own
    converge, idempotence and check phases; five whole reruns here cost CI 7 minutes."""
    result = converge(
        *extra_vars,
        inventories=[str(SCENARIO / "inventory")],
        tags="exporter_firewall",
        limit="fw-exporter",
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result


def test_hosts_without_the_firewall_are_untouched():
    for other in (PROM, OTHER):
        assert not other.package("nftables").is_installed
        assert not other.file(f"/etc/systemd/system/{FIREWALL_UNIT}").exists


def test_table_matches_the_inventory():
    groups = inventory()
    scrapers = set(groups.get("prometheus", {}).get("hosts", [])) | set(
        groups.get("prometheus_global", {}).get("hosts", [])
    )
    assert scrapers == {"fw-prom"}
    loaded = table()
    assert loaded["sets"]["exporter_ports"] == [NODE_PORT, IPMI_PORT]
    assert loaded["sets"]["allowed_ipv4"] == sorted(address(name) for name in scrapers)
    assert loaded["sets"]["allowed_ipv6"] == []
    hook = loaded["chains"]["input"]
    assert (hook["hook"], hook["policy"], hook["family"]) == ("input", "accept", "inet")
    service = EXPORTER.service(FIREWALL_UNIT)
    assert service.is_enabled and service.systemd_properties["ActiveState"] == "active"


def test_prometheus_host_and_loopback_reach_the_exporter():
    assert fetch(PROM).stdout == "200"
    local = f"http://127.0.0.1:{NODE_PORT}/metrics"
    assert EXPORTER.run(f"curl -sSf -o /dev/null --max-time 3 {local}").rc == 0


def up(job: str) -> dict[str, str]:
    """instance -> value of up{job=...} as the Prometheus on fw-prom has it now."""
    query = f'up{{job="{job}"}}'
    answer = PROM.run(
        f"curl -sS --max-time 5 http://127.0.0.1:9090/api/v1/query --data-urlencode 'query={query}'"
    )
    if answer.rc != 0:
        return {}
    result = json.loads(answer.stdout)["data"]["result"]
    return {item["metric"]["instance"]: item["value"][1] for item in result}


def test_prometheus_scrapes_the_overridden_node_port_and_the_ipmi_exporter():
    """The registry drives the scrape: node_exporter on the host's own node_exporter_port,
    the IPMI exporter as job ipmi, both through the firewall. up, not ipmi_up: a
    container has no BMC, so the exporter answers while its IPMI collectors fail."""
    target = address("fw-exporter")
    node = f"{target}:{NODE_PORT}"
    ipmi = f"{target}:{IPMI_PORT}"
    assert eventually(lambda: up("node").get(node) == "1", timeout=90), up("node")
    assert eventually(lambda: up("ipmi").get(ipmi) == "1", timeout=90), up("ipmi")
    # Only the compute node runs the IPMI exporter; nothing is scraped on the old port.
    assert set(up("ipmi")) == {ipmi}
    assert f"{target}:9100" not in up("node")
    # The scrape above is TLS with gpufleet's login, derived from the IPMI exporter's own
    # settings: the CA file Prometheus verifies with really verifies the exporter.
    (ca_file,) = PROM.check_output("find /etc -name ipmi-ca.crt -path '*/web/*'").split()
    password = (Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "ipmi-password").read_text()
    login = f"-u gpufleet:{password.strip()}"
    body = PROM.check_output(
        f"curl -sSf --max-time 10 --cacert {ca_file} {login} https://{ipmi}/metrics"
    )
    assert "ipmi_up" in body
    assert fetch(PROM, port=IPMI_PORT).stdout == "401"


def test_firewall_opens_the_overridden_and_the_ipmi_port_to_prometheus_only():
    # The IPMI exporter asks for a login (401): what matters here is that it answers.
    for port, code in ((NODE_PORT, "200"), (IPMI_PORT, "401")):
        assert fetch(PROM, port=port).stdout == code, port
        assert fetch(OTHER, port=port).rc == CURL_TIMEOUT_RC, f"fw-other reached {port}"


def drops() -> int:
    listed = json.loads(EXPORTER.check_output(f"nft -j list chain inet {TABLE} exporter_access"))
    counters = [
        expr["counter"]["packets"]
        for item in listed["nftables"]
        if "rule" in item
        for expr in item["rule"]["expr"]
        if "counter" in expr
    ]
    return counters[0]


def test_other_hosts_are_dropped():
    before = drops()
    result = fetch(OTHER)
    assert result.rc == CURL_TIMEOUT_RC, (result.rc, result.stdout, result.stderr)
    assert drops() > before
    # The controller is not a Prometheus host either.
    controller = subprocess.run(
        ["curl", "-sS", "--max-time", "3", f"http://{address('fw-exporter')}:{NODE_PORT}/metrics"],
        capture_output=True,
        check=False,
    )
    assert controller.returncode == CURL_TIMEOUT_RC


def test_ssh_and_other_ports_are_untouched():
    assert fetch(OTHER, port=8080, path="/").stdout == "200"
    target = address("fw-exporter")
    assert OTHER.run(f"timeout 3 bash -c '</dev/tcp/{target}/22'").rc == 0
    key = subprocess.run(
        [sys.executable, str(REPO / "molecule" / "testbed" / "testbed.py"), "key"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ssh = subprocess.run(
        [
            "ssh", "-i", key, "-o", "BatchMode=yes", "-o", "ControlMaster=no",
            "-o", "ControlPath=none", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5",
            "-o", "LogLevel=ERROR", f"root@{target}", "echo", "reached",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )  # fmt: skip
    assert ssh.stdout.strip() == "reached", ssh.stderr


def test_rules_survive_a_restart_of_the_unit():
    EXPORTER.check_output(f"systemctl restart {FIREWALL_UNIT}")
    assert table()["sets"]["allowed_ipv4"] == [address("fw-prom")]
    assert_enforced()


def test_stop_removes_only_gpufleets_table_and_start_restores_it():
    EXPORTER.check_output("nft add table inet gpufleet_test_site")
    try:
        EXPORTER.check_output(f"systemctl stop {FIREWALL_UNIT}")
        assert not table_loaded()
        assert EXPORTER.run("nft list table inet gpufleet_test_site").rc == 0
        assert fetch(OTHER).stdout == "200", "the stopped firewall still filters"
        EXPORTER.check_output(f"systemctl start {FIREWALL_UNIT}")
        assert table_loaded()
        assert_enforced()
    finally:
        EXPORTER.run(f"systemctl start {FIREWALL_UNIT}")
        EXPORTER.run("nft delete table inet gpufleet_test_site")


KEEPALIVE = """
import http.client, os, sys, time
conn = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=10)
def get():
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    response.read()
    return f"{conn.sock.getsockname()[1]} {response.status}"
with open("/tmp/keepalive.out", "w", buffering=1) as out:
    out.write("first " + get() + "\\n")
    deadline = time.time() + 300
    while not os.path.exists("/tmp/keepalive.go") and time.time() < deadline:
        time.sleep(0.2)
    try:
        out.write("second " + get() + "\\n")
    except Exception as err:
        out.write(f"second error {err!r}\\n")
"""


def wait_for_line(source, path: str, prefix: str, timeout: float = 30) -> str:
    def line() -> str | None:
        lines = source.run(f"cat {path}").stdout.splitlines()
        return next((text for text in lines if text.startswith(prefix)), None)

    found = eventually(line, timeout, interval=0.5)
    assert found, f"no {prefix!r} line in {path}"
    return found


def test_config_change_reloads_and_keeps_established_connections():
    PROM.run("rm -f /tmp/keepalive.out /tmp/keepalive.go")
    PROM.check_output(f"cat > /tmp/keepalive.py <<'EOF'\n{KEEPALIVE}\nEOF")
    PROM.check_output(
        f"systemd-run --collect --unit gpufleet-test-keepalive python3 /tmp/keepalive.py "
        f"{address('fw-exporter')} {NODE_PORT}"
    )
    try:
        first = wait_for_line(PROM, "/tmp/keepalive.out", "first ").split()
        assert first[2] == "200"
        started = EXPORTER.service(FIREWALL_UNIT).systemd_properties[
            "ActiveEnterTimestampMonotonic"
        ]

        result = rerun('{"exporter_firewall_extra_ports": [8080]}')
        assert "RUNNING HANDLER [exporter_firewall : Reload the exporter firewall]" in result.stdout
        assert table()["sets"]["exporter_ports"] == [8080, NODE_PORT, IPMI_PORT]
        # Reloaded, not restarted: a restart would leave the ports open in between.
        assert (
            EXPORTER.service(FIREWALL_UNIT).systemd_properties["ActiveEnterTimestampMonotonic"]
            == started
        )

        PROM.check_output("touch /tmp/keepalive.go")
        second = wait_for_line(PROM, "/tmp/keepalive.out", "second ").split()
        assert second[1:] == first[1:], "the established scrape connection did not survive"

        assert fetch(OTHER, port=8080, path="/").rc == CURL_TIMEOUT_RC
        assert fetch(PROM, port=8080, path="/").stdout == "200"
    finally:
        PROM.run("touch /tmp/keepalive.go; systemctl stop gpufleet-test-keepalive")
        rerun()
    assert table()["sets"]["exporter_ports"] == [NODE_PORT, IPMI_PORT]
    assert fetch(OTHER, port=8080, path="/").stdout == "200"


def test_a_table_removed_behind_the_units_back_is_restored_by_the_next_run():
    EXPORTER.check_output(f"nft delete table inet {TABLE}")
    assert fetch(OTHER).stdout == "200"
    result = rerun()
    assert "changed: [fw-exporter]" in result.stdout
    assert table_loaded()
    assert_enforced()


def test_disabling_removes_the_firewall():
    try:
        rerun("exporter_firewall_enabled=false")
        assert not table_loaded()
        assert not EXPORTER.file(f"/etc/systemd/system/{FIREWALL_UNIT}").exists
        assert not EXPORTER.file(RULES).exists
        assert EXPORTER.run(f"systemctl cat {FIREWALL_UNIT}").rc != 0, (
            "systemd still knows the unit"
        )
        assert fetch(OTHER).stdout == "200"
        assert EXPORTER.service("node_exporter").is_running
    finally:
        rerun()
    assert table_loaded()
    assert_enforced()


# Last: it reboots the exporter host.
def reaches_ssh(source) -> bool:
    """Whether source opens a TCP connection to fw-exporter's sshd (not an exporter port)."""
    target = f"/dev/tcp/{address('fw-exporter')}/22"
    return source.run(f"timeout 3 bash -c '</dev/null >{target}'").rc == 0


def test_rules_survive_a_reboot():
    restart_host(EXPORTER)
    # The restarted container comes back with a new MAC address: the peers' neighbour
    # caches need a few seconds, and until then every port looks dropped.
    # Bounded as the loop this replaced was at worst (30 rounds of SSH checks, each up to
    # 3 s when dropped): a loaded test machine needs more than 30 s here.
    back = eventually(
        lambda: (
            EXPORTER.service("node_exporter").is_running
            and table_loaded()
            and reaches_ssh(PROM)
            and reaches_ssh(OTHER)
            and fetch(PROM).stdout == "200"
        ),
        180,
        interval=2,
    )
    assert back, "fw-exporter did not come back with node_exporter answering fw-prom"
    assert table_loaded()
    assert EXPORTER.service(FIREWALL_UNIT).is_enabled
    assert reaches_ssh(OTHER), "fw-other cannot reach fw-exporter at all after the reboot"
    assert_enforced()
