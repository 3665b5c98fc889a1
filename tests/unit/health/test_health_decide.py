"""What the health program decides (gpu_health.decide): verdict, intent, valve, reason."""

from __future__ import annotations

import json
from typing import Any

import pytest
from health_helpers import NOW, STAMP, UNKNOWN, failing, ok_checks, passing, verdict_of, xid79

from gpufleet_node.gpu_collector.verdict import Check
from gpufleet_node.gpu_health import decide
from gpufleet_node.gpu_health.decide import Failure, Limits, intent, over_valve, valve_problem
from gpufleet_node.gpu_health.slurmnode import NodeState

OURS = f"gpufleet: xid79 gpu3 (fallen off the bus) {STAMP}"


def doc(**overrides: Any) -> str:
    data: dict[str, Any] = {
        "version": 1,
        "time": NOW,
        "boot_id": "b",
        "verdict": "fail",
        "checks": [{"check": "xid", "gpu": "3", "state": "fail", "reason": "r", "jobs": []}],
    }
    data.update(overrides)
    return json.dumps(data)


def parse(text: str | None, now: float = NOW, max_age: float = 120) -> decide.Verdict:
    return decide.parse_verdict(text, now, max_age)


# --- parse_verdict ------------------------------------------------------------------


def test_a_fresh_failing_verdict():
    verdict = parse(doc(), NOW + 119)
    assert verdict == decide.Verdict("fail", NOW, (Failure("xid", "3", "r", ()),))


@pytest.mark.parametrize("state", ["ok", "warn"])
def test_a_passing_verdict_names_no_failure(state):
    checks = [
        {"check": "xid", "gpu": "0", "state": "ok", "reason": "", "jobs": []},
        {"check": "xid", "gpu": "1", "state": state, "reason": "xid63 (x)", "jobs": ["7"]},
    ]
    verdict = parse(doc(verdict=state, checks=checks))
    assert (verdict.state, verdict.failures, verdict.why_unknown) == (state, (), "")


def test_a_verdict_without_checks_is_ok():
    assert parse(doc(verdict="ok", checks=[])) == decide.Verdict("ok", NOW, ())


@pytest.mark.parametrize(
    ("said", "states", "worst"),
    [
        ("fail", [], "ok"),
        ("fail", ["ok", "warn"], "warn"),
        ("fail", ["unknown"], "unknown"),
        ("ok", ["ok", "fail"], "fail"),
        ("ok", ["warn"], "warn"),
        ("ok", ["unknown", "warn"], "unknown"),
        ("warn", ["ok"], "ok"),
        ("warn", ["unknown"], "unknown"),
        ("unknown", ["ok", "fail", "unknown"], "fail"),
        ("unknown", ["ok"], "ok"),
    ],
)
def test_the_verdict_must_be_the_worst_state_of_its_checks(said, states, worst):
    checks = [
        {"check": "xid", "gpu": str(i), "state": s, "reason": "r", "jobs": []}
        for i, s in enumerate(states)
    ]
    verdict = parse(doc(verdict=said, checks=checks))
    assert verdict == decide.unknown(f"the verdict says {said}, its checks say {worst}")


