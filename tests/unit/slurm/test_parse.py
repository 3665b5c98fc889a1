"""Parse functions on real Slurm 22.05 captures, synthesized newer formats, malformed input."""

from __future__ import annotations

import pytest
from conftest import exp, fixture_text


def _nodes(d: str):
    rows, bad = exp.parse_sinfo_nodes(fixture_text(d, "sinfo_nodes.txt"))
    assert bad == 0
    return {(r.node, r.partition): r for r in rows}


def _jobs(d: str):
    jobs, bad = exp.parse_scontrol_jobs(fixture_text(d, "scontrol_jobs.txt"))
    assert bad == 0
    return {j.job_id: j for j in jobs}


# --- GRES, ranges, hostlists ------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("gpu:a100:2(IDX:0-1)", [("gpu", "a100", 2, (0, 1))]),
        ("gpu:a100:4", [("gpu", "a100", 4, ())]),
        ("gpu:4", [("gpu", None, 4, ())]),
        ("gpu:model_a:4(S:0-3)", [("gpu", "model_a", 4, ())]),
        ("gpu:model_a:2(IDX:0,3)", [("gpu", "model_a", 2, (0, 3))]),
        ("gpu:model_a:0(IDX:N/A)", [("gpu", "model_a", 0, ())]),
        ("gpu:(null):0(IDX:N/A)", [("gpu", None, 0, ())]),
        ("gpu:4(IDX:3,5-7)", [("gpu", None, 4, (3, 5, 6, 7))]),
        ("gpu(IDX:0-1)", [("gpu", None, 2, (0, 1))]),
        ("gpu:nvidia_a100_1g.5gb:21(S:0-1)", [("gpu", "nvidia_a100_1g.5gb", 21, ())]),
        (
            "gpu:model_a:0(IDX:N/A),gpu:model_b:1(IDX:2)",
            [("gpu", "model_a", 0, ()), ("gpu", "model_b", 1, (2,))],
        ),
        (
            "gpu:a100:2(IDX:0-1),mps:200(0/100,100/100)",
            [("gpu", "a100", 2, (0, 1)), ("mps", None, 200, ())],
        ),
        ("(null)", []),
        ("", []),
    ],
)
def test_parse_gres(spec, expected):
    got = [(g.name, g.type, g.count, g.indices) for g in exp.parse_gres(spec)]
    assert got == expected


def test_parse_gres_rejects_bad_index():
    with pytest.raises(ValueError):
        exp.parse_gres("gpu:2(IDX:0-x)")


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("vm", ["vm"]),
        ("gpu02,vm", ["gpu02", "vm"]),
        ("dgx-[40,48]", ["dgx-40", "dgx-48"]),
        ("gpu[01-03,07],vm", ["gpu01", "gpu02", "gpu03", "gpu07", "vm"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ],
)
def test_expand_hostlist(text, hosts):
    assert exp.expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text", ["vm[", "vm]", "vm[1-x]", "vm[3-1]", "vm[]", "vm[[1]]", "n[1234567890]", "n[-1]"]
)
def test_expand_hostlist_rejects_malformed(text):
    with pytest.raises(ValueError):
        exp.expand_hostlist(text)


def test_hostlist_size_is_checked_before_anything_is_expanded():
    # 10**10 hosts: refused from the bracket sizes alone (the old parser used > 4 GB here).
    with pytest.raises(exp.BoundExceeded):
        exp.expand_hostlist("a[0-99999]b[0-99999]")
    with pytest.raises(exp.BoundExceeded):
        exp.expand_hostlist(f"n[0-{exp.MAX_HOSTS_PER_EXPRESSION}]")  # one more than allowed
    assert len(exp.expand_hostlist(f"n[1-{exp.MAX_HOSTS_PER_EXPRESSION}]")) == (
        exp.MAX_HOSTS_PER_EXPRESSION
    )
    # The per-collection budget is shared by all expressions of one command output.
    budget = exp.HostBudget(5)
    assert exp.expand_hostlist("n[1-3]", budget) == ["n1", "n2", "n3"]
    with pytest.raises(exp.BoundExceeded):
        exp.expand_hostlist("m[1-3]", budget)
    assert exp.expand_hostlist("m[1-2]", budget) == ["m1", "m2"]


