"""Prometheus recording/alerting rules of roles/prometheus: promtool checks and conventions.

Runs ``promtool check rules`` on every rule file and ``promtool test rules`` on every test
file under tests/rules/, and checks what promtool does not: every alert has a severity,
summary, description and a runbook_url pointing at its own section of docs/alerts.md, every
alert is unit-tested firing and not firing, recording rule names follow
``level:metric:operations`` and are unique, and the global tier only reads series the
documented federation ``match[]`` brings over.

Both promtool runs are parametrized over two majors (ids ``promtool2``, ``promtool3``): the
rules must hold under the Prometheus 2.42 the test bed runs and the 3.x gpufleet pins.
promtool 2 is Debian 12's ``/usr/bin/promtool`` (scripts/bootstrap installs it); promtool 3
is sid's package, downloaded and verified by apt (molecule/testbed/debian_suite.py) and
unpacked once under ``.cache/promtool/``. A missing one fails the run: it is not skipped.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import sid_deb
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "roles" / "prometheus" / "files" / "rules"
TESTS_DIR = ROOT / "tests" / "rules"
ALERTS_DOC = ROOT / "docs" / "alerts.md"
RULE_FILES = sorted(RULES_DIR.glob("*.rules.yml"))
TEST_FILES = sorted(TESTS_DIR.glob("*.test.yml"))
GLOBAL_FILE = RULES_DIR / "gpufleet-global.rules.yml"
SHARD_FILES = [f for f in RULE_FILES if f != GLOBAL_FILE]

SEVERITIES = {"critical", "warning", "info"}
RUNBOOK_BASE = "https://github.com/gpufleet/gpufleet/blob/main/docs/alerts.md#"
RECORD_NAME = re.compile(r"^[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*$")
# The global tier's federate job: these match[] selectors must appear verbatim in
# docs/alerts.md (the prometheus role copies them from there).
FEDERATE_MATCH = (
    '{__name__=~"(cluster|rack|partition|gpu_model|slurm_job|slurm_user|slurm_account)'
    ':[a-z0-9_]+:(sum|count|max|sum_rate5m|sum1h)"}',
    '{__name__=~"node:[a-z0-9_]+:[a-z0-9_]+"}',
)
# level:metric:op tokens in PromQL (a recorded series read by another rule).
RECORDED_TOKEN = re.compile(r"(?<![A-Za-z0-9_:])([a-z][a-z0-9_]*:[a-z0-9_]+:[a-z0-9_]+)")


PROMTOOL2 = Path("/usr/bin/promtool")
PROMTOOL_CACHE = ROOT / ".cache" / "promtool"


def _major(promtool: Path) -> int:
    """promtool's major version, from `promtool --version` ("promtool, version 3.5.3+ds1 ...")."""
    result = subprocess.run(
        [str(promtool), "--version"], capture_output=True, text=True, check=False, timeout=60
    )
    match = re.search(r"version (\d+)\.\d+", result.stdout + result.stderr)
    assert match, f"{promtool} --version: {result.stdout}{result.stderr}"
    return int(match.group(1))


def _promtool3() -> Path:
    """sid's promtool, unpacked from its apt-verified .deb into .cache/promtool/<deb name>/."""
    try:
        root = sid_deb.unpacked("promtool", PROMTOOL_CACHE)
    except sid_deb.DebUnavailable as error:
        pytest.fail(
            f"{error}; the rule tests must run under both Prometheus majors, so this fails "
            "rather than skips (needs apt access to a Debian mirror, see "
            "molecule/testbed/debian_suite.py)",
            pytrace=False,
        )
    return root / "usr" / "bin" / "promtool"


@pytest.fixture(scope="session", params=[2, 3], ids=["promtool2", "promtool3"])
def promtool(request: pytest.FixtureRequest) -> Path:
    """The promtool of one Prometheus major; its major is checked, the exact version floats."""
    if request.param == 2:
        if not PROMTOOL2.exists():
            pytest.fail(
                f"promtool 2 missing: {PROMTOOL2} (Debian 12 package prometheus, installed by "
                "scripts/bootstrap)",
                pytrace=False,
            )
        path = PROMTOOL2
    else:
        path = _promtool3()
    major = _major(path)
    assert major == request.param, f"{path} is promtool {major}, expected {request.param}.x"
    return path