@pytest.mark.parametrize(
    ("states", "worst"),
    [
        (["ok"], "ok"),
        (["ok", "warn"], "warn"),
        (["warn", "unknown", "ok"], "unknown"),
        (["unknown", "fail", "warn"], "fail"),
    ],
)
def test_a_consistent_verdict_takes_its_worst_state(states, worst):
    checks = [
        {"check": "xid", "gpu": str(i), "state": s, "reason": "r", "jobs": []}
        for i, s in enumerate(states)
    ]
    verdict = parse(doc(verdict=worst, checks=checks))
    assert (verdict.state, verdict.why_unknown) == (worst, "")
    assert len(verdict.failures) == states.count("fail")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (None, "no verdict from the GPU collector yet"),
        ("", "the verdict is not JSON"),
        ("{", "the verdict is not JSON"),
        ("[" * 100000 + "]" * 100000, "the verdict is not JSON"),
        ("[]", "the verdict has an unknown version"),
        ('"fail"', "the verdict has an unknown version"),
        (doc(version=2), "the verdict has an unknown version"),
        (doc(version="1"), "the verdict has an unknown version"),
        (doc(version=None), "the verdict has an unknown version"),
        (doc(time=None), "the verdict has no time"),
        (doc(time="1764237720"), "the verdict has no time"),
        (doc(time=True), "the verdict has no time"),
        (doc(time=[NOW]), "the verdict has no time"),
        (doc().replace(f'"time": {NOW}', '"time": NaN'), "the verdict has no time"),
        (doc().replace(f'"time": {NOW}', '"time": Infinity'), "the verdict has no time"),
        (doc().replace(f'"time": {NOW}', '"time": 1e400'), "the verdict has no time"),
        (doc(verdict="bad"), "the verdict has no state"),
        (doc(verdict=None), "the verdict has no state"),
        (doc(verdict=["fail"]), "the verdict has no state"),
        (doc(checks={}), "the verdict has no state"),
        (doc(checks=None), "the verdict has no state"),
        (doc(checks=[]), "the verdict says fail, its checks say ok"),
        (doc(checks=["fail", 5, None]), "a check of the wrong shape"),
        (doc(checks=[{"check": "xid", "gpu": 3, "state": "fail", "reason": "r"}]), "wrong shape"),
        (doc(checks=[{"check": "xid", "gpu": "3", "state": "fail"}]), "wrong shape"),
        (doc(checks=[{"check": None, "gpu": "3", "state": "fail", "reason": "r"}]), "wrong shape"),
    ],
)
def test_odd_verdicts_are_unknown(text, why):
    verdict = parse(text)
    assert verdict.state == "unknown"
    assert verdict.failures == ()
    assert why in verdict.why_unknown


@pytest.mark.parametrize("version", [True, 1.0])
def test_version_is_the_integer_1(version):
    """Regression: True == 1 == 1.0 in Python; "version" must be the JSON integer 1."""
    assert parse(doc(version=version)) == decide.unknown("the verdict has an unknown version")


def check_doc(**fields: Any) -> str:
    """A failing verdict of one check with these fields changed (None: left out)."""
    check: dict[str, Any] = {"check": "xid", "gpu": "3", "state": "fail", "reason": "r"}
    check["jobs"] = []
    check.update(fields)
    return doc(checks=[{k: v for k, v in check.items() if v is not None}])


@pytest.mark.parametrize(
    "fields",
    [
        {"check": "Xid"},
        {"check": "1xid"},
        {"check": "_xid"},
        {"check": ""},
        {"check": "xid-79"},
        {"check": "xid 79"},
        {"check": "x" * 33},
        {"check": "xid\n"},
        {"check": 5},
        {"gpu": "12345"},
        {"gpu": "a"},
        {"gpu": "-1"},
        {"gpu": " 3"},
        {"gpu": "3\n"},
        {"gpu": "\u0663"},  # a digit, but not ASCII
        {"gpu": 3},
        {"gpu": None},
        {"reason": "x" * 201},
        {"reason": "two\nlines"},
        {"reason": "tab\there"},
        {"reason": "\x1b[31mred"},
        {"reason": "del\x7f"},
        {"reason": "caf\u00e9"},
        {"reason": None},
        {"reason": ["r"]},
        {"state": "bad"},
        {"state": "FAIL"},
        {"state": None},
        {"state": ["fail"]},
    ],
)
def test_a_check_of_the_wrong_shape_is_unknown(fields):
    verdict = parse(check_doc(**fields))
    assert verdict == decide.unknown("a check of the wrong shape")


def test_fields_at_their_bounds_are_a_right_shape():
    verdict = parse(check_doc(check="a" + "z9_" * 10 + "b", gpu="9999", reason="~ " * 100))
    assert verdict.state == "fail"
    assert verdict.failures == (Failure("a" + "z9_" * 10 + "b", "9999", "~ " * 100, ()),)
    assert parse(check_doc(gpu="", reason="")).failures == (Failure("xid", "", "", ()),)


