"""Reruns of converge on the converged host: what reloads, restarts, or is refused.

Runs after test_observability.py (pytest takes the files in name order) on the Loki
and Alloy stand-ins that roles/loki and roles/alloy installed from the loopback mirror.
Each test reruns the converge playbook with a few variables overridden (limited to the
role concerned with its tags) and checks the live services, not only the files: the
main PID tells a restart from a reload, the stand-ins' /metrics and /config say what
they loaded. Where a test must change exactly one thing it carries along the overrides
of the tests before it. The last test reruns the whole playbook without overrides and
checks that the converged state is back.
"""

from __future__ import annotations

import json

import pytest
from observability_helpers import (
    ALLOY_BINARY,
    LOKI_BINARY,
    MIRROR,
    REFUSE_MARKER,
    alloy_config_hash,
    alloy_metrics,
    built,
    converge,
    fetch,
    fetch_on_host,
    main_pid,
    output,
    process,
    recap,
)
from testbed_helpers import eventually, host_address

testinfra_hosts = ["all"]

CONVERGED_FILES = [
    "/etc/loki/loki.yml",
    "/etc/systemd/system/loki.service",
    LOKI_BINARY,
    "/etc/alloy/config.alloy",
    "/etc/default/alloy",
    "/etc/systemd/system/alloy.service.d/gpufleet.conf",
    ALLOY_BINARY,
]
CANARY = json.dumps({"alloy_extra_labels": {"canary": "reload"}})
GROUPS = json.dumps({"alloy_supplementary_groups": ["systemd-journal", "adm", "users"]})


@pytest.fixture(scope="module")
def converged(host) -> dict[str, str]:
    """sha256 of the files the roles manage, as the converge step left them."""
    return {path: host.file(path).sha256sum for path in CONVERGED_FILES}


def loki_ready(host, port: int = 3100) -> bool:
    return fetch(f"http://{host_address(host)}:{port}/ready")[0] == 200


def alloy_ready(host, address: str = "127.0.0.1:12345") -> bool:
    return fetch_on_host(host, f"http://{address}/-/ready")[0] == 200


def test_config_alloy_change_reloads_alloy(host, converged):
    pid = main_pid(host, "alloy")
    reloads = int(alloy_metrics(host)["alloy_standin_config_reloads_total"])
    result = converge(CANARY, tags="alloy")
    assert result.returncode == 0, result.stdout[-3000:]
    config = host.file("/etc/alloy/config.alloy")
    assert 'canary = "reload"' in config.content_string
    assert main_pid(host, "alloy") == pid, "a config.alloy change must not restart Alloy"

    def reloaded() -> dict | None:
        series = alloy_metrics(host)
        return series if alloy_config_hash(series) == config.sha256sum else None

    series = eventually(reloaded, timeout=15)
    assert series, "Alloy did not load the new config.alloy"
    assert int(series["alloy_standin_config_reloads_total"]) == reloads + 1
    assert series["alloy_config_last_load_successful"] == "1"


def assert_validate_refuses(host, unit: str, config: str, overrides: dict) -> None:
    """A config the stand-in's validate entry point refuses (it holds REFUSE_MARKER):
    the play fails with its message, and the file and the running service stay."""
    config_before = host.file(config).sha256sum
    pid = main_pid(host, unit)
    result = converge(json.dumps(overrides), tags=unit)
    assert result.returncode != 0
    text = output(result)
    assert "failed to validate" in text
    assert f"refuses a file containing {REFUSE_MARKER}" in text, "its message reaches the admin"
    assert recap(result, host)["changed"] == 0
    assert host.file(config).sha256sum == config_before
    assert main_pid(host, unit) == pid


def test_broken_alloy_config_is_refused_and_alloy_keeps_running(host):
    series_before = alloy_metrics(host)
    # What `alloy fmt` would refuse is unit-tested (tests/unit/test_loki_alloy_schema.py).
    broken = {
        "alloy_extra_labels": {"canary": "reload"},
        "alloy_config_extra": f"// {REFUSE_MARKER}",
    }
    assert_validate_refuses(host, "alloy", "/etc/alloy/config.alloy", broken)
    series = alloy_metrics(host)
    for counter in ("alloy_standin_config_reloads_total", "alloy_config_load_failures_total"):
        assert series[counter] == series_before[counter], f"{counter}: Alloy was signalled"
    assert alloy_ready(host)


def test_broken_loki_config_is_refused_and_loki_keeps_serving(host):
    # What `loki -verify-config` would refuse is unit-tested (test_loki_alloy_schema.py).
    assert_validate_refuses(
        host, "loki", "/etc/loki/loki.yml", {"loki_config_extra": {REFUSE_MARKER: True}}
    )
    assert loki_ready(host)


def test_loki_config_change_restarts_loki(host):
    pid = main_pid(host, "loki")
    result = converge("loki_log_level=debug", tags="loki")
    assert result.returncode == 0, result.stdout[-3000:]
    config = host.file("/etc/loki/loki.yml").content_string
    assert "log_level: debug" in config
    assert main_pid(host, "loki") not in (pid, 0), "Loki has no reload: a config change restarts"
    assert eventually(lambda: loki_ready(host)), "Loki did not come back"
    assert fetch(f"http://{host_address(host)}:3100/config") == (200, config)


