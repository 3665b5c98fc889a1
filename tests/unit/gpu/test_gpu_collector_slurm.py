"""Slurm job attribution from /proc/PID/cgroup (cgroup v1, v2, Slurm 26.05 SLUIDs)."""

from __future__ import annotations

import pwd
import time
from pathlib import Path

import pytest
from gpu_helpers import gc, values_of

from gpufleet_node.gpu_collector import slurm

# Whole /proc/PID/cgroup files. The controller list is the one of the test bed's
# hybrid-mode kernel (Debian 12 host); the Slurm paths are the shapes each Slurm
# writes (shared/TESTBED.md "Slurm 24.11", shared/reference/gpu-metrics.md 6.5).


def v1_cgroup(freezer: str, devices: str, memory: str, cpuset: str, cpuacct: str = "/") -> str:
    """A hybrid-mode /proc/PID/cgroup: the test bed kernel's controllers, with Slurm's
    paths in the five controllers Slurm's cgroup plugins place tasks in."""
    return (
        "28:perf_event:/\n"
        "26:hugetlb:/\n"
        "25:net_cls,net_prio:/\n"
        "9:name=systemd:/system.slice/slurmd.service\n"
        "8:pids:/system.slice/slurmd.service\n"
        "7:blkio:/\n"
        f"6:freezer:{freezer}\n"
        f"5:devices:{devices}\n"
        f"4:memory:{memory}\n"
        f"3:cpuset:{cpuset}\n"
        f"2:cpuacct:{cpuacct}\n"
        "1:cpu:/\n"
        "0::/system.slice/slurmd.service\n"
    )


# Slurm 22.05 (bookworm), cgroup v1, no cgroup namespace, proctrack+task/cgroup.
_2205 = "/slurm/uid_1000/job_12345/step_batch"
V1_2205_BATCH = v1_cgroup(_2205, f"{_2205}/task_0", f"{_2205}/task_0", _2205, f"{_2205}/task_0")

# Slurm 24.11 (trixie) in a test host with --cgroupns=private: the slurm_<node>
# root, freezer at step level, memory at task level (verified on the test bed).
_2411 = "/slurm_gpu01/uid_1000/job_3/step_batch"
V1_2411_BATCH = v1_cgroup(_2411, _2411, f"{_2411}/task_0", _2411)
# ... and an srun step of job 4 (task level in memory, step level in freezer).
_2411_SRUN = "/slurm_gpu01/uid_1000/job_4/step_0"
V1_2411_SRUN = v1_cgroup(_2411_SRUN, _2411_SRUN, f"{_2411_SRUN}/task_0", _2411_SRUN)

# cgroup v2 (unified): one "0::" line.
V2_STEP0 = "0::/system.slice/slurmstepd.scope/job_840392/step_0/user/task_0\n"
V2_SHAPES = [
    ("0::/system.slice/slurmstepd.scope/job_3/step_0/user/task_0\n", "3"),
    ("0::/system.slice/slurmstepd.scope/job_3/step_batch/user/task_0\n", "3"),
    ("0::/system.slice/slurmstepd.scope/job_3/step_extern/user\n", "3"),  # pam_slurm_adopt
    ("0::/system.slice/slurmstepd.scope/job_3/step_interactive/user/task_0\n", "3"),
    ("0::/system.slice/slurmstepd.scope/job_3\n", "3"),
    ("0::/system.slice/gpu01_slurmstepd.scope/job_7/step_0/user/task_1\n", "7"),  # multi-slurmd
    ("0::/system.slice/gpu-a.rack2_slurmstepd.scope/job_7/step_batch/user/task_0\n", "7"),
]
# A node inside a container whose cgroup namespace is not private: slurmd's hierarchy
# lies below the container's cgroup, which --slurm-cgroup-root names.
IN_CONTAINER = "0::/machine.slice/libpod-1a2b.scope/system.slice/slurmstepd.scope/job_9/step_0\n"
# Slurm 26.05 without CgroupJobIdPaths=yes (shared/reference/jobcentric-anchors.md).
SLUID = "sEKNKTV3WPV500"
V2_SLUID = f"0::/system.slice/slurmstepd.scope/{SLUID}/step_0/user/task_0\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (V1_2205_BATCH, ("12345", 1000, "")),
        (V1_2411_BATCH, ("3", 1000, "")),
        (V1_2411_SRUN, ("4", 1000, "")),
        (V2_STEP0, ("840392", None, "")),
        ("11:cpuset:/slurm_node7/uid_0/job_99\n", ("99", 0, "")),
        ("4:memory:/slurm/uid_1000/job_3\n", ("3", 1000, "")),
        (V2_SLUID, ("", None, SLUID)),
        (V2_SLUID.replace(SLUID, SLUID.lower()), ("", None, SLUID)),  # str2sluid takes both
        (f"0::/system.slice/n1_slurmstepd.scope/{SLUID}/step_extern/user\n", ("", None, SLUID)),
    ],
)
def test_parse_slurm_cgroup_files(text, expected):
    assert gc.parse_slurm_cgroup(text) == expected


