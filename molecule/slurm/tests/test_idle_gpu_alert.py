"""The two real jobs end to end (converge.yml, prepare.yml): the idle-GPU alert while they
run, and their stored summaries once they have ended.

Two real jobs of two users: alice's on gpufleet-slurm-gpu1, whose nvidia-smi double
serves its load capture (100 % on every GPU), and bob's on gpufleet-slurm-gpu2, whose
double serves its idle capture (0 %); the double answers per node, not per GPU index.
The controller's Prometheus joins the Slurm exporter's job GPUs to the collector's
utilization; after the 1m idle duration the alert fires for bob's job only, and
Alertmanager mails bob@example.org once (the owner template) and sends the admins one
digest. This file runs before test_slurm_exporter.py, on an empty cluster, so the
digest group is new (its interval is an hour) and no earlier idle job has mailed.

When the jobs end, slurmctld runs the slurm_exporter role's job summary program
(slurm.conf's EpilogSlurmctld), which stores each job's GF1 summary in its AdminComment.
The test bed has no slurmdbd (so no sacct): AdminComment is read with scontrol, which
keeps ended jobs for MinJobAge (600 s). `gpufleet jobstats` runs here, on the Ansible
controller, against the scenario's Prometheus; the jobs' series are then deleted with
Prometheus' admin API (enabled in converge.yml) and the report comes from the summary.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest
from testbed_helpers import eventually, host_address

from gpufleet_node.job_summary.summary import decode

testinfra_hosts = ["gpufleet-slurmctl"]

PROMETHEUS = "http://127.0.0.1:9090"
ALERTMANAGER = "http://127.0.0.1:9093"
# prepare.yml's sinks.
MAILS = "/var/log/gpufleet-test-mail.jsonl"
DIGESTS = "/var/log/gpufleet-test-webhook.jsonl"
CONF = "/etc/fake-nvidia-smi.conf"
APPS = "/run/fake-nvidia-smi/apps"
BUSY_NODE, IDLE_NODE = "gpufleet-slurm-gpu1", "gpufleet-slurm-gpu2"
JOB = "srun /usr/local/bin/gpufleet-test-gpu-job 900"
# converge.yml: 1m idle duration, 3 s scrape and evaluation, 5 s collectors; the
# alert fires at about 70 s after the jobs start and Alertmanager waits 1 s.
FIRES_WITHIN = 150
MIB = 1048576
# What a stored figure is, as docs/jobstats.md defines it: over the job's span, ending at
# its end, on the recording rules. The test's own statement, not the program's table.
GPU_FIGURES = {
    "util_mean": "avg_over_time(gpu:utilization_percent:max{%s}[%ds])",
    "util_max": "max_over_time(gpu:utilization_percent:max{%s}[%ds])",
    "mem_used_max": "max_over_time(gpu:memory_used_bytes:sum{%s}[%ds])",
    "mem_total": "max_over_time(gpu:memory_total_bytes:sum{%s}[%ds])",
    "power_mean": "avg_over_time(gpu:power_draw_watts:max{%s}[%ds])",
    "power_max": "max_over_time(gpu:power_draw_watts:max{%s}[%ds])",
}
NODE_FIGURES = {
    "cpu_mean": "avg_over_time(node:cpu_utilization:ratio{%s}[%ds])",
    "cpu_max": "max_over_time(node:cpu_utilization:ratio{%s}[%ds])",
    "mem_max": "max_over_time(node:memory_utilization:ratio{%s}[%ds])",
    "mem_total": "max_over_time(node:memory_total_bytes:sum{%s}[%ds])",
    "cpus": "max_over_time(node:cpus:count{%s}[%ds])",
}


def query(ctl, promql: str, at: float | None = None) -> list[dict]:
    """An instant query, from here: the figures take dozens, one command on a host each."""
    params = {"query": promql} | ({"time": str(at)} if at is not None else {})
    url = f"http://{host_address(ctl)}:9090/api/v1/query?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)["data"]["result"]


def log_lines(ctl, path: str) -> list[dict]:
    text = ctl.run(f"cat {path}").stdout  # absent until the first delivery
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def submit(ctl, user: str, account: str, node: str) -> str:
    cmd = ["sbatch", "--parsable", "--chdir=/tmp", "-o", "/dev/null", "-J", "gpufleet-idle",
           f"--account={account}", "-p", "gpu", "-w", node, "--gres=gpu:a100:2",
           "--wrap", JOB]  # fmt: skip
    return ctl.check_output(f"runuser -u {user} -- {shlex.join(cmd)}").split(";")[0]


def set_state(node, state: str) -> None:
    node.check_output(f"sed -i 's/^STATE=.*/STATE={state}/' {CONF}")


def active(ctl, states: str = "PD,R,CG") -> set[str]:
    return set(ctl.check_output(f"squeue -h -t {states} -o %A").split())


def end_jobs(ctl, jobs) -> None:
    if jobs:
        ctl.run(f"scancel {' '.join(jobs)}")
        assert eventually(lambda: not active(ctl) & set(jobs), 60), "the test jobs did not end"


def node_utilization(ctl, node: str) -> list[float]:
    found = query(ctl, f'gpu:utilization_percent:max{{node="{node}"}}')
    return sorted(float(series["value"][1]) for series in found)


@pytest.fixture(scope="module")
def jobs(ctl, gpu_nodes):
    """alice's busy job and bob's idle one, running; cancelled, the doubles reset, after."""
    assert eventually(lambda: ctl.run(f"curl -fsS {PROMETHEUS}/-/ready").rc == 0, 60)
    set_state(gpu_nodes[BUSY_NODE], "load")
    submitted: list[str] = []
    try:
        # The double's load reaches Prometheus before the job starts, so the busy job's
        # whole span is at load and its figures are the double's, not a mix.
        loaded = eventually(lambda: node_utilization(ctl, BUSY_NODE) == [100.0] * 4, 30)
        assert loaded, node_utilization(ctl, BUSY_NODE)
        submitted.append(submit(ctl, "alice", "physics", BUSY_NODE))
        submitted.append(submit(ctl, "bob", "chem", IDLE_NODE))
        running = eventually(lambda: active(ctl, "R") >= set(submitted), 60)
        assert running, ctl.check_output("squeue")
        yield tuple(submitted)
    finally:
        try:
            end_jobs(ctl, submitted)
        finally:
            set_state(gpu_nodes[BUSY_NODE], "idle")
            for node in gpu_nodes.values():
                node.check_output(f": > {APPS}")


def test_idle_job_alerts_its_owner_once_and_the_admins_in_one_digest(ctl, jobs):
    busy, idle = jobs
    assert eventually(lambda: ctl.run(f"curl -fsS {ALERTMANAGER}/-/ready").rc == 0, 60)
    # Nothing was delivered before: the jobs are the first of the cluster.
    mails_before, digests_before = len(log_lines(ctl, MAILS)), len(log_lines(ctl, DIGESTS))

    # Prometheus sees each job's own two GPUs at the double's load: the join of
    # Slurm's GPU index to the device works, so the alert below is not vacuous.
    def per_job() -> dict[str, list[float]] | None:
        found: dict[str, list[float]] = {}
        for series in query(ctl, "slurm_job_gpu:gpu_utilization_percent:max"):
            found.setdefault(series["metric"]["job_id"], []).append(float(series["value"][1]))
        want = {busy: [100.0, 100.0], idle: [0.0, 0.0]}
        return found if {k: sorted(v) for k, v in found.items()} == want else None

    assert eventually(per_job, 60, interval=2), query(
        ctl, "slurm_job_gpu:gpu_utilization_percent:max"
    )

    def delivered() -> tuple[list[dict], list[dict]] | None:
        mails, digests = (
            log_lines(ctl, MAILS)[mails_before:],
            log_lines(ctl, DIGESTS)[digests_before:],
        )
        return (mails, digests) if mails and digests else None

    assert eventually(delivered, FIRES_WITHIN, interval=2), "no owner mail or digest"
    firing = [
        alert
        for alert in json.loads(ctl.check_output(f"curl -fsS {PROMETHEUS}/api/v1/alerts"))["data"][
            "alerts"
        ]
        if alert["labels"]["alertname"] == "SlurmJobGpuIdle"
    ]
    assert len(firing) == 1, firing
    (alert,) = firing
    assert alert["state"] == "firing"
    labels = alert["labels"]
    assert (labels["job_id"], labels["user"], labels["account"], labels["partition"]) == (
        idle, "bob", "chem", "gpu",
    )  # fmt: skip
    assert labels["node"] == IDLE_NODE
    assert float(alert["value"]) == 2  # both GPUs of the job

    # Duplicates would come in the same flush or at the next evaluations.
    ctl.run("sleep 10")
    mails, digests = delivered() or ([], [])
    assert [mail["rcpt"] for mail in mails] == [["<bob@example.org>"]], mails
    # Subject: [FIRING:1] <group labels by name: alertname cluster job_id user> (...)
    subject = re.search(r"^Subject: (.*(?:\n[ \t].*)*)", mails[0]["data"], re.MULTILINE)
    assert subject, mails[0]["data"][:2000]
    assert re.search(rf"SlurmJobGpuIdle\s+slurmlab\s+{idle}\s+bob\b", subject.group(1))
    (digest,) = digests
    payload = digest["payload"]
    assert payload["groupLabels"] == {"alertname": "SlurmJobGpuIdle", "cluster": "slurmlab"}
    assert [a["labels"]["job_id"] for a in payload["alerts"]] == [idle]
    assert payload["alerts"][0]["labels"]["user"] == "bob"


# ------------------------------------------------- summaries after the jobs end


def admin_comment(ctl, job: str) -> str:
    (record,) = json.loads(ctl.check_output(f"scontrol show job {job} --json"))["jobs"]
    return record.get("admin_comment") or ""


def jobstats(*args: str) -> subprocess.CompletedProcess:
    """`gpufleet jobstats` on this Ansible controller, as an admin runs it."""
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", "jobstats", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def report(*args: str) -> dict:
    done = jobstats(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def double_gpus(node) -> dict[str, dict[str, float]]:
    """The figures the node's nvidia-smi double serves now, per GPU index."""
    fields = "index,utilization.gpu,memory.used,memory.total,power.draw"
    out = node.check_output(f"nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits")
    rows = [[cell.strip() for cell in line.split(",")] for line in out.splitlines()]
    return {
        index: {"util": float(util), "mem_used": float(used) * MIB,
                "mem_total": float(total) * MIB, "power": float(power)}
        for index, util, used, total, power in rows
    }  # fmt: skip


