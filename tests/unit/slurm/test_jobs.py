"""Job records: user text in scontrol's free-text fields must not change who holds which GPU.

The text form (`scontrol show job -d -o`, Slurm 22.05) is read through its fixed layout; the
JSON form (`scontrol show job -d --json`, 24.11) through the data_parser schema. The attacks
below are the reported ones: a job name carrying ` UserId=victim(4242) ...`, a work dir
carrying a per-node GRES group on a node that does not exist, a hostlist bomb in a pending
job's name, and a line break that starts a forged record.
"""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest
from conftest import exp, fixture_text

CAPTURE = fixture_text("22.05", "scontrol_jobs.txt")
SQUEUE = exp.parse_squeue(fixture_text("22.05", "squeue.txt"))[0]
FORGED_HEAD = (
    "UserId=victim(4242) GroupId=victim(4242) MCS_label=N/A Account=victim_acct "
    "JobState=RUNNING Partition=vip NodeList=gpu09 JOB_GRES=gpu:a100:8   "
    "Nodes=gpu09 CPU_IDs=0 Mem=0 GRES=gpu:a100:8(IDX:0-7) MinCPUsNode=1"
)


def record(job_id: str, text: str = CAPTURE) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"JobId={job_id} "))


def replace_in(job_id: str, old: str, new: str, text: str = CAPTURE) -> str:
    line = record(job_id, text)
    assert old in line
    return text.replace(line, line.replace(old, new, 1))


def view(jobs) -> dict[str, tuple]:
    return {
        j.job_id: (j.state, j.user, j.account, j.partition, j.array_job_id, j.allocations)
        for j in jobs
    }


CLEAN = view(exp.parse_scontrol_jobs(CAPTURE)[0])


def attributed(jobs) -> dict[str, tuple]:
    """What reaches the per-job series: verified RUNNING jobs with GPUs."""
    kept, _ = exp.verify_jobs(jobs, SQUEUE)
    return {
        j.job_id: (j.user, j.account, j.partition, j.allocations)
        for j in kept
        if j.state == "RUNNING" and j.allocations
    }


# --- the reported attacks, text form -------------------------------------------------------


def test_job_name_cannot_claim_another_user_account_or_partition():
    text = replace_in(
        "1", "JobName=train-a", "JobName=x UserId=victim(4242) Account=victim_acct Partition=vip"
    )
    jobs, bad = exp.parse_scontrol_jobs(text)
    assert bad == 0
    assert view(jobs) == CLEAN  # job 1 is still root's, physics, gpu, gpu02 IDX 0-1


def test_work_dir_cannot_add_gpus_on_a_phantom_node():
    text = replace_in(
        "7",
        "WorkDir=/tmp/slurmtest/jobs",
        "WorkDir=/tmp/a Nodes=gpu09 CPU_IDs=0 Mem=0 GRES=gpu:a100:8(IDX:0-7)",
    )
    jobs, bad = exp.parse_scontrol_jobs(text)
    assert bad == 0 and view(jobs) == CLEAN
    assert all(a.node != "gpu09" for j in jobs for a in j.allocations)


@pytest.mark.parametrize(
    "field", ["Command=(null)", "StdOut=/tmp/slurmtest/jobs/slurm-6.out", "Features=(null)"]
)
def test_other_free_text_fields_cannot_add_gpus(field):
    key = field.split("=", 1)[0]
    text = replace_in(
        "6", field, f"{key}=/x   Nodes=gpu09 CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7) JobState=RUNNING"
    )
    jobs, bad = exp.parse_scontrol_jobs(text)
    assert bad == 0 and view(jobs) == CLEAN


