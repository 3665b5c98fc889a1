"""roles/alertmanager: each severity at its own pace, site routes inside, one alert per node.

src/gpufleet/alert_routes.py builds the severity routes; the rendered configuration is
checked by the real amtool of both ends of the supported range (the fixture of
test_alertmanager_idle_routes), and a real Alertmanager proves that a node's
GpuDegradedOnNode holds back the per-GPU alerts it sums up.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request
from http.server import HTTPServer
from pathlib import Path

import pytest
import yaml
from render_role import ROOT, evaluate, render
from sid_deb import listening_port, wait_ready
from test_alertmanager_idle_routes import _Hook, _receivers, amtool  # noqa: F401 (fixture)

from gpufleet.alert_routes import severity_routes, timing_problems

GPU_RULES = ROOT / "roles/prometheus/files/rules/gpufleet-gpu.rules.yml"
TEMPLATE = ROOT / "roles/alertmanager/files/gpufleet.tmpl"
SETTINGS = {
    "alertmanager_receivers": [{"name": "admins"}, {"name": "pager"}, {"name": "berlin"}],
    "alertmanager_default_receiver": "admins",
    "alertmanager_severity_receivers": {"critical": "pager"},
    "alertmanager_routes": [{"receiver": "berlin", "matchers": ['site="berlin"']}],
}
DEFAULT_TIMING = evaluate("alertmanager", "alertmanager_severity_timing", "mon01", {})


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = tmp_path_factory.mktemp("am") / "alertmanager.yml"
    path.write_text(render("alertmanager", "alertmanager.yml.j2", "mon01", SETTINGS))
    return {"path": path, "yaml": yaml.safe_load(path.read_text())}


def test_default_timing_is_valid() -> None:
    assert timing_problems(DEFAULT_TIMING, {}) == []
    assert DEFAULT_TIMING["critical"]["repeat_interval"] == "10m"
    assert DEFAULT_TIMING["warning"]["repeat_interval"] == "1h"
    assert DEFAULT_TIMING["info"]["repeat_interval"] == "24h"


@pytest.mark.parametrize(
    "timing,receivers,expected",
    [
        ({"critical": {"repeat": "5m"}}, {}, "critical.repeat is not one of"),
        ({"critical": {"repeat_interval": "10 minutes"}}, {}, "must be a duration"),
        ({"critical": {"repeat_interval": ""}}, {}, "must be a duration"),
        ({"critical": {"repeat_interval": 600}}, {}, "must be a duration"),
        ({"critical": "10m"}, {}, "must be a map"),
        ({'crit"ical': {}}, {}, "is not a plain lower-case word"),
        ({}, {"Critical|.*": "pager"}, "is not a plain lower-case word"),
        ([], {}, "must be a map of severity"),
    ],
)
def test_bad_timing_is_refused(timing: object, receivers: object, expected: str) -> None:
    problems = timing_problems(timing, receivers)
    assert any(expected in problem for problem in problems), problems


def test_the_role_refuses_bad_timing() -> None:
    """The preflight's expression, through the role's own variables."""
    problems = evaluate(
        "alertmanager",
        "alertmanager_severity_timing"
        " | gpufleet_alertmanager_timing_problems(alertmanager_severity_receivers)",
        "mon01",
        {"alertmanager_severity_timing": {"critical": {"repeat_interval": "soon"}}},
    )
    assert problems == [
        "alertmanager_severity_timing.critical.repeat_interval must be a duration such as"
        " 30s, 5m or 4h (got 'soon')"
    ]


def test_severity_routes_order_receivers_and_inheritance() -> None:
    team = [{"receiver": "berlin", "matchers": ['site="berlin"'], "repeat_interval": "2h"}]
    routes = severity_routes(
        {"info": {"repeat_interval": "24h"}, "critical": {"group_wait": "10s"}, "page": {}},
        {"critical": "pager", "audit": "log"},
        "admins",
        team,
    )
    assert [r.get("matchers") for r in routes] == [
        ['severity="critical"'], ['severity="info"'], ['severity="audit"'],
        ['severity="page"'], ['site="berlin"'],
    ]  # fmt: skip
    assert [r["receiver"] for r in routes] == ["pager", "admins", "log", "admins", "berlin"]
    assert routes[0] == {
        "matchers": ['severity="critical"'], "receiver": "pager", "group_wait": "10s",
        "routes": team,
    }  # fmt: skip
    assert routes[0]["routes"][0] is not team[0]  # copies: no YAML anchors in the output
    assert severity_routes({}, {}, "admins", []) == []


def test_check_config(amtool: Path, config: dict) -> None:  # noqa: F811
    result = subprocess.run(
        [str(amtool), "check-config", str(config["path"])],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "&id" not in config["path"].read_text()


@pytest.mark.parametrize(
    "labels,receiver",
    [
        ({"severity": "critical", "site": "berlin"}, "berlin"),
        ({"severity": "critical", "site": "paris"}, "pager"),
        ({"severity": "warning", "site": "berlin"}, "berlin"),
        ({"severity": "warning"}, "admins"),
        ({"site": "berlin"}, "berlin"),  # no severity: the site's route still applies
        ({"severity": "debug"}, "admins"),
    ],
)
def test_routes(amtool: Path, config: dict, labels: dict, receiver: str) -> None:  # noqa: F811
    assert _receivers(amtool, config["path"], {"alertname": "NodeDown"} | labels) == [receiver]


def test_a_site_route_keeps_its_severitys_pace(config: dict) -> None:
    routes = {tuple(r.get("matchers", [])): r for r in config["yaml"]["route"]["routes"]}
    critical = routes[('severity="critical"',)]
    assert {k: critical[k] for k in ("group_wait", "group_interval", "repeat_interval")} == (
        DEFAULT_TIMING["critical"]
    )
    # the site's route inside carries no timing of its own: it inherits the severity's
    assert critical["routes"] == SETTINGS["alertmanager_routes"]
    assert routes[('severity="info"',)]["repeat_interval"] == "24h"


def _rule_problems() -> set[str]:
    groups = yaml.safe_load(GPU_RULES.read_text())["groups"]
    (group,) = [g for g in groups if g["name"] == "gpufleet-gpu-node-alerts"]
    found: set[str] = set()
    for rule in group["rules"]:
        (names,) = re.findall(r'alertname=~"([A-Za-z|]+)"', rule["expr"])
        found |= set(names.split("|"))
    return found


def test_inhibit_list_matches_the_node_alerts() -> None:
    listed = evaluate("alertmanager", "_alertmanager_gpu_node_problems", "mon01", {})
    assert len(listed) == len(set(listed))
    assert set(listed) == _rule_problems()
    groups = yaml.safe_load(GPU_RULES.read_text())["groups"]
    alerts = {rule.get("alert") for group in groups for rule in group["rules"]}
    assert set(listed) <= alerts  # each names a real per-GPU alert


def test_shipped_templates_render(amtool: Path) -> None:  # noqa: F811
    text = "".join(
        f'{{{{ template "{name}" . }}}}|'
        for name in ("gpufleet.subject", "gpufleet.text", "gpufleet.idle.subject",
                     "gpufleet.idle.text", "gpufleet.idle.html")
    )  # fmt: skip
    result = subprocess.run(
        [str(amtool), "template", "render",
         f"--template.glob={TEMPLATE}", f"--template.text={text}"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_template_is_refused(amtool: Path, tmp_path: Path) -> None:  # noqa: F811
    """What the role's validate: runs on each template file before it is installed."""
    broken = tmp_path / "site.tmpl"
    broken.write_text('{{ define "site.title" }}{{ if .Status }}open{{ end }}\n')
    command = [str(amtool), "template", "render", f"--template.glob={broken}", "--template.text="]
    assert subprocess.run(command, capture_output=True, check=False, timeout=60).returncode != 0


