"""gpufleet-gpu-health's command line (gpu_health.cli) against a fake scontrol."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import syslog
import time
from pathlib import Path
from typing import Any

import pytest
from health_helpers import (
    NOW,
    STAMP,
    UNKNOWN,
    FakeScontrol,
    config_data,
    failing,
    make_config,
    node,
    ok_checks,
    passing,
    values_of,
    verdict_of,
    verdict_text,
    write_config,
    xid79,
)

from gpufleet_node.gpu_collector.state import boot_id
from gpufleet_node.gpu_collector.verdict import Check
from gpufleet_node.gpu_health import cli, decide
from gpufleet_node.gpu_health.cli import ConfigError, Outcome
from gpufleet_node.gpu_health.decide import DAY

OURS = f"gpufleet: xid79 gpu3 (fallen off the bus) {STAMP}"
FOUR = [node(name) for name in ("gpu-a", "gpu-b", "gpu-c", "gpu-d")]


def fresh_state() -> dict[str, Any]:
    return cli.load_state("/nonexistent/state.json")


def drain_call(name: str, reason: str) -> list[str]:
    return ["update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}"]


def resume_call(name: str) -> list[str]:
    return ["update", f"NodeName={name}", "State=RESUME"]


class Site:
    """One node's health program: its config, state and Slurm (the fake scontrol)."""

    def __init__(self, tmp_path: Path, fake: FakeScontrol, name: str = "gpu-a", **cfg: Any):
        self.fake = fake
        self.config = make_config(tmp_path, node=name, scontrol=str(fake.bin), **cfg)
        self.slurm = cli.Slurm(self.config.scontrol, self.config.timeout)
        self.state = fresh_state()

    def act(self, verdict: decide.Verdict, now: float = NOW) -> Outcome:
        return cli.act(self.config, self.slurm, verdict, self.state, now)


@pytest.fixture
def fake(tmp_path) -> FakeScontrol:
    return FakeScontrol(tmp_path, [dict(n) for n in FOUR])


# --- parse_config -------------------------------------------------------------------


def test_a_valid_config(tmp_path):
    config = make_config(tmp_path, mode="drain+resume", resume_after_runs=4)
    assert config.mode == "drain+resume"
    assert config.limits == decide.Limits(0.5, 0.5)
    assert (config.resume_after, config.max_resumes_per_day) == (4, 2)
    assert isinstance(config.resume_after, int)
    assert (config.node, config.chain, config.timeout) == ("gpu-a", "", 10.0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"mode": "resume"}, "mode: one of alert, drain, drain+resume, not 'resume'"),
        ({"mode": "Drain"}, "mode: one of"),
        ({"mode": None}, "mode: one of"),
        ({"mode": ["drain"]}, "mode: one of"),
        ({"mode": "drain\n"}, "not 'drain\\n'"),
        ({"node": ""}, "node: text is needed"),
        ({"node": 7}, "node: text is needed"),
        ({"node": "gpu-a\nFAKE LOG LINE"}, "node: holds a control character"),
        ({"node": "gpu-a\x1b[2J"}, "node: holds a control character"),
        ({"node": "gpu\x7f"}, "node: holds a control character"),
        ({"verdict": "health.json"}, "verdict: an absolute path is needed"),
        ({"verdict": "./health.json"}, "verdict: an absolute path is needed"),
        ({"xid_state": "var/lib/x.json"}, "xid_state: an absolute path is needed"),
        ({"xid_baseline": "~/b.json"}, "xid_baseline: an absolute path is needed"),
        ({"state_dir": ""}, "state_dir: text is needed"),
        ({"textfile_dir": "textfile"}, "textfile_dir: an absolute path is needed"),
        ({"scontrol": "scontrol"}, "scontrol: an absolute path is needed"),
        ({"scontrol": "/usr/bin/scontrol\t-v"}, "scontrol: holds a control character"),
        ({"chain": "nhc"}, "chain: an absolute path is needed"),
        ({"chain": "/usr/sbin/nhc\n"}, "chain: holds a control character"),
        ({"chain": None}, "chain: text is needed"),
        ({"max_age_seconds": 0}, "max_age_seconds: 0 is outside 1..86400"),
        ({"max_age_seconds": "60"}, "max_age_seconds: a number is needed"),
        ({"max_age_seconds": True}, "max_age_seconds: a number is needed"),
        ({"max_age_seconds": None}, "max_age_seconds: a number is needed"),
        ({"max_drained_share_partition": 1.5}, "max_drained_share_partition: 1.5 is outside"),
        ({"max_drained_share_cluster": -0.1}, "max_drained_share_cluster: -0.1 is outside"),
        ({"max_drained_share_cluster": False}, "a number is needed"),
        ({"max_drained_share_partition": [0.5]}, "a number is needed"),
        ({"resume_after_runs": 0}, "resume_after_runs: 0 is outside 1..100"),
        ({"resume_after_runs": 3.0}, "resume_after_runs: a whole number is needed"),
        ({"resume_after_runs": 2.5}, "resume_after_runs: a whole number is needed"),
        ({"resume_after_runs": True}, "resume_after_runs: a whole number is needed"),
        ({"resume_after_runs": "3"}, "resume_after_runs: a whole number is needed"),
        ({"resume_after_runs": None}, "resume_after_runs: a whole number is needed"),
        ({"max_resumes_per_day": 101}, "max_resumes_per_day: 101 is outside 0..100"),
        ({"max_resumes_per_day": -1}, "max_resumes_per_day: -1 is outside 0..100"),
        ({"max_resumes_per_day": 2.0}, "max_resumes_per_day: a whole number is needed"),
        ({"max_resumes_per_day": False}, "max_resumes_per_day: a whole number is needed"),
        ({"timeout_seconds": 1e308}, "timeout_seconds: 1e+308 is outside 1..300"),
        ({"timeout_seconds": 0.5}, "timeout_seconds: 0.5 is outside 1..300"),
    ],
)
def test_config_errors_are_one_line(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as err:
        cli.parse_config(json.dumps(config_data(tmp_path, **overrides)))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("key", sorted(set(config_data(Path("/x"))) - {"chain"}))
def test_every_key_but_chain_is_required(tmp_path, key):
    data = config_data(tmp_path)
    del data[key]
    with pytest.raises(ConfigError, match=key):
        cli.parse_config(json.dumps(data))
    del data["chain"]
    data[key] = config_data(tmp_path)[key]
    assert cli.parse_config(json.dumps(data)).chain == ""


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1" + "0" * 400])
def test_config_non_finite_numbers_are_no_numbers(tmp_path, value):
    """NaN, Infinity and integers past float's range: "a number is needed", one line."""
    text = json.dumps(config_data(tmp_path, max_age_seconds=60)).replace(
        '"max_age_seconds": 60', f'"max_age_seconds": {value}'
    )
    with pytest.raises(ConfigError) as err:
        cli.parse_config(text)
    assert str(err.value) == "max_age_seconds: a number is needed"


def count_config(tmp_path: Path, value: str) -> str:
    return json.dumps(config_data(tmp_path, resume_after_runs=3)).replace(
        '"resume_after_runs": 3', f'"resume_after_runs": {value}'
    )


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "3.0", "1e2", "true"])
def test_config_counts_are_json_integers(tmp_path, value):
    with pytest.raises(ConfigError) as err:
        cli.parse_config(count_config(tmp_path, value))
    assert str(err.value) == "resume_after_runs: a whole number is needed"