@pytest.mark.parametrize(
    "bad",
    [
        5,
        None,
        "ok",
        ["ok"],
        {"check": "xid", "gpu": "0", "state": "ok", "reason": 5, "jobs": []},
        {"check": "xid", "gpu": 0, "state": "ok", "reason": "", "jobs": []},
        {"check": "XID", "gpu": "0", "state": "ok", "reason": ""},
        {"check": "xid", "gpu": "0", "state": "warn", "reason": "a\tb"},
        {"check": "xid", "gpu": "0", "state": "maybe", "reason": ""},
    ],
)
def test_a_check_of_the_wrong_shape_anywhere_is_unknown(bad):
    """Not only a failing check: any check of the wrong shape makes the verdict unknown."""
    good = {"check": "xid", "gpu": "3", "state": "fail", "reason": "r", "jobs": []}
    for checks in ([good, bad], [bad, good]):
        assert parse(doc(checks=checks)) == decide.unknown("a check of the wrong shape")


@pytest.mark.parametrize("age", [121, 3600, 10**9])
def test_a_stale_verdict_is_unknown(age):
    verdict = parse(doc(), NOW + age)
    assert verdict.state == "unknown"
    assert verdict.why_unknown == f"the verdict is {age} s old (collector stopped?)"
    assert verdict.time == NOW


@pytest.mark.parametrize("ahead", [61, 3600, 10**9])
def test_a_verdict_from_the_future_is_not_trusted(ahead):
    """Regression: a time far ahead of the clock (a clock that jumped back, a forged file)
    once counted as fresh until the clock caught up. More than 60 s ahead is unknown."""
    verdict = parse(doc(time=NOW + ahead))
    assert verdict == decide.unknown(f"the verdict is {ahead} s in the future", NOW + ahead)


def test_a_verdict_far_in_the_future_is_not_trusted():
    assert parse(doc(time=NOW + 1e300)).state == "unknown"
    assert "s in the future" in parse(doc(time=NOW + 1e300)).why_unknown


@pytest.mark.parametrize("ahead", [0.5, 30, 60])
def test_a_verdict_a_little_ahead_is_clock_skew(ahead):
    assert parse(doc(time=NOW + ahead)).state == "fail"


@pytest.mark.parametrize("value", [10**400, -(10**400), 2**1024])
def test_a_huge_integer_time_is_unknown_not_an_exception(value):
    """Regression: math.isfinite(10**400) once raised OverflowError in parse_verdict."""
    text = doc().replace(f'"time": {NOW}', f'"time": {value}')
    assert parse(text) == decide.unknown("the verdict has no time")


@pytest.mark.parametrize(
    ("value", "number"),
    [
        (5, 5.0),
        (-1.5, -1.5),
        (2**53, float(2**53)),
        (True, None),
        (False, None),
        (float("nan"), None),
        (float("inf"), None),
        (float("-inf"), None),
        (10**400, None),
        ("5", None),
        (None, None),
        ([5], None),
    ],
)
def test_finite(value, number):
    assert decide.finite(value) == number


def test_jobs_of_a_failure_are_text_and_bounded():
    checks = [
        {
            "check": "xid",
            "gpu": "1",
            "state": "fail",
            "reason": "r",
            "jobs": [str(i) for i in range(50)],
        },
        {"check": "xid", "gpu": "2", "state": "fail", "reason": "r", "jobs": "12"},
        {"check": "xid", "gpu": "3", "state": "fail", "reason": "r", "jobs": None},
        {"check": "xid", "gpu": "4", "state": "fail", "reason": "r"},
        {"check": "xid", "gpu": "5", "state": "fail", "reason": "r", "jobs": {"12": 1}},
        {"check": "xid", "gpu": "6", "state": "ok", "reason": "", "jobs": 5},  # not a failure
    ]
    one, *others = parse(doc(checks=checks)).failures
    assert one.jobs == tuple(str(i) for i in range(20))
    assert [f.jobs for f in others] == [(), (), (), ()]