@pytest.mark.parametrize(("text", "job_id"), V2_SHAPES)
def test_v2_shapes(text, job_id):
    assert gc.parse_slurm_cgroup(text, "") == gc.parse_slurm_cgroup(text)
    job = gc.parse_slurm_cgroup(text)
    assert job is not None and job.job_id == job_id and job.uid is None and job.sluid == ""


@pytest.mark.parametrize(
    "line",
    [
        "6:freezer:/slurm_gpu01/uid_1000/job_3/step_batch",
        "4:memory:/slurm_gpu01/uid_1000/job_3/step_batch/task_0",
        "4:memory:/slurm_gpu01/uid_1000/job_4/step_0/task_0",
        "6:freezer:/slurm/uid_1000/job_3/step_extern",
        "6:freezer:/slurm/uid_1000/job_3/step_interactive",
    ],
)
def test_single_v1_lines(line):
    job = gc.parse_slurm_cgroup(line + "\n")
    assert job is not None and job.uid == 1000 and job.job_id in ("3", "4")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0::/\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/system.slice/cron.service/job_12\n",  # not Slurm
        "0::/user.slice/slurmfoo/job_12\n",
        "4:memory:/slurm/uid_1000/job_abc/step_0\n",
        "4:memory:/slurm/uid_1000/job_/step_0\n",
        "4:memory:/slurm/uid_1000/job_0\n",  # 0 is not a job id
        "4:memory:/slurm/uid_1000/job_007\n",  # Slurm never writes leading zeros
        "4:memory:/slurm/uid_1000/job_12345678901\n",  # over 32 bits
        "4:memory:/slurm/uid_1000/job_4294967295\n",  # INFINITE
        "4:memory:/slurm/uid_abc/job_3\n",
        "4:memory:/slurm/uid_99999999999/job_3\n",
        "4:memory:/slurm/uid_1000/job_3x\n",
        "4:memory:/slurm/uid_1000\n",
        "0::/system.slice/slurmstepd.scope\n",
        "0::/system.slice/slurmstepd.scope/step_0/user/task_0\n",
        "0::/system.slice/slurmstepd.scope/sEKNKTV3WPV50\n",  # 12 digits
        "0::/system.slice/slurmstepd.scope/sEKNKTV3WPV5000\n",  # 14 digits
        "0::/system.slice/slurmstepd.scope/sEKNKTV3WPVU00\n",  # U is not Crockford
        "0::/system.slice/slurmstepd.scope/sZKNKTV3WPV500\n",  # first digit over 4 bits
        "0::/system.slice/slurmstepd.scope/xEKNKTV3WPV500\n",
        "freezer:/slurm/uid_1000/job_3/step_batch\n",  # not hierarchy:controllers:path
        "x:memory:/slurm/uid_1000/job_3\n",
        "4:memory:slurm/uid_1000/job_3\n",  # relative path
        "4:memory:/slurm/uid_1000/job_3" + "/a" * 5000 + "\n",  # longer than any kernel line
        "\x00\xff\ufffd:::::/slurm/uid_1/job_1\n",
        "::" * 100000,
    ],
)
def test_no_job_never_an_exception(text):
    assert gc.parse_slurm_cgroup(text) is None


def test_huge_files_are_read_bounded_and_fast(tmp_path):
    proc = tmp_path / "proc"
    lines = ("4:memory:/" + "slurm/uid_1/" * 300 + "x\n") * 3000  # 11 MB of Slurm-ish roots
    _proc(proc, 40, lines + "0::/system.slice/slurmstepd.scope/job_3\n")
    _proc(proc, 41, "0::/" + "a" * 10_000_000 + "\n")
    start = time.monotonic()
    assert gc.job_of_pid(str(proc), 40) is None  # job_3 lies past the 64 KiB read
    assert gc.job_of_pid(str(proc), 41) is None
    assert gc.parse_slurm_cgroup(lines[: gc.CGROUP_MAX_BYTES]) is None
    assert time.monotonic() - start < 1


def test_first_slurm_line_wins_and_colons_stay_in_the_path():
    text = (
        "0::/system.slice/slurmd.service\n"
        "3:cpuset:/slurm/uid_5/job_8:9/x\n"
        "2:cpu:/slurm/uid_5/job_8\n"
    )
    assert gc.parse_slurm_cgroup(text) == ("8", 5, "")


def test_status_uid():
    assert gc.parse_status_uid("Name:\tpython\nUid:\t1000\t1000\t1000\t1000\n") == 1000
    assert gc.parse_status_uid("Name: x\n") is None
    assert gc.parse_status_uid("Uid:\t99999999999\t0\n") is None


# ------------------------------------------------------------------ SLUID -> job id