@pytest.mark.parametrize(
    "spec",
    [
        "gpu:1(IDX:0-99999)",  # 100000 indices: the reported 100,006-series job
        f"gpu:2(IDX:0,{exp.MAX_GRES_INDEX + 1})",
        f"gpu:{exp.MAX_GPU_COUNT + 1}",
    ],
)
def test_parse_gres_bounds(spec):
    with pytest.raises(exp.BoundExceeded):
        exp.parse_gres(spec)


def test_parse_gres_refuses_numbers_longer_than_nine_digits():
    with pytest.raises(ValueError):
        exp.parse_gres("gpu:1(IDX:0-1234567890123)")


def test_parse_gres_large_non_gpu_counts_are_fine():
    assert exp.parse_gres("shard:100000,mps:400")[0].count == 100000


# --- sinfo: node states, GRES, drain reasons --------------------------------------------


def test_sinfo_nodes_real_2205_draining_and_down():
    nodes = _nodes("22.05")
    assert sorted(nodes) == [("gpu02", "gpu"), ("gpu03", "gpu"), ("vm", "debug"), ("vm", "gpu")]
    gpu02 = nodes[("gpu02", "gpu")]
    # drained while jobs 1 and 6 still run on it: "draining"
    assert gpu02.state == "draining"
    assert gpu02.reason == "XID 79: GPU fell off the bus, ticket #123 | check"  # '|' kept
    assert gpu02.reason_timestamp is not None
    assert (gpu02.cpu_alloc, gpu02.cpu_idle, gpu02.cpu_other, gpu02.cpu_total) == (2, 0, 0, 2)
    assert (gpu02.mem_alloc, gpu02.mem_total) == (600, 4000)
    assert [(g.gres_type, g.count) for g in gpu02.gres] == [("gpu:a100", 4)]
    assert [(g.count, g.indices) for g in gpu02.gres_used] == [(3, (0, 1, 2))]
    gpu03 = nodes[("gpu03", "gpu")]
    assert gpu03.state == "down*"  # '*' = not responding
    assert gpu03.reason == "power supply replaced, awaiting burn-in"
    assert (gpu03.cpu_other, gpu03.cpu_total) == (2, 2)
    assert exp.gpu_count(gpu03.gres_used) == 0
    vm = nodes[("vm", "gpu")]
    assert vm.state == "allocated" and vm.reason is None and vm.reason_timestamp is None
    assert vm.gres_used[0].indices == (0, 1, 2)


def test_sinfo_nodes_real_2205_drained_after_jobs_end():
    nodes = _nodes("22.05-after")
    assert nodes[("gpu02", "gpu")].state == "drained"
    assert exp.gpu_count(nodes[("gpu02", "gpu")].gres_used) == 0
    assert nodes[("vm", "gpu")].gres_used[0].indices == (0, 1, 2, 3)


def test_sinfo_nodes_synthesized_newer_formats():
    nodes = _nodes("synthesized")
    a005 = nodes[("a005", "gpu")]
    assert [(g.count, g.indices) for g in a005.gres_used] == [(2, (0, 3))]
    g2 = nodes[("g2", "gpu")]
    assert [(g.gres_type, g.count) for g in g2.gres] == [("gpu:model_a", 2), ("gpu:model_b", 2)]
    assert [(g.gres_type, g.count, g.indices) for g in g2.gres_used] == [
        ("gpu:model_a", 0, ()),
        ("gpu:model_b", 1, (2,)),
    ]
    assert nodes[("c001", "cpu")].gres == ()
    assert nodes[("a002", "gpu")].state == "drained*"
    assert exp.gpu_count(nodes[("m1", "mig")].gres) == 21