def _alert(name: str, severity: str, node: str, **labels: str) -> dict:
    common = {"alertname": name, "severity": severity, "cluster": "c1", "node": node}
    return {"labels": common | labels}


def test_a_node_alert_holds_back_its_gpus_alerts(amtool: Path, tmp_path: Path) -> None:  # noqa: F811
    """A real Alertmanager: gpu001's three hot GPUs reach the admins as one
    GpuDegradedOnNode; gpu002's single hot GPU, with no node alert, still arrives."""
    binary = amtool.parent / "prometheus-alertmanager"
    _Hook.posts = []
    hook = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    settings = {
        "alertmanager_receivers": [
            {
                "name": "admins",
                "webhook_configs": [{"url": f"http://127.0.0.1:{hook.server_port}/"}],
            }
        ],
        "alertmanager_default_receiver": "admins",
        "alertmanager_severity_timing": {"warning": {"group_wait": "2s"}},
        "alertmanager_config_dir": str(tmp_path),
    }
    config = tmp_path / "alertmanager.yml"
    config.write_text(render("alertmanager", "alertmanager.yml.j2", "mon01", settings))
    command = [str(binary), f"--config.file={config}", f"--storage.path={tmp_path / 'data'}",
               "--web.listen-address=127.0.0.1:0", "--cluster.listen-address="]  # fmt: skip
    hot = "GpuTemperatureNearLimit"
    alerts = [_alert("GpuDegradedOnNode", "warning", "gpu001", problem=hot, rack="r1")] + [
        _alert(hot, "warning", "gpu001", gpu=gpu, rack="r1") for gpu in ("0", "1", "2")
    ] + [_alert(hot, "warning", "gpu002", gpu="0", rack="r1")]  # fmt: skip
    log = (tmp_path / "alertmanager.log").open("w+", encoding="utf-8")
    with log, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT) as server:
        try:
            url = f"http://127.0.0.1:{listening_port(server, log, seconds=30)}"
            wait_ready(url, server, log, seconds=30)
            request = urllib.request.Request(
                f"{url}/api/v2/alerts", json.dumps(alerts).encode(),
                {"Content-Type": "application/json"},
            )  # fmt: skip
            urllib.request.urlopen(request, timeout=5)
            deadline = time.monotonic() + 60  # leaves early once both groups arrived
            while time.monotonic() < deadline and len(_Hook.posts) < 2:
                time.sleep(0.2)
            time.sleep(0.5)
        finally:
            server.terminate()
            hook.shutdown()
    delivered = sorted(
        (a["labels"]["alertname"], a["labels"]["node"], a["labels"].get("gpu", ""))
        for post in _Hook.posts for a in post["alerts"]
    )  # fmt: skip
    assert delivered == [("GpuDegradedOnNode", "gpu001", ""), (hot, "gpu002", "0")], delivered