def env(*entries: str) -> bytes:
    return b"".join(e.encode() + b"\0" for e in entries)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (env("PATH=/usr/bin", "SLURM_JOB_ID=77", "HOME=/h"), "77"),
        (env("SLURM_JOB_ID=77", "SLURM_JOB_ID=78"), "77"),  # getenv() takes the first
        (env("SLURM_JOBID=77"), ""),
        (env("SLURM_JOB_ID=abc"), ""),
        (env("SLURM_JOB_ID=0"), ""),
        (env("SLURM_JOB_ID=99999999999"), ""),
        (env("XSLURM_JOB_ID=77"), ""),
        (b"A=1\0SLURM_JOB_ID=12", ""),  # cut by the read limit: never used
        (b"", ""),
        (b"\xff\xfe\0SLURM_JOB_ID=\xff\0", ""),
    ],
)
def test_environ_job_id(data, expected):
    assert gc.environ_job_id(data) == expected


def _proc(
    root: Path, pid: int, cgroup: str, uid: int | None = None, environ: bytes | None = None
) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(cgroup)
    if uid is not None:
        (root / str(pid) / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    if environ is not None:
        (root / str(pid) / "environ").write_bytes(environ)


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def test_sluid_resolved_from_a_job_process_environment(tmp_path):
    proc = tmp_path / "proc"
    extern = f"0::/system.slice/slurmstepd.scope/{SLUID}/step_extern/user\n"
    _proc(proc, 10, extern, uid=0, environ=env("SSH_CONNECTION=x"))  # adopted ssh: no id
    _proc(proc, 11, V2_SLUID, uid=0, environ=env("SLURM_JOB_ID=4242"))
    resolver = gc.SluidResolver(str(proc))
    refs = {gc.job_of_pid(str(proc), pid, resolver) for pid in (10, 11)}
    assert refs == {gc.JobRef("", _name(0), SLUID)}
    assert resolver.ids == {SLUID: "4242"}
    assert gc.job_label(next(iter(refs)), resolver.ids) == "4242"


def test_unresolved_sluid_is_the_job_key(tmp_path):
    proc = tmp_path / "proc"
    _proc(proc, 12, V2_SLUID, uid=0)  # no environ file (unreadable)
    resolver = gc.SluidResolver(str(proc))
    ref = gc.job_of_pid(str(proc), 12, resolver)
    assert ref == gc.JobRef("", _name(0), SLUID)
    assert gc.job_label(ref, resolver.ids) == SLUID


def test_environ_read_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "ENVIRON_MAX_BYTES", 64)
    proc = tmp_path / "proc"
    padding = "P=" + "x" * 50  # SLURM_JOB_ID=123456 straddles byte 64
    _proc(proc, 13, V2_SLUID, uid=0, environ=env(padding, "SLURM_JOB_ID=123456"))
    resolver = gc.SluidResolver(str(proc))
    gc.job_of_pid(str(proc), 13, resolver)
    assert resolver.ids == {}  # never "12" from a cut entry


def test_environ_reads_per_cycle_are_capped(tmp_path):
    proc = tmp_path / "proc"
    sluids = [f"s0000000000{n:03d}" for n in range(5)]
    for n, sluid in enumerate(sluids):
        cgroup = f"0::/system.slice/slurmstepd.scope/{sluid}/step_0/user/task_0\n"
        _proc(proc, 20 + n, cgroup, uid=0, environ=env(f"SLURM_JOB_ID={100 + n}"))
    resolver = gc.SluidResolver(str(proc), max_reads=2)
    for n in range(5):
        assert gc.job_of_pid(str(proc), 20 + n, resolver) is not None
    assert resolver.ids == {sluids[0]: "100", sluids[1]: "101"}
    assert resolver.reads_left == 0


def test_missing_and_odd_proc_entries_are_no_job(tmp_path):
    proc = tmp_path / "proc"
    (proc / "30" / "cgroup").mkdir(parents=True)  # a directory, not a file
    _proc(proc, 31, "4:memory:/slurm/uid_1000/job_abc\n")
    assert gc.job_of_pid(str(proc), 29, gc.SluidResolver(str(proc))) is None
    assert gc.job_of_pid(str(proc), 30) is None
    assert gc.job_of_pid(str(proc), 31) is None


# ------------------------------------------------------------------ end to end


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
    assert "sluid" not in "".join(jobs)


def test_whole_files_of_each_slurm_end_to_end(fake_smi, run_collector, tmp_path):
    proc = tmp_path / "proc"
    _proc(proc, 11327, V1_2411_BATCH)
    _proc(proc, 11328, V1_2205_BATCH)
    _proc(proc, 11345, V2_SLUID, uid=0, environ=env("SLURM_JOB_ID=5"))
    fake_smi.set(state="load")
    text = run_collector("--proc-root", str(proc))
    assert values_of(text, "node_gpu_slurm_job_info", job_id="3", user=_name(1000)) == [1]
    assert values_of(text, "node_gpu_slurm_job_info", job_id="12345") == [1]
    assert values_of(text, "node_gpu_slurm_job_info", job_id="5", sluid=SLUID) == [1]
    assert len(values_of(text, "node_gpu_slurm_job_info")) == 3


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
    lookup = {1: gc.JobRef("5", "alice"), 2: gc.JobRef("5", "alice")}.get
    assert gc.jobs_by_gpu(apps, lookup) == {"GPU-a": {gc.JobRef("5", "alice")}}