# --- squeue: states and pending reasons -------------------------------------------------


def test_squeue_real_2205_states_and_reasons():
    rows, bad = exp.parse_squeue(fixture_text("22.05", "squeue.txt"))
    assert bad == 0
    by_id = {r.job_id_display: r for r in rows}
    assert {r.state for r in rows} == {"COMPLETED", "FAILED", "PENDING", "CANCELLED", "RUNNING"}
    pending = {k: r.reason for k, r in by_id.items() if r.state == "PENDING"}
    assert pending == {
        "8": "Resources",  # 4 GPUs wanted, cluster full
        "9": "Dependency",
        "10": "JobHeldUser",
        "12": "Priority",
        "11_1": "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher "
        "priority partitions",
        "11_2": "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher "
        "priority partitions",
        "11_3": "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher "
        "priority partitions",
    }
    assert by_id["5"].reason == "NonZeroExitCode"
    assert by_id["7"].user == "slurm" and by_id["7"].account == "chem"
    assert by_id["6"].nodes == 2 and by_id["6"].cpus == 2


def test_squeue_real_2205_running_array_task_has_raw_job_id():
    rows, _ = exp.parse_squeue(fixture_text("22.05-after", "squeue.txt"))
    task = next(r for r in rows if r.job_id_display == "11_1")
    assert task.state == "RUNNING" and task.job_id == "13"


def test_squeue_multi_partition_pending():
    rows, _ = exp.parse_squeue("5|5|PENDING|gpu,debug|alice|ml|4|1|Priority\n")
    assert rows[0].partitions == ("gpu", "debug")


# --- scontrol show job -d: GPUs and indices per job per node -----------------------------


def test_scontrol_jobs_real_2205_gpu_indices():
    jobs = _jobs("22.05")
    # scontrol show job -d 1 printed: Nodes=gpu02 CPU_IDs=0 Mem=500 GRES=gpu:a100:2(IDX:0-1)
    j1 = jobs["1"]
    assert (j1.state, j1.user, j1.account, j1.partition) == ("RUNNING", "root", "physics", "gpu")
    assert [(a.node, a.gpus, a.indices) for a in j1.allocations] == [("gpu02", 2, (0, 1))]
    # the two-node job: one GPU on each node, different indices
    j6 = jobs["6"]
    assert [(a.node, a.gpus, a.indices) for a in j6.allocations] == [
        ("gpu02", 1, (2,)),
        ("vm", 1, (0,)),
    ]
    j7 = jobs["7"]
    assert j7.user == "slurm" and j7.account == "chem"
    assert [(a.node, a.gpus, a.indices) for a in j7.allocations] == [("vm", 2, (1, 2))]
    # finished jobs keep Nodes= segments with an empty GRES=: no allocation
    assert jobs["2"].allocations == () and jobs["4"].allocations == ()
    assert jobs["8"].state == "PENDING" and jobs["8"].allocations == ()


def test_scontrol_indices_agree_with_sinfo_gres_used():
    """The per-job indices on each node add up to sinfo's GresUsed indices for that node."""
    for d in ("22.05", "22.05-after"):
        jobs = _jobs(d)
        held: dict[str, list[int]] = {}
        for j in jobs.values():
            if j.state == "RUNNING":
                for a in j.allocations:
                    held.setdefault(a.node, []).extend(a.indices)
        for (node, _part), row in _nodes(d).items():
            used = sorted(i for g in row.gres_used for i in g.indices)
            assert sorted(held.get(node, [])) == used, (d, node)
            assert exp.gpu_count(row.gres_used) == len(used)


def test_scontrol_jobs_real_2205_array_task():
    jobs = _jobs("22.05-after")
    task = jobs["13"]
    assert task.array_job_id == "11" and task.state == "RUNNING"
    assert jobs["8"].allocations[0].indices == (0, 1, 2, 3)