def test_job_ids_that_are_not_text_of_job_id_characters_are_dropped():
    """Not converted with str(): a number, a bool or odd text is no Slurm job id."""
    jobs = [
        "4711",
        4712,
        True,
        None,
        ["4713"],
        "",
        "4714 4715",
        "4716\n",
        "47;17",
        "x" * 65,
        "x" * 64,
        "4718_3",
        "4719+0",
        "a.b-C",
        "\u0664\u0667",
    ]
    (failure,) = parse(
        doc(checks=[{"check": "xid", "gpu": "3", "state": "fail", "reason": "r", "jobs": jobs}])
    ).failures
    assert failure.jobs == ("4711", "x" * 64, "4718_3", "4719+0", "a.b-C")


def test_only_the_first_20_good_job_ids_are_kept():
    jobs = [5, "bad id"] * 10 + [str(i) for i in range(30)]
    check = {"check": "xid", "gpu": "3", "state": "fail", "reason": "r", "jobs": jobs}
    (failure,) = parse(doc(checks=[check])).failures
    assert failure.jobs == tuple(str(i) for i in range(20))


# --- drain_reason -------------------------------------------------------------------


def test_drain_reason_of_an_xid():
    assert decide.drain_reason([Failure("xid", "3", "xid79 (fallen off the bus)", ())], NOW) == (
        f"gpufleet: xid79 gpu3 (fallen off the bus) {STAMP}"
    )


def test_drain_reason_of_other_checks_and_of_the_node():
    remap = Failure("row_remap_pending", "0", "row remap pending (reset the GPU)", ())
    count = Failure("gpu_count", "", "7 of 8 GPUs present", ())
    assert decide.drain_reason([remap], NOW) == (
        f"gpufleet: row_remap_pending gpu0 (row remap pending (reset the GPU)) {STAMP}"
    )
    assert decide.drain_reason([count, remap], NOW) == (
        f"gpufleet: gpu_count node (7 of 8 GPUs present) +1 more {STAMP}"
    )


def test_drain_reason_with_every_check_of_64_gpus_failing():
    """The collector's largest verdict: its reasons (120 characters at most) and 64 GPUs
    with every check failing: one reason of at most 100 characters, the first failure."""
    checks = [Check("gpu_count", "", "fail", "1 of 64 GPUs present")]
    for gpu in range(64):
        checks += [
            Check("xid", str(gpu), "fail", "xid79 (fallen off the bus)"),
            Check("ecc_uncorrectable", str(gpu), "fail", f"{10**12} uncorrectable ECC errors"),
            Check("recovery_action", str(gpu), "fail", "driver asks for drain and reset"),
            Check("retired_pages", str(gpu), "fail", "x" * 500),
        ]
    verdict = verdict_of(checks)
    assert len(verdict.failures) == len(checks)
    reason = decide.drain_reason(verdict.failures, NOW)
    assert reason == f"gpufleet: gpu_count node (1 of 64 GPUs present) +256 more {STAMP}"
    reversed_reason = decide.drain_reason(verdict.failures[::-1], NOW)
    assert len(reversed_reason) == decide.REASON_MAX_CHARS
    assert reversed_reason.startswith("gpufleet: retired_pages gpu63 (xxxx")
    assert reversed_reason.endswith(f"...) +256 more {STAMP}")


@pytest.mark.parametrize("size", [0, 1, 40, 55, 56, 57, 58, 120, 5000])
def test_drain_reason_is_never_longer_than_slurm_allows(size):
    reason = decide.drain_reason([Failure("ecc_uncorrectable", "12", "y" * size, ())], NOW)
    assert len(reason) <= decide.REASON_MAX_CHARS
    assert reason.startswith("gpufleet: ecc_uncorrectable gpu12 (")
    assert reason.endswith(f") {STAMP}")