def test_config_count_of_a_huge_integer_is_out_of_range(tmp_path):
    """A JSON integer past float's range is still a whole number: out of range."""
    with pytest.raises(ConfigError) as err:
        cli.parse_config(count_config(tmp_path, "1" + "0" * 400))
    assert str(err.value) == f"resume_after_runs: {str(10**400)[:20]} is outside 1..100"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not JSON"),
        ("{", "not JSON"),
        ("[" * 100000, "not JSON"),
        ("[]", "not a JSON object"),
        ("null", "not a JSON object"),
        ('"drain"', "not a JSON object"),
    ],
)
def test_config_that_is_no_object(text, message):
    with pytest.raises(ConfigError, match=message) as err:
        cli.parse_config(text)
    assert "\n" not in str(err.value)


def test_config_with_a_huge_integer_is_a_config_error(tmp_path):
    """Regression: an integer past float's range (10**400) once raised OverflowError in
    _number, and main() died with a traceback; it is "a number is needed" now."""
    text = json.dumps(config_data(tmp_path, max_age_seconds=60)).replace(
        '"max_age_seconds": 60', '"max_age_seconds": 1' + "0" * 400
    )
    with pytest.raises(ConfigError, match=r"^max_age_seconds: a number is needed$"):
        cli.parse_config(text)
    assert decide.finite(10**400) is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot be read"),
        ("not json", "not JSON"),
        (json.dumps({"mode": "later"}), "mode: one of"),
    ],
)
def test_main_with_a_bad_config_says_one_line_and_exits_2(tmp_path, capsys, content, message):
    path = tmp_path / "gpu-health.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    assert cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpufleet-gpu-health: {path}: ")
    assert message in err
    assert err.count("\n") == 1


