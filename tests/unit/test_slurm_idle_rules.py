"""SlurmJobGpuIdle's threshold and duration are site settings (prometheus role).

The static gpufleet-slurm.rules.yml ships the defaults (5 %, 30m); gpufleet.slurm_idle
(filter gpufleet_slurm_idle_rules) substitutes the site's values. A non-default setting must
change when the alert fires (checked by both promtool majors), the defaults must leave
the file byte for byte as shipped (so tests/rules/ test what is deployed), and the alert
keeps job_id, user, account and partition through every instance's alert relabeling.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from test_prometheus_config import config
from test_rules import promtool  # noqa: F401  (the two-major promtool fixture)

from gpufleet import slurm_idle

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "roles" / "prometheus" / "files" / "rules" / "gpufleet-slurm.rules.yml"
DEFAULTS = ROOT / "roles" / "prometheus" / "defaults" / "main.yml"
OWNER_LABELS = {"job_id", "user", "account", "partition"}


def _rendered(threshold: object, duration: str) -> str:
    return slurm_idle.idle_rules(RULES.read_text(), threshold, duration)


LABELS = 'cluster="c1", node="gpu001"'
# Job 7 holds GPU 0 at 20 % utilization from minute 0 on: idle under a 50 % threshold,
# busy under the default 5 %.
INPUT = [
    {
        "series": f'gpu:utilization_percent:max{{{LABELS}, rack="r1", gpu="0", gpu_model="H100"}}',
        "values": "20x60",
    },
    {"series": f'slurm_job_gpu_index_info{{{LABELS}, job_id="7", gpu="0"}}', "values": "1x60"},
    {
        "series": f'slurm_job_gpus_allocated{{{LABELS}, job_id="7", user="carol", account="chem", '
        'partition="gpu"}',
        "values": "1x60",
    },
    {"series": f'up{{job="node", {LABELS}}}', "values": "1x60"},
    {"series": 'up{job="slurm", cluster="c1", node="slurmctl"}', "values": "1x60"},
]
FIRING = [
    {
        "exp_labels": {
            "severity": "info",
            "cluster": "c1",
            "rack": "r1",
            "node": "gpu001",
            "job_id": "7",
            "user": "carol",
            "account": "chem",
            "partition": "gpu",
        },
        "exp_annotations": {
            "summary": "Job 7 of carol leaves 1 GPU(s) idle on gpu001",
            "description": "Slurm job 7 (user carol, account chem, partition gpu) holds 1 "
            "GPU(s) on node gpu001 that have stayed below 50 % utilization for 10 minutes.",
            "runbook_url": "https://github.com/gpufleet/gpufleet/blob/main/docs/alerts.md#slurmjobgpuidle",
        },
    }
]


def _promtool_test(promtool: Path, tmp_path: Path, rules: str, alerts: list) -> None:  # noqa: F811
    (tmp_path / "slurm.rules.yml").write_text(rules)
    test = {
        "rule_files": ["slurm.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": INPUT, "alert_rule_test": alerts}],
    }
    (tmp_path / "idle.test.yml").write_text(yaml.safe_dump(test))
    for command in (["check", "rules", "slurm.rules.yml"], ["test", "rules", "idle.test.yml"]):
        result = subprocess.run(
            [str(promtool), *command], capture_output=True, text=True, check=False, cwd=tmp_path
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_site_threshold_and_duration_change_when_it_fires(promtool: Path, tmp_path: Path) -> None:  # noqa: F811
    alerts = [
        {"eval_time": "9m", "alertname": "SlurmJobGpuIdle", "exp_alerts": []},
        {"eval_time": "12m", "alertname": "SlurmJobGpuIdle", "exp_alerts": FIRING},
    ]
    _promtool_test(promtool, tmp_path, _rendered(50, "10m"), alerts)


def test_recorded_threshold_follows_the_setting(promtool: Path, tmp_path: Path) -> None:  # noqa: F811
    """What jobstats and the dashboards read: the site's threshold, not the shipped 5."""
    (tmp_path / "slurm.rules.yml").write_text(_rendered(12.5, "2h"))
    test = {
        "rule_files": ["slurm.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": INPUT,
                "promql_expr_test": [
                    {
                        "expr": "gpufleet:slurm_idle_gpu_threshold:percent",
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": "gpufleet:slurm_idle_gpu_threshold:percent", "value": 12.5}
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "threshold.test.yml").write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [str(promtool), "test", "rules", "threshold.test.yml"],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_threshold_leaves_a_20_percent_gpu_alone(promtool: Path, tmp_path: Path) -> None:  # noqa: F811
    alerts = [{"eval_time": "50m", "alertname": "SlurmJobGpuIdle", "exp_alerts": []}]
    _promtool_test(promtool, tmp_path, _rendered(5, "30m"), alerts)


def test_idle_count_follows_the_settings() -> None:
    text = _rendered(12.5, "2h")
    rules = {
        r.get("record") or r["alert"]: r for g in yaml.safe_load(text)["groups"] for r in g["rules"]
    }
    assert "[2h]) < 12.5)" in rules["slurm_job:gpus_allocated_idle:count"]["expr"]
    assert rules["gpufleet:slurm_idle_gpu_threshold:percent"]["expr"] == "vector(12.5)"
    assert rules["SlurmJobGpuIdle"]["for"] == "2h"
    assert "< 12.5" in rules["SlurmJobGpuIdle"]["expr"]
    assert (
        "below 12.5 % utilization for 2 hours"
        in rules["SlurmJobGpuIdle"]["annotations"]["description"]
    )


def test_defaults_deploy_the_file_as_shipped() -> None:
    defaults = yaml.safe_load(DEFAULTS.read_text())
    threshold = defaults["prometheus_slurm_idle_gpu_threshold_percent"]
    duration = defaults["prometheus_slurm_idle_gpu_duration"]
    assert _rendered(threshold, duration) == RULES.read_text()


@pytest.mark.parametrize(
    "threshold,duration",
    [
        (0, "30m"),
        (101, "30m"),
        ("5; drop", "30m"),
        (5, "30m\nfor: 0s"),
        (5, "0m"),
        (5, "30"),
        (5, "1h30m"),
    ],
)
def test_hostile_or_invalid_settings_are_refused(threshold: object, duration: str) -> None:
    with pytest.raises(ValueError):
        _rendered(threshold, duration)


@pytest.mark.parametrize("mode", ["standalone", "shard", "global"])
def test_alert_relabeling_keeps_the_owner_labels(mode: str) -> None:
    """No alert_relabel_config of any instance drops or rewrites the owner labels."""
    for rule in config(mode)["alerting"].get("alert_relabel_configs", []):
        action = rule.get("action", "replace")
        if action in ("labeldrop", "labelkeep"):
            kept = {label for label in OWNER_LABELS if re.fullmatch(rule["regex"], label)}
            assert (kept == set()) if action == "labeldrop" else kept == OWNER_LABELS, rule
        else:
            assert rule.get("target_label") not in OWNER_LABELS, rule
            assert action in ("replace", "keep", "drop"), rule
            if action in ("keep", "drop"):
                assert "SlurmJobGpuIdle" not in str(rule.get("regex")), rule