@pytest.mark.parametrize(
    "failure",
    [
        Failure("c" * 150, "0", "r", ()),
        Failure("xid", "1" * 150, "xid79 (fallen off the bus)", ()),
        Failure("xid", "0", "x" * 150 + " (fallen off the bus)", ()),
    ],
)
def test_drain_reason_of_a_forged_verdict_is_still_bounded(failure):
    """Regression: a long check name, gpu label or XID word once made a reason of 190
    characters and more (parse_verdict now rejects such checks, and drain_reason cuts
    the whole reason to REASON_MAX_CHARS)."""
    reason = decide.drain_reason([failure], NOW)
    assert len(reason) <= decide.REASON_MAX_CHARS
    assert reason.startswith("gpufleet: ")


def test_drain_reason_holds_no_control_character():
    """Regression: a newline, tab or escape sequence once went into Slurm's node reason
    as is (parse_verdict now rejects such a reason; drain_reason replaces them too)."""
    reason = decide.drain_reason([Failure("ecc", "0", "two\nlines\x1b[31m\u00e9", ())], NOW)
    assert reason == f"gpufleet: ecc gpu0 (two?lines?[31m?) {STAMP}"
    assert parse(check_doc(reason="two\nlines")).state == "unknown"


# --- the safety valve ---------------------------------------------------------------


def slurm_node(
    name: str, *flags: str, reason: str = "", at: int = 0, partitions: tuple[str, ...] = ("gpu",)
) -> NodeState:
    return NodeState(name, frozenset(flags or ("IDLE",)), reason, at, partitions)


def ours(name: str, at: int = 100, partitions: tuple[str, ...] = ("gpu",)) -> NodeState:
    return slurm_node(name, "IDLE", "DRAIN", reason=OURS, at=at, partitions=partitions)


HALF = Limits(0.5, 0.5)


def test_valve_two_nodes_at_half_one_may_drain():
    a, b = slurm_node("a"), slurm_node("b")
    assert valve_problem(a, [a, b], HALF) == ""
    # a drained (by us): b may not follow
    problem = valve_problem(b, [ours("a"), b], HALF)
    assert problem == "1 of 2 nodes of the cluster drained by gpufleet already; the limit is 50%"


def test_valve_counts_only_gpufleets_drains():
    admin = slurm_node("a", "IDLE", "DRAIN", reason="bad PSU", at=50)
    b = slurm_node("b")
    assert valve_problem(b, [admin, b], HALF) == ""


def test_valve_per_partition():
    limits = Limits(0.5, 1.0)
    fleet = [
        ours("a", partitions=("p1",)),
        slurm_node("b", partitions=("p1",)),
        slurm_node("c", partitions=("p2",)),
        slurm_node("d", partitions=("p2",)),
        slurm_node("e", partitions=("p2", "p1")),
    ]
    # p1 has a, b, e: floor(1.5) = 1 already taken by a
    assert valve_problem(fleet[1], fleet, limits) == (
        "1 of 3 nodes of partition p1 drained by gpufleet already; the limit is 50%"
    )
    assert valve_problem(fleet[2], fleet, limits) == ""
    assert "partition p1" in valve_problem(fleet[4], fleet, limits)


@pytest.mark.parametrize(
    ("share", "size", "may_drain"),
    [(0.0, 10, 0), (0.1, 10, 1), (0.25, 10, 2), (0.5, 1, 0), (1.0, 3, 3), (0.3, 10, 3)],
)
def test_valve_allows_a_share_rounded_down(share, size, may_drain):
    names = [f"n{i:02d}" for i in range(size)]
    fleet = [slurm_node(name) for name in names]
    drained = 0
    for i, name in enumerate(names):
        if not valve_problem(fleet[i], fleet, Limits(share, share)):
            fleet[i] = ours(name)
            drained += 1
    assert drained == may_drain