def _load(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _rules(path: Path) -> list[dict[str, Any]]:
    return [rule for group in _load(path)["groups"] for rule in group["rules"]]


def _alerts() -> list[tuple[str, dict[str, Any]]]:
    return [(f.name, r) for f in RULE_FILES for r in _rules(f) if "alert" in r]


def _records(files: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    return [(f.name, r) for f in files for r in _rules(f) if "record" in r]


def _alert_tests() -> list[dict[str, Any]]:
    cases = []
    for path in TEST_FILES:
        for test in _load(path).get("tests", []):
            cases.extend(test.get("alert_rule_test") or [])
    return cases


def test_files_exist() -> None:
    assert {f.name for f in RULE_FILES} >= {
        "gpufleet-node.rules.yml",
        "gpufleet-gpu.rules.yml",
        "gpufleet-slurm.rules.yml",
        "gpufleet-prometheus.rules.yml",
        "gpufleet-global.rules.yml",
    }
    assert TEST_FILES, "no promtool test files under tests/rules"


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(promtool: Path, path: Path) -> None:
    result = subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_promtool_test_rules(promtool: Path, path: Path) -> None:
    result = subprocess.run(
        [str(promtool), "test", "rules", path.name],
        capture_output=True,
        text=True,
        check=False,
        cwd=TESTS_DIR,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_test_files_cover_all_rule_files() -> None:
    used = {
        (TESTS_DIR / name).resolve() for path in TEST_FILES for name in _load(path)["rule_files"]
    }
    assert {f.resolve() for f in RULE_FILES} <= used


@pytest.mark.parametrize("name,alert", _alerts(), ids=lambda x: x if isinstance(x, str) else "")
def test_alert_metadata(name: str, alert: dict[str, Any]) -> None:
    alertname = alert["alert"]
    assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", alertname), alertname
    assert alert.get("labels", {}).get("severity") in SEVERITIES, alertname
    annotations = alert.get("annotations", {})
    for key in ("summary", "description", "runbook_url"):
        assert annotations.get(key, "").strip(), f"{name}: {alertname} lacks {key}"
    assert annotations["runbook_url"] == RUNBOOK_BASE + alertname.lower(), alertname


def test_alert_names_unique() -> None:
    names = [a["alert"] for _, a in _alerts()]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_every_alert_has_a_runbook_section() -> None:
    doc = ALERTS_DOC.read_text(encoding="utf-8")
    headings = set(re.findall(r"^### ([A-Za-z0-9]+)\s*$", doc, flags=re.MULTILINE))
    missing = sorted({a["alert"] for _, a in _alerts()} - headings)
    assert not missing, f"docs/alerts.md lacks '### <Alert>' sections for {missing}"


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    firing, quiet = set(), set()
    for case in _alert_tests():
        (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {a["alert"] for _, a in _alerts()}
    assert not names - firing, f"no firing test for {sorted(names - firing)}"
    assert not names - quiet, f"no non-firing test for {sorted(names - quiet)}"
    assert not (firing | quiet) - names, f"tests of unknown alerts {(firing | quiet) - names}"


def test_tested_alert_labels_carry_severity() -> None:
    severity = {a["alert"]: a["labels"]["severity"] for _, a in _alerts()}
    for case in _alert_tests():
        for exp in case.get("exp_alerts") or []:
            assert exp["exp_labels"].get("severity") == severity[case["alertname"]]


def test_gpu_alerts_carry_node_for_inhibition() -> None:
    """NodeDown inhibits GPU alerts by `node`: every GPU alert must keep that label."""
    for case in _alert_tests():
        if case["alertname"].startswith(("Gpu", "Dcgm")):
            for exp in case.get("exp_alerts") or []:
                assert "node" in exp["exp_labels"], case["alertname"]


@pytest.mark.parametrize(
    "name,rule", _records(RULE_FILES), ids=lambda x: x if isinstance(x, str) else ""
)
def test_record_names(name: str, rule: dict[str, Any]) -> None:
    record = rule["record"]
    assert RECORD_NAME.fullmatch(record), f"{name}: {record} is not level:metric:operations"
    assert record.startswith("global_") == (name == GLOBAL_FILE.name), record


def test_record_names_unique() -> None:
    for files in (SHARD_FILES, [GLOBAL_FILE]):
        names = [r["record"] for _, r in _records(files)]
        assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def _federated(name: str) -> bool:
    for selector in FEDERATE_MATCH:
        regex = re.search(r'__name__=~"([^"]+)"', selector)
        assert regex
        if re.fullmatch(regex.group(1), name):
            return True
    return False


def test_federation_match_documented() -> None:
    doc = ALERTS_DOC.read_text(encoding="utf-8")
    for selector in FEDERATE_MATCH:
        assert selector in doc, f"docs/alerts.md must document match[] {selector}"


def test_federation_ships_mergeable_rollups_only() -> None:
    """Shard rollups that are averages or ratios are not federated (they cannot be merged)."""
    for _, rule in _records(SHARD_FILES):
        record = rule["record"]
        if record.split(":")[-1] in ("avg", "ratio", "info") or record.startswith("gpu:"):
            assert not _federated(record) or record.startswith("node:"), record


def test_global_rules_read_only_federated_series() -> None:
    shard_records = {r["record"] for _, r in _records(SHARD_FILES)}
    global_records = {r["record"] for _, r in _records([GLOBAL_FILE])}
    for rule in _rules(GLOBAL_FILE):
        for token in RECORDED_TOKEN.findall(rule["expr"]):
            if token in global_records:
                continue
            assert token in shard_records, f"global rule reads {token}, which no shard records"
            assert _federated(token), f"global rule reads {token}, which is not federated"
