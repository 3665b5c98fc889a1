"""``gpufleet jobstats`` and ``gpufleet report idle`` against a real, backfilled Prometheus."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from jobstats_scenario import CPU, GIB, MEM_USED_GIB, SITE_THRESHOLD, UTIL, requeued_runs
from jobstats_synth import Job, free_port, prometheus

from gpufleet.cli import main
from gpufleet.jobstats.discover import find_job
from gpufleet.jobstats.report import FAULT_ADVICE
from gpufleet_node.job_summary.prom import PromClient

Prom = tuple[str, Job, Job]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_job_report_matches_the_known_load(prom: Prom, capsys: pytest.CaptureFixture[str]) -> None:
    url, job, _ = prom
    code, out, err = run(capsys, "jobstats", job.job_id, "--prometheus", url, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["user"], report["account"], report["partition"]) == ("alice", "physics", "gpu")
    assert report["start"] == pytest.approx(job.start, abs=60)
    assert report["end"] == job.end
    assert report["running"] is False
    gpus = {(g["node"], int(g["gpu"])): g for g in report["gpus"]}
    assert set(gpus) == set(UTIL)
    for key, (mean, jitter) in UTIL.items():
        assert gpus[key]["util_mean"] == pytest.approx(mean, abs=0.5), key
        assert gpus[key]["util_max"] == pytest.approx(mean + 2 * jitter), key
        assert gpus[key]["mem_total"] == 80 * GIB
        expected_mem = MEM_USED_GIB.get(key, 1.0) * GIB
        assert gpus[key]["mem_used_max"] == pytest.approx(expected_mem), key
        assert gpus[key]["power_mean"] == pytest.approx(60 + 3 * mean, abs=1.5), key
    assert [g["idle"] for g in report["gpus"]] == [False, False, True, True, False, False]
    nodes = {n["node"]: n for n in report["nodes"]}
    for node, cpu in CPU.items():
        assert nodes[node]["cpu_mean"] == pytest.approx(cpu), node
        assert nodes[node]["cpus"] == 64
    assert nodes["n1"]["gpus_allocated"] == 4
    assert report["verdict"] == "idle GPUs"
    # the threshold is the site's, read from the rules' series (10), not the shipped 5
    assert report["threshold"] == SITE_THRESHOLD and err == ""
    assert "n1: GPUs 2-3 stayed under 10 % utilization for the whole run" in report["advice"]
    assert "request 4 GPUs instead of 6" in report["advice"]
    assert report["missing"] == []
    # n1:0 failed until 2 minutes before the job: not the job's fault
    assert report["faults"] == [] and not any("health check" in a for a in report["advice"])


def test_the_span_ends_at_the_last_sample_between_whole_minutes(prom: Prom) -> None:
    """Seen 10 s after its sample at end - 30 (the scenario's step is 30 s), the job's last
    whole-minute step is end - 60: its span still ends at the last sample (a running job,
    or one that just ended, as when the epilog stores its summary)."""
    url, job, _ = prom
    assert find_job(PromClient(url), job.job_id, 30 * 86400, job.end - 10).end == job.end - 30


def test_a_job_younger_than_the_coarse_step_has_its_span(prom: Prom) -> None:
    """A long lookback is searched at a coarse step first; a job that started after the
    last coarse point has none yet (the demo's jobs, asked about a minute in). Its span is
    still from its first sample to its last, not a range Prometheus refuses."""
    url, job, _ = prom
    coarse = next(c for c in (130, 131, 137) if job.start % c)  # 30 days and a bit
    now = -(-job.start // coarse) * coarse - 1  # before the first coarse point after start
    place = find_job(PromClient(url), job.job_id, coarse * 20_000, now)
    assert place.start == pytest.approx(job.start, abs=30), (place.start, job.start)
    assert place.start <= place.end <= now
    assert place.gpus_allocated


def test_a_finished_job_shorter_than_the_coarse_step_has_its_span(prom: Prom) -> None:
    """A job that ended and lasted less than the coarse step may have no coarse point at
    all (a one-minute job in a 30-day lookback). Here the 2-hour job, with a lookback whose
    coarse step is longer than the job and its 5 minutes of lookback delta, and no coarse
    point between: its span is still from its first sample to its last."""
    url, job, _ = prom
    tail = job.end + 300  # an instant query still sees the last sample until then
    coarse = next(c for c in range(7_600, 20_000, 7) if (job.start - 1) // c == tail // c)
    now = job.end + 3600
    place = find_job(PromClient(url), job.job_id, coarse * 20_000, now)
    assert place.gpus_allocated == {"n1": 4, "n2": 2}
    assert (place.start, place.end) == (pytest.approx(job.start, abs=30), job.end)


def test_text_report_has_bars_and_advice(prom: Prom, capsys: pytest.CaptureFixture[str]) -> None:
    url, job, _ = prom
    code, out, _ = run(capsys, "jobstats", job.job_id, "--prometheus", url, "--stats")
    assert code == 0
    assert "n1:0" in out and "[################....]" in out  # 80 % of 20 columns
    assert "verdict: idle GPUs" in out
    assert "request 4 GPUs instead of 6" in out


def test_running_job(prom: Prom, capsys: pytest.CaptureFixture[str]) -> None:
    url, _, running = prom
    code, out, err = run(capsys, "jobstats", running.job_id, "--prometheus", url, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["running"] is True
    assert report["verdict"] == "good"
    assert [g["util_mean"] for g in report["gpus"]] == [70.0, 70.0]


def test_running_job_reports_the_faults_of_its_gpus_and_node(
    prom: Prom, capsys: pytest.CaptureFixture[str]
) -> None:
    """n2:3 (the job's) fails from hour - 30 min, n2 itself from hour - 15 min for 5
    minutes; n2:1 (not the job's) fails, n2:2 only warns: neither is reported."""
    url, _, running = prom
    hour = running.start + 3600
    code, out, err = run(capsys, "jobstats", running.job_id, "--prometheus", url, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["faults"] == [
        {
            "node": "n2",
            "gpu": "3",
            "check": "xid",
            "reason": "xid79 (fallen off the bus)",
            "first_seen": hour - 1800,
        },
        {
            "node": "n2",
            "gpu": None,
            "check": "gpu_count",
            "reason": "3 of 4 GPUs present",
            "first_seen": hour - 900,
        },
    ]
    assert report["verdict"] == "good" and report["advice"][0] == FAULT_ADVICE
    code, out, err = run(capsys, "jobstats", running.job_id, "--prometheus", url)
    assert code == 0, err
    seen = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(hour - 1800))
    assert (
        f"GPU 3 on n2 faulted during the run: xid79 (fallen off the bus), first seen {seen}"
        in out.splitlines()
    )


def test_requeued_job_reports_its_last_run(prom: Prom, capsys: pytest.CaptureFixture[str]) -> None:
    url, job, _ = prom
    _, second = requeued_runs(job.end + 3600)
    code, out, err = run(capsys, "jobstats", second.job_id, "--prometheus", url, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert [(g["node"], g["gpu"]) for g in report["gpus"]] == [("n2", "0")]
    assert [n["node"] for n in report["nodes"]] == ["n2"]
    assert report["start"] == pytest.approx(second.start, abs=60)
    assert report["end"] == second.end
    assert report["gpus"][0]["util_mean"] == pytest.approx(100.0)
    [gap] = report["missing"]
    assert "came back" in gap and "the figures cover the last run only" in gap


def test_unknown_job_is_one_line(prom: Prom, capsys: pytest.CaptureFixture[str]) -> None:
    url, _, _ = prom
    code, out, err = run(capsys, "jobstats", "999999", "--prometheus", url)
    assert code == 3 and out == ""
    assert err.count("\n") == 1 and "job 999999: unknown" in err


def test_job_outside_the_lookback(prom: Prom, capsys: pytest.CaptureFixture[str]) -> None:
    url, job, _ = prom
    code, _, err = run(capsys, "jobstats", job.job_id, "--prometheus", url, "--lookback", "1h")
    assert code == 3
    assert "raise --lookback or check the retention" in err


def test_idle_report_from_the_recording_rules(
    prom: Prom, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _, _ = prom
    code, out, err = run(capsys, "report", "idle", "--since", "24h", "--prometheus", url, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["threshold"] == SITE_THRESHOLD and err == ""
    # job 4242: 2 idle GPUs for 2 h; bob's hours record 0 and are left out
    assert result["by_user"] == [{"user": "alice", "gpu_hours": pytest.approx(4.0, abs=0.01)}]
    assert result["by_account"] == [
        {"account": "physics", "gpu_hours": pytest.approx(4.0, abs=0.01)}
    ]


@pytest.mark.parametrize(("threshold", "hours"), [("5", 4.0), ("50", 6.0)])
def test_idle_report_with_a_threshold(
    prom: Prom, capsys: pytest.CaptureFixture[str], threshold: str, hours: float
) -> None:
    """Raw per-GPU series at 5-minute steps: n1:2-3 under 5 %, and n2:1 (max 46 %) under 50 %."""
    url, _, _ = prom
    argv = ["report", "idle", "--since", "1d", "--threshold", threshold, "--prometheus", url]
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    by_user = {row["user"]: row["gpu_hours"] for row in json.loads(out)["by_user"]}
    assert by_user == {"alice": pytest.approx(hours, abs=0.35)}


def write_node_list(directory: Path, port_bases: tuple[int, int], monitoring: str) -> None:
    """A node list of the scenario's nodes and two Prometheus hosts, mon1 on 127.0.0.1 and
    mon2 on 127.0.0.2, with these port bases; ``monitoring``: its monitoring keys."""
    (directory / "nodes.gpufleet.yml").write_text(
        f"""plugin: gpufleet
cluster: c1
nodes:
  - hosts: "n[1-2]"
    address: "10.9.0.{{num}}"
    gpu: {{vendor: nvidia, model: H100, count: 4}}
servers:
  - hosts: mon1
    address: 127.0.0.1
    vars: {{prometheus_port_base: {port_bases[0]}}}
  - hosts: mon2
    address: 127.0.0.2
    vars: {{prometheus_port_base: {port_bases[1]}}}
monitoring:
{monitoring}""",
        encoding="utf-8",
    )


def test_shard_down_from_the_inventory(
    prom: Prom, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """shard-0 is the live Prometheus, shard-1 points at a closed port: the report comes
    with one line naming the shard that is down, and a non-zero exit."""
    url, job, _ = prom
    port = int(url.rsplit(":", 1)[1])
    monitoring = '  shards: 2\n  prometheus_hosts: "mon[1-2]"\n  global_hosts: mon1\n'
    write_node_list(tmp_path, (port - 1, free_port() - 2), monitoring)
    code, out, err = run(capsys, "jobstats", job.job_id, "-i", str(tmp_path), "--json")
    assert code == 3, err
    assert out, err
    assert json.loads(out)["verdict"] == "idle GPUs"
    assert err.startswith("gpufleet jobstats: shard-1: no replica answers: http://127.0.0.2:")
    assert err.count("\n") == 1


def test_a_replica_with_an_empty_tsdb_does_not_hide_the_job(
    prom: Prom, capsys: pytest.CaptureFixture[str], tmp_path: Path, prometheus_binary: Path
) -> None:
    """Two replicas of a standalone Prometheus; the first answers from an empty TSDB (as one
    restarted without its data would): the report comes from the one that holds the job."""
    url, job, _ = prom
    with prometheus(prometheus_binary, tmp_path / "empty-tsdb", host="127.0.0.2") as empty:
        # mon2 (127.0.0.2) is the first replica in the role's order: mon[1-2] swapped.
        port_bases = (int(url.rsplit(":", 1)[1]), int(empty.rsplit(":", 1)[1]))
        write_node_list(tmp_path, port_bases, "  prometheus_hosts: [mon2, mon1]\n  replicas: 2\n")
        code, out, err = run(capsys, "jobstats", job.job_id, "-i", str(tmp_path), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["sources"] == [url]
    assert report["verdict"] == "idle GPUs"
