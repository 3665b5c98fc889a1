"""The Slurm exporter against a real Slurm 24.11 cluster on Debian 13 (prepare.yml).

Jobs are real: submitted with sbatch by unprivileged users, scheduled by slurmctld
onto GRES GPUs, run by slurmd in their own job cgroups (proctrack/cgroup, task/cgroup
with devices constrained). Every number the exporter serves is checked against Slurm's
own view (`scontrol show job --json`, `sinfo`, `squeue`), and the job ids on each GPU
against what gpu_collector sees on the node itself. The tests run in file order: idle
cluster, busy cluster, hostile job text, a drained node, slurmctld down.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections import Counter

import pytest
from testbed_helpers import converge, eventually

testinfra_hosts = ["gpufleet-slurmctl"]

USER = "gpufleet-slurm-exporter"
URL = "http://127.0.0.1:9341/metrics"
# converge.yml: slurm_exporter_collect_interval / _command_timeout.
INTERVAL = 5
TIMEOUT = 3
NODES = ("gpufleet-slurm-gpu1", "gpufleet-slurm-gpu2")
JOB = "srun /usr/local/bin/gpufleet-test-gpu-job 900"
LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


# ------------------------------------------------------------------- helpers


def samples(body: str, name: str) -> list[tuple[dict[str, str], float]]:
    found = []
    for line in body.splitlines():
        match = re.match(rf"^{name}(?:\{{(.*)\}})? (\S+)$", line)
        if match:
            labels = {
                k: v.replace('\\"', '"').replace("\\\\", "\\")
                for k, v in LABEL_RE.findall(match.group(1) or "")
            }
            found.append((labels, float(match.group(2))))
    return found


def value(body: str, name: str, **labels: str) -> float | None:
    for found, val in samples(body, name):
        if all(found.get(k) == v for k, v in labels.items()):
            return val
    return None


def metrics(host, url: str = URL) -> str:
    return host.check_output(f"curl -fsS --max-time 2 {url}")


def host_time(host) -> float:
    return float(host.check_output("date +%s.%N"))


def collected_after(ctl, since: float, timeout: float = 4 * INTERVAL) -> str:
    """Metrics of the first collection cycle that started after `since` (host clock)."""

    def started_after() -> str | None:
        # Connection refused is expected only here: right after a restart the
        # exporter may not listen yet.
        body = ctl.run(f"curl -fsS --max-time 2 {URL}").stdout
        end = value(body, "slurm_exporter_last_collect_timestamp_seconds")
        duration = value(body, "slurm_exporter_collect_duration_seconds") or 0.0
        return body if end is not None and end - duration > since else None

    body = eventually(started_after, timeout, interval=0.5)
    assert body, "no collection cycle started after the change"
    return body


def wait_until(predicate, timeout: float, what: str):
    result = eventually(predicate, timeout)
    assert result, f"timed out waiting for {what}"
    return result


def as_user(user: str, command: str) -> str:
    return f"runuser -u {user} -- {command}"


def sbatch(ctl, user: str, *args: str) -> str:
    cmd = [
        "sbatch",
        "--parsable",
        "--chdir=/tmp",
        "-o",
        "/dev/null",
        "-J",
        "gpufleet-test",
        *args,
        "--wrap",
        JOB,
    ]
    return ctl.check_output(as_user(user, shlex.join(cmd))).split(";")[0]


def hostnames(ctl, hostlist: str) -> list[str]:
    return ctl.check_output(f"scontrol show hostnames {shlex.quote(hostlist)}").split()


def expand_indices(text: str) -> set[str]:
    out: set[str] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.update(str(i) for i in range(int(low), int(high or low) + 1))
    return out


def scontrol_allocations(ctl) -> tuple[dict, set]:
    """Slurm's own answer: {(job, node): (gpus, user, account, partition)}, {(job, node, idx)}.

    From `scontrol show job --json`, where user-set text (names, working directories,
    comments) stays inside JSON strings: gres_detail[i] is the GRES of the job's i-th
    allocated node.
    """
    alloc: dict[tuple[str, str], tuple[float, str, str, str]] = {}
    indices: set[tuple[str, str, str]] = set()
    for job in json.loads(ctl.check_output("scontrol show job --json"))["jobs"]:
        if "RUNNING" not in job["job_state"]:
            continue
        job_id = str(job["job_id"])
        owner = (job["user_name"], job["account"], job["partition"])
        nodes = [node["name"] for node in job["job_resources"]["nodes"]["allocation"]]
        for node, gres in zip(nodes, job["gres_detail"], strict=True):
            for count, idx in re.findall(r"gpu:(?:[^:(,]+:)?(\d+)\(IDX:([^)]*)\)", gres):
                alloc[(job_id, node)] = (float(count), *owner)
                indices.update((job_id, node, i) for i in expand_indices(idx))
    return alloc, indices


def exporter_allocations(body: str) -> tuple[dict, set]:
    alloc = {
        (lab["job_id"], lab["node"]): (val, lab["user"], lab["account"], lab["partition"])
        for lab, val in samples(body, "slurm_job_gpus_allocated")
    }
    indices = {
        (lab["job_id"], lab["node"], lab["gpu"])
        for lab, val in samples(body, "slurm_job_gpu_index_info")
        if val == 1
    }
    return alloc, indices


def sinfo_nodes(ctl) -> set[tuple[str, str, str]]:
    """(node, partition, state) as sinfo prints them, one per node and partition."""
    out = ctl.check_output("sinfo -h -N -o '%N|%R|%T'")
    return {tuple(line.split("|")) for line in out.splitlines()}


def exporter_nodes(body: str) -> set[tuple[str, str, str]]:
    return {
        (lab["node"], lab["partition"], lab["status"])
        for lab, _ in samples(body, "slurm_node_status")
    }


def converge_exporter(*extra_vars: str) -> subprocess.CompletedProcess:
    """Rerun converge.yml for the exporter alone, as an admin changing a flag would."""
    return converge(*extra_vars, tags="slurm_exporter", limit="gpufleet-slurmctl", timeout=300)


def main_pid(host) -> str:
    return host.service("gpufleet-slurm-exporter").systemd_properties["MainPID"]


# ---------------------------------------------------------- the idle cluster


def test_exporter_runs_as_its_own_unprivileged_user(host):
    service = host.service("gpufleet-slurm-exporter")
    assert service.is_enabled
    assert service.is_running
    pid = service.systemd_properties["MainPID"]
    assert host.check_output(f"ps -o user= -p {pid}") == USER
    # Its own group only: no slurm, munge, sudo or other supplementary group.
    assert host.check_output(f"id -Gn {USER}") == USER
    assert host.user(USER).shell == "/usr/sbin/nologin"
    props = service.systemd_properties
    assert props["ProtectSystem"] == "strict"
    assert props["NoNewPrivileges"] == "yes"
    assert props.get("CapabilityBoundingSet", "") == ""  # no capabilities at all
    # ...and yet the Slurm commands reach munge and /etc/slurm: slurmctld answers.
    body = metrics(host)
    assert value(body, "slurm_up") == 1
    version = host.check_output("sinfo --version").split()[-1]  # "slurm 24.11.5"
    assert version.startswith("24.11."), version
    assert value(body, "slurm_info", type="general", version=version) == 1
    for command in ("sinfo_nodes", "squeue", "scontrol_jobs", "sdiag", "sinfo_version", "sshare"):
        assert value(body, "slurm_exporter_command_success", command=command) == 1, command
    # slurmdbd's associations (prepare.yml): fair-share per account and per user.
    assert value(body, "slurm_account_fairshare_raw_shares", account="physics") == 1
    assert value(body, "slurm_user_fairshare_raw_shares", account="chem", user="bob") == 1


def test_metrics_are_reachable_from_another_host(gpu_nodes):
    # By name: the GPU node resolves the controller through the network's DNS.
    body = metrics(gpu_nodes["gpufleet-slurm-gpu1"], "http://gpufleet-slurmctl:9341/metrics")
    assert value(body, "slurm_up") == 1
    assert "slurm_nodes_total 2" in body


def test_idle_nodes_and_gpus_match_sinfo(host):
    body = collected_after(host, host_time(host))
    assert exporter_nodes(body) == sinfo_nodes(host)
    for node in NODES:
        assert value(body, "slurm_node_gres_total", node=node, partition="gpu") == 4
        assert value(body, "slurm_node_gres_used", node=node, partition="gpu") == 0
    assert value(body, "slurm_gpus_total") == 8
    assert value(body, "slurm_gpus_alloc") == 0
    assert value(body, "slurm_nodes_idle", partition="gpu") == 2
    assert value(body, "slurm_nodes_idle", partition="debug") == 1


# ---------------------------------------------------------- a busy cluster


def clear_jobs(ctl, gpu_nodes) -> None:
    ctl.run("scancel --quiet -u alice; scancel --quiet -u bob")
    wait_until(
        lambda: not ctl.check_output("squeue -h -t PD,R,CG -u alice,bob"),
        60,
        "the test jobs to end",
    )
    for node in gpu_nodes.values():
        node.check_output(": > /run/fake-nvidia-smi/apps")


@pytest.fixture(scope="module")
def jobs(ctl, gpu_nodes):
    """Fill the 8 GPUs with real jobs of two users, then queue two that must wait."""
    clear_jobs(ctl, gpu_nodes)
    running = [
        sbatch(ctl, "alice", "--account=physics", "-p", "gpu", "--gres=gpu:a100:2"),
        sbatch(ctl, "bob", "--account=chem", "-N", "2", "--gres=gpu:a100:1"),
        sbatch(ctl, "alice", "--account=physics", "-p", "debug", "--gres=gpu:a100:1"),
    ]
    wait_until(
        lambda: len(ctl.check_output("squeue -h -t R -u alice,bob").splitlines()) == 3,
        60,
        "the first jobs to start",
    )
    # 5 of 8 GPUs are held; three 1-GPU jobs take the rest.
    running += [sbatch(ctl, "bob", "--account=chem", "--gres=gpu:a100:1") for _ in range(3)]
    wait_until(
        lambda: len(ctl.check_output("squeue -h -t R -u alice,bob").splitlines()) == 6,
        60,
        "the cluster to fill",
    )
    pending = [
        sbatch(ctl, "alice", "--account=physics", "--gres=gpu:a100:2"),
        sbatch(ctl, "bob", "--account=chem", "--hold", "--gres=gpu:a100:1"),
    ]

    def reasons_settled():
        out = ctl.check_output("squeue -h -t PD -o '%A %r'")
        return len(out.splitlines()) == 2 and "None" not in out

    wait_until(reasons_settled, 60, "pending reasons")
    yield {"running": running, "pending": pending}
    clear_jobs(ctl, gpu_nodes)


def test_job_gpu_counts_and_indices_match_scontrol(host, jobs):
    body = collected_after(host, host_time(host))
    want_alloc, want_idx = scontrol_allocations(host)
    # Every running job holds GPUs; the 2-node job has one series per node.
    assert {job for job, _ in want_alloc} == set(jobs["running"])
    assert len(want_alloc) == 7
    got_alloc, got_idx = exporter_allocations(body)
    assert got_alloc == want_alloc
    assert got_idx == want_idx
    assert {user for _, user, _, _ in got_alloc.values()} == {"alice", "bob"}
    # Indices on a node are each held by one job, and all 4 of each node are held.
    for node in NODES:
        held = sorted(i for _, n, i in got_idx if n == node)
        assert held == ["0", "1", "2", "3"], node
        assert value(body, "slurm_node_gres_used", node=node, partition="gpu") == 4
    assert value(body, "slurm_gpus_alloc") == 8
    assert value(body, "slurm_gpus_utilization") == 1
    for user in ("alice", "bob"):
        held = sum(gpus for gpus, u, _, _ in want_alloc.values() if u == user)
        assert value(body, "slurm_user_gpus_running", user=user) == held
    for account in ("physics", "chem"):
        held = sum(gpus for gpus, _, a, _ in want_alloc.values() if a == account)
        assert value(body, "slurm_account_gpus_running", account=account) == held
    assert value(body, "slurm_exporter_job_series") == 7


def test_node_states_match_sinfo_when_busy(host, jobs):
    body = collected_after(host, host_time(host))
    nodes = exporter_nodes(body)
    assert nodes == sinfo_nodes(host)
    assert {state for _, _, state in nodes} <= {"mixed", "allocated"}


def test_pending_reasons_match_squeue(host, jobs):
    body = collected_after(host, host_time(host))
    queued = [
        line.split("|")
        for line in host.check_output("squeue -h -t PD -o '%A|%u|%P|%r'").splitlines()
    ]
    assert sorted(job for job, *_ in queued) == sorted(jobs["pending"])
    by_reason = Counter(reason for *_, reason in queued)
    # The cluster is full: the 2-GPU job waits for resources; the held one is held.
    assert by_reason["Resources"] == 1
    assert by_reason["JobHeldUser"] == 1
    got = {lab["reason"]: val for lab, val in samples(body, "slurm_jobs_pending_by_reason")}
    assert got == dict(by_reason)
    for (user, partition, reason), count in Counter((u, p, r) for _, u, p, r in queued).items():
        assert (
            value(body, "slurm_queue_pending", user=user, partition=partition, reason=reason)
            == count
        )
    assert value(body, "slurm_jobs_pending") == 2
    assert value(body, "slurm_jobs_running") == 6


def test_gpu_collector_names_the_same_jobs_as_the_exporter(host, gpu_nodes, jobs):
    """node_gpu_slurm_job_info on each node == slurm_job_gpu_index_info for that node.

    The jobs' processes registered themselves with the nvidia-smi double on the GPUs
    Slurm gave them; gpu_collector finds their job through /proc/PID/cgroup, where
    proctrack/cgroup put them (.../slurm_<node>/uid_<uid>/job_<id>/step_0).
    """
    _, got_idx = exporter_allocations(collected_after(host, host_time(host)))
    users = {
        job: user for (job, _), (_, user, _, _) in exporter_allocations(metrics(host))[0].items()
    }
    for name, node in gpu_nodes.items():
        want = {(job, gpu, users[job]) for job, n, gpu in got_idx if n == name}

        def seen(node=node, want=want):
            body = metrics(node, "http://127.0.0.1:9100/metrics")
            found = {
                (lab["job_id"], lab["gpu"], lab["user"])
                for lab, _ in samples(body, "node_gpu_slurm_job_info")
            }
            return found if found == want else None

        wait_until(seen, 6 * INTERVAL, f"gpu_collector on {name} to see {sorted(want)}")
        # The attribution is Slurm's own cgroup, not a test-made one.
        pid = node.check_output("head -1 /run/fake-nvidia-smi/apps").split(":")[0]
        assert re.search(
            r"freezer:.*/slurm_[^/]+/uid_\d+/job_\d+/step_0$",
            node.check_output(f"cat /proc/{pid}/cgroup"),
            re.MULTILINE,
        )


def test_user_text_cannot_fake_attribution(host, gpu_nodes, jobs):
    """Job names, working directories and comments are text any user sets. A job of bob
    dressed up as alice's, with a working directory and a comment that read like GPU
    segments of a node that does not exist, keeps its real owner and its one GPU; a
    pending job named like a huge hostlist costs nothing."""
    freed = jobs["running"].pop()  # one of bob's 1-GPU jobs makes room
    host.check_output(f"scancel {freed}")
    wait_until(
        lambda: freed not in host.check_output("squeue -h -t R,CG -o %A").split(),
        60,
        "a GPU to free",
    )
    workdir = "/tmp/x Nodes=gpufleet-slurm-gpu9 CPU_IDs=0 GRES=gpu:a100:8(IDX:0-7)"
    for node in (host, *gpu_nodes.values()):
        node.check_output(f"mkdir -p -m 1777 {shlex.quote(workdir)}")
    hostile = sbatch(
        host, "bob", "--account=chem", "--gres=gpu:a100:1",
        "-J", "x UserId=alice(2001) Account=physics Partition=debug",
        f"--chdir={workdir}",
        "--comment", " Nodes=gpufleet-slurm-gpu9 CPU_IDs=0 Mem=0 GRES=gpu:a100:8(IDX:0-7)",
    )  # fmt: skip
    jobs["running"].append(hostile)
    jobs["pending"].append(
        sbatch(host, "alice", "--account=physics", "--hold", "--gres=gpu:a100:1",
               "-J", "Nodes=a[0-99999]b[0-99999]c[0-99999]")
    )  # fmt: skip
    wait_until(
        lambda: hostile in host.check_output("squeue -h -t R -o %A").split(),
        60,
        "the hostile job to start",
    )
    body = collected_after(host, host_time(host))
    want_alloc, want_idx = scontrol_allocations(host)
    ((node, owner),) = [(n, o) for (job, n), o in want_alloc.items() if job == hostile]
    assert owner == (1.0, "bob", "chem", "gpu")
    got_alloc, got_idx = exporter_allocations(body)
    assert got_alloc == want_alloc
    assert got_idx == want_idx
    assert {n for _, n in got_alloc} <= set(NODES)
    assert value(body, "slurm_gpus_alloc") == 8
    # Bounded: the exporter did not expand the pending job's name into hosts.
    rss_kib = int(host.check_output(f"ps -o rss= -p {main_pid(host)}"))
    assert rss_kib < 200 * 1024, rss_kib


def test_drained_node_state_and_reason(host, jobs):
    node, reason = "gpufleet-slurm-gpu2", "gpufleet test: fan 3 failed | ticket #42"
    since = host_time(host)
    host.check_output(f"scontrol update nodename={node} state=drain reason={shlex.quote(reason)}")
    try:
        body = collected_after(host, since)
        state, sinfo_reason = host.check_output(f"sinfo -h -N -n {node} -p gpu -o '%T|%E'").split(
            "|", 1
        )
        assert sinfo_reason == reason
        assert state == "draining"  # busy: drains once its jobs end
        assert (
            value(body, "slurm_node_state_reason_info", node=node, state=state, reason=reason) == 1
        )
        assert value(body, "slurm_node_drain_reason_info", node=node, reason=reason) == 1
        assert value(body, "slurm_node_status", node=node, partition="gpu", status=state) == 1
        assert value(body, "slurm_nodes_drain", partition="gpu") == 1
        assert value(body, "slurm_nodes_drain", partition="debug") == 0
        assert exporter_nodes(body) == sinfo_nodes(host)
    finally:
        since = host_time(host)
        host.check_output(f"scontrol update nodename={node} state=resume")
    body = collected_after(host, since)
    # Resumed: no longer drained. Slurm 24.11 keeps the last reason on the node (22.05
    # cleared it); the exporter says what sinfo says.
    state, sinfo_reason = host.check_output(f"sinfo -h -N -n {node} -p gpu -o '%T|%E'").split(
        "|", 1
    )
    assert not state.startswith("drain")
    reasons = {
        (lab["node"], lab["state"], lab["reason"])
        for lab, _ in samples(body, "slurm_node_state_reason_info")
    }
    assert reasons == ({(node, state, sinfo_reason)} if sinfo_reason != "none" else set())
    assert not samples(body, "slurm_node_drain_reason_info")
    assert value(body, "slurm_nodes_drain", partition="gpu") == 0
    assert exporter_nodes(body) == sinfo_nodes(host)


def test_flag_change_restarts_and_the_job_series_cap_holds(host, jobs):
    before = main_pid(host)
    result = converge_exporter("slurm_exporter_max_job_series=3")
    assert result.returncode == 0, result.stdout[-3000:]
    try:
        assert main_pid(host) != before
        body = collected_after(host, host_time(host))
        want_alloc, _ = scontrol_allocations(host)
        got_alloc, got_idx = exporter_allocations(body)
        assert len(got_alloc) == 3
        assert value(body, "slurm_exporter_job_series") == 3
        assert value(body, "slurm_exporter_job_series_dropped_total") >= len(want_alloc) - 3
        # The exported pairs are Slurm's, from the lowest job ids, with their indices.
        assert all(want_alloc[pair] == got for pair, got in got_alloc.items())
        kept = {int(job) for job, _ in got_alloc}
        assert max(kept) <= min(int(job) for job, _ in set(want_alloc) - set(got_alloc))
        assert {(job, node) for job, node, _ in got_idx} == set(got_alloc)
        # Totals per user are computed before the cap.
        for user in ("alice", "bob"):
            held = sum(gpus for gpus, u, _, _ in want_alloc.values() if u == user)
            assert value(body, "slurm_user_gpus_running", user=user) == held
    finally:
        result = converge_exporter()
    assert result.returncode == 0, result.stdout[-3000:]
    body = collected_after(host, host_time(host))
    assert exporter_allocations(body) == scontrol_allocations(host)


def self_signed(tmp_path) -> tuple[str, str]:
    """A throwaway certificate for 127.0.0.1 and its key, made on the controller."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(tmp_path / "tls.key"), "-out", str(tmp_path / "tls.crt"),
         "-subj", "/CN=gpufleet-slurmctl", "-addext", "subjectAltName=IP:127.0.0.1",
         "-addext", "keyUsage=critical,digitalSignature,keyCertSign",
         "-days", "2"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return (tmp_path / "tls.crt").read_text(), (tmp_path / "tls.key").read_text()