def test_hostlist_bomb_in_a_pending_job_name_costs_nothing():
    bomb = "JobName=Nodes=a[0-99999]b[0-99999] CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-99999)"
    text = replace_in("8", "JobName=big", bomb)
    tracemalloc.start()
    start = time.thread_time()  # CPU time: a loaded machine cannot fail the bound
    try:
        jobs, bad = exp.parse_scontrol_jobs(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.thread_time() - start < 1.0
    assert peak < 5 * 1024 * 1024  # was > 4 GB
    assert bad == 0 and view(jobs) == CLEAN


# Job 1 is root's, physics, gpu, RUNNING: a head only its owner could write to hide it.
OWN_CLONE = (
    FORGED_HEAD.replace("victim(4242)", "root(0)")
    .replace("Account=victim_acct", "Account=physics")
    .replace("Partition=vip", "Partition=gpu")
)


def test_a_forged_head_in_free_text_is_outvoted_by_squeue():
    """Issue 26 finding 2: a record head forged in the Comment (or name, or work dir) made
    the record ambiguous and dropped all its series; the owner escaped the idle alert."""
    forged_comment = f"Comment=x {FORGED_HEAD.replace('RUNNING', 'PENDING')} StdErr="
    for old, new in (
        ("JobName=train-a", f"JobName=x {FORGED_HEAD}"),
        ("WorkDir=/tmp/slurmtest/jobs", f"WorkDir=/x {FORGED_HEAD}"),
        ("StdErr=", forged_comment),
    ):
        jobs, bad = exp.parse_scontrol_jobs(replace_in("1", old, new))
        assert bad == 0 and list(jobs.unresolved) == ["1"]
        assert attributed(jobs) == attributed(exp.parse_scontrol_jobs(CAPTURE)[0])
        assert exp.verify_jobs(jobs, SQUEUE)[1] == {}


def test_a_head_cloned_by_its_owner_costs_only_the_owner_and_is_counted():
    jobs, _ = exp.parse_scontrol_jobs(replace_in("1", "JobName=train-a", f"JobName=x {OWN_CLONE}"))
    _, rejected = exp.verify_jobs(jobs, SQUEUE)
    assert rejected == {"ambiguous": 1}  # slurm_exporter_job_records_rejected: an alert
    clean = attributed(exp.parse_scontrol_jobs(CAPTURE)[0])
    assert attributed(jobs) == {k: v for k, v in clean.items() if k != "1"}


def test_a_line_break_cannot_forge_a_record():
    # A fresh job id: the text parser cannot tell, squeue can (no such job).
    forged = f"JobId=4242 JobName=y {FORGED_HEAD} "
    text = replace_in("7", "StdOut=/tmp/slurmtest/jobs/slurm-7.out", f"StdOut=/x\n{forged}")
    jobs, _ = exp.parse_scontrol_jobs(text)
    assert "4242" in view(jobs)
    _, rejected = exp.verify_jobs(jobs, SQUEUE)
    assert rejected == {"not_in_squeue": 1}
    assert attributed(jobs) == attributed(exp.parse_scontrol_jobs(CAPTURE)[0])


def test_a_record_forged_with_another_jobs_id_does_not_drop_that_job():
    """Issue 26 finding 2: a job named `x\nJobId=<another job> ...` made the duplicate rule
    drop the other user's job. squeue's columns (no user text) say which record is real."""
    clean = attributed(exp.parse_scontrol_jobs(CAPTURE)[0])
    forged = f"JobId=6 JobName=y {FORGED_HEAD.replace('victim', 'root')} "
    for job_id, old, new in (
        ("7", "StdOut=/tmp/slurmtest/jobs/slurm-7.out", f"StdOut=/x\n{forged}"),
        ("7", "JobName=", f"JobName=x\n{forged} JobName="),
    ):
        jobs, _ = exp.parse_scontrol_jobs(replace_in(job_id, old, new))
        assert list(jobs.unresolved) == ["6"]
        _, rejected = exp.verify_jobs(jobs, SQUEUE)
        assert attributed(jobs)["6"] == clean["6"]
        assert rejected.get("duplicate", 0) == 0


def test_a_perfect_clone_of_another_jobs_record_is_settled_by_asking_for_that_job():
    """A forged record that copies everything squeue shows of job 6 but its GPUs: the text
    of the whole table cannot tell; `scontrol show job -d -o 6` starts with the real one."""
    six = record("6")
    clone = six.replace("Nodes=vm", "Nodes=gpu09").replace("JobName=multi", "JobName=y")
    text = replace_in("7", "StdOut=/tmp/slurmtest/jobs/slurm-7.out", f"StdOut=/x\n{clone}")
    jobs, _ = exp.parse_scontrol_jobs(text)
    assert exp.verify_jobs(jobs, SQUEUE)[1] == {"duplicate": 1}  # the table alone: doubt
    reader = exp.TextJobReader()
    reader.feed(text.encode())
    reader.finish()
    reader.adopt("6", six + "\n" + clone)  # what scontrol says of job 6 alone
    assert attributed(reader.result) == attributed(exp.parse_scontrol_jobs(CAPTURE)[0])


def test_a_forged_record_cannot_take_the_id_of_an_unreadable_one():
    """Found by the fuzz test: job 12's own record made ambiguous by its owner, and a line
    break elsewhere forging "JobId=12" with 12's user: the id still has two records."""
    text = replace_in("12", "JobName=gpus-flag", f"JobName=x {FORGED_HEAD}")
    forged = f"JobId=12 JobName=y {FORGED_HEAD.replace('victim(4242)', 'slurm(64030)')} "
    text = replace_in("4", "Command=(null)", f"Command=/x\n{forged}", text)
    jobs, _ = exp.parse_scontrol_jobs(text)
    assert attributed(jobs) == attributed(exp.parse_scontrol_jobs(CAPTURE)[0])
    # Unreadable (more heads than MAX_RECORD_HEADS): no other record of 12 is believed.
    many = " ".join([FORGED_HEAD] * (exp.MAX_RECORD_HEADS + 1))
    text = replace_in("12", "JobName=gpus-flag", f"JobName=x {many}")
    forged = f"JobId=12 JobName=y {record('12').split(' ', 2)[2]}"
    text = replace_in("4", "Command=(null)", f"Command=/x\n{forged}", text)
    jobs, _ = exp.parse_scontrol_jobs(text)
    assert jobs.rejected == {"ambiguous": 1}
    assert exp.verify_jobs(jobs, SQUEUE)[1] == {"duplicate": 1}
    assert "12" not in view(exp.verify_jobs(jobs, SQUEUE)[0])


def test_squeue_must_name_the_same_user():
    queue = [r if r.job_id != "7" else r._replace(user="x") for r in SQUEUE]
    jobs, _ = exp.parse_scontrol_jobs(CAPTURE)
    kept, rejected = exp.verify_jobs(jobs, queue)
    assert rejected == {"user_mismatch": 1}
    assert "7" not in {j.job_id for j in kept}
    # Without squeue results no text record is exported.
    assert exp.verify_jobs(jobs, None)[1] == {"not_in_squeue": 3}


def test_characters_splitlines_would_split_on_stay_in_the_name():
    for sep in ("\r", "\x1c", "\x1e", "\u2028", "\x85", "\x0b"):
        text = replace_in("1", "JobName=train-a", f"JobName=a{sep}JobId=99 {FORGED_HEAD}")
        jobs, _ = exp.parse_scontrol_jobs(text)
        assert view(jobs) == {k: v for k, v in CLEAN.items() if k != "1"}  # ambiguous, not 99


def test_head_tolerates_new_system_fields_and_the_2411_tres_names():
    text = CAPTURE.replace(" BatchHost=", " StepMgrEnabled=Yes BatchHost=").replace(
        " TRES=cpu=", " ReqTRES=cpu=1 AllocTRES=cpu="
    )
    jobs, bad = exp.parse_scontrol_jobs(text)
    assert bad == 0 and view(jobs) == CLEAN


def test_crontab_spec_is_the_one_quoted_value():
    cron = 'Deadline=N/A CronJob=Yes CrontabSpec="*/5 * * * *" SuspendTime='
    jobs, bad = exp.parse_scontrol_jobs(replace_in("1", "Deadline=N/A SuspendTime=", cron))
    assert bad == 0 and view(jobs) == CLEAN
    # ... and cannot smuggle keys in.
    cron = 'Deadline=N/A CrontabSpec="* UserId=victim(4242)" SuspendTime='
    jobs, bad = exp.parse_scontrol_jobs(replace_in("1", "Deadline=N/A SuspendTime=", cron))
    assert bad == 1 and "1" not in view(jobs)


def test_a_huge_gres_index_range_rejects_only_that_job():
    text = replace_in("1", "GRES=gpu:a100:2(IDX:0-1)", "GRES=gpu:1(IDX:0-99999)")
    jobs, bad = exp.parse_scontrol_jobs(text)
    assert bad == 1 and jobs.rejected == {"bounds": 1}
    assert view(jobs) == {k: v for k, v in CLEAN.items() if k != "1"}


def test_the_hostlist_budget_is_shared_by_the_records_of_one_output():
    seg = "Nodes=gpu[00000-59999] CPU_IDs=0 Mem=1 GRES=gpu:1(IDX:0)"
    text = "\n".join(
        replace_in("1", "Nodes=gpu02 CPU_IDs=0 Mem=500 GRES=gpu:a100:2(IDX:0-1)", seg).replace(
            "JobId=1 ", f"JobId={n} "
        )
        for n in range(100, 106)
    )
    jobs, _ = exp.parse_scontrol_jobs(text)
    hosts = sum(len(j.allocations) for j in jobs)
    assert hosts <= exp.MAX_HOSTS_PER_SCRAPE and jobs.rejected["bounds"] >= 1


def test_only_running_jobs_get_their_gpus_read():
    text = replace_in("1", "JobState=RUNNING", "JobState=COMPLETING")
    jobs, _ = exp.parse_scontrol_jobs(text)
    assert view(jobs)["1"][0] == "COMPLETING" and view(jobs)["1"][-1] == ()


# --- JSON (data_parser) ------------------------------------------------------------------


def test_json_reads_the_same_allocations_as_the_text_form():
    jobs, bad = exp.parse_scontrol_jobs_json(fixture_text("synthesized-json", "scontrol_jobs.json"))
    assert bad == 0 and jobs.source == "json"
    got = view(jobs)
    for job_id in ("1", "6", "7"):  # the same jobs as the 22.05 text capture
        assert got[job_id] == CLEAN[job_id], job_id
    assert got["13"] == ("RUNNING", "root", "bio", "debug", "11", ())
    assert got["14"][0] == "COMPLETING" and got["14"][-1] == ()  # ["COMPLETED", "COMPLETING"]
    assert got["8"][0] == "PENDING" and got["2"][0] == "CANCELLED"
    assert "99" not in got  # the line break in job 7's name is just a character in JSON
    assert exp.verify_jobs(jobs, None) == (list(jobs), {})  # JSON needs no squeue


def test_json_v0038_shape():
    # 22.05's openapi v0.0.38 (squeue --json): plain numbers, job_state a string.
    doc = {
        "jobs": [
            {
                "job_id": 5,
                "job_state": "RUNNING",
                "user_name": "alice",
                "account": "a",
                "partition": "p",
                "array_job_id": 0,
                "nodes": "g[1-2]",
                "job_resources": {"nodes": "g[1-2]", "allocated_hosts": 2},
                "gres_detail": ["gpu:1(IDX:0)", "gpu:a100:2(IDX:2-3)"],
            },
            {"job_id": 6, "job_state": "PENDING", "user_id": 1001, "gres_detail": []},
        ]
    }
    jobs, bad = exp.parse_scontrol_jobs_json(json.dumps(doc))
    assert bad == 0
    assert view(jobs) == {
        "5": (
            "RUNNING",
            "alice",
            "a",
            "p",
            None,
            (exp.NodeAlloc("g1", 1, (0,)), exp.NodeAlloc("g2", 2, (2, 3))),
        ),
        "6": ("PENDING", "1001", "", "", None, ()),
    }


@pytest.mark.parametrize(
    ("text", "rejected"),
    [
        ("not json", {"malformed": 1}),
        ('{"jobs": {}}', {"malformed": 1}),
        ('{"jobs": [1, {"job_id": "x"}, {"job_id": 3, "job_state": 7}]}', {"malformed": 3}),
        (
            '{"jobs": [{"job_id": 3, "job_state": ["RUNNING"], "nodes": "a[0-99999]b[0-99999]",'
            ' "gres_detail": ["gpu:1"]}]}',
            {"bounds": 1},
        ),
        (
            '{"jobs": [{"job_id": 3, "job_state": ["RUNNING"], "nodes": "a",'
            ' "gres_detail": ["gpu:1(IDX:0-99999)"]}]}',
            {"bounds": 1},
        ),
        (
            '{"jobs": [{"job_id": 3, "job_state": "PENDING"},'
            ' {"job_id": 3, "job_state": "RUNNING"}]}',
            {"duplicate": 2},
        ),
    ],
)
def test_json_bad_input_is_counted_not_raised(text, rejected):
    jobs, bad = exp.parse_scontrol_jobs_json(text)
    assert list(jobs) == [] and jobs.rejected == rejected and bad == sum(rejected.values())


# --- real Slurm 24.11 captures (job 4: hostile free text; job 5: a hostlist bomb as name) ----

WANT_2411 = {
    "2": ("RUNNING", "alice", "physics", "gpu", None, (("gpufleet-slurm-gpu1", 2, (0, 1)),)),
    "3": (
        "RUNNING",
        "bob",
        "chem",
        "gpu",
        None,
        (("gpufleet-slurm-gpu1", 1, (2,)), ("gpufleet-slurm-gpu2", 1, (0,))),
    ),
    "4": ("RUNNING", "bob", "chem", "gpu", None, (("gpufleet-slurm-gpu1", 1, (3,)),)),
}


def view_2411(jobs) -> dict[str, tuple]:
    return {
        job_id: (*v[:5], tuple((a.node, a.gpus, a.indices) for a in v[5]))
        for job_id, v in view(jobs).items()
        if v[0] == "RUNNING"
    }


def test_2411_text_capture_with_hostile_job_text():
    text = fixture_text("24.11", "scontrol_jobs.txt")
    line = record("4", text)
    assert "UserId=alice(2001)" in line and "gpu09" in line  # the hostile text is there
    jobs, bad = exp.parse_scontrol_jobs(text)
    assert bad == 0 and view_2411(jobs) == WANT_2411
    queue = exp.parse_squeue(fixture_text("24.11", "squeue.txt"))[0]
    kept, rejected = exp.verify_jobs(jobs, queue)
    assert not rejected and {j.job_id for j in kept} == set(view(jobs))
    assert view(jobs)["5"][0] == "PENDING"


@pytest.mark.parametrize("name", ["scontrol_jobs_json.txt", "squeue_json.txt"])
def test_2411_json_captures(name):
    jobs, bad = exp.parse_scontrol_jobs_json(fixture_text("24.11", name))
    assert bad == 0 and view_2411(jobs) == WANT_2411
    text_jobs = exp.parse_scontrol_jobs(fixture_text("24.11", "scontrol_jobs.txt"))[0]
    assert view(jobs) == view(text_jobs)  # every job, every field: both forms agree


def test_2411_json_pairs_gres_detail_with_the_allocation_list():
    doc = json.loads(fixture_text("24.11", "scontrol_jobs_json.txt"))
    job = next(j for j in doc["jobs"] if j["job_id"] == 3)
    # Only the allocation list names the nodes: the hostlists are gone.
    job["nodes"] = job["job_resources"]["nodes"]["list"] = ""
    job["job_resources"]["nodes"]["allocation"].reverse()
    job["gres_detail"].reverse()
    jobs, bad = exp.parse_scontrol_jobs_json(json.dumps({"jobs": [job]}))
    assert bad == 0
    assert {(a.node, a.indices) for a in jobs[0].allocations} == {
        ("gpufleet-slurm-gpu1", (2,)),
        ("gpufleet-slurm-gpu2", (0,)),
    }


# --- real Slurm 26.05 captures (molecule slurm_sid): job records carry SLUID= ------------------

WANT_2605 = {
    "2": ("RUNNING", "alice", "physics", "gpu", None, (("gpufleet-sid-gpu1", 2, (0, 1)),)),
    "3": ("RUNNING", "bob", "chem", "gpu", None, (("gpufleet-sid-gpu1", 1, (2,)),)),
}


def test_2605_text_and_json_captures_agree():
    text = fixture_text("26.05", "scontrol_jobs.txt")
    assert "SLUID=" in record("2", text)  # 26.05's new field, between JobName and UserId
    jobs, bad = exp.parse_scontrol_jobs(text)
    assert bad == 0 and view_2411(jobs) == WANT_2605
    queue = exp.parse_squeue(fixture_text("26.05", "squeue.txt"))[0]
    kept, rejected = exp.verify_jobs(jobs, queue)
    assert not rejected and {j.job_id for j in kept} == set(view(jobs))
    for name in ("scontrol_jobs_json.txt", "squeue_json.txt"):
        json_jobs, bad = exp.parse_scontrol_jobs_json(fixture_text("26.05", name))
        assert bad == 0 and view_2411(json_jobs) == WANT_2605, name
        assert view(json_jobs) == view(jobs), name
