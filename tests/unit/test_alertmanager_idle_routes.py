"""roles/alertmanager: SlurmJobGpuIdle to the job's owner, one digest for the admins.

The rendered configuration is checked by the real amtool of both ends of the supported
range: Debian 12's 0.25 (/usr/bin/amtool, scripts/bootstrap) and sid's (0.33 today,
downloaded and verified by apt like promtool 3 in test_rules.py, unpacked once under
.cache/amtool/). ``amtool config routes test`` proves which receivers a label set reaches, and the
Alertmanager binary of the same package delivers to an SMTP and a webhook sink.
"""

from __future__ import annotations

import json
import shutil
import socketserver
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import sid_deb
import yaml
from render_role import ROOT, evaluate, render
from sid_deb import listening_port, wait_ready

AMTOOL_025 = Path("/usr/bin/amtool")
AMTOOL_CACHE = ROOT / ".cache" / "amtool"
# This Python's, as the other role tests run it: not whichever is first on PATH.
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
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
    """sid's amtool, unpacked from its apt-verified .deb into .cache/amtool/<deb name>/."""
    try:
        root = sid_deb.unpacked("prometheus-alertmanager", AMTOOL_CACHE)
    except sid_deb.DebUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    return root / "usr" / "bin" / "amtool"


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
        r["group_by"] == ["alertname", "cluster", "user"] and r["continue"] for r in owners
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


@pytest.mark.parametrize("tag", ["alertmanager_preflight", "alertmanager_configure"])
def test_the_owner_settings_are_checked_before_the_config_is_written(
    tag: str, tmp_path: Path
) -> None:
    """A `--tags alertmanager_configure` run, which writes alertmanager.yml, checks the
    settings too (Ansible's own tag selection, listed without running anything)."""
    play = tmp_path / "play.yml"
    play.write_text(
        "- {name: Alertmanager, hosts: all, gather_facts: false, roles: [alertmanager]}\n"
    )
    result = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", str(play), "--list-tasks", "--tags", tag],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    tasks = [line.split("\t")[0].strip() for line in result.stdout.splitlines()]
    check = "alertmanager : Check the idle-GPU owner settings"
    assert check in tasks, result.stdout
    if tag == "alertmanager_configure":
        write = "alertmanager : Write the Alertmanager configuration"
        assert tasks.index(check) < tasks.index(write), result.stdout


# --- delivery by a real Alertmanager -------------------------------------------------------


class _Smtp(socketserver.StreamRequestHandler):
    """An SMTP sink: records each mail's recipients and body (no TLS, no auth)."""

    mails: ClassVar[list[tuple[list[str], str]]] = []

    def handle(self) -> None:
        def say(text: str) -> None:
            self.wfile.write(f"{text}\r\n".encode())

        say("220 sink")
        rcpt: list[str] = []
        data: list[str] | None = None
        for raw in self.rfile:
            line = raw.decode().rstrip("\r\n")
            if data is not None:
                if line == ".":
                    self.mails.append((rcpt, "\n".join(data)))
                    data, rcpt = None, []
                    say("250 ok")
                else:
                    data.append(line)
                continue
            verb = line[:4].upper()
            if verb == "EHLO":
                say("250 sink")
            elif verb == "RCPT":
                rcpt.append(line.split(":", 1)[1].strip())
                say("250 ok")
            elif verb == "DATA":
                data = []
                say("354 go")
            elif verb == "QUIT":
                say("221 bye")
                return
            else:
                say("250 ok")


class _Hook(BaseHTTPRequestHandler):
    """The admins' webhook: records each notification."""

    posts: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        self.posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _idle(job: str, user: str, account: str, node: str) -> dict:
    labels = IDLE | {"job_id": job, "user": user, "account": account, "partition": "gpu"}
    return {"labels": labels | {"node": node}, "annotations": {"summary": f"job {job}"}}


