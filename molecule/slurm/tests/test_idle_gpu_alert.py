"""The two real jobs end to end (converge.yml, prepare.yml): the idle-GPU alert while they
run.

Two real jobs of two users: alice's on gpufleet-slurm-gpu1, whose nvidia-smi double
serves its load capture (100 % on every GPU), and bob's on gpufleet-slurm-gpu2, whose
double serves its idle capture (0 %); the double answers per node, not per GPU index.
The controller's Prometheus joins the Slurm exporter's job GPUs to the collector's
utilization; after the 1m idle duration the alert fires for bob's job only, and
Alertmanager mails bob@example.org once (the owner template) and sends the admins one
digest. This file runs before test_slurm_exporter.py, on an empty cluster, so the
digest group is new (its interval is an hour) and no earlier idle job has mailed.

Then `gpufleet jobstats` of each job, against what the doubles serve; then alice's job
ends, the epilog (EpilogSlurmctld, wired in converge.yml) stores its summary in the job's
AdminComment in slurmdbd, the job's series are deleted from Prometheus, and `gpufleet
jobstats` answers the same from the summary, read with sacct.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest
from testbed_helpers import eventually, host_address

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


def query(ctl, promql: str, at: float | None = None) -> list[dict]:
    """An instant query, from here: the figures take dozens, one command on a host each."""
    params = {"query": promql} | ({"time": str(at)} if at is not None else {})
    url = f"http://{host_address(ctl)}:9090/api/v1/query?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)["data"]["result"]


def log_lines(ctl, path: str) -> list[dict]:
    text = ctl.run(f"cat {path}").stdout  # absent until the first delivery
    lines = [line for line in text.splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except ValueError:
            if number < len(lines):
                raise
            # The sink may be writing the last line (a mail is 10 KB): the next read has it.
    return records


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
    # The role's gpufleet.idle.* templates (roles/alertmanager/files/gpufleet.tmpl): one mail
    # per user, greeting them and listing the job (quoted-printable keeps short lines whole).
    data = mails[0]["data"]
    subject = re.search(r"^Subject: (.*(?:\n[ \t].*)*)", data, re.MULTILINE)
    assert subject, data[:2000]
    assert subject.group(1) == "Idle GPUs in your Slurm jobs on slurmlab", data[:2000]
    assert "Hello bob," in data and f"job {idle} on {IDLE_NODE} " in data, data[:2000]
    (digest,) = digests
    payload = digest["payload"]
    assert payload["groupLabels"] == {"alertname": "SlurmJobGpuIdle", "cluster": "slurmlab"}
    assert [a["labels"]["job_id"] for a in payload["alerts"]] == [idle]
    assert payload["alerts"][0]["labels"]["user"] == "bob"


def served(node) -> dict[str, dict[str, float]]:
    """What the node's nvidia-smi double answers per GPU index: the truth to compare with."""
    fields = "index,utilization.gpu,memory.used,memory.total,power.draw"
    text = node.check_output(f"nvidia-smi --query-gpu={fields} --format=csv,noheader,nounits")
    rows = {}
    for line in text.splitlines():
        index, util, used, total, power = (cell.strip() for cell in line.split(","))
        rows[index] = {
            "util": float(util),
            "mem_used": float(used) * 2**20,
            "mem_total": float(total) * 2**20,
            "power": float(power),
        }
    return rows


