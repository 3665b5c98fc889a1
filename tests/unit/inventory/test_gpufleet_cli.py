"""``gpufleet plan`` and ``gpufleet plan --diff``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from inventory_helpers import REPO_ROOT, SRC, minimal_node_list, write_node_list

from gpufleet.cli import main

EXAMPLE = REPO_ROOT / "inventories" / "example"


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def node_list_with(directory: Path, **monitoring: int) -> Path:
    """The minimal node list with these ``monitoring`` settings, written to ``directory``."""
    data = minimal_node_list()
    data["monitoring"].update(monitoring)
    return write_node_list(directory, data)


def test_plan_prints_the_shard_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "plan", str(EXAMPLE))
    assert code == 0
    assert "cluster hpc-a: 66 hosts, 304 GPUs" in out
    assert "shard   hosts    gpus       series   share" in out
    assert "imbalance:" in out and "limit 1.05, ok" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "plan", str(EXAMPLE / "nodes.gpufleet.yml"), "--json")
    report = json.loads(out)
    assert code == 0
    assert report["shards"] == 2 and len(report["shard_table"]) == 2
    assert sum(row["hosts"] for row in report["shard_table"]) == report["hosts"] == 66
    assert report["assignment"]["gpu001"] == 0  # pinned
    assert report["imbalance"] <= 1.05


def test_plan_reports_the_series_budget(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "plan", str(EXAMPLE))
    assert code == 0
    from gpufleet.sizing import DEFAULT_MAX_SERIES_PER_SHARD, PROMETHEUS_2_MAX_SERIES_PER_SHARD

    assert f"series budget per shard: {DEFAULT_MAX_SERIES_PER_SHARD:,} (heaviest shard " in out
    assert (
        "(the Prometheus 3.x default; servers on 2.x: "
        f"max_series_per_shard: {PROMETHEUS_2_MAX_SERIES_PER_SHARD})"
    ) in out
    assert "WARNING" not in out


def test_plan_warns_for_each_shard_over_the_budget(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = node_list_with(tmp_path, max_series_per_shard=1000)
    code, out, _ = run_main(capsys, "plan", str(path))
    assert code == 0  # a warning: the plan is still valid
    warnings = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 2, out
    assert warnings[0].startswith("WARNING: shard 0 expects ")
    assert "over the budget of 1,000 (monitoring.max_series_per_shard)" in warnings[0]
    assert max(len(line) for line in out.splitlines() if not line.startswith("WARNING")) <= 80
    _, out, _ = run_main(capsys, "plan", str(path), "--json")
    report = json.loads(out)
    assert report["over_budget"] == [0, 1] and report["max_series_per_shard"] == 1000


def test_plan_warns_for_a_shard_with_more_gpus_than_measured(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Each shard holds 2 of the 8-GPU nodes: 16 GPUs, at the limit of 16.
    _, out, _ = run_main(capsys, "plan", str(node_list_with(tmp_path, max_gpus_per_shard=16)))
    assert "WARNING" not in out
    path = node_list_with(tmp_path, max_gpus_per_shard=15)
    code, out, _ = run_main(capsys, "plan", str(path))
    assert code == 0
    warnings = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert warnings == [
        f"WARNING: shard {k} holds 16 GPUs, over the limit of 15 (monitoring.max_gpus_per_shard, "
        "the largest shard whose rule evaluation was measured): add shards"
        for k in (0, 1)
    ], out
    _, out, _ = run_main(capsys, "plan", str(path), "--json")
    report = json.loads(out)
    assert report["over_gpu_limit"] == [0, 1] and report["max_gpus_per_shard"] == 15


def test_the_default_gpu_limit_is_the_largest_shard_the_benchmark_ran() -> None:
    from gpufleet.sizing import DEFAULT_MAX_GPUS_PER_SHARD

    assert DEFAULT_MAX_GPUS_PER_SHARD == 1000 * 8  # bench/shard_scale_bench.py --nodes 1000


def test_plan_shards_override(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(capsys, "plan", str(EXAMPLE), "--shards", "4", "--json")
    assert len(json.loads(out)["shard_table"]) == 4


def test_diff_shows_moves_additions_and_removals(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    old = write_node_list(tmp_path, minimal_node_list(), "old.gpufleet.yml")
    data = minimal_node_list()
    data["monitoring"]["shards"] = 3
    data["nodes"][0]["hosts"] = "gpu[001-003,005-006]"
    new = write_node_list(tmp_path, data, "new.gpufleet.yml")
    code, out, _ = run_main(capsys, "plan", "--diff", str(old), str(new), "--json")
    report = json.loads(out)
    assert code == 0
    assert {a["host"] for a in report["added"]} == {"gpu005", "gpu006"}
    assert [r["host"] for r in report["removed"]] == ["gpu004"]
    assert all(m["from"] != m["to"] for m in report["moved"])
    code, text, _ = run_main(capsys, "plan", "--diff", str(old), str(new))
    assert "2 added, 1 removed" in text and "added:" in text and "removed:" in text


def test_diff_of_identical_lists_moves_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(capsys, "plan", "--diff", str(EXAMPLE), str(EXAMPLE))
    assert "0 host(s) move (0.0% of the hosts in both), 0 added, 0 removed" in out


def test_bad_node_list_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = node_list_with(tmp_path, shards=0)
    code, out, err = run_main(capsys, "plan", str(path))
    assert code == 2 and out == ""
    assert err == f"gpufleet: {path}: monitoring.shards: must be an integer >= 1, got 0\n"


def test_directory_without_node_list_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_main(capsys, "plan", str(tmp_path))
    assert code == 2 and "no *.gpufleet.yml files found" in err


def test_python_dash_m_works() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet", "plan", str(EXAMPLE)],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "cluster hpc-a" in result.stdout