def test_tls_and_basic_auth_switch_on_and_off_without_a_restart(host, tmp_path):
    cert, key = self_signed(tmp_path)
    password = "molecule-only-scrape-4Rt9"
    secured = {
        "slurm_exporter_tls_cert": cert,
        "slurm_exporter_tls_key": key,
        "slurm_exporter_basic_auth_users": {"prometheus": password},
    }
    pid = main_pid(host)
    host.check_output(f"printf '%s' {shlex.quote(cert)} > /tmp/exporter-ca.crt")
    https = URL.replace("http://", "https://")
    curl = "curl -sS --max-time 3 --cacert /tmp/exporter-ca.crt -o /dev/null -w '%{http_code}'"
    try:
        result = converge_exporter(json.dumps(secured))
        assert result.returncode == 0, result.stdout[-3000:]
        assert password not in result.stdout and "PRIVATE KEY" not in result.stdout
        mode = host.file("/etc/gpufleet/slurm-exporter/tls.key")
        assert (mode.mode, mode.user, mode.group) == (0o640, "root", USER)
        # The exporter rereads its web config: TLS and auth are on, same process.
        assert host.check_output(f"{curl} {https}") == "401"
        assert host.check_output(f"{curl} -u prometheus:wrong-password {https}") == "401"
        body = host.check_output(
            f"curl -fsS --max-time 3 --cacert /tmp/exporter-ca.crt -u prometheus:{password} {https}"
        )
        assert value(body, "slurm_up") == 1
        assert host.run(f"curl -sS --max-time 3 {URL}").rc != 0  # no plain HTTP any more
        assert main_pid(host) == pid
        # A rerun with the same settings changes nothing (the bcrypt hash is stable).
        again = converge_exporter(json.dumps(secured))
        assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]
    finally:
        result = converge_exporter()
    assert result.returncode == 0, result.stdout[-3000:]
    assert value(metrics(host), "slurm_up") == 1
    assert not host.file("/etc/gpufleet/slurm-exporter/tls.key").exists
    assert main_pid(host) == pid