def jobstats(ctl, job: str, env: dict[str, str] | None = None) -> dict:
    code = "import sys; from gpufleet.cli import main; sys.exit(main(sys.argv[1:]))"
    prometheus = f"http://{host_address(ctl)}:9090"
    done = subprocess.run(
        [sys.executable, "-c", code, "jobstats", job, "--prometheus", prometheus, "--json"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(("which", "node", "verdict"), [
    (0, BUSY_NODE, "good"), (1, IDLE_NODE, "idle GPUs"),
])  # fmt: skip
def test_jobstats_reports_what_the_double_served(ctl, gpu_nodes, jobs, which, node, verdict):
    """`gpufleet jobstats` of each running job: its own two GPUs on its node, each with the
    utilization, memory and power its node's double served the whole time (the double is
    constant per state, so mean and max equal it), and the verdict that follows."""
    job = jobs[which]
    report = jobstats(ctl, job)
    assert (report["job_id"], report["running"], report["verdict"]) == (job, True, verdict)
    assert [(n["node"], n["gpus_allocated"]) for n in report["nodes"]] == [(node, 2)]
    truth = served(gpu_nodes[node])
    assert len(report["gpus"]) == 2 and {g["node"] for g in report["gpus"]} == {node}
    for gpu in report["gpus"]:
        want = truth[gpu["gpu"]]
        got = {
            "util": (gpu["util_mean"], gpu["util_max"]),
            "mem": (gpu["mem_used_max"], gpu["mem_total"]),
            "power": (gpu["power_mean"], gpu["power_max"]),
        }
        assert got["util"] == pytest.approx((want["util"], want["util"]), abs=0.5), got
        assert got["mem"] == pytest.approx((want["mem_used"], want["mem_total"]), rel=1e-3), got
        assert got["power"] == pytest.approx((want["power"], want["power"]), rel=1e-2), got


def figures(report: dict) -> dict[tuple[str, str], tuple[float, ...]]:
    names = ("util_mean", "util_max", "mem_used_max", "mem_total", "power_mean", "power_max")
    return {(g["node"], g["gpu"]): tuple(g[name] for name in names) for g in report["gpus"]}


def test_a_finished_jobs_summary_answers_after_its_series_are_gone(ctl, jobs, tmp_path):
    """alice's job ends; the epilog stores its summary in slurmdbd (AdminComment). With the
    job's series deleted from Prometheus, `gpufleet jobstats` says so and answers from the
    summary, read with the controller's sacct: the same GPUs and figures as live."""
    job = jobs[0]
    live = jobstats(ctl, job)
    end_jobs(ctl, [job])
    sacct = f"sacct -j {job} -X -n -P -o AdminComment"
    stored = eventually(lambda: ctl.check_output(sacct).startswith("GF1:"), 90, interval=2)
    assert stored, ctl.run(f"{sacct}; journalctl -u slurmctld -n 30 --no-pager").stdout
    # The exporter serves its last good job table while scontrol fails (up to
    # --max-stale): on a loaded host a 3 s command timeout can keep the ended job in it
    # for a while, and a scrape after the deletion below would bring its series back.
    # Wait until the exporter itself no longer lists the job.
    gone = eventually(
        lambda: (
            f'job_id="{job}"' not in ctl.check_output("curl -fsS http://127.0.0.1:9341/metrics")
        ),
        120,
        interval=2,
    )
    assert gone, ctl.run("journalctl -u gpufleet-slurm-exporter -n 20 --no-pager").stdout

    match = urllib.parse.urlencode({"match[]": f'{{job_id="{job}"}}'})
    for path in (f"delete_series?{match}", "clean_tombstones"):
        url = f"http://{host_address(ctl)}:9090/api/v1/admin/tsdb/{path}"
        urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30).close()
    assert not query(ctl, f'slurm_job_gpus_allocated{{job_id="{job}"}}[1h]')

    # The controller's sacct, as where gpufleet runs on the controller.
    shim = tmp_path / "sacct"
    shim.write_text(f'#!/bin/sh\nexec podman exec {shlex.quote(ctl_name(ctl))} sacct "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    report = jobstats(ctl, job, env)
    # Where the job's series came back from, if they did: the exporter's own view.
    why = ctl.run(
        f"curl -fsS http://127.0.0.1:9341/metrics | grep -E 'job_id=\"{job}\"|command_errors'"
        "; journalctl -u gpufleet-slurm-exporter -n 20 --no-pager; squeue; "
        f"scontrol show job {job} | head -3"
    ).stdout
    assert report["running"] is False, why
    assert report["verdict"] == live["verdict"] == "good"
    assert any("AdminComment" in source for source in report["sources"]), report["sources"]
    want, got = figures(live), figures(report)
    assert got.keys() == want.keys() and len(got) == 2
    for key, values in want.items():
        assert got[key] == pytest.approx(values, rel=2e-2), (key, got[key])


def ctl_name(ctl) -> str:
    return ctl.backend.get_variables()["inventory_hostname"]