def test_main_as_a_program_with_bad_configs_prints_no_traceback(tmp_path):
    bad = {
        "relative": config_data(tmp_path, state_dir="state"),
        "control": config_data(tmp_path, node="a\rb"),
        "mode": config_data(tmp_path, mode="drain+resume+reboot"),
        "bool": config_data(tmp_path, resume_after_runs=True),
        "float count": config_data(tmp_path, max_resumes_per_day=1.0),
        "huge": config_data(tmp_path, timeout_seconds=10**400),
    }
    for name, data in bad.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        done = subprocess.run(
            [sys.executable, "-m", "gpufleet_node.gpu_health.cli", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, (name, done.stderr)
        assert "Traceback" not in done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stdout == ""


# --- load_state and metrics ---------------------------------------------------------


def test_state_defaults(tmp_path):
    assert cli.load_state(str(tmp_path / "absent.json")) == {
        "actions": {"drain": 0, "resume": 0, "blocked": 0, "undone": 0},
        "passing_runs": 0,
        "resumes": [],
    }


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "[1, 2]",
        "null",
        "[" * 100000,
        json.dumps({"actions": [1], "passing_runs": "3", "resumes": {"a": 1}}),
        json.dumps({"actions": {"drain": -1, "resume": 1.5, "blocked": True}, "passing_runs": -4}),
        json.dumps({"passing_runs": True, "resumes": "1764237720"}),
    ],
)
def test_state_of_another_shape_starts_afresh(tmp_path, text):
    path = tmp_path / "state.json"
    path.write_text(text, encoding="utf-8")
    assert cli.load_state(str(path)) == cli.load_state(str(tmp_path / "absent.json"))


def test_state_keeps_what_is_valid(tmp_path):
    path = tmp_path / "state.json"
    resumes = [NOW - i for i in range(150)]
    path.write_text(
        json.dumps(
            {
                "actions": {"drain": 4, "undone": 2, "bogus": 9},
                "passing_runs": 7,
                "resumes": [*resumes, "x", None],
            }
        ),
        encoding="utf-8",
    )
    path.write_text(path.read_text().replace('"x"', "NaN").replace("null", "Infinity"))
    state = cli.load_state(str(path))
    assert state["actions"] == {"drain": 4, "resume": 0, "blocked": 0, "undone": 2}
    assert state["passing_runs"] == 7
    # the newest 100 entries, then the ones that are not finite numbers dropped
    assert state["resumes"] == [float(r) for r in resumes[52:]]


def test_state_with_a_huge_integer_starts_afresh(tmp_path):
    """Regression: a resume time of 10**400 once raised OverflowError in load_state, and
    `check` died on every run until someone deleted state.json; it is dropped now."""
    path = tmp_path / "state.json"
    path.write_text('{"resumes": [1' + "0" * 400 + "]}", encoding="utf-8")
    assert cli.load_state(str(path))["resumes"] == []


def test_metrics(tmp_path):
    config = make_config(tmp_path, mode="drain+resume")
    state = fresh_state()
    state["actions"].update(drain=3, undone=1)
    text = cli.metrics(config, state, Outcome("blocked", False, True), NOW + 0.25)
    assert values_of(text, "node_gpu_health_actions_total", action="drain") == [3]
    assert values_of(text, "node_gpu_health_actions_total", action="undone") == [1]
    assert values_of(text, "node_gpu_health_actions_total", action="resume") == [0]
    modes = {m: values_of(text, "node_gpu_health_mode", mode=m) for m in decide.MODES}
    assert modes == {"alert": [0], "drain": [0], "drain+resume": [1]}
    assert values_of(text, "node_gpu_health_drain_blocked") == [1]
    assert values_of(text, "node_gpu_health_drained") == [0]
    assert values_of(text, "node_gpu_health_run_success") == [1]
    assert values_of(text, "node_gpu_health_last_run_timestamp_seconds") == [NOW + 0.25]
    assert "# TYPE node_gpu_health_actions_total counter" in text


# --- act: drain, resume, the valve, through scontrol --------------------------------


def test_drain_mode_drains_a_failing_node_once(tmp_path, fake, journal):
    site = Site(tmp_path, fake)
    outcome = site.act(failing("3", jobs={"3": ["4711", "4712"]}))
    assert outcome == Outcome("drain", True, True)
    assert fake.updates() == [drain_call("gpu-a", OURS)]
    record = fake.node("gpu-a")
    assert "DRAIN" in record["state"] and record["reason"] == OURS
    assert site.state["actions"]["drain"] == 1
    assert (syslog.LOG_WARNING, f"drained gpu-a: {OURS}; jobs on the GPU: 4711, 4712") in journal
    # still failing: already drained by gpufleet, nothing more
    fake.clear_calls()
    assert site.act(failing("3"), NOW + 60) == Outcome("none", True, True)
    assert fake.updates() == []
    assert fake.node("gpu-a")["reason"] == OURS
    assert site.state["actions"]["drain"] == 1


def test_alert_mode_drains_nothing(tmp_path, fake, journal):
    site = Site(tmp_path, fake, mode="alert")
    for i in range(3):
        assert site.act(failing(), NOW + i) == Outcome("none", False, True)
    assert fake.updates() == []
    assert site.state["actions"] == dict.fromkeys(cli.ACTIONS, 0)
    assert (syslog.LOG_WARNING, "gpu-a: failing; mode alert drains nothing") in journal