def test_valve_leaves_the_node_itself_out():
    a = ours("a")  # already drained: asking again must not count a twice
    assert valve_problem(a, [a, slurm_node("b")], HALF) == ""


def test_race_two_nodes_drained_at_once_the_later_name_steps_back():
    a, b = ours("a", at=500), ours("b", at=500)
    assert over_valve(a, [a, b], HALF) == ""
    assert over_valve(b, [a, b], HALF) == (
        "2 nodes of the cluster drained by gpufleet at once; the limit is 50%"
    )


def test_race_the_earlier_drain_keeps_its_place_whatever_its_name():
    a, b = ours("a", at=501), ours("b", at=500)
    assert over_valve(b, [a, b], HALF) == ""
    assert "at once" in over_valve(a, [a, b], HALF)


def test_race_exactly_one_of_two_failing_nodes_stays_drained():
    """Both passed the valve before either drained; after draining, each looks again."""
    before = [slurm_node("a"), slurm_node("b")]
    assert valve_problem(before[0], before, HALF) == valve_problem(before[1], before, HALF) == ""
    after = [ours("a", at=700), ours("b", at=700)]
    stays = [me.name for me in after if not over_valve(me, after, HALF)]
    assert stays == ["a"]


def test_race_per_partition_and_admin_drains_do_not_rank():
    limits = Limits(0.5, 1.0)
    fleet = [
        slurm_node("a", "IDLE", "DRAIN", reason="admin", at=1, partitions=("p1",)),
        ours("b", at=10, partitions=("p1",)),
        ours("c", at=10, partitions=("p1",)),
        ours("e", at=10, partitions=("p2",)),
    ]
    assert over_valve(fleet[1], fleet, limits) == ""
    # p1 holds a, b, c: one of them may be gpufleet's; a (an admin's) does not rank
    assert over_valve(fleet[2], fleet, limits) == (
        "2 nodes of partition p1 drained by gpufleet at once; the limit is 50%"
    )
    assert over_valve(fleet[3], fleet, limits) == ""


# --- intent -------------------------------------------------------------------------

IDLE = slurm_node("gpu-a")
OURS_DRAINED = ours("gpu-a")
ADMIN_DRAINED = slurm_node("gpu-a", "IDLE", "DRAIN", reason="RMA ticket 42", at=5)


def want(
    verdict: decide.Verdict,
    mode: str,
    node: NodeState,
    passing_runs: int = 0,
    resumes_today: int = 0,
    resume_after: int = 3,
    max_resumes: int = 2,
) -> decide.Intent:
    return intent(verdict, mode, node, passing_runs, resumes_today, resume_after, max_resumes, NOW)


@pytest.mark.parametrize("mode", decide.MODES)
@pytest.mark.parametrize("node", [IDLE, OURS_DRAINED, ADMIN_DRAINED])
@pytest.mark.parametrize("runs", [0, 3, 1000])
def test_unknown_never_drains_and_never_resumes(mode, node, runs):
    got = want(UNKNOWN, mode, node, passing_runs=runs)
    assert got == decide.Intent("none", "verdict unknown: the verdict is not JSON")


@pytest.mark.parametrize("node", [IDLE, OURS_DRAINED, ADMIN_DRAINED])
def test_alert_mode_does_nothing(node):
    assert want(failing(), "alert", node) == decide.Intent(
        "none", "failing; mode alert drains nothing"
    )
    assert want(passing(), "alert", node, passing_runs=100).action == "none"


@pytest.mark.parametrize("mode", ["drain", "drain+resume"])
def test_a_failing_idle_node_drains_with_gpufleets_reason(mode):
    assert want(failing("3"), mode, IDLE) == decide.Intent("drain", OURS)


@pytest.mark.parametrize("mode", ["drain", "drain+resume"])
def test_drain_once(mode):
    assert want(failing(), mode, OURS_DRAINED) == decide.Intent(
        "none", "failing; drained by gpufleet already"
    )


