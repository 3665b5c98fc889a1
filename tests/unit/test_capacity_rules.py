"""The series budget alert: rendered from the inventory's budget, checked and tested by
both promtool majors, and the role's fallback equals gpufleet's default budget."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from render_role import evaluate, render
from test_rules import promtool  # noqa: F401  (the two-major promtool fixture)

from gpufleet.sizing import BUDGET_WARNING_RATIO, DEFAULT_MAX_SERIES_PER_SHARD

RUNBOOK = "https://github.com/gpufleet/gpufleet/blob/main/docs/alerts.md#prometheusseriesnearbudget"

DESCRIPTION = (
    "Prometheus 10.0.0.1:9091 on mon01 has held more than 80 % of its budget of 1000 head "
    "series for 30 minutes. Add shards (monitoring.shards, then gpufleet plan --diff), or "
    "raise monitoring.max_series_per_shard where the servers have the memory."
)


def head_series(node: str, address: str) -> str:
    return f'prometheus_tsdb_head_series{{job="prometheus", node="{node}", instance="{address}"}}'


# mon01 grows past 800 of its 1,000 series at minute 10; mon02 stays at 790.
PROMTOOL_TEST = {
    "rule_files": ["capacity.rules.yml"],
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                {"series": head_series("mon01", "10.0.0.1:9091"), "values": "500x10 850x60"},
                {"series": head_series("mon02", "10.0.0.2:9091"), "values": "790x70"},
            ],
            "alert_rule_test": [
                {"eval_time": "30m", "alertname": "PrometheusSeriesNearBudget", "exp_alerts": []},
                {
                    "eval_time": "45m",
                    "alertname": "PrometheusSeriesNearBudget",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "severity": "warning",
                                "node": "mon01",
                                "instance": "10.0.0.1:9091",
                            },
                            "exp_annotations": {
                                "summary": "Prometheus 10.0.0.1:9091 holds 850 series, "
                                "over 80 % of its budget",
                                "description": DESCRIPTION,
                                "runbook_url": RUNBOOK,
                            },
                        }
                    ],
                },
            ],
        }
    ],
}


def test_budget_alert_fires_at_80_percent(promtool: Path, tmp_path: Path) -> None:  # noqa: F811
    text = render(
        "prometheus", "capacity.rules.yml.j2", "mon01", {"gpufleet_max_series_per_shard": 1000}
    )
    (tmp_path / "capacity.rules.yml").write_text(text)
    (tmp_path / "capacity.test.yml").write_text(yaml.safe_dump(PROMTOOL_TEST))
    for command in (
        ["check", "rules", "capacity.rules.yml"],
        ["test", "rules", "capacity.test.yml"],
    ):
        result = subprocess.run(
            [str(promtool), *command], capture_output=True, text=True, check=False, cwd=tmp_path
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_threshold_is_the_budget_times_the_warning_ratio() -> None:
    text = render(
        "prometheus", "capacity.rules.yml.j2", "mon01", {"gpufleet_max_series_per_shard": 250_000}
    )
    (rule,) = yaml.safe_load(text)["groups"][0]["rules"]
    assert rule["expr"].split(">")[-1].strip() == str(int(250_000 * BUDGET_WARNING_RATIO))


def test_role_fallback_is_gpufleets_default_budget() -> None:
    """Without the inventory plugin's variable the role uses the same default."""
    inventory = ({"all": ["mon01"], "prometheus": ["mon01"]}, {"mon01": {}})
    value = evaluate("prometheus", "prometheus_max_series | int", "mon01", inventory=inventory)
    assert int(value) == DEFAULT_MAX_SERIES_PER_SHARD  # 2.18 renders text, 2.19+ an int