@pytest.mark.parametrize("mode", decide.MODES)
def test_unknown_neither_drains_nor_resumes(tmp_path, fake, mode):
    fake.set_node("gpu-a", state=["IDLE", "DRAIN"], reason=OURS, reason_time=int(NOW))
    fake.set_node("gpu-b", state=["IDLE"])
    site_a = Site(tmp_path, fake, mode=mode, resume_after_runs=1)
    site_b = Site(tmp_path, fake, "gpu-b", mode=mode)
    for i in range(5):
        assert site_a.act(UNKNOWN, NOW + i) == Outcome("none", True, True)
        assert site_b.act(UNKNOWN, NOW + i) == Outcome("none", False, True)
    stale = decide.parse_verdict(verdict_text(ok_checks(), NOW - 1000), NOW, 120)
    assert stale.state == "unknown"
    assert site_a.act(stale, NOW) == Outcome("none", True, True)
    assert fake.updates() == []
    assert site_a.state["passing_runs"] == 0


def test_an_admins_drain_is_left_alone(tmp_path, fake):
    admin = "RMA 1234: replace gpu3 (do not resume)"
    fake.set_node("gpu-a", state=["MIXED", "DRAIN"], reason=admin, reason_time=5)
    site = Site(tmp_path, fake, mode="drain+resume", resume_after_runs=1)
    assert site.act(failing()) == Outcome("none", False, True)
    for i in range(5):
        assert site.act(passing(NOW + i), NOW + i) == Outcome("none", False, True)
    assert fake.updates() == []
    assert fake.node("gpu-a")["reason"] == admin


@pytest.mark.parametrize("state", [["DOWN"], ["IDLE", "MAINTENANCE"], ["DOWN", "DRAIN"]])
def test_a_node_out_of_service_by_an_admin_is_left_alone(tmp_path, fake, journal, state):
    """Regression: an admin's DOWN node was once drained over (its reason replaced) and
    later resumed back into service."""
    admin = "admin: replacing the PSU"
    fake.set_node("gpu-a", state=state, reason=admin, reason_time=5)
    site = Site(tmp_path, fake, mode="drain+resume", resume_after_runs=1)
    assert site.act(failing()) == Outcome("none", False, True)
    for i in range(1, 4):
        assert site.act(passing(NOW + i), NOW + i) == Outcome("none", False, True)
    assert fake.updates() == []
    assert fake.node("gpu-a")["reason"] == admin
    assert (
        syslog.LOG_WARNING,
        f"gpu-a: failing; out of service by someone else ({admin!r})",
    ) in journal


def test_mode_drain_never_resumes(tmp_path, fake):
    site = Site(tmp_path, fake, mode="drain", resume_after_runs=1)
    site.act(failing())
    for i in range(1, 6):
        assert site.act(passing(NOW + i), NOW + i) == Outcome("none", True, True)
    assert fake.updates() == [drain_call("gpu-a", OURS)]


def test_resume_after_n_passing_runs(tmp_path, fake, journal):
    site = Site(tmp_path, fake, mode="drain+resume", resume_after_runs=3)
    site.act(failing())
    outcomes = [site.act(passing(NOW + i), NOW + i) for i in (1, 2, 3)]
    assert outcomes == [
        Outcome("none", True, True),
        Outcome("none", True, True),
        Outcome("resume", False, True),
    ]
    assert fake.updates() == [drain_call("gpu-a", OURS), resume_call("gpu-a")]
    assert "DRAIN" not in fake.node("gpu-a")["state"]
    assert site.state["resumes"] == [NOW + 3]
    assert site.state["actions"]["resume"] == 1
    assert (syslog.LOG_INFO, f"resumed gpu-a: every check passes (was: {OURS})") in journal


def test_an_unknown_run_restarts_the_count(tmp_path, fake):
    site = Site(tmp_path, fake, mode="drain+resume", resume_after_runs=3)
    site.act(failing())
    for i, verdict in enumerate([passing(), passing(), UNKNOWN, passing(), passing()], 1):
        assert site.act(verdict, NOW + i).action == "none"
    assert site.act(passing(), NOW + 6).action == "resume"


def test_flapping_gpu_stays_drained_for_a_day(tmp_path, fake):
    site = Site(tmp_path, fake, mode="drain+resume", resume_after_runs=1, max_resumes_per_day=1)
    clock = NOW
    assert site.act(failing(now=clock), clock).action == "drain"
    clock += 60
    assert site.act(passing(clock), clock).action == "resume"
    clock += 60
    assert site.act(failing(now=clock), clock).action == "drain"
    for _ in range(5):
        clock += 60
        assert site.act(passing(clock), clock) == Outcome("none", True, True)
    assert fake.node("gpu-a")["reason"].startswith("gpufleet: ")
    # a day after the first resume: one more is allowed
    clock = NOW + 60 + DAY + 1
    assert site.act(passing(clock), clock).action == "resume"
    assert [call[2] for call in fake.updates()] == [
        "State=DRAIN",
        "State=RESUME",
        "State=DRAIN",
        "State=RESUME",
    ]


def test_max_resumes_zero_never_resumes(tmp_path, fake):
    site = Site(tmp_path, fake, mode="drain+resume", resume_after_runs=1, max_resumes_per_day=0)
    site.act(failing())
    for i in range(1, 4):
        assert site.act(passing(NOW + i), NOW + i).action == "none"
    assert len(fake.updates()) == 1