def test_drop_in_change_restarts_alloy_with_the_new_groups(host):
    pid = main_pid(host, "alloy")
    # Only the drop-in differs from the live state (CANARY keeps config.alloy as it is).
    result = converge(CANARY, GROUPS, tags="alloy")
    assert result.returncode == 0, result.stdout[-3000:]
    dropin = host.file("/etc/systemd/system/alloy.service.d/gpufleet.conf").content_string
    assert "SupplementaryGroups=systemd-journal adm users" in dropin
    new_pid = main_pid(host, "alloy")
    assert new_pid not in (pid, 0), "a drop-in change must restart Alloy"
    # The account is not in `users`: the running process has it from the drop-in.
    assert "users" not in host.check_output("id -Gn alloy").split()
    assert host.group("users").gid in process(host, new_pid)["groups"]
    assert eventually(lambda: alloy_ready(host))


def test_environment_change_restarts_alloy_and_the_reload_is_skipped(host):
    pid = main_pid(host, "alloy")
    # /etc/default/alloy (listen address) and config.alloy (label) change together:
    # restart notified, reload notified; only the restart may run.
    result = converge(
        json.dumps({"alloy_extra_labels": {"canary": "restart"}}),
        GROUPS,
        "alloy_listen_address=127.0.0.1:12346",
        tags="alloy",
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert main_pid(host, "alloy") not in (pid, 0)
    assert eventually(lambda: alloy_ready(host, "127.0.0.1:12346")), "not on the new address"
    assert not alloy_ready(host, "127.0.0.1:12345")
    series = alloy_metrics(host, "127.0.0.1:12346")
    assert alloy_config_hash(series) == host.file("/etc/alloy/config.alloy").sha256sum
    # A reload after the restart would have counted one.
    assert series["alloy_standin_config_reloads_total"] == "0"


def assert_download_refused(result, host) -> None:
    """A tampered artifact: the play fails on the checksum, and reports no change."""
    assert result.returncode != 0
    text = output(result)
    assert "could not be fetched and verified" in text
    assert "checksum" in text.lower()
    assert "nothing was installed" in text
    counts = recap(result, host)
    assert (counts["changed"], counts["failed"]) == (0, 1)


def test_wrong_loki_checksum_fails_clearly_and_changes_nothing(host, tmp_path):
    # An empty download cache that the role finds as it wants it (roles/_common's
    # upstream_release.yml keeps each artifact under its pinned sha256): a clean failure
    # then reports changed=0, controller side included.
    cache = tmp_path / "loki" / built()["loki"]["sha256"]
    cache.mkdir(parents=True)
    cache.chmod(0o755)
    binary = host.file(LOKI_BINARY).sha256sum
    config = host.file("/etc/loki/loki.yml").sha256sum
    pid = main_pid(host, "loki")
    result = converge(
        f"loki_download_base_url={MIRROR}/tampered/grafana/loki/releases/download",
        f"loki_download_dir={tmp_path}",
        tags="loki",
    )
    assert_download_refused(result, host)
    assert not (cache / "loki-linux-amd64.zip").exists(), "the wrong file was kept"
    assert host.file(LOKI_BINARY).sha256sum == binary
    assert host.file("/etc/loki/loki.yml").sha256sum == config
    assert main_pid(host, "loki") == pid


def test_wrong_alloy_checksum_fails_clearly_and_changes_nothing(host, tmp_path):
    alloy = built()["alloy"]
    package = f"alloy-{alloy['version']}-1.{alloy['arch']}.deb"
    status = host.check_output("dpkg-query -W -f '${Version} ${Status}' alloy")
    cached = host.file(f"/var/cache/gpufleet/{package}").sha256sum
    binary = host.file(ALLOY_BINARY).sha256sum
    pid = main_pid(host, "alloy")
    cache = tmp_path / "downloads"
    artifact = cache / "alloy" / alloy["sha256"]
    artifact.mkdir(parents=True)
    artifact.chmod(0o755)
    result = converge(
        f"alloy_download_base_url={MIRROR}/tampered/grafana/alloy/releases/download",
        f"alloy_download_dir={cache}",
        tags="alloy",
    )
    assert_download_refused(result, host)
    assert not (artifact / package).exists(), "the wrong file was kept"
    assert host.check_output("dpkg-query -W -f '${Version} ${Status}' alloy") == status
    assert host.file(f"/var/cache/gpufleet/{package}").sha256sum == cached
    assert host.file(ALLOY_BINARY).sha256sum == binary
    assert main_pid(host, "alloy") == pid


def test_rerun_restores_the_converged_state(host, converged):
    result = converge()
    assert result.returncode == 0, result.stdout[-3000:]
    assert {path: host.file(path).sha256sum for path in CONVERGED_FILES} == converged
    assert eventually(lambda: loki_ready(host))
    assert eventually(lambda: alloy_ready(host))
    assert (
        fetch(f"http://{host_address(host)}:3100/config")[1]
        == host.file("/etc/loki/loki.yml").content_string
    )
    assert alloy_config_hash(alloy_metrics(host)) == converged["/etc/alloy/config.alloy"]
    assert host.group("users").gid not in process(host, main_pid(host, "alloy"))["groups"]