def assert_the_doubles_load(job: dict, node: str, served: dict[str, dict[str, float]]) -> None:
    """Each of the job's GPUs at what the double served during the whole job."""
    assert [(gpu["node"], gpu["gpu"]) for gpu in job["gpus"]] == [(node, "0"), (node, "1")]
    for gpu in job["gpus"]:
        want = served[gpu["gpu"]]
        # Every sample in the span is the double's (constant) figure: the only error
        # is the summary's rounding (2 digits for utilization, 1 for power).
        assert math.isclose(gpu["util_mean"], want["util"], abs_tol=0.01), gpu
        assert math.isclose(gpu["util_max"], want["util"], abs_tol=0.01), gpu
        assert math.isclose(gpu["mem_used_max"], want["mem_used"], abs_tol=1), gpu
        assert math.isclose(gpu["mem_total"], want["mem_total"], abs_tol=1), gpu
        assert math.isclose(gpu["power_mean"], want["power"], abs_tol=0.05), gpu
        assert math.isclose(gpu["power_max"], want["power"], abs_tol=0.05), gpu
        assert gpu["idle"] is (want["util"] < job["threshold"])


def test_ended_jobs_keep_their_summary_after_prometheus_forgets_them(
    ctl, gpu_nodes, jobs, tmp_path
):
    busy, idle = jobs
    served = {
        BUSY_NODE: double_gpus(gpu_nodes[BUSY_NODE]),
        IDLE_NODE: double_gpus(gpu_nodes[IDLE_NODE]),
    }
    assert {gpu["util"] for gpu in served[BUSY_NODE].values()} == {100.0}
    assert {gpu["util"] for gpu in served[IDLE_NODE].values()} == {0.0}
    end_jobs(ctl, jobs)  # the busy node stays at load until the fixture's teardown

    # slurmctld ran the epilog as each job ended: its AdminComment holds a summary.
    texts = {job: eventually(lambda job=job: admin_comment(ctl, job), 30) for job in jobs}
    assert all(text.startswith("GF1:") for text in texts.values()), (
        texts, ctl.run("journalctl -q -t gpufleet-job-summary --no-pager").stdout,
    )  # fmt: skip
    stored = {job: decode(text, job) for job, text in texts.items()}
    owners = {job: (s.user, s.account, s.partition, s.cluster) for job, s in stored.items()}
    assert owners == {busy: ("alice", "physics", "gpu", "slurmlab"),
                      idle: ("bob", "chem", "gpu", "slurmlab")}  # fmt: skip
    for job, node in ((busy, BUSY_NODE), (idle, IDLE_NODE)):
        summary = stored[job]
        assert list(summary.nodes) == [node] and summary.nodes[node][0] == 2
        assert sorted(summary.gpus) == [(node, "0"), (node, "1")]
        assert (summary.dropped, summary.down) == (0, [])
        # Its numbers are what Prometheus had over the span it stored. The span is kept
        # to the second and figures rounded: ratios may differ by an edge sample.
        span = max(60, round(summary.end - summary.start))
        selectors = [(summary.nodes[node][1], NODE_FIGURES, f'node="{node}"')] + [
            (values, GPU_FIGURES, f'node="{node}",gpu="{gpu}"')
            for (_, gpu), values in summary.gpus.items()
        ]
        for values, figures, selector in selectors:
            for name, promql in figures.items():
                (had,) = query(ctl, promql % (selector, span), summary.end)
                want = float(had["value"][1])
                assert values[name] is not None and math.isclose(
                    values[name], want, rel_tol=1e-3, abs_tol=0.02
                ), (job, selector, name, values[name], want)

    # The live report, from Prometheus while it still holds the jobs: the busy job's
    # GPUs at the double's load, the idle job's GPUs idle.
    url = f"http://{host_address(ctl)}:9090"
    live = {job: report(job, "--prometheus", url) for job in jobs}
    assert_the_doubles_load(live[busy], BUSY_NODE, served[BUSY_NODE])
    assert_the_doubles_load(live[idle], IDLE_NODE, served[IDLE_NODE])
    assert (live[busy]["verdict"], live[idle]["verdict"]) == ("good", "idle GPUs")
    assert live[idle]["advice"][0].startswith(f"{IDLE_NODE}: GPUs 0-1 stayed under 5 %")

    # Prometheus forgets the jobs (as after its retention), the busy one first: the report
    # comes from the stored summary, the same figures and verdict, and says so.
    why = {
        busy: f"job {busy}: unknown on {url} ",  # the idle job's series are still there
        idle: f"job {idle}: no Slurm job series at all",  # none left
    }
    for job in jobs:
        match = shlex.quote(f'match[]={{job_id="{job}"}}')
        ctl.check_output(
            f"curl -fsS --data-urlencode {match} {PROMETHEUS}/api/v1/admin/tsdb/delete_series"
        )
        gone = jobstats(job, "--prometheus", url)
        assert gone.returncode == 3 and why[job] in gone.stderr, gone
        path = tmp_path / f"{job}.txt"
        path.write_text(texts[job] + "\n")
        from_summary = report(job, "--summary", str(path))
        assert from_summary["sources"] == [f"the summary in {path}"]
        assert from_summary["missing"] == []
        for key in ("user", "account", "partition", "cluster", "verdict", "advice"):
            assert from_summary[key] == live[job][key], key
        node = BUSY_NODE if job == busy else IDLE_NODE
        assert_the_doubles_load(from_summary, node, served[node])
    text = jobstats(busy, "--summary", str(tmp_path / f"{busy}.txt"))
    assert text.returncode == 0, text.stderr
    assert f"job {busy}  user alice  account physics" in text.stdout
    assert text.stdout.rstrip().endswith(f"source: the summary in {tmp_path / f'{busy}.txt'}")