def test_each_shard_gets_its_own_nodes_from_the_node_map(host):
    """/metrics?shard=k serves the nodes the node map gives shard k, no process restart.

    This scenario has no Prometheus shards: the role writes an empty map. A two-shard map
    is put in its place (as a rebalanced inventory would), then the role's is restored.
    """
    path = "/etc/gpufleet/slurm-exporter/node-shards.json"
    node_map = host.file(path)
    assert (node_map.mode, node_map.user, node_map.group) == (0o640, "root", USER)
    assert json.loads(node_map.content_string) == {"shards": {}}
    pid = main_pid(host)
    two = json.dumps({"shards": {"0": [NODES[0]], "1": [NODES[1]]}})
    try:
        host.check_output(f"printf '%s' {shlex.quote(two)} > {path}")
        # Reread at the next collection.
        wait_until(
            lambda: value(metrics(host), "slurm_exporter_node_map_shards") == 2,
            4 * INTERVAL,
            "the changed node map to be reread",
        )
        whole = metrics(host)
        shard0 = metrics(host, shlex.quote(URL + "?shard=0"))
        shard1 = metrics(host, shlex.quote(URL + "?cluster=1&shard=1"))
        node_of = re.compile(r'node="([^"]*)"')
        assert set(node_of.findall(shard0)) == {NODES[0]}
        assert set(node_of.findall(shard1)) == {NODES[1]}
        assert value(shard0, "slurm_up") is None and value(shard1, "slurm_up") == 1
        assert value(whole, "slurm_exporter_unmapped_nodes") == 0
        assert len(shard0) < len(whole) and len(shard1) < len(whole)
        code = "curl -sS --max-time 2 -o /dev/null -w '%{http_code}' "
        assert host.check_output(code + shlex.quote(URL + "?shard=7")) == "404"
        assert host.check_output(code + shlex.quote(URL + "?node=x")) == "400"
    finally:
        result = converge_exporter()
    assert result.returncode == 0, result.stdout[-3000:]
    assert json.loads(host.file(path).content_string) == {"shards": {}}
    assert main_pid(host) == pid