def test_valve_two_nodes_at_half_sequential_runs(tmp_path, journal):
    fake = FakeScontrol(tmp_path, [node("gpu-a"), node("gpu-b")])
    site_a = Site(tmp_path, fake, "gpu-a")
    site_b = Site(tmp_path, fake, "gpu-b")
    assert site_a.act(failing()) == Outcome("drain", True, True)
    assert site_b.act(failing(), NOW + 1) == Outcome("blocked", False, True)
    assert site_b.state["actions"] == {"drain": 0, "resume": 0, "blocked": 1, "undone": 0}
    assert fake.updates() == [drain_call("gpu-a", OURS)]
    assert "DRAIN" not in fake.node("gpu-b")["state"]
    crit = [m for p, m in journal if p == syslog.LOG_CRIT]
    assert crit == [
        f"not draining gpu-b ({OURS}): 1 of 2 nodes of the cluster drained by gpufleet "
        "already; the limit is 50%"
    ]
    # b asks again every run: still blocked, counted each time
    assert site_b.act(failing(), NOW + 2).action == "blocked"
    assert site_b.state["actions"]["blocked"] == 2


def test_valve_race_two_nodes_drain_at_once_exactly_one_stays(tmp_path, journal):
    """gpu-a's program drains in the same second as gpu-b's: both passed the valve; b,
    later by name, steps back (resumes itself) when it sees a drained with it."""
    fake = FakeScontrol(tmp_path, [node("gpu-a"), node("gpu-b")])
    fake.update(with_drain={"gpu-b": ["gpu-a"]})
    site_b = Site(tmp_path, fake, "gpu-b")
    assert site_b.act(failing()) == Outcome("blocked", False, True)
    assert fake.updates() == [drain_call("gpu-b", OURS), resume_call("gpu-b")]
    assert site_b.state["actions"] == {"drain": 1, "resume": 0, "blocked": 0, "undone": 1}
    drained = [n["name"] for n in fake.read()["nodes"] if "DRAIN" in n["state"]]
    assert drained == ["gpu-a"]
    assert (
        syslog.LOG_CRIT,
        "resumed gpu-b again: 2 nodes of the cluster drained by gpufleet at once; the limit is 50%",
    ) in journal


def test_valve_race_the_earlier_name_keeps_its_drain(tmp_path):
    fake = FakeScontrol(tmp_path, [node("gpu-a"), node("gpu-b")])
    fake.update(with_drain={"gpu-a": ["gpu-b"]})
    site_a = Site(tmp_path, fake, "gpu-a")
    assert site_a.act(failing()) == Outcome("drain", True, True)
    assert fake.updates() == [drain_call("gpu-a", OURS)]


def test_an_admins_drain_does_not_use_up_the_valve(tmp_path):
    fake = FakeScontrol(tmp_path, [node("gpu-a", "IDLE", "DRAIN", reason="admin"), node("gpu-b")])
    assert Site(tmp_path, fake, "gpu-b").act(failing()).action == "drain"


def test_drain_reason_with_many_failures_fits_slurm(tmp_path, fake):
    checks = [Check("gpu_count", "", "fail", "3 of 8 GPUs present")]
    checks += [xid79(str(g)) for g in range(8)]
    checks += [Check("ecc_uncorrectable", str(g), "fail", "9" * 200) for g in range(8)]
    site = Site(tmp_path, fake)
    site.act(verdict_of(checks))
    reason = fake.node("gpu-a")["reason"]
    assert reason == f"gpufleet: gpu_count node (3 of 8 GPUs present) +16 more {STAMP}"
    site2 = Site(tmp_path, fake, "gpu-b")
    site2.act(verdict_of(checks[::-1]))
    reason = fake.node("gpu-b")["reason"]
    assert len(reason) <= decide.REASON_MAX_CHARS
    assert reason.startswith("gpufleet: ecc_uncorrectable gpu7 (999")
    assert reason.endswith(f"...) +16 more {STAMP}")


# --- Slurm failures -----------------------------------------------------------------


def test_scontrol_failure_is_a_slurm_error(tmp_path, fake):
    fake.update(fail={"show": "slurm_load_node error: Unable to contact slurm controller"})
    site = Site(tmp_path, fake)
    with pytest.raises(
        cli.SlurmError, match=r"scontrol show node gpu-a --json: .*Unable to contact"
    ):
        site.act(failing())
    assert fake.updates() == []


def test_a_node_slurm_does_not_know(tmp_path, fake):
    site = Site(tmp_path, fake, "gpu-z")
    with pytest.raises(cli.SlurmError):
        site.act(failing())


def test_scontrol_answer_of_another_shape(tmp_path, fake):
    fake.update(raw='{"nodes": [{"name": "gpu-a", "state": 7}]}')
    with pytest.raises(cli.SlurmShapeError):
        Site(tmp_path, fake).act(failing())


