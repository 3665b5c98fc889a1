"""roles/alertmanager: SlurmJobGpuIdle to the job's owner, one digest for the admins.

The rendered configuration is checked by the real amtool of both ends of the supported
range: Debian 12's 0.25 (/usr/bin/amtool, scripts/bootstrap) and sid's (0.33 today,
downloaded and verified by apt like promtool 3 in test_rules.py, unpacked once under
.cache/amtool/). ``amtool config routes test`` proves which receivers a label set reaches.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from render_role import ROOT, evaluate, render
from test_rules import _debian_suite

AMTOOL_025 = Path("/usr/bin/amtool")
AMTOOL_CACHE = ROOT / ".cache" / "amtool"
SETTINGS = {
    "alertmanager_receivers": [
        {"name": "admins", "webhook_configs": [{"url": "http://127.0.0.1:9/admins"}]}
    ],
    "alertmanager_default_receiver": "admins",
    "alertmanager_global": {"smtp_smarthost": "mail:25", "smtp_from": "gpufleet@example.org"},
    "alertmanager_idle_owner_address": "{user}@example.org",
    "alertmanager_idle_owner_addresses": {"alice": "a.smith@example.org"},
    "alertmanager_idle_opt_out_accounts": ["bio"],
    "alertmanager_idle_opt_out_partitions": ["debug.q"],
}
IDLE = {"alertname": "SlurmJobGpuIdle", "cluster": "c1", "job_id": "7", "severity": "info"}


def _amtool_sid() -> Path:
    try:
        deb = _debian_suite().fetch("prometheus-alertmanager", "sid")
    except (SystemExit, OSError, subprocess.SubprocessError) as error:
        pytest.fail(f"cannot fetch amtool from Debian sid ({error})", pytrace=False)
    target = AMTOOL_CACHE / deb.stem
    binary = target / "usr" / "bin" / "amtool"
    if not binary.exists():
        AMTOOL_CACHE.mkdir(parents=True, exist_ok=True)
        for stale in AMTOOL_CACHE.iterdir():
            shutil.rmtree(stale, ignore_errors=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{deb.stem}.", dir=AMTOOL_CACHE))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(partial)], check=True, timeout=120)
        try:
            partial.rename(target)
        except OSError:  # a concurrent run unpacked it first
            shutil.rmtree(partial, ignore_errors=True)
    return binary


@pytest.fixture(scope="session", params=["0.25", "sid"], ids=["amtool025", "amtool-sid"])
def amtool(request: pytest.FixtureRequest) -> Path:
    if request.param == "0.25":
        if not AMTOOL_025.exists():
            pytest.fail(f"{AMTOOL_025} missing (Debian 12 prometheus-alertmanager)", pytrace=False)
        return AMTOOL_025
    return _amtool_sid()


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("am") / "alertmanager.yml"
    path.write_text(render("alertmanager", "alertmanager.yml.j2", "mon01", SETTINGS))
    return path


def _receivers(amtool: Path, config: Path, labels: dict[str, str]) -> list[str]:
    result = subprocess.run(
        [str(amtool), "config", "routes", "test", f"--config.file={config}"]
        + [f"{key}={value}" for key, value in labels.items()],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().splitlines()[-1].split(",")


def test_check_config(amtool: Path, config_file: Path) -> None:
    result = subprocess.run(
        [str(amtool), "check-config", str(config_file)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # sid's amtool falls back to the classic matcher parser with a warning: not for ours.
    assert "incompatible" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "labels,receivers",
    [
        # an idle job: its owner (address template) and the admins' digest
        (
            {"user": "carol", "account": "chem", "partition": "gpu"},
            ["gpufleet-idle-owner", "admins"],
        ),
        # a user of the map gets the mapped address, not the template's
        (
            {"user": "alice", "account": "chem", "partition": "gpu"},
            ["gpufleet-idle-owner-alice", "admins"],
        ),
        # opted-out account or partition: the digest only
        ({"user": "carol", "account": "bio", "partition": "gpu"}, ["admins"]),
        ({"user": "carol", "account": "chem", "partition": "debug.q"}, ["admins"]),
        (
            {"user": "carol", "account": "chem", "partition": "debugXq"},
            ["gpufleet-idle-owner", "admins"],
        ),
        # a hostile user label never reaches an address
        ({"user": "x@evil.org,y", "account": "chem", "partition": "gpu"}, ["admins"]),
        ({"user": "carol\nBcc: x@evil.org", "account": "chem", "partition": "gpu"}, ["admins"]),
    ],
)
def test_idle_routes(amtool: Path, config_file: Path, labels: dict, receivers: list) -> None:
    assert _receivers(amtool, config_file, IDLE | labels) == receivers


def test_other_alerts_are_unaffected(amtool: Path, config_file: Path) -> None:
    labels = {"alertname": "NodeDown", "cluster": "c1", "node": "gpu001", "severity": "critical"}
    assert _receivers(amtool, config_file, labels) == ["admins"]
    labels = {"alertname": "GpuXidError", "user": "carol", "account": "chem"}
    assert _receivers(amtool, config_file, labels) == ["admins"]


def test_throttled_and_one_digest(config_file: Path) -> None:
    (idle,) = [
        r
        for r in yaml.safe_load(config_file.read_text())["route"]["routes"]
        if r.get("matchers") == ['alertname="SlurmJobGpuIdle"']
    ]
    assert idle["group_by"] == ["alertname", "cluster"]  # one digest per cluster, not per job
    assert (idle["group_interval"], idle["repeat_interval"]) == ("1h", "24h")
    owners = [r for r in idle["routes"] if r["receiver"].startswith("gpufleet-idle-owner")]
    assert owners and all(
        r["group_by"] == ["alertname", "cluster", "job_id", "user"] and r["continue"]
        for r in owners
    )
    receivers = {r["name"]: r for r in yaml.safe_load(config_file.read_text())["receivers"]}
    assert receivers["gpufleet-idle-owner"]["email_configs"][0]["to"] == (
        "{{ .GroupLabels.user }}@example.org"
    )
    assert receivers["gpufleet-idle-owner-alice"]["email_configs"][0]["to"] == "a.smith@example.org"


def test_without_owner_settings_only_the_digest(amtool: Path, tmp_path: Path) -> None:
    path = tmp_path / "alertmanager.yml"
    path.write_text(
        render(
            "alertmanager",
            "alertmanager.yml.j2",
            "mon01",
            {k: SETTINGS[k] for k in ("alertmanager_receivers", "alertmanager_default_receiver")},
        )
    )
    assert _receivers(amtool, path, IDLE | {"user": "carol", "account": "chem"}) == ["admins"]


@pytest.mark.parametrize(
    "override",
    [
        {"alertmanager_idle_owner_address": "carol@example.org"},  # no {user}
        {"alertmanager_idle_owner_address": "{user}@example.org, boss@example.org"},
        {"alertmanager_idle_owner_address": "x@{user}.example.org"},
        {"alertmanager_idle_owner_addresses": {'a"b': "a@example.org"}},
        {"alertmanager_idle_owner_addresses": {"alice": "a@example.org\nBcc: x@evil.org"}},
        {"alertmanager_idle_owner_addresses": {"alice": "a@example.org,x@evil.org"}},
        {"alertmanager_idle_opt_out_accounts": ['bio"|.*']},
        {"alertmanager_idle_opt_out_partitions": ["gpu\n"]},
    ],
)
def test_hostile_settings_are_refused(override: dict) -> None:
    assert evaluate("alertmanager", "_alertmanager_idle_problems", "mon01", override)


def test_good_settings_pass() -> None:
    assert evaluate("alertmanager", "_alertmanager_idle_problems", "mon01", SETTINGS) == []
