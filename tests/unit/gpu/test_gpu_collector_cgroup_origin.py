"""Only slurmd's own cgroup hierarchy and position name a job (issue 26, finding 6).

A user can make cgroups below user@<uid>.service (systemd delegates that subtree), in
a rootless container, or inside their own job; paths there may carry every Slurm
fragment (slurm/uid_<n>/job_<n>, slurmstepd.scope/job_<n>). Only the fragment at the
root of the hierarchy slurmd uses (or --slurm-cgroup-root) is a job.
"""

from __future__ import annotations

import random
import time

import pytest
from gpu_helpers import gc, values_of
from test_gpu_collector_slurm import IN_CONTAINER, SLUID, _proc

SEED = 20261129
ITERATIONS = 3000
USER = "/user.slice/user-1000.slice/user@1000.service"

# The finding's paths, and their siblings: never a job.
FORGED = [
    f"0::{USER}/app.slice/slurmstepd.scope/job_77/x",
    f"0::{USER}/app.slice/system.slice/slurmstepd.scope/job_77/step_0/user/task_0",
    f"0::{USER}/slurm/uid_2000/job_88",
    f"9:name=systemd:{USER}/slurm/uid_2000/job_88",  # v1 named hierarchy (delegated)
    f"0::{USER}/user.slice/libpod-abc.scope/container/slurm/job_5",
    f"0::{USER}/user.slice/libpod-abc.scope/container/slurm/uid_0/job_5",
    "0::/user.slice/user-1000.slice/session-3.scope/system.slice/slurmstepd.scope/job_5",
    "4:memory:/user.slice/slurm/uid_0/job_5",  # v1 fragment at depth 2
    "4:memory:/system.slice/slurmstepd.scope/job_5",  # v2 form on a v1 controller line
    "0::/slurm/uid_0/job_5",  # v1 form on the unified line
    "0::/system.slice/slurmstepd.scope/job_5".replace("/system.slice", "/x/system.slice"),
    "0::/system.slice//slurmstepd.scope/job_5",
    "0::/system.slice/slurmstepd.scope//job_5",
    "4:memory:/slurm/job_5",  # no uid_ level
    "0::/machine.slice/libpod-1a2b.scope/system.slice/slurmstepd.scope/job_9/step_0",
]


@pytest.mark.parametrize("line", FORGED, ids=range(len(FORGED)))
def test_user_made_cgroups_are_no_job(line):
    assert gc.parse_slurm_cgroup(line + "\n") is None


def test_forged_lines_beside_a_real_one_do_not_change_it():
    real = "4:memory:/slurm/uid_1000/job_3/step_0/task_0\n"
    assert gc.parse_slurm_cgroup(real + "\n".join(FORGED) + "\n") == ("3", 1000, "")


def test_lines_naming_two_jobs_are_no_job():
    text = "4:memory:/slurm/uid_1000/job_3\n6:freezer:/slurm/uid_1000/job_4\n"
    assert gc.parse_slurm_cgroup(text) is None


@pytest.mark.parametrize("separator", ["\r", "\u2028", "\x0b", "\x1c", "\x85"])
def test_only_newline_separates_lines(separator):
    """A cgroup name may hold any of these (never '\\n'): no second 'line' from them."""
    line = f"0::{USER}/a{separator}0::/system.slice/slurmstepd.scope/job_66/step_0\n"
    assert gc.parse_slurm_cgroup(line) is None


def test_below_the_job_anything_is_still_that_job():
    inner = "0::/system.slice/slurmstepd.scope/job_3/step_0/user/task_0/mine/slurm/uid_0/job_9"
    assert gc.parse_slurm_cgroup(inner + "\n") == ("3", None, "")
    v1 = "4:memory:/slurm/uid_1000/job_3/step_0/task_0/slurm/uid_0/job_9\n"
    assert gc.parse_slurm_cgroup(v1) == ("3", 1000, "")


def test_configured_root_for_a_containerised_slurmd():
    root = "/machine.slice/libpod-1a2b.scope"
    assert gc.parse_slurm_cgroup(IN_CONTAINER) is None
    assert gc.parse_slurm_cgroup(IN_CONTAINER, root) == ("9", None, "")
    # with a root, the hierarchy's own root no longer counts
    assert gc.parse_slurm_cgroup("0::/system.slice/slurmstepd.scope/job_3\n", root) is None
    assert gc.parse_slurm_cgroup(IN_CONTAINER, root + "/system.slice") is None


@pytest.mark.parametrize(
    ("root", "ok"),
    [
        ("", True),
        ("/machine.slice/libpod-1a2b.scope", True),
        ("/", False),
        ("machine.slice", False),
        ("/a/", False),
        ("/a//b", False),
        ("/a/../b", False),
    ],
)
def test_slurm_cgroup_root_option(root, ok):
    assert gc.valid_cgroup_root(root) is ok
    if not ok:
        with pytest.raises(SystemExit):
            gc.parse_args(["--slurm-cgroup-root", root])