@pytest.mark.parametrize("mode", decide.MODES)
def test_an_admins_drain_is_never_re_reasoned_nor_resumed(mode):
    got = want(failing(), mode, ADMIN_DRAINED)
    assert got.action == "none"
    if mode != "alert":
        assert got.reason == "failing; out of service by someone else ('RMA ticket 42')"
    assert want(passing(), mode, ADMIN_DRAINED, passing_runs=1000).action == "none"


@pytest.mark.parametrize(
    "flags",
    [
        ("DOWN",),
        ("IDLE", "FAIL"),
        ("ALLOCATED", "FAILING"),
        ("IDLE", "MAINTENANCE"),
        ("MIXED", "REBOOT_REQUESTED"),
        ("DOWN", "DRAIN"),
    ],
)
@pytest.mark.parametrize("mode", ["drain", "drain+resume"])
def test_a_node_out_of_service_by_someone_else_is_left_alone(mode, flags):
    """Regression: a node an admin set DOWN (FAIL, MAINTENANCE, ...) with their own
    reason was once drained over by gpufleet, its reason replaced, and later resumed."""
    admin = slurm_node("gpu-a", *flags, reason="admin: replacing the PSU", at=5)
    assert want(failing(), mode, admin) == decide.Intent(
        "none", "failing; out of service by someone else ('admin: replacing the PSU')"
    )
    for runs in (0, 3, 1000):
        assert want(passing(), mode, admin, passing_runs=runs) == decide.Intent("none", "healthy")


@pytest.mark.parametrize("flags", [("IDLE",), ("ALLOCATED",), ("MIXED", "COMPLETING")])
def test_a_node_in_service_with_an_old_reason_is_drained(flags):
    """A reason alone (Slurm keeps the last one) does not put a node out of service."""
    node = slurm_node("gpu-a", *flags, reason="admin: replaced the PSU", at=5)
    assert want(failing(), "drain", node) == decide.Intent("drain", OURS)


def test_warn_is_healthy():
    verdict = verdict_of([*ok_checks(), Check("xid", "1", "warn", "xid63 (r)")])
    assert verdict.state == "warn"
    assert want(verdict, "drain+resume", IDLE).action == "none"
    assert want(verdict, "drain+resume", OURS_DRAINED, passing_runs=3).action == "resume"


def test_mode_drain_never_resumes():
    assert want(passing(), "drain", OURS_DRAINED, passing_runs=1000) == decide.Intent(
        "none", "healthy"
    )


@pytest.mark.parametrize(("runs", "action"), [(0, "none"), (1, "none"), (2, "none"), (3, "resume")])
def test_resume_after_n_passing_runs(runs, action):
    got = want(passing(), "drain+resume", OURS_DRAINED, passing_runs=runs, resume_after=3)
    assert got.action == action
    if action == "none":
        assert got.reason == f"healthy for {runs} of 3 runs before resume"


@pytest.mark.parametrize(
    ("today", "limit", "action"),
    [(0, 2, "resume"), (1, 2, "resume"), (2, 2, "none"), (0, 0, "none")],
)
def test_flapping_limit(today, limit, action):
    got = want(passing(), "drain+resume", OURS_DRAINED, 5, resumes_today=today, max_resumes=limit)
    assert got.action == action
    if action == "none":
        assert "flapping, left drained" in got.reason


def test_recent_is_the_last_day():
    stamps = [NOW - decide.DAY - 1, NOW - decide.DAY, NOW - decide.DAY + 1, NOW, NOW + 1]
    assert decide.recent(stamps, NOW) == [NOW - decide.DAY + 1, NOW]


def test_xid79_check_in_a_verdict_drains_with_that_gpu():
    verdict = verdict_of([*ok_checks(), xid79("5")], jobs={"5": ["77"]})
    assert verdict.failures == (Failure("xid", "5", "xid79 (fallen off the bus)", ("77",)),)
    assert want(verdict, "drain", IDLE).reason == (
        f"gpufleet: xid79 gpu5 (fallen off the bus) {STAMP}"
    )
