"""gpufleet on a real Slurm 26.05 (Debian sid's packages; prepare.yml), as on 24.11.

The same checks as the `slurm` scenario's, against Slurm's own answers (`sinfo`,
`scontrol show job --json`): the exporter's node states, GRES and per-job GPU indices,
the GPU collector's job attribution from the job's own cgroup, the job summary epilog and
`gpufleet jobstats`. Then what 26.05 adds: slurmctld's own metrics endpoints, scraped by
Prometheus from the primary only (the standby backup's 303 is not followed), and the
check that refuses a PrivateData setting that would make that scrape fail. The tests run
in file order.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import CONTROLLER, GPU_NODE
from test_idle_gpu_alert import jobstats
from test_slurm_exporter import (
    clear_jobs,
    collected_after,
    exporter_allocations,
    exporter_nodes,
    host_time,
    metrics,
    samples,
    sbatch,
    scontrol_allocations,
    sinfo_nodes,
    value,
    wait_until,
)
from testbed_helpers import ANSI, eventually, host_address

RELEASE = "26.05."
INTERVAL = 5  # converge.yml: slurm_exporter_collect_interval
ENDPOINTS = ["/metrics/jobs", "/metrics/jobs-users-accts", "/metrics/nodes",
             "/metrics/partitions", "/metrics/scheduler"]  # fmt: skip
APPS = "/run/fake-nvidia-smi/apps"


def query(ctl, promql: str) -> list[dict]:
    params = urllib.parse.urlencode({"query": promql})
    url = f"http://{host_address(ctl)}:9090/api/v1/query?{params}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)["data"]["result"]


def targets(ctl, job: str) -> list[dict]:
    url = f"http://{host_address(ctl)}:9090/api/v1/targets?state=active"
    with urllib.request.urlopen(url, timeout=10) as answer:
        found = json.load(answer)["data"]["activeTargets"]
    return [t for t in found if t["labels"]["job"] == job]


def reconfigure(ctl, gpu, *lines: str) -> None:
    """slurm.conf with lines appended (none: the scenario's own), on both hosts, read again."""
    for host in (ctl, gpu):
        host.check_output(
            "sed -i '/^# gpufleet test:/,$d' /etc/slurm/slurm.conf && "
            + " && ".join(
                f"echo {shlex.quote(line)} >> /etc/slurm/slurm.conf"
                for line in ("# gpufleet test: appended by test_slurm_2605.py", *lines)
            )
            if lines
            else "sed -i '/^# gpufleet test:/,$d' /etc/slurm/slurm.conf"
        )
    ctl.check_output("scontrol reconfigure")


def check_playbook() -> subprocess.CompletedProcess:
    """playbooks/slurmctld_metrics.yml against the scenario's hosts, as site.yml runs it."""
    project = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
    playbook = project / "playbooks" / "slurmctld_metrics.yml"
    args = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(playbook)]
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    done.stdout, done.stderr = ANSI.sub("", done.stdout), ANSI.sub("", done.stderr)
    return done


def status(host, url: str) -> str:
    return host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 5 {url}")


# ------------------------------------------------------------ the release


def test_the_cluster_runs_slurm_26_05_with_a_standby_backup(ctl, gpu):
    for host in (ctl, gpu):
        version = host.check_output("sinfo --version").split()[-1]
        assert version.startswith(RELEASE), version
    # Both controllers answer; the GPU node's is the standby backup.
    ping = ctl.check_output("scontrol ping")
    assert f"Slurmctld(primary) at {CONTROLLER} is UP" in ping, ping
    assert f"Slurmctld(backup) at {GPU_NODE} is UP" in ping, ping


def test_exporter_matches_sinfo_on_the_idle_cluster(ctl):
    body = collected_after(ctl, host_time(ctl))
    assert value(body, "slurm_up") == 1
    version = ctl.check_output("sinfo --version").split()[-1]
    assert value(body, "slurm_info", type="general", version=version) == 1
    for command in ("sinfo_nodes", "squeue", "scontrol_jobs", "sdiag", "sinfo_version", "sshare"):
        assert value(body, "slurm_exporter_command_success", command=command) == 1, command
    assert exporter_nodes(body) == sinfo_nodes(ctl)
    assert value(body, "slurm_node_gres_total", node=GPU_NODE, partition="gpu") == 4
    assert value(body, "slurm_gpus_total") == 4
    assert value(body, "slurm_gpus_alloc") == 0
    assert value(body, "slurm_account_fairshare_raw_shares", account="physics") == 1


