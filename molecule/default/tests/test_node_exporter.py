"""node_exporter from the distribution package on one real systemd host."""

from __future__ import annotations

from testbed_helpers import converge, eventually, host_address, probe_from_network, restart_host

testinfra_hosts = ["all"]


def metrics(host, url="http://127.0.0.1:9100/metrics") -> str:
    return host.check_output(f"curl -fsS {url}")


def test_service_runs_under_its_own_user(host):
    service = host.service("node_exporter")
    assert service.is_running
    assert service.is_enabled
    pid = service.systemd_properties["MainPID"]
    assert host.check_output(f"ps -o user= -p {pid}").strip() == "node-exporter"


def test_distribution_unit_is_masked(host):
    unit = host.run("systemctl is-enabled prometheus-node-exporter.service")
    assert unit.stdout.strip() == "masked"


def test_unit_is_hardened(host):
    properties = host.service("node_exporter").systemd_properties
    assert properties["NoNewPrivileges"] == "yes"
    assert properties["ProtectSystem"] == "strict"
    assert properties["User"] == "node-exporter"


def test_serves_metrics(host):
    body = metrics(host)
    assert "node_exporter_build_info" in body
    assert 'collector="textfile"' in body


def test_textfile_drop_appears(host):
    host.run(
        "printf '# HELP gpufleet_test_marker Test.\\n# TYPE gpufleet_test_marker gauge\\n"
        "gpufleet_test_marker 42\\n' > /var/lib/node_exporter/textfile/.t && "
        "mv /var/lib/node_exporter/textfile/.t /var/lib/node_exporter/textfile/marker.prom"
    )
    try:
        assert "gpufleet_test_marker 42" in metrics(host)
    finally:
        host.run("rm -f /var/lib/node_exporter/textfile/marker.prom")


def test_reachable_from_another_host(host):
    address = host_address(host)
    body = probe_from_network(host, f"http://{address}:9100/metrics")
    assert "node_exporter_build_info" in body


def test_tag_limited_config_change_restarts_the_service(host):
    """--tags node_exporter_configure skips the start task whose result the handler
    reads; the handler still restarts node_exporter with the new flags."""
    before = host.service("node_exporter").systemd_properties["MainPID"]
    flag = '{"node_exporter_extra_flags": ["--web.max-requests=41"]}'
    try:
        result = converge(flag, tags="node_exporter_configure")
        assert result.returncode == 0, result.stdout[-3000:]
        assert "RUNNING HANDLER [node_exporter : Restart node_exporter]" in result.stdout
        properties = host.service("node_exporter").systemd_properties
        assert properties["MainPID"] != before
        cmdline = host.check_output(f"tr '\\0' ' ' < /proc/{properties['MainPID']}/cmdline")
        assert "--web.max-requests=41" in cmdline
    finally:
        result = converge(tags="node_exporter_configure")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "node_exporter_build_info" in metrics(host)


# Last in the file: it reboots the host.
def test_survives_host_restart(host):
    restart_host(host)
    assert eventually(lambda: host.service("node_exporter").is_running, 30)
    assert "node_exporter_build_info" in metrics(host)