def test_end_to_end_forged_cgroups_get_no_job_series(fake_smi, run_collector, tmp_path):
    proc = tmp_path / "proc"
    _proc(proc, 4242, f"0::{USER}/app.slice/slurmstepd.scope/job_77/x\n", uid=1000)
    _proc(proc, 4243, f"0::{USER}/slurm/uid_2000/job_88\n", uid=1000)
    _proc(proc, 4244, "0::/system.slice/slurmstepd.scope/job_5/step_0/user/task_0\n", uid=0)
    fake_smi.set(apps="4242:0,4243:0,4244:0")
    text = run_collector("--proc-root", str(proc))
    jobs = values_of(text, "node_gpu_slurm_job_info")
    assert jobs == [1]
    assert 'job_id="5"' in text and 'job_id="77"' not in text and 'job_id="88"' not in text
    assert values_of(text, "node_gpu_compute_processes", gpu="0") == [3]
    # the two forged ones are counted, for GpuJobCgroupRejected
    assert values_of(text, "node_gpu_job_cgroups_rejected") == [2]


def test_processes_outside_any_job_shape_are_not_counted_as_rejected(
    fake_smi, run_collector, tmp_path
):
    proc = tmp_path / "proc"
    _proc(proc, 4250, "0::/user.slice/user-1000.slice/session-3.scope\n", uid=1000)
    _proc(proc, 4251, "0::/system.slice/slurmstepd.scope/job_5/step_0/user/task_0\n", uid=0)
    fake_smi.set(apps="4250:0,4251:0")
    text = run_collector("--proc-root", str(proc))
    assert values_of(text, "node_gpu_job_cgroups_rejected") == [0]


@pytest.mark.parametrize("line", FORGED, ids=range(len(FORGED)))
def test_user_made_job_shaped_cgroups_look_like_jobs(line):
    """What parse_slurm_cgroup refuses above is what the rejected gauge counts."""
    assert gc.looks_like_slurm_job(line + "\n")


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/system.slice/sshd.service\n",
        "4:memory:/slurm/uid_0\n",  # slurmd's own level above the jobs
        "0::/user.slice/job_x/jobs_5/my_slurmstepd.scopes\n",
        "",
    ],
)
def test_cgroups_without_a_job_shaped_name_do_not(text):
    assert not gc.looks_like_slurm_job(text)


# --------------------------------------------------------------- property tests


def _fragment(rng: random.Random) -> tuple[str, str, tuple[str, int | None, str]]:
    """(hierarchy head, the Slurm part of a path, the job it names at the root)."""
    job = str(rng.randrange(1, 0xFFFFFFFD))
    tail = rng.choice(["", "/step_0", "/step_batch/user/task_0", "/step_extern/user"])
    if rng.random() < 0.5:
        uid = rng.randrange(0, 70000)
        node = rng.choice(["", "_gpu01", "_n-7.rack2"])
        controller = rng.choice(["4:memory", "6:freezer", "3:cpuset", "2:cpu,cpuacct"])
        return controller, f"/slurm{node}/uid_{uid}/job_{job}{tail}", (job, uid, "")
    scope = rng.choice(["slurmstepd.scope", "gpu01_slurmstepd.scope"])
    if rng.random() < 0.2:
        return "0:", f"/system.slice/{scope}/{SLUID}{tail}", ("", None, SLUID)
    return "0:", f"/system.slice/{scope}/job_{job}{tail}", (job, None, "")


PREFIX_NAMES = [
    "user.slice",
    "user-1000.slice",
    "user@1000.service",
    "app.slice",
    "container",
    "slurm",
    "machine.slice",
    "libpod-1a2b.scope",
    "docker-0f.scope",
    "init.scope",
    "system.slice",
    "slurmstepd.scope",
    "uid_0",
    "job_1",
    "session-3.scope",
]


def _prefix(rng: random.Random) -> str:
    names = rng.choices([*PREFIX_NAMES, "x" * rng.randrange(1, 9)], k=rng.randrange(1, 5))
    return "/" + "/".join(names)


def test_property_valid_fragments_count_only_at_the_root():
    rng = random.Random(SEED)
    deadline = time.monotonic() + 20
    for _ in range(ITERATIONS):
        head, fragment, job = _fragment(rng)
        assert gc.parse_slurm_cgroup(f"{head}:{fragment}\n") == job, fragment
        prefix = _prefix(rng)
        assert gc.parse_slurm_cgroup(f"{head}:{prefix}{fragment}\n") is None, prefix + fragment
        assert gc.looks_like_slurm_job(f"{head}:{prefix}{fragment}\n"), prefix + fragment
        # the same prefix as the configured root makes it a job again
        assert gc.parse_slurm_cgroup(f"{head}:{prefix}{fragment}\n", prefix) == job
        # a named (v1, no controller) hierarchy never counts
        assert gc.parse_slurm_cgroup(f"7:name=systemd:{fragment}\n") is None
        assert time.monotonic() < deadline


def test_property_random_paths_never_raise():
    rng = random.Random(SEED + 1)
    alphabet = "/:_.-0123456789abcjobuidslurmstepd\r\n\u2028\x00 @"
    for _ in range(ITERATIONS):
        text = "".join(rng.choices(alphabet, k=rng.randrange(0, 120)))
        job = gc.parse_slurm_cgroup(text)
        assert job is None or isinstance(job, gc.CgroupJob)