# ------------------------------------------------------------ real jobs


@pytest.fixture(scope="module")
def jobs(ctl, gpu):
    """alice holds 2 GPUs, bob 1: real jobs in their own cgroups on the GPU node."""
    clear_jobs(ctl, {GPU_NODE: gpu})
    running = [
        sbatch(ctl, "alice", "--account=physics", "-p", "gpu", "--gres=gpu:a100:2"),
        sbatch(ctl, "bob", "--account=chem", "-p", "gpu", "--gres=gpu:a100:1"),
    ]
    wait_until(
        lambda: len(ctl.check_output("squeue -h -t R -u alice,bob").splitlines()) == 2,
        60,
        "the jobs to start",
    )
    yield running
    clear_jobs(ctl, {GPU_NODE: gpu})


def test_job_gpu_counts_and_indices_match_scontrol(ctl, jobs):
    body = collected_after(ctl, host_time(ctl))
    want_alloc, want_idx = scontrol_allocations(ctl)
    assert {job for job, _ in want_alloc} == set(jobs)
    got_alloc, got_idx = exporter_allocations(body)
    assert got_alloc == want_alloc
    assert got_idx == want_idx and len(got_idx) == 3
    assert value(body, "slurm_gpus_alloc") == 3
    assert value(body, "slurm_user_gpus_running", user="alice") == 2
    assert value(body, "slurm_account_gpus_running", account="chem") == 1
    assert exporter_nodes(body) == sinfo_nodes(ctl)


def test_gpu_collector_names_the_same_jobs_as_the_exporter(ctl, gpu, jobs):
    """The jobs' processes registered with the nvidia-smi double on the GPUs Slurm gave
    them; the collector finds each one's job through the cgroup slurmd 26.05 made."""
    _, got_idx = exporter_allocations(collected_after(ctl, host_time(ctl)))
    allocations = exporter_allocations(metrics(ctl))[0]
    users = {job: user for (job, _), (_, user, _, _) in allocations.items()}
    want = {(job, index, users[job]) for job, _, index in got_idx}

    def seen():
        body = metrics(gpu, "http://127.0.0.1:9100/metrics")
        found = {
            (lab["job_id"], lab["gpu"], lab["user"])
            for lab, _ in samples(body, "node_gpu_slurm_job_info")
        }
        return found if found == want else None

    pid = gpu.check_output(f"head -1 {APPS}").split(":")[0]
    cgroups = gpu.check_output(f"cat /proc/{pid}/cgroup")
    assert eventually(seen, 6 * INTERVAL), (want, cgroups)
    assert re.search(r"freezer:.*/slurm_[^/]+/uid_\d+/job_\d+/step_\w+$", cgroups, re.M), cgroups


def test_jobstats_and_the_job_summary_epilog(ctl, jobs, tmp_path):
    """alice's running job in `gpufleet jobstats`; ended, its summary is in slurmdbd
    (AdminComment, by the epilog) and jobstats answers from it."""
    job = jobs[0]
    live = eventually(lambda: (r := jobstats(ctl, job))["gpus"] and r, 60, interval=3)
    assert live and live["running"] is True, live
    assert [(n["node"], n["gpus_allocated"]) for n in live["nodes"]] == [(GPU_NODE, 2)]
    ctl.run(f"scancel {job}")
    sacct = f"sacct -j {job} -X -n -P -o AdminComment"
    stored = eventually(lambda: ctl.check_output(sacct).startswith("GF1:"), 90, interval=2)
    assert stored, ctl.run(f"{sacct}; journalctl -u slurmctld -n 30 --no-pager").stdout
    # The controller's sacct, as where gpufleet runs on the controller.
    shim = tmp_path / "sacct"
    shim.write_text(f'#!/bin/sh\nexec podman exec {CONTROLLER} sacct "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    # A job seen in the last 3 minutes counts as running: as in `slurm`, the ended job's
    # series are deleted (once the exporter no longer lists it), so jobstats answers from
    # the stored summary alone.
    gone = eventually(lambda: f'job_id="{job}"' not in metrics(ctl), 120, interval=2)
    assert gone, ctl.run("journalctl -u gpufleet-slurm-exporter -n 20 --no-pager").stdout
    match = urllib.parse.urlencode({"match[]": f'{{job_id="{job}"}}'})
    for path in (f"delete_series?{match}", "clean_tombstones"):
        url = f"http://{host_address(ctl)}:9090/api/v1/admin/tsdb/{path}"
        urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30).close()
    ended = jobstats(ctl, job, env)
    assert ended["running"] is False, ended
    assert any("AdminComment" in source for source in ended["sources"]), ended["sources"]
    assert {(g["node"], g["gpu"]) for g in ended["gpus"]} == {
        (g["node"], g["gpu"]) for g in live["gpus"]
    }