def test_owner_mail_and_one_digest_are_delivered(amtool: Path, tmp_path: Path) -> None:
    """The real Alertmanager of the same release as amtool: the templated `to:` reaches
    carol (one mail for her two idle jobs: one notification group per user), the map
    reaches alice, opted-out and hostile users get no mail, and the admins
    get one digest with every idle job."""
    binary = amtool.parent / "prometheus-alertmanager"
    _Smtp.mails, _Hook.posts = [], []
    smtp = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Smtp)
    hook = HTTPServer(("127.0.0.1", 0), _Hook)
    for server in (smtp, hook):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    settings = SETTINGS | {
        "alertmanager_receivers": [
            {
                "name": "admins",
                "webhook_configs": [{"url": f"http://127.0.0.1:{hook.server_port}/"}],
            }
        ],
        "alertmanager_global": {
            "smtp_smarthost": f"127.0.0.1:{smtp.server_address[1]}",
            "smtp_from": "gpufleet@example.org",
            "smtp_require_tls": False,
        },
        "alertmanager_group_wait": "1s",
    }
    # The shipped notification templates, where the rendered configuration lists them.
    (tmp_path / "templates").mkdir()
    shutil.copy(ROOT / "roles/alertmanager/files/gpufleet.tmpl", tmp_path / "templates")
    settings["alertmanager_config_dir"] = str(tmp_path)
    config = tmp_path / "alertmanager.yml"
    config.write_text(render("alertmanager", "alertmanager.yml.j2", "mon01", settings))
    command = [str(binary), f"--config.file={config}", f"--storage.path={tmp_path / 'data'}",
               "--web.listen-address=127.0.0.1:0", "--cluster.listen-address="]  # fmt: skip
    log = (tmp_path / "alertmanager.log").open("w+", encoding="utf-8")
    with log, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT) as server:
        try:
            url = f"http://127.0.0.1:{listening_port(server, log, seconds=30)}"
            wait_ready(url, server, log, seconds=30)
            alerts = [_idle("7", "carol", "chem", "gpu001"), _idle("7", "carol", "chem", "gpu002"),
                      _idle("11", "carol", "chem", "gpu006"),
                      _idle("8", "alice", "chem", "gpu003"), _idle("9", "dave", "bio", "gpu004"),
                      _idle("10", "x@evil.org,y", "chem", "gpu005")]  # fmt: skip
            request = urllib.request.Request(
                f"{url}/api/v2/alerts", json.dumps(alerts).encode(),
                {"Content-Type": "application/json"},
            )  # fmt: skip
            urllib.request.urlopen(request, timeout=5)
            deadline = time.monotonic() + 60  # leaves early once delivered
            while time.monotonic() < deadline and (len(_Smtp.mails) < 2 or not _Hook.posts):
                time.sleep(0.2)
            time.sleep(0.5)  # a duplicate or a split digest comes in the same flush
        finally:
            server.terminate()
            smtp.shutdown()
            hook.shutdown()
    # The shipped gpufleet.idle.* templates: an alert is a list item of the html part.
    mails = sorted((rcpt, body.count("<li>job ")) for rcpt, body in _Smtp.mails)
    # one mail per owner, not per job: carol's lists job 7 (two nodes) and job 11
    assert mails == [(["<a.smith@example.org>"], 1), (["<carol@example.org>"], 3)], mails
    (carol,) = [body for rcpt, body in _Smtp.mails if rcpt == ["<carol@example.org>"]]
    assert "Subject: Idle GPUs in your Slurm jobs on c1" in carol.splitlines()
    assert "Hello carol," in carol
    assert "job 7 on gpu002 (account chem, partition gpu)" in carol and "job 11 on gpu006" in carol
    (digest,) = _Hook.posts
    assert digest["groupLabels"] == {"alertname": "SlurmJobGpuIdle", "cluster": "c1"}
    jobs = sorted(a["labels"]["job_id"] for a in digest["alerts"])
    assert jobs == ["10", "11", "7", "7", "8", "9"]