def test_scontrol_jobs_synthesized_hostlist_types_mig():
    jobs = _jobs("synthesized")
    j = jobs["840392"]
    assert j.user == "alice" and j.account == "ml_lab"
    assert [(a.node, a.gpus, a.indices) for a in j.allocations] == [
        ("dgx-40", 4, (3, 5, 6, 7)),
        ("dgx-48", 4, (3, 5, 6, 7)),
    ]
    assert j.gpus == 8
    two_types = jobs["840400"]
    assert [(a.gpus, a.indices) for a in two_types.allocations] == [(2, (0, 2))]
    mig = jobs["840401"]
    assert mig.user == "4294967294" and mig.account == ""
    assert mig.allocations[0].indices == (5,)


# --- sdiag, sshare, version ------------------------------------------------------------


def test_sdiag_real_2205():
    sd, bad = exp.parse_sdiag(fixture_text("22.05", "sdiag.txt"))
    assert bad == 0
    v = sd.values
    assert v["threads"] == 3 and v["queue_size"] == 0 and v["dbd_queue_size"] == 0
    assert v["last_cycle"] == 94 and v["mean_cycle"] == 108 and v["cycle_per_minute"] == 5
    assert v["backfill_last_cycle"] == 195 and v["backfill_mean_cycle"] == 254
    assert v["backfill_depth_mean"] == 3 and v["backfilled_jobs_since_start"] == 0
    assert v["jobs_submitted"] == 7
    assert sd.rpc_by_type["REQUEST_SUBMIT_BATCH_JOB"][0] >= 5
    assert "root" in sd.rpc_by_user


def test_sshare_real_2205_is_empty_without_slurmdbd():
    assert exp.parse_sshare(fixture_text("22.05", "sshare.txt")) == ([], 0)


def test_sshare_synthesized():
    rows, bad = exp.parse_sshare(fixture_text("synthesized", "sshare.txt"))
    assert bad == 0
    by = {(r.account, r.user): r for r in rows}
    assert by[("account_a", "")].fairshare == 0.6
    assert by[("account_a", "user2")].raw_usage == 50000
    assert by[("account_b", "user4")].raw_shares is None  # "parent"


@pytest.mark.parametrize(
    ("text", "ver"), [("slurm-wlm 22.05.8\n", "22.05.8"), ("slurm 25.11.2\n", "25.11.2")]
)
def test_version(text, ver):
    assert exp.parse_version(text) == ver


# --- malformed and empty -----------------------------------------------------------------


@pytest.mark.parametrize(
    "parser",
    ["parse_sinfo_nodes", "parse_squeue", "parse_scontrol_jobs", "parse_sdiag", "parse_sshare"],
)
def test_empty_output(parser):
    result, bad = getattr(exp, parser)(fixture_text("malformed", "empty.txt"))
    assert bad == 0
    assert not (result.values if isinstance(result, exp.Sdiag) else result)


def test_malformed_sinfo_skips_bad_lines():
    rows, bad = exp.parse_sinfo_nodes(fixture_text("malformed", "sinfo_nodes.txt"))
    assert [r.node for r in rows] == ["gpu02"]
    assert bad == 4


def test_malformed_squeue_and_scontrol():
    rows, bad = exp.parse_squeue(fixture_text("malformed", "squeue.txt"))
    assert [r.job_id for r in rows] == ["1"] and bad == 2
    jobs, bad = exp.parse_scontrol_jobs(fixture_text("malformed", "scontrol_jobs.txt"))
    assert [j.job_id for j in jobs] == ["1"] and bad == 2


def test_malformed_sdiag_keeps_good_values():
    sd, bad = exp.parse_sdiag(fixture_text("malformed", "sdiag.txt"))
    assert sd.values == {"queue_size": 7, "mean_cycle": 120}
    assert bad == 2


def test_scontrol_no_jobs_message():
    assert exp.parse_scontrol_jobs("No jobs in the system\n") == ([], 0)