def test_scontrol_missing(tmp_path):
    fake = FakeScontrol(tmp_path, [node("gpu-a")])
    fake.bin.unlink()
    with pytest.raises(cli.SlurmError):
        Site(tmp_path, fake).act(failing())


# --- check, status, clear, main -----------------------------------------------------


def write_verdict(tmp_path: Path, checks: list[Check], **kw: Any) -> Path:
    path = tmp_path / "collector-state" / "health.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(verdict_text(checks, time.time(), **kw), encoding="utf-8")
    return path


def prom(tmp_path: Path) -> str:
    return (tmp_path / "textfile" / cli.OUTPUT).read_text(encoding="utf-8")


def test_check_end_to_end(tmp_path, fake):
    config_path = write_config(tmp_path, scontrol=str(fake.bin))
    write_verdict(tmp_path, [*ok_checks(), xid79("3")])
    assert cli.main(["--config", str(config_path)]) == 0
    assert len(fake.updates()) == 1
    assert fake.node("gpu-a")["reason"].startswith("gpufleet: xid79 gpu3 (fallen off the bus) ")
    text = prom(tmp_path)
    assert values_of(text, "node_gpu_health_drained") == [1]
    assert values_of(text, "node_gpu_health_run_success") == [1]
    assert values_of(text, "node_gpu_health_actions_total", action="drain") == [1]
    assert values_of(text, "node_gpu_health_mode", mode="drain") == [1]
    saved = json.loads((tmp_path / "health-state" / "state.json").read_text(encoding="utf-8"))
    assert saved["actions"]["drain"] == 1
    # the next run: drained already; the counters come back from state.json
    assert cli.main(["--config", str(config_path), "check"]) == 0
    assert len(fake.updates()) == 1
    assert values_of(prom(tmp_path), "node_gpu_health_actions_total", action="drain") == [1]
    assert values_of(prom(tmp_path), "node_gpu_health_drained") == [1]


def test_check_without_a_verdict_does_nothing(tmp_path, fake):
    config_path = write_config(tmp_path, scontrol=str(fake.bin))
    assert cli.main(["--config", str(config_path)]) == 0
    assert fake.updates() == []
    assert values_of(prom(tmp_path), "node_gpu_health_run_success") == [1]


@pytest.mark.parametrize(
    "table",
    [
        {"fail": {"show": "slurm_load_node error: Unable to contact slurm controller"}},
        {"raw": "Node gpu-a not found"},
        {"raw": '{"nodes": "gpu-a"}'},
    ],
)
def test_check_when_slurm_cannot_answer(tmp_path, fake, journal, table):
    fake.update(**table)
    config_path = write_config(tmp_path, scontrol=str(fake.bin))
    write_verdict(tmp_path, [*ok_checks(), xid79("3")])
    assert cli.main(["--config", str(config_path)]) == 0
    assert fake.updates() == []
    assert values_of(prom(tmp_path), "node_gpu_health_run_success") == [0]
    assert any(p == syslog.LOG_ERR and m.startswith("nothing done: ") for p, m in journal)


def test_check_when_the_drain_is_refused(tmp_path, fake):
    config_path = write_config(tmp_path, scontrol=str(fake.bin))
    write_verdict(tmp_path, [*ok_checks(), xid79("3")])
    fake.update(fail={"update": "slurm_update error: Access/permission denied"})
    assert cli.main(["--config", str(config_path)]) == 0
    assert values_of(prom(tmp_path), "node_gpu_health_run_success") == [0]
    assert values_of(prom(tmp_path), "node_gpu_health_actions_total", action="drain") == [0]


