"""Slurm job attribution from /proc/PID/cgroup (cgroup v1 and v2)."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest
from gpu_helpers import gc, values_of

V2 = "0::/system.slice/slurmstepd.scope/job_840392/step_0/user/task_0\n"
V1 = (
    "12:memory:/slurm/uid_1000/job_12345/step_0\n"
    "4:cpu,cpuacct:/slurm/uid_1000/job_12345/step_batch/task_0\n"
    "1:name=systemd:/system.slice/slurmd.service\n"
    "0::/\n"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (V2, ("840392", None)),
        (V1, ("12345", 1000)),
        ("0::/system.slice/slurmstepd.scope/job_42/step_extern/user\n", ("42", None)),
        ("0::/system.slice/node7_slurmstepd.scope/job_9/step_interactive\n", ("9", None)),
        ("11:cpuset:/slurm_node7/uid_0/job_99\n", ("99", 0)),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("0::/system.slice/cron.service/job_12\n", None),  # not Slurm
        ("", None),
    ],
)
def test_parse_slurm_cgroup(text, expected):
    assert gc.parse_slurm_cgroup(text) == expected


def test_status_uid():
    assert gc.parse_status_uid("Name:\tpython\nUid:\t1000\t1000\t1000\t1000\n") == 1000
    assert gc.parse_status_uid("Name: x\n") is None


def _proc(root: Path, pid: int, cgroup: str, uid: int | None = None) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(cgroup)
    if uid is not None:
        (root / str(pid) / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def test_one_series_per_gpu_and_job(fake_smi, run_collector, tmp_path):
    """H100 load capture: PIDs 11327/11328 (memhog) and 11345 (gpu_burn) on GPU 0."""
    proc = tmp_path / "proc"
    _proc(proc, 11327, "0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0\n", uid=0)
    _proc(proc, 11328, "0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_1\n", uid=0)
    _proc(proc, 11345, "7:memory:/slurm/uid_65534/job_456/step_batch\n")
    fake_smi.set(state="load")
    text = run_collector("--proc-root", str(proc))
    jobs = [line for line in text.splitlines() if line.startswith("node_gpu_slurm_job_info{")]
    assert len(jobs) == 2
    assert values_of(text, "node_gpu_slurm_job_info", gpu="0", job_id="123", user=_name(0)) == [1]
    user = _name(65534)
    assert values_of(text, "node_gpu_slurm_job_info", gpu="0", job_id="456", user=user) == [1]
    assert "pid" not in "".join(jobs)


def test_eight_gpus_jobs_bounded(fake_smi, run_collector, tmp_path):
    proc = tmp_path / "proc"
    apps = []
    for gpu in range(8):
        for task in range(4):  # 4 ranks of the same job on every GPU
            pid = 2000 + gpu * 10 + task
            job = 700 if gpu < 4 else 701
            _proc(
                proc,
                pid,
                f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_{task}\n",
                uid=0,
            )
            apps.append(f"{pid}:{gpu}:512")
    apps.append("999:0:100")  # a process outside Slurm (no cgroup file)
    fake_smi.set(gpus=8, apps=",".join(apps))
    text = run_collector("--proc-root", str(proc))
    assert len(values_of(text, "node_gpu_slurm_job_info")) == 8
    assert values_of(text, "node_gpu_slurm_job_info", gpu="5", job_id="701") == [1]
    assert values_of(text, "node_gpu_compute_processes", gpu="0") == [5]
    assert values_of(text, "node_gpu_compute_processes", gpu="7") == [4]


def test_jobs_by_gpu_is_pure():
    apps = [gc.ComputeApp("GPU-a", 1, None), gc.ComputeApp("GPU-a", 2, None)]
    lookup = {1: ("5", "alice"), 2: ("5", "alice")}.get
    assert gc.jobs_by_gpu(apps, lookup) == {"GPU-a": {("5", "alice")}}
