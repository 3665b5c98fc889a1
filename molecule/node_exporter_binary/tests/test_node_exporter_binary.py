"""node_exporter from a release mirror: checksums, TLS, basic auth, restart policy."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import ssl
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from testbed_helpers import converge, host_address

testinfra_hosts = ["all"]
EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
BINARY = "/usr/local/bin/node_exporter"


def test_vars() -> dict:
    return yaml.safe_load((EPHEMERAL / "test-vars.yml").read_text())


def scrape(
    host, user: str | None = None, password: str | None = None, scheme: str = "https"
) -> int:
    """HTTP status of a scrape from the controller (the Prometheus side)."""
    context = ssl.create_default_context(cafile=str(EPHEMERAL / "tls.crt"))
    request = urllib.request.Request(f"{scheme}://{host_address(host)}:9100/metrics")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            assert b"node_exporter_build_info" in response.read()
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def main_pid(host) -> str:
    return host.service("node_exporter").systemd_properties["MainPID"]


def archived_binary_sha256() -> str:
    release = test_vars()["node_exporter_version"]
    path = next(
        (EPHEMERAL / "mirror" / "genuine").rglob(f"node_exporter-{release}.linux-amd64.tar.gz")
    )
    with tarfile.open(fileobj=io.BytesIO(path.read_bytes())) as tar:
        member = tar.extractfile(f"node_exporter-{release}.linux-amd64/node_exporter")
        return hashlib.sha256(member.read()).hexdigest()


def test_binary_from_mirror_is_installed(host):
    binary = host.file(BINARY)
    assert binary.mode == 0o755
    assert binary.user == "root"
    assert binary.sha256sum == archived_binary_sha256()
    assert host.service("node_exporter").is_running


def test_web_config_holds_a_bcrypt_hash_not_the_password(host):
    config = host.file("/etc/node_exporter/web-config.yml")
    assert config.mode == 0o640
    content = config.content_string
    assert "$2b$" in content
    assert test_vars()["node_exporter_scrape_password"] not in content


def test_unauthenticated_scrape_is_refused(host):
    assert scrape(host) == 401
    assert scrape(host, "prometheus", "wrong-password") == 401


def test_plain_http_is_refused(host):
    # Go's TLS server answers plain HTTP with 400 and never serves metrics over it.
    assert scrape(host, scheme="http") == 400


def test_authenticated_scrape_over_tls_works(host):
    assert scrape(host, "prometheus", test_vars()["node_exporter_scrape_password"]) == 200


def test_password_change_needs_no_restart(host):
    before = main_pid(host)
    result = converge("node_exporter_scrape_password=rotated-secret-1")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "rotated-secret-1" not in result.stdout
    assert main_pid(host) == before
    assert scrape(host, "prometheus", "rotated-secret-1") == 200
    assert scrape(host, "prometheus", test_vars()["node_exporter_scrape_password"]) == 401


def test_flag_change_restarts(host):
    before = main_pid(host)
    result = converge('{"node_exporter_disabled_collectors": ["arp"]}')
    assert result.returncode == 0, result.stdout[-3000:]
    assert main_pid(host) != before
    assert (
        "--no-collector.arp"
        in host.file("/etc/systemd/system/node_exporter.service").content_string
    )


def test_wrong_checksum_fails_clearly_and_changes_nothing(host, tmp_path):
    binary_before = host.file(BINARY).sha256sum
    pid_before = main_pid(host)
    result = converge(
        "gpufleet_mirror_url=http://127.0.0.1:18091/tampered",
        f"gpufleet_download_dir={tmp_path}",
    )
    assert result.returncode != 0
    # Failures go to stderr, and the YAML callback wraps long messages.
    output = " ".join((result.stdout + result.stderr).split())
    assert "could not be fetched and verified" in output
    assert "checksum" in output.lower()
    assert "nothing was installed" in output
    assert host.file(BINARY).sha256sum == binary_before
    assert main_pid(host) == pid_before


def test_install_tag_on_a_fresh_host_installs_without_starting(host):
    # A fresh host as far as node_exporter goes: no unit, no binary. The new binary
    # notifies the restart, but the unit is written by the (skipped) configure step.
    fresh = host.run(
        "systemctl disable --now node_exporter.service"
        f" && rm -f /etc/systemd/system/node_exporter.service {BINARY}"
        " && systemctl daemon-reload"
    )
    assert fresh.rc == 0, fresh.stderr
    result = converge(tags="node_exporter_install")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert host.file(BINARY).sha256sum == archived_binary_sha256()
    assert not host.file("/etc/systemd/system/node_exporter.service").exists
    assert not host.service("node_exporter").is_running


def test_rerun_restores_the_converged_state(host):
    result = converge()
    assert result.returncode == 0, result.stdout[-3000:]
    assert scrape(host, "prometheus", test_vars()["node_exporter_scrape_password"]) == 200