def chain_script(tmp_path: Path, status: int) -> str:
    path = tmp_path / f"nhc-{status}"
    path.write_text(f"#!/bin/sh\necho ran >> {tmp_path}/chain.log\nexit {status}\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(("status", "rc"), [(0, 0), (1, 1), (3, 1)])
def test_chain_runs_first_and_its_status_is_ours(tmp_path, fake, status, rc):
    config_path = write_config(
        tmp_path, scontrol=str(fake.bin), chain=chain_script(tmp_path, status)
    )
    write_verdict(tmp_path, [*ok_checks(), xid79("3")])
    assert cli.main(["--config", str(config_path)]) == rc
    assert (tmp_path / "chain.log").read_text() == "ran\n"
    assert len(fake.updates()) == 1  # the GPU verdict is acted on either way


def test_chain_that_is_missing(tmp_path, fake):
    config_path = write_config(tmp_path, scontrol=str(fake.bin), chain=str(tmp_path / "no-nhc"))
    assert cli.main(["--config", str(config_path)]) == 1


def test_status(tmp_path, fake, capsys):
    fake.set_node("gpu-a", state=["IDLE", "DRAIN"], reason=OURS, reason_time=int(NOW))
    config_path = write_config(tmp_path, scontrol=str(fake.bin), mode="drain+resume")
    checks = [*ok_checks(), xid79("3"), Check("retired_pages", "1", "warn", "pending")]
    write_verdict(tmp_path, checks, jobs={"3": ["4711"]})
    assert cli.main(["--config", str(config_path), "status"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "gpu-a: fail",
        "  gpu3 xid: fail: xid79 (fallen off the bus) [jobs 4711]",
        "  gpu1 retired_pages: warn: pending",
        f"  slurm: drained: {OURS} (mode drain+resume)",
    ]


def test_status_without_verdict_or_slurm(tmp_path, capsys):
    config_path = write_config(tmp_path, scontrol=str(tmp_path / "no-scontrol"))
    assert cli.main(["--config", str(config_path), "status"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "gpu-a: unknown (no verdict from the GPU collector yet)"
    assert out[1].startswith("  slurm: unknown (scontrol show node gpu-a --json: ")


@pytest.mark.parametrize("text", ["[]", "garbage", '{"checks": 5}', '{"checks": [5, null]}'])
def test_status_of_odd_verdicts(tmp_path, fake, capsys, text):
    config_path = write_config(tmp_path, scontrol=str(fake.bin))
    write_verdict(tmp_path, []).write_text(text)
    assert cli.main(["--config", str(config_path), "status"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gpu-a: unknown (")
    assert out[-1] == "  slurm: not drained (mode drain)"


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100000 + "]" * 100000,
        json.dumps({"checks": [{"check": "xid", "gpu": "0", "state": "fail", "jobs": 5}]}),
        json.dumps({"checks": [{"check": "xid", "gpu": "0", "state": "fail", "jobs": True}]}),
    ],
)
def test_status_of_forged_verdicts_prints_no_traceback(tmp_path, fake, capsys, text):
    """Regression: status() once parsed the verdict again unguarded (a deeply nested
    document raised RecursionError, a "jobs" number TypeError)."""
    config_path = write_config(tmp_path, scontrol=str(fake.bin))
    write_verdict(tmp_path, []).write_text(text)
    assert cli.main(["--config", str(config_path), "status"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gpu-a: unknown (")
    assert out[-1] == "  slurm: not drained (mode drain)"


# clear: the baseline the collector counts XIDs from (see also test_health_collector.py)


def xid_files(tmp_path: Path, counts: dict[str, int], pci_map: Any, baseline: Any) -> None:
    state = tmp_path / "collector-state"
    state.mkdir(parents=True, exist_ok=True)
    (state / "xid_state.json").write_text(json.dumps({"counts": counts, "pci_map": pci_map}))
    if baseline is not None:
        (state / "xid_baseline.json").write_text(json.dumps(baseline))


def baseline_of(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "collector-state" / "xid_baseline.json").read_text())


COUNTS = {"0000:18:00|79": 2, "0000:2a:00|48": 1, "0000:2a:00|13": 9}
PCI_MAP = {"0000:18:00": ["0", "GPU-0"], "0000:2a:00": ["1", "GPU-1"]}


def test_clear_takes_every_count_now(tmp_path, journal):
    xid_files(tmp_path, COUNTS, PCI_MAP, {"boot_id": "old", "counts": {"0000:18:00|79": 1}})
    config = make_config(tmp_path)
    assert cli.clear(config, None) == 0
    assert baseline_of(tmp_path) == {"boot_id": boot_id(), "counts": COUNTS}
    assert (syslog.LOG_INFO, "XIDs cleared on gpu-a by an admin") in journal


def test_clear_one_gpu(tmp_path, journal):
    old = {"0000:18:00|79": 1, "0000:2a:00|48": 0}
    # A baseline of this boot (one of an earlier boot is void: every count is cleared).
    xid_files(tmp_path, COUNTS, PCI_MAP, {"boot_id": boot_id(), "counts": old})
    assert cli.main(["--config", str(write_config(tmp_path)), "clear", "--gpu", "1"]) == 0
    assert baseline_of(tmp_path)["counts"] == {
        "0000:18:00|79": 1,  # gpu0: as it was
        "0000:2a:00|48": 1,
        "0000:2a:00|13": 9,
    }
    assert (syslog.LOG_INFO, "XIDs cleared on gpu-a gpu1 by an admin") in journal


def test_clear_without_a_baseline_yet(tmp_path):
    xid_files(tmp_path, COUNTS, PCI_MAP, None)
    assert cli.clear(make_config(tmp_path), "0") == 0
    # No baseline of this boot yet: the collector would take every count now, so does clear.
    assert baseline_of(tmp_path)["counts"] == COUNTS


def test_clear_voids_a_baseline_of_an_earlier_boot(tmp_path):
    xid_files(tmp_path, COUNTS, PCI_MAP, {"boot_id": "an-earlier-boot", "counts": {}})
    assert cli.clear(make_config(tmp_path), "0") == 0
    assert baseline_of(tmp_path) == {"boot_id": boot_id(), "counts": COUNTS}


@pytest.mark.parametrize(
    ("xid_state", "gpu", "message"),
    [
        ("", None, "is not JSON"),
        ("not json", None, "is not JSON"),
        ("not json", "0", "is not JSON"),
        ("[" * 100000, None, "is not JSON"),
        ("[]", None, "wrong shape: a JSON list, not an object"),
        ('"counts"', "0", "wrong shape: a JSON str, not an object"),
        (json.dumps({"counts": [1]}), None, "wrong shape: 'counts' has the wrong shape"),
        (json.dumps({"counts": {"x|79": 1}}), None, "wrong shape: 'counts' has the wrong shape"),
        (json.dumps({"counts": {}, "pci_map": []}), None, "wrong shape: 'pci_map' has"),
        (json.dumps({"counts": {}, "pci_map": {"0000:18:00": ["0"]}}), "0", "wrong shape"),
        (json.dumps({"counts": {}, "rejected": {"bogus": 1}}), None, "'rejected' has the wrong"),
        (json.dumps({"counts": {}, "source": 5}), None, "'source' has the wrong shape"),
        (json.dumps({"counts": COUNTS, "pci_map": PCI_MAP}), "7", "knows no GPU 7"),
        (json.dumps({"counts": COUNTS}), "0", "knows no GPU 0"),
    ],
)
def test_clear_refuses(tmp_path, capsys, xid_state, gpu, message):
    xid_files(tmp_path, {}, {}, {"boot_id": "b", "counts": {}})
    (tmp_path / "collector-state" / "xid_state.json").write_text(xid_state)
    assert cli.clear(make_config(tmp_path), gpu) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpufleet-gpu-health: ")
    assert message in err and err.count("\n") == 1
    assert baseline_of(tmp_path) == {"boot_id": "b", "counts": {}}


@pytest.mark.parametrize("gpu", ["0", None])
def test_clear_with_a_forged_pci_map_says_so(tmp_path, capsys, gpu):
    """Regression: a pci_map value that is not a list once raised TypeError in clear();
    the file is checked as a whole now (state.xid_state_problem)."""
    xid_files(tmp_path, COUNTS, {"0000:18:00": 5}, None)
    assert cli.clear(make_config(tmp_path), gpu) == 1
    err = capsys.readouterr().err
    assert "wrong shape: 'pci_map' has the wrong shape" in err and err.count("\n") == 1
    assert not (tmp_path / "collector-state" / "xid_baseline.json").exists()


@pytest.mark.parametrize("where", ["missing-dir/b.json", "a-dir"])
def test_clear_when_the_baseline_cannot_be_written(tmp_path, capsys, where):
    """Regression: write_textfile's OSError (no directory, a directory in the way) once
    ended `clear` in a traceback; it is one line and exit 1 now."""
    xid_files(tmp_path, COUNTS, PCI_MAP, None)
    (tmp_path / "a-dir").mkdir()
    config = make_config(tmp_path, xid_baseline=str(tmp_path / where))
    assert cli.clear(config, None) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gpufleet-gpu-health: cannot write {tmp_path / where}: ")
    assert err.count("\n") == 1


def test_clear_without_an_xid_state_writes_an_empty_baseline(tmp_path, journal):
    """No XID state file yet (the collector has read no XID): nothing to clear, and the
    baseline taken is empty."""
    (tmp_path / "collector-state").mkdir()
    assert cli.main(["--config", str(write_config(tmp_path)), "clear"]) == 0
    assert baseline_of(tmp_path) == {"boot_id": boot_id(), "counts": {}}
    assert (syslog.LOG_INFO, "XIDs cleared on gpu-a by an admin") in journal


def test_clear_of_one_gpu_without_an_xid_state_knows_no_gpu(tmp_path, capsys):
    (tmp_path / "collector-state").mkdir()
    assert cli.clear(make_config(tmp_path), "0") == 1
    err = capsys.readouterr().err
    assert "knows no GPU 0" in err and err.count("\n") == 1


def test_unknown_command_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as done:
        cli.main(["--config", str(write_config(tmp_path)), "reboot"])
    assert done.value.code == 2


def test_default_config_path():
    assert cli.parse_args([]).config == cli.DEFAULT_CONFIG == "/etc/gpufleet/gpu-health.json"
    assert cli.parse_args([]).command == "check"


def test_read_small_bounds_what_it_reads(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b" " * (cli.MAX_FILE_BYTES + 1))
    assert cli.read_small(str(big)) is None
    assert cli.read_small(str(tmp_path)) is None  # a directory
    assert cli.read_small(str(tmp_path / "absent")) is None
    small = tmp_path / "small"
    small.write_bytes(b"ok \xff")
    assert cli.read_small(str(small)) == "ok \ufffd"


def test_save_reports_an_unwritable_textfile_dir(tmp_path, journal):
    config = make_config(tmp_path, textfile_dir=str(tmp_path / "no-such-dir"))
    cli.save(config, fresh_state(), Outcome("none", False, True), NOW)
    assert (tmp_path / "health-state" / "state.json").exists()
    assert any(p == syslog.LOG_ERR and "cannot write" in m for p, m in journal)
    assert os.listdir(tmp_path / "health-state") == ["state.json"]
