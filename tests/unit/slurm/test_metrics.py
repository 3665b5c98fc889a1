"""Metric values built from the real 22.05 captures; series cap; promtool; stale policy."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from conftest import FILES, FIXTURES, assert_samples, exp, fixture_text, metric_samples, runner_for


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
    assert_samples(
        collect(),
        """
        slurm_up 1
        slurm_info{type="general",version="22.05.8"} 1
        # 3 nodes x 4 GPUs; gpu02 (draining) holds 3, vm holds 3; gpu03 is down*
        slurm_gpus_total 12
        slurm_gpus_alloc 6
        # 4 on down* gpu03 + 1 free on draining gpu02
        slurm_gpus_other 5
        # index 3 on vm
        slurm_gpus_idle 1
        slurm_gpus_utilization 0.5
        slurm_cpus_alloc 4
        slurm_cpus_other 2
        slurm_cpus_total 6
        slurm_nodes_total 3
        slurm_nodes_drain{partition="gpu"} 1
        slurm_nodes_down{partition="gpu"} 1
        slurm_nodes_alloc{partition="gpu"} 1
        slurm_nodes_alloc{partition="debug"} 1
        slurm_nodes_idle{partition="gpu"} 0
        slurm_partition_gpus_allocated{partition="gpu"} 6
        slurm_partition_gpus_idle{partition="gpu"} 1
        slurm_partition_cpus_total{partition="debug"} 2
        slurm_node_gres_used{gres_type="gpu:a100",node="gpu02",partition="gpu",status="draining"} 3
        slurm_node_mem_alloc{node="gpu02",partition="gpu",status="draining"} 600
        """,
    )


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
    assert_samples(
        collect(),
        """
        slurm_jobs_pending 7
        slurm_jobs_running 3
        slurm_jobs_completed 1
        slurm_jobs_failed 1
        slurm_jobs_cancelled 2
        slurm_jobs_cores_running 4
        slurm_queue_pending{partition="gpu",reason="Resources",user="root"} 1
        slurm_queue_pending{partition="gpu",reason="Priority",user="slurm"} 1
        slurm_jobs_pending_by_reason{reason="Dependency"} 1
        slurm_jobs_pending_by_reason{reason="JobHeldUser"} 1
        slurm_partition_jobs_pending{partition="debug"} 3
        slurm_partition_jobs_running{partition="gpu"} 3
        slurm_queue_running{partition="gpu",user="root"} 2
        slurm_account_jobs_running{account="physics"} 2
        slurm_user_cpus_running{user="root"} 3
        """,
    )


def test_gpus_per_job_user_account_2205():
    m = collect()
    job = 'slurm_job_gpus_allocated{account="%s",job_id="%s",node="%s",partition="gpu",user="%s"}'
    assert_samples(
        m,
        f"""
        {job % ("physics", 1, "gpu02", "root")} 2
        {job % ("physics", 6, "gpu02", "root")} 1
        {job % ("physics", 6, "vm", "root")} 1
        {job % ("chem", 7, "vm", "slurm")} 2
        slurm_account_gpus_running{{account="physics"}} 4
        slurm_account_gpus_running{{account="chem"}} 2
        slurm_user_gpus_running{{user="slurm"}} 2
        slurm_exporter_job_series 4
        slurm_exporter_job_series_dropped_total 0
        """,
    )
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


def test_gpu_index_series_are_capped():
    c = exp.Collector(runner=fixture_runner("22.05"), max_gpu_index_series=4)
    m = metric_samples(c.collect().decode())
    idx = [k for k in m if k.startswith("slurm_job_gpu_index_info")]
    assert len(idx) == 4 and m["slurm_exporter_gpu_index_series"] == 4
    assert m["slurm_exporter_gpu_index_series_dropped_total"] == 2  # 6 held
    assert m["slurm_exporter_job_series"] == 4  # the (job, node) pairs are all there
    m = metric_samples(c.collect().decode())
    assert m["slurm_exporter_gpu_index_series_dropped_total"] == 4  # a counter


def test_one_job_cannot_flood_index_series():
    """The reported case: GRES=gpu:1(IDX:0-99999) made 100,006 index series."""
    text = fixture_text("22.05", "scontrol_jobs.txt").replace(
        "GRES=gpu:a100:2(IDX:0-1)", "GRES=gpu:1(IDX:0-99999)"
    )
    c = exp.Collector(runner=runner_for("22.05", texts={"scontrol_jobs": text}))
    body = c.collect().decode()
    m = metric_samples(body)
    assert len(body.splitlines()) < 1000
    assert len([k for k in m if k.startswith("slurm_job_gpu_index_info")]) == 4  # jobs 6, 7
    assert m['slurm_exporter_job_records_rejected{reason="bounds"}'] == 1
    assert m['slurm_exporter_parse_errors_total{command="scontrol_jobs"}'] == 1
    assert m['slurm_exporter_command_success{command="scontrol_jobs"}'] == 1

    # Many jobs with valid indices: the cap holds and the rest is counted.
    line = next(
        x for x in fixture_text("22.05", "scontrol_jobs.txt").splitlines() if "IDX:1-2" in x
    )
    many = "\n".join(
        line.replace("JobId=7 ", f"JobId={n} ")
        .replace("IDX:1-2", "IDX:0-7")
        .replace("gpu:a100:2(", "gpu:a100:8(")
        for n in range(1000, 1200)
    )
    queue = "".join(f"{n}|{n}|RUNNING|gpu|slurm|chem|1|1|None\n" for n in range(1000, 1200))
    run = runner_for("22.05", texts={"scontrol_jobs": many, "squeue": queue})
    m = metric_samples(exp.Collector(runner=run, max_gpu_index_series=100).collect().decode())
    assert m["slurm_exporter_gpu_index_series"] == 100
    assert m["slurm_exporter_gpu_index_series_dropped_total"] == 200 * 8 - 100


def test_forged_text_records_are_not_exported():
    base = fixture_text("22.05", "scontrol_jobs.txt")
    line = next(x for x in base.splitlines() if x.startswith("JobId=7 "))
    forged = line.replace("JobId=7 ", "JobId=4242 ").replace("Nodes=vm", "Nodes=gpu09")
    text = base.replace(
        "StdOut=/tmp/slurmtest/jobs/slurm-7.out", "StdOut=/x\n" + forged.rstrip(), 1
    )
    m = metric_samples(
        exp.Collector(runner=runner_for("22.05", texts={"scontrol_jobs": text})).collect().decode()
    )
    assert not any('node="gpu09"' in k or 'job_id="4242"' in k for k in m)
    assert m['slurm_exporter_job_records_rejected{reason="not_in_squeue"}'] == 1
    assert m['slurm_exporter_job_source_info{source="text"}'] == 1
    assert m["slurm_exporter_job_series"] == 4  # the real jobs are all there


def _json_runner(**kw):
    return runner_for(
        {"*": "22.05", "scontrol_jobs_json": "synthesized-json"},
        texts={"sinfo_version": "slurm 24.11.5\n"},
        **kw,
    )


def test_auto_reads_json_from_2411_on():
    calls: list[str] = []
    c = exp.Collector(runner=_json_runner(calls=calls))
    m = metric_samples(c.collect().decode())
    assert calls[0] == "sinfo_version"  # the version decides the job source, so it goes first
    assert "scontrol_jobs_json" in calls and "scontrol_jobs" not in calls
    assert m['slurm_exporter_job_source_info{source="json"}'] == 1
    assert m['slurm_info{type="general",version="24.11.5"}'] == 1
    # The same allocations as the 22.05 text capture (the JSON fixture mirrors it).
    text = metric_samples(exp.Collector(runner=fixture_runner("22.05")).collect().decode())

    def alloc(x):
        return {k: v for k, v in x.items() if k.startswith(("slurm_job_", "slurm_user_gpus"))}

    assert alloc(m) == alloc(text) and alloc(m)
    assert not any('"victim' in k or "gpu09" in k for k in m)


def test_auto_falls_back_to_text_when_json_fails():
    calls: list[str] = []
    c = exp.Collector(runner=_json_runner(calls=calls, fail={"scontrol_jobs_json": "exit_code"}))
    m = metric_samples(c.collect().decode())
    assert m['slurm_exporter_job_source_info{source="text"}'] == 1
    assert m['slurm_exporter_command_success{command="scontrol_jobs"}'] == 1
    assert m["slurm_exporter_job_series"] == 4
    assert c.json_failed
    calls.clear()
    c.collect()
    assert "scontrol_jobs_json" not in calls  # text from now on


def test_auto_falls_back_to_text_when_json_passes_the_output_bound():
    """Issue 26 finding 3: at ~27,000 jobs the JSON passed the 256 MiB cap and every per-job
    series went, each cycle; auto did not fall back. A small bound stands in for it here."""
    cap = 32 * 1024  # the 24.11 captures: JSON 62 KB, text 7 KB (8.4 KB and ~1 KB a job)
    calls: list[str] = []
    c = exp.Collector(runner=runner_for("24.11", calls=calls), job_max_output=cap)
    m = metric_samples(c.collect().decode())
    text = metric_samples(
        exp.Collector(runner=runner_for("24.11"), job_source="text").collect().decode()
    )
    assert "scontrol_jobs_json" in calls and "scontrol_jobs" in calls
    assert m['slurm_exporter_job_source_info{source="text"}'] == 1
    assert m["slurm_exporter_job_series"] == text["slurm_exporter_job_series"] > 0
    reason = 'command="scontrol_jobs",reason="output_limit"'
    assert m[f"slurm_exporter_command_errors_total{{{reason}}}"] == 1  # counted, and logged
    assert c.json_failed
    # Forced json has no fallback: the bound is an error, and no stale job series.
    c = exp.Collector(runner=runner_for("24.11"), job_source="json", job_max_output=cap)
    m = metric_samples(c.collect().decode())
    assert m['slurm_exporter_command_success{command="scontrol_jobs"}'] == 0
    assert "slurm_exporter_job_series" not in m


def test_job_records_are_parsed_as_they_arrive(tmp_path):
    """The real runner hands scontrol's output over in chunks; nothing holds it whole."""
    text = fixture_text("22.05", "scontrol_jobs.txt")
    chunks: list[bytes] = []
    res = exp.run_command(
        ["cat", str(FIXTURES / "22.05" / "scontrol_jobs.txt")], 5.0, sink=chunks.append
    )
    assert res.error is None and res.stdout == "" and b"".join(chunks) == text.encode()
    big = exp.run_command(
        ["sh", "-c", "yes | head -c 300000"], 5.0, max_output=100000, sink=chunks.append
    )
    assert big.error == "output_limit"
    reader = exp.TextJobReader()
    data = text.encode()
    for i in range(len(data)):  # byte by byte: lines and UTF-8 split anywhere
        reader.feed(data[i : i + 1])
    assert reader.finish()[0] == exp.parse_scontrol_jobs(text)[0]
    doc = fixture_text("24.11", "scontrol_jobs_json.txt").encode()
    json_reader = exp.JsonJobReader()
    for i in range(0, len(doc), 7):
        json_reader.feed(doc[i : i + 7])
    assert json_reader.finish()[0] == exp.parse_scontrol_jobs_json(doc.decode())[0]
    cut = exp.JsonJobReader()
    cut.feed(doc[: len(doc) // 2])
    jobs, bad = cut.finish()
    assert bad == 1 and not jobs and jobs.unusable  # a cut-off table is no table


def test_a_cloned_record_is_settled_by_asking_scontrol_for_that_job():
    """A line break in job 7's StdOut forges a record with all that squeue shows of job 6
    but other GPUs: the collector asks `scontrol show job -d -o 6` and keeps its real one."""
    base = fixture_text("22.05", "scontrol_jobs.txt")
    six = next(x for x in base.split("\n") if x.startswith("JobId=6 "))
    clone = six.replace("Nodes=vm", "Nodes=gpu09").rstrip()
    text = base.replace("StdOut=/tmp/slurmtest/jobs/slurm-7.out", "StdOut=/x\n" + clone, 1)
    plain = runner_for("22.05", texts={"scontrol_jobs": text})
    asked: list[list[str]] = []

    def run(argv, timeout):
        if argv[:-1] == exp.COMMANDS["scontrol_jobs"]:
            asked.append(argv)
            return exp.CommandResult(six + "\n", 0.01, None)
        return plain(argv, timeout)

    m = metric_samples(exp.Collector(runner=run).collect().decode())
    clean = metric_samples(exp.Collector(runner=fixture_runner("22.05")).collect().decode())
    assert asked == [[*exp.COMMANDS["scontrol_jobs"], "6"]]
    assert not any("gpu09" in k for k in m)
    assert {k: v for k, v in m.items() if k.startswith("slurm_job_")} == {
        k: v for k, v in clean.items() if k.startswith("slurm_job_")
    }
    assert m['slurm_exporter_job_records_rejected{reason="duplicate"}'] == 0


def test_asking_for_single_jobs_keeps_within_one_command_timeout():
    """Forged records for many ids cannot stretch the cycle: one timeout for all the asks."""
    base = fixture_text("22.05", "scontrol_jobs.txt")
    lines = [x for x in base.split("\n") if x.startswith("JobId=")]
    text = base + "\n".join(lines) + "\n"  # every id twice
    plain = runner_for("22.05", texts={"scontrol_jobs": text})
    asked: list[str] = []

    def run(argv, timeout):
        if argv[:-1] == exp.COMMANDS["scontrol_jobs"]:
            asked.append(argv[-1])
            time.sleep(0.1)
            return exp.CommandResult("", 0.1, None)
        return plain(argv, timeout)

    start = time.monotonic()
    exp.Collector(runner=run, command_timeout=0.35).collect()
    assert 2 <= len(asked) <= 5 < len(lines)
    assert time.monotonic() - start < 3


def test_forced_job_sources():
    calls: list[str] = []
    c = exp.Collector(runner=_json_runner(calls=calls), job_source="text")
    m = metric_samples(c.collect().decode())
    assert m['slurm_exporter_job_source_info{source="text"}'] == 1 and "scontrol_jobs" in calls
    c = exp.Collector(runner=_json_runner(), job_source="json")
    c.status["sinfo_version"].result = None
    m = metric_samples(c.collect().decode())
    assert m['slurm_exporter_job_source_info{source="json"}'] == 1
    # Forced json does not fall back: a failure is a failure.
    c = exp.Collector(
        runner=_json_runner(fail={"scontrol_jobs_json": "exit_code"}), job_source="json"
    )
    m = metric_samples(c.collect().decode())
    assert m['slurm_exporter_command_errors_total{command="scontrol_jobs",reason="exit_code"}'] == 1
    with pytest.raises(ValueError):
        exp.Collector(job_source="yaml")


def test_2411_captures_auto_json_and_forced_text_agree():
    """Real 24.11: job 4 is bob's with a job name, work dir and comment faking alice's and gpu09."""
    calls: list[str] = []
    auto = metric_samples(exp.Collector(runner=runner_for("24.11", calls=calls)).collect().decode())
    assert "scontrol_jobs_json" in calls
    text = metric_samples(
        exp.Collector(runner=runner_for("24.11"), job_source="text").collect().decode()
    )
    assert auto['slurm_exporter_job_source_info{source="json"}'] == 1
    assert text['slurm_exporter_job_source_info{source="text"}'] == 1

    def per_job(m):
        return {k: v for k, v in m.items() if k.startswith(("slurm_job_", "slurm_user_gpus"))}

    assert per_job(auto) == per_job(text)
    job = (
        'slurm_job_gpus_allocated{account="chem",job_id="4",node="gpufleet-slurm-gpu1",'
        'partition="gpu",user="bob"}'
    )
    assert auto[job] == 1
    assert auto['slurm_job_gpu_index_info{gpu="3",job_id="4",node="gpufleet-slurm-gpu1"}'] == 1
    assert auto['slurm_user_gpus_running{user="alice"}'] == 2
    assert auto['slurm_user_gpus_running{user="bob"}'] == 3
    assert not any("gpu09" in k or "gpu9" in k for k in auto)
    assert not any('partition="debug"' in k for k in per_job(auto))
    assert (
        sum(v for k, v in auto.items() if k.startswith("slurm_job_gpus_allocated"))
        == (auto["slurm_gpus_alloc"])
    )


def test_sdiag_and_sshare_metrics():
    m = collect()
    assert m["slurm_scheduler_last_cycle"] == 94
    assert m["slurm_scheduler_backfill_mean_cycle"] == 254
    assert m["slurm_scheduler_backfilled_jobs_since_start_total"] == 0
    assert m["slurm_scheduler_jobs_submitted"] == 7
    assert m['slurm_rpc_stats{operation="REQUEST_SUBMIT_BATCH_JOB"}'] >= 5
    assert not any(k.startswith("slurm_account_fairshare") for k in m)  # 22.05: no slurmdbd


# squeue lines for the synthesized scontrol records (text records need squeue to agree).
SYNTHESIZED_SQUEUE = (
    "840392|840392|RUNNING|gpu|alice|ml_lab|32|2|None\n"
    "840400|840399_1|RUNNING|gpu|bob|hpc_team|2|1|None\n"
    "840401|840401|RUNNING|mig|4294967294|(null)|1|1|None\n"
)


def test_fairshare_metrics_synthesized():
    sources = {n: "synthesized" for n in ("sshare", "sinfo_nodes", "scontrol_jobs")}
    run = runner_for({"*": "22.05", **sources}, texts={"squeue": SYNTHESIZED_SQUEUE})
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
@pytest.mark.parametrize("fixture_dir", ["22.05", "22.05-after", "synthesized", "24.11"])
def test_promtool_check_metrics(fixture_dir):
    sources = {
        name: fixture_dir if (FIXTURES / fixture_dir / file).exists() else "22.05"
        for name, file in FILES.items()
    }
    run = runner_for({**sources, "scontrol_jobs_json": fixture_dir})
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


def test_a_resumed_node_keeps_its_reason_but_is_no_drain():
    """Slurm 24.11 keeps the last reason on a node resumed from drain (seen live in molecule
    slurm): sinfo shows it, so slurm_node_state_reason_info does, but a node that takes jobs
    has no drain reason."""
    base = fixture_runner("24.11")
    kept = "gpufleet test: fan 3 failed | ticket #42"

    def run(argv: list[str], timeout: float) -> exp.CommandResult:
        result = base(argv, timeout)
        if argv == exp.COMMANDS["sinfo_nodes"]:
            lines = result.stdout.splitlines()
            lines[-1] = lines[-1].rsplit("|", 2)[0] + f"|Unknown|{kept}"
            return exp.CommandResult("\n".join(lines) + "\n", 0.01, None)
        return result

    m = metric_samples(exp.Collector(runner=run).collect().decode())
    key = (
        f'slurm_node_state_reason_info{{node="gpufleet-slurm-gpu2",reason="{kept}",state="mixed"}}'
    )
    assert m[key] == 1
    assert not any(k.startswith("slurm_node_drain_") for k in m)
