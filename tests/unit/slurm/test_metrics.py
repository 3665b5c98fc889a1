"""Metric values built from the real 22.05 captures; series cap; promtool; stale policy."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import FILES, FIXTURES, exp, fixture_text, metric_samples


def fixture_runner(fixture_dir: str, fail: dict[str, str] | None = None):
    """A runner for Collector that answers each command from a capture directory."""
    by_argv = {tuple(argv): name for name, argv in exp.COMMANDS.items()}
    fail = fail or {}

    def run(argv: list[str], timeout: float) -> exp.CommandResult:
        name = by_argv[tuple(argv)]
        if name in fail:
            return exp.CommandResult("", 0.01, fail[name])
        return exp.CommandResult(fixture_text(fixture_dir, FILES[name]), 0.01, None)

    return run


def collect(fixture_dir: str = "22.05", **kw) -> dict[str, float]:
    c = exp.Collector(runner=fixture_runner(fixture_dir), **kw)
    return metric_samples(c.collect().decode())


def test_cluster_gpu_cpu_node_totals_2205():
    m = collect()
    assert m["slurm_up"] == 1
    assert m['slurm_info{type="general",version="22.05.8"}'] == 1
    # 3 nodes x 4 GPUs; gpu02 (draining) holds 3, vm holds 3; gpu03 is down*
    assert m["slurm_gpus_total"] == 12
    assert m["slurm_gpus_alloc"] == 6
    assert m["slurm_gpus_other"] == 5  # 4 on down* gpu03 + 1 free on draining gpu02
    assert m["slurm_gpus_idle"] == 1  # index 3 on vm
    assert m["slurm_gpus_utilization"] == 0.5
    assert (m["slurm_cpus_alloc"], m["slurm_cpus_other"], m["slurm_cpus_total"]) == (4, 2, 6)
    assert m["slurm_nodes_total"] == 3
    assert m['slurm_nodes_drain{partition="gpu"}'] == 1
    assert m['slurm_nodes_down{partition="gpu"}'] == 1
    assert m['slurm_nodes_alloc{partition="gpu"}'] == 1
    assert m['slurm_nodes_alloc{partition="debug"}'] == 1
    assert m['slurm_nodes_idle{partition="gpu"}'] == 0
    assert m['slurm_partition_gpus_allocated{partition="gpu"}'] == 6
    assert m['slurm_partition_gpus_idle{partition="gpu"}'] == 1
    assert m['slurm_partition_cpus_total{partition="debug"}'] == 2
    assert (
        m[
            'slurm_node_gres_used{gres_type="gpu:a100",node="gpu02",partition="gpu",status="draining"}'
        ]
        == 3
    )
    assert m['slurm_node_mem_alloc{node="gpu02",partition="gpu",status="draining"}'] == 600


def test_node_reasons_2205():
    m = collect()
    key = (
        'slurm_node_state_reason_info{node="gpu02",'
        'reason="XID 79: GPU fell off the bus, ticket #123 | check",state="draining"}'
    )
    assert m[key] == 1
    assert (
        m[
            'slurm_node_state_reason_info{node="gpu03",'
            'reason="power supply replaced, awaiting burn-in",state="down*"}'
        ]
        == 1
    )
    assert 'slurm_node_drain_since_timestamp_seconds{node="gpu02"}' in m
    assert not any(k.startswith('slurm_node_state_reason_info{node="vm"') for k in m)
    after = collect("22.05-after")
    assert any('node="gpu02"' in k and 'state="drained"' in k for k in after)


def test_jobs_by_state_partition_reason_2205():
    m = collect()
    assert m["slurm_jobs_pending"] == 7
    assert m["slurm_jobs_running"] == 3
    assert m["slurm_jobs_completed"] == 1
    assert m["slurm_jobs_failed"] == 1
    assert m["slurm_jobs_cancelled"] == 2
    assert m["slurm_jobs_cores_running"] == 4
    assert m['slurm_queue_pending{partition="gpu",reason="Resources",user="root"}'] == 1
    assert m['slurm_queue_pending{partition="gpu",reason="Priority",user="slurm"}'] == 1
    assert m['slurm_jobs_pending_by_reason{reason="Dependency"}'] == 1
    assert m['slurm_jobs_pending_by_reason{reason="JobHeldUser"}'] == 1
    assert m['slurm_partition_jobs_pending{partition="debug"}'] == 3
    assert m['slurm_partition_jobs_running{partition="gpu"}'] == 3
    assert m['slurm_queue_running{partition="gpu",user="root"}'] == 2
    assert m['slurm_account_jobs_running{account="physics"}'] == 2
    assert m['slurm_user_cpus_running{user="root"}'] == 3


def test_gpus_per_job_user_account_2205():
    m = collect()
    job = (
        "slurm_job_gpus_allocated"
        '{{account="{a}",job_id="{j}",node="{n}",partition="gpu",user="{u}"}}'
    )
    assert m[job.format(a="physics", j="1", n="gpu02", u="root")] == 2
    assert m[job.format(a="physics", j="6", n="gpu02", u="root")] == 1
    assert m[job.format(a="physics", j="6", n="vm", u="root")] == 1
    assert m[job.format(a="chem", j="7", n="vm", u="slurm")] == 2
    assert sum(v for k, v in m.items() if k.startswith("slurm_job_gpus_allocated")) == 6
    idx = {k for k in m if k.startswith("slurm_job_gpu_index_info")}
    assert idx == {
        'slurm_job_gpu_index_info{gpu="0",job_id="1",node="gpu02"}',
        'slurm_job_gpu_index_info{gpu="1",job_id="1",node="gpu02"}',
        'slurm_job_gpu_index_info{gpu="2",job_id="6",node="gpu02"}',
        'slurm_job_gpu_index_info{gpu="0",job_id="6",node="vm"}',
        'slurm_job_gpu_index_info{gpu="1",job_id="7",node="vm"}',
        'slurm_job_gpu_index_info{gpu="2",job_id="7",node="vm"}',
    }
    assert m['slurm_account_gpus_running{account="physics"}'] == 4
    assert m['slurm_account_gpus_running{account="chem"}'] == 2
    assert m['slurm_user_gpus_running{user="slurm"}'] == 2
    assert m["slurm_exporter_job_series"] == 4
    assert m["slurm_exporter_job_series_dropped_total"] == 0


def test_job_series_cap():
    c = exp.Collector(runner=fixture_runner("22.05"), max_job_series=2)
    m = metric_samples(c.collect().decode())
    jobs = {k for k in m if k.startswith("slurm_job_gpus_allocated")}
    # lowest job ids first: job 1 on gpu02, job 6 on gpu02
    assert len(jobs) == 2 and all('node="gpu02"' in k for k in jobs)
    assert m["slurm_exporter_job_series_dropped_total"] == 2
    assert m["slurm_exporter_job_series"] == 2
    assert not any('job_id="7"' in k for k in m if k.startswith("slurm_job_gpu_index_info"))
    # per-account totals are not capped
    assert m['slurm_account_gpus_running{account="chem"}'] == 2
    m = metric_samples(c.collect().decode())
    assert m["slurm_exporter_job_series_dropped_total"] == 4  # a counter


def test_sdiag_and_sshare_metrics():
    m = collect()
    assert m["slurm_scheduler_last_cycle"] == 94
    assert m["slurm_scheduler_backfill_mean_cycle"] == 254
    assert m["slurm_scheduler_backfilled_jobs_since_start_total"] == 0
    assert m["slurm_scheduler_jobs_submitted"] == 7
    assert m['slurm_rpc_stats{operation="REQUEST_SUBMIT_BATCH_JOB"}'] >= 5
    assert not any(k.startswith("slurm_account_fairshare") for k in m)  # 22.05: no slurmdbd


def test_fairshare_metrics_synthesized():
    def run(argv, timeout):
        name = {tuple(v): k for k, v in exp.COMMANDS.items()}[tuple(argv)]
        src = "synthesized" if name in ("sshare", "sinfo_nodes", "scontrol_jobs") else "22.05"
        return exp.CommandResult(fixture_text(src, FILES[name]), 0.0, None)

    m = metric_samples(exp.Collector(runner=run).collect().decode())
    assert m['slurm_account_fairshare{account="account_a"}'] == 0.6
    assert m['slurm_user_fairshare{account="account_a",user="user2"}'] == 0.8
    assert (
        m['slurm_user_fairshare_raw_usage_cpu_seconds{account="account_b",user="user4"}'] == 10000
    )
    assert 'slurm_user_fairshare_raw_shares{account="account_b",user="user4"}' not in m
    assert (
        m[
            'slurm_job_gpus_allocated{account="ml_lab",job_id="840392",node="dgx-48",partition="gpu",user="alice"}'
        ]
        == 4
    )
    assert (
        m['slurm_node_gres_total{gres_type="gpu:model_b",node="g2",partition="gpu",status="mixed"}']
        == 2
    )


def test_command_failure_keeps_last_values_marked_down_and_drops_job_series():
    runner_ok = fixture_runner("22.05")
    fail = {n: "exit_code" for n in ("sinfo_nodes", "squeue", "scontrol_jobs", "sdiag", "sshare")}
    runner_down = fixture_runner("22.05", fail=fail)
    current = {"r": runner_ok}
    c = exp.Collector(runner=lambda a, t: current["r"](a, t), max_stale=300)
    assert metric_samples(c.collect().decode())["slurm_up"] == 1
    current["r"] = runner_down
    m = metric_samples(c.collect().decode())
    assert m["slurm_up"] == 0
    assert m["slurm_gpus_alloc"] == 6  # last good value, within --max-stale
    assert m["slurm_jobs_pending"] == 7
    assert not any(k.startswith("slurm_job_gpus_allocated") for k in m)  # never stale
    assert not any(k.startswith("slurm_job_gpu_index_info") for k in m)
    assert m['slurm_exporter_command_errors_total{command="squeue",reason="exit_code"}'] == 1
    assert m['slurm_exporter_command_success{command="squeue"}'] == 0
    assert m['slurm_exporter_command_success{command="sinfo_version"}'] == 1
    c.max_stale = 0
    m = metric_samples(c.collect().decode())
    assert m["slurm_up"] == 0
    assert "slurm_gpus_alloc" not in m and "slurm_jobs_pending" not in m
    assert m['slurm_exporter_command_errors_total{command="squeue",reason="exit_code"}'] == 2


def test_parse_failure_is_an_error_not_a_crash():
    def run(argv, timeout):
        return exp.CommandResult("garbage\nmore garbage\n", 0.0, None)

    m = metric_samples(exp.Collector(runner=run).collect().decode())
    assert m["slurm_up"] == 0
    assert m['slurm_exporter_command_errors_total{command="sinfo_nodes",reason="parse"}'] == 1
    assert m['slurm_exporter_parse_errors_total{command="squeue"}'] == 2


def test_runner_exception_does_not_escape():
    def run(argv, timeout):
        raise RuntimeError("boom")

    m = metric_samples(exp.Collector(runner=run).collect().decode())
    assert m["slurm_up"] == 0
    assert m['slurm_exporter_command_errors_total{command="sdiag",reason="exec_error"}'] == 1


def test_label_escaping():
    fam = exp.Family("x_info", "gauge", "help")
    fam.set(1, reason='a "quoted"\\ value\nnext')
    assert (
        exp.render([fam]).splitlines()[-1] == 'x_info{reason="a \\"quoted\\"\\\\ value\\nnext"} 1'
    )


# Names kept for dashboard compatibility (vpenso/SckyzO) that promtool's lint flags because
# they are gauges ending in _total. Nothing else may be flagged.
COMPAT_TOTAL_GAUGES = {
    "slurm_cpus_total",
    "slurm_gpus_total",
    "slurm_node_cpu_total",
    "slurm_node_gres_total",
    "slurm_node_mem_total",
    "slurm_nodes_total",
    "slurm_partition_cpus_total",
}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
@pytest.mark.parametrize("fixture_dir", ["22.05", "22.05-after", "synthesized"])
def test_promtool_check_metrics(fixture_dir):
    def run(argv, timeout):
        name = {tuple(v): k for k, v in exp.COMMANDS.items()}[tuple(argv)]
        path = FIXTURES / fixture_dir / FILES[name]
        if not path.exists():
            path = FIXTURES / "22.05" / FILES[name]
        return exp.CommandResult(path.read_text(), 0.0, None)

    body = exp.Collector(runner=run).collect()
    proc = subprocess.run(
        ["promtool", "check", "metrics"], input=body, capture_output=True, timeout=60
    )
    out = (proc.stdout + proc.stderr).decode()
    problems = [line for line in out.splitlines() if line.strip()]
    for line in problems:
        name, _, msg = line.partition(" ")
        assert name in COMPAT_TOTAL_GAUGES and '"_total" suffix' in msg, line
    assert proc.returncode in (0, 3), out  # 3 = lint problems only, 1 = unparsable