# ------------------------------------------------------------ slurmctld's own metrics


def test_slurmctlds_endpoints_are_scraped_from_the_primary_only(ctl, gpu, jobs):
    """Five targets per controller; the primary's answer, the standby backup's 303 is not
    followed (it would bring the primary's series a second time)."""
    for endpoint in ENDPOINTS:
        assert status(ctl, f"http://{CONTROLLER}:6817{endpoint}") == "200", endpoint
        assert status(ctl, f"http://{GPU_NODE}:6817{endpoint}") == "303", endpoint

    def settled():
        found = targets(ctl, "slurmctld")
        done = len(found) == 10 and all(t["lastScrape"] != "0001-01-01T00:00:00Z" for t in found)
        return found if done else None

    found = eventually(settled, 60, interval=2)
    assert found, targets(ctl, "slurmctld")
    by_node = {(t["labels"]["node"], t["labels"]["metrics_path"]): t for t in found}
    for endpoint in ENDPOINTS:
        primary, backup = by_node[(CONTROLLER, endpoint)], by_node[(GPU_NODE, endpoint)]
        assert primary["health"] == "up", primary["lastError"]
        assert backup["health"] == "down" and "303" in backup["lastError"], backup
    # Every series of the job comes from the primary's targets, once each.
    instances = query(ctl, 'count by (instance) ({job="slurmctld", __name__!~"up|scrape_.+"})')
    assert [s["metric"]["instance"] for s in instances] == [f"{host_address(ctl)}:6817"]
    # No family in both jobs: what gpufleet's exporter serves is dropped from Slurm's.
    native = {
        s["metric"]["__name__"] for s in query(ctl, 'count by (__name__) ({job="slurmctld"})')
    }
    ours = {s["metric"]["__name__"] for s in query(ctl, 'count by (__name__) ({job="slurm"})')}
    assert len(native) > 150 and len(ours) > 50
    assert sorted(native & ours - {"up", "scrape_duration_seconds", "scrape_samples_scraped",
                                    "scrape_samples_post_metric_relabeling",
                                    "scrape_series_added"}) == []  # fmt: skip


def test_a_private_data_setting_is_refused_before_prometheus_scrapes(ctl, gpu):
    """PrivateData restricts 26.05's endpoints to SlurmUser and root with a JWT: the scrape
    would fail (401), so the check stops the run in one line; with ignore_private_data
    it passes."""
    assert check_playbook().returncode == 0
    try:
        reconfigure(ctl, gpu, "PrivateData=jobs")
        assert status(ctl, f"http://{CONTROLLER}:6817/metrics/jobs") == "401"
        refused = check_playbook()
        assert refused.returncode != 0
        # The callback wraps long lines: compared without line breaks.
        said = " ".join((refused.stdout + refused.stderr).split())
        assert f"{CONTROLLER} (group slurmctld_metrics): PrivateData=jobs restricts" in said, (
            refused.stdout[-2000:] + refused.stderr[-2000:]
        )
        reconfigure(ctl, gpu, "PrivateData=jobs", "MetricsParameters=ignore_private_data")
        assert status(ctl, f"http://{CONTROLLER}:6817/metrics/jobs") == "200"
        passed = check_playbook()
        assert passed.returncode == 0, passed.stdout[-3000:]
    finally:
        reconfigure(ctl, gpu)