def test_keeps_serving_with_slurmctld_down(host, jobs):
    pid = main_pid(host)
    stopped = float(host.check_output("systemctl stop slurmctld && date +%s.%N"))
    try:

        def down():
            body = metrics(host)  # curl --max-time 2: a scrape never waits for Slurm
            return body if value(body, "slurm_up") == 0 else None

        body = wait_until(down, 3 * (INTERVAL + TIMEOUT), "slurm_up 0")
        # Said by the end of the first cycle that starts after the stop (at most one
        # interval later) and whose commands are killed at the timeout. Host clock, so
        # the test's own SSH round trips do not count.
        reported = value(body, "slurm_exporter_last_collect_timestamp_seconds")
        assert reported - stopped <= INTERVAL + TIMEOUT + 1
        assert value(body, "slurm_exporter_command_success", command="squeue") == 0
        errors = sum(
            val
            for lab, val in samples(body, "slurm_exporter_command_errors_total")
            if lab["command"] == "squeue"
        )
        assert errors >= 1
        # Per-job series are never served stale; node series are, within --max-stale.
        assert not samples(body, "slurm_job_gpus_allocated")
        assert samples(body, "slurm_node_status")
        time.sleep(INTERVAL)
        assert value(metrics(host), "slurm_up") == 0
    finally:
        host.check_output("systemctl start slurmctld")
    body = wait_until(
        lambda: (b := metrics(host)) and value(b, "slurm_up") == 1 and b,
        60,
        "slurm_up 1 after slurmctld is back",
    )
    assert main_pid(host) == pid
    # The jobs survived the controller's restart and are back in the series.
    body = collected_after(host, host_time(host))
    assert exporter_allocations(body) == scontrol_allocations(host)
