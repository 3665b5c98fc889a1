"""Every number gpufleet reports on may be NaN, +/-Inf, huge or negative: the output is
defined and every JSON document is strict JSON (issue 26 finding 10).

The class: numbers from Prometheus answers (and stored summaries) are taken through one
rule (gpufleet_node.numbers: non-finite is no figure, shown "-" or null; figures outside
0..1e18 are no figure, GPU-hours outside 0..1e12 are left out and counted) and every JSON
output goes through strict_dumps. Property tests feed seeded hostile values into every
report path (jobstats live, text and JSON; report idle, recorded and raw; the epilog's
summary) through a stand-in for the Prometheus API that answers as Prometheus writes
numbers ("NaN", "+Inf", "-Inf" strings). Plus the finding's other cases: job id 0042,
and a corrupt last stored summary line.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_prom import END, START, FakeApi

from gpufleet.cli import main
from gpufleet.jobstats import render, stored
from gpufleet_node.job_summary import cli as epilog
from gpufleet_node.job_summary import gather, prom
from gpufleet_node.job_summary.summary import (
    FIGURES,
    MAX_JOB_ID,
    Summary,
    SummaryError,
    canonical_job_id,
    decode,
    encode,
)
from gpufleet_node.numbers import finite_tree, strict_dumps

HOSTILE = ["NaN", "+Inf", "-Inf", "1e308", "-1", "0", "-0", "1e-320", "1e30", "3.5", "99.9"]
SEEDS = range(40)


def no_constants(name: str) -> Any:
    raise AssertionError(f"not strict JSON: {name}")


def strict(text: str) -> Any:
    """json.loads that refuses NaN, Infinity and -Infinity."""
    return json.loads(text, parse_constant=no_constants)


def hostile_picker(rng: random.Random) -> Callable[[str], str]:
    """Mostly hostile values; a sane one now and then, so that reports get made."""
    sane = {"count": "2", "time": str(START), "threshold": "5", "hours": "12.5", "figure": "40"}

    def pick(kind: str) -> str:
        return sane[kind] if rng.random() < 0.35 else rng.choice(HOSTILE)

    return pick


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[str], str]], FakeApi]:
    def install(pick: Callable[[str], str]) -> FakeApi:
        fake = FakeApi(pick)
        monkeypatch.setattr(
            prom.PromClient, "_get", lambda client, path, params: fake.get(path, params)
        )
        return fake

    return install


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_defined(code: int, out: str, err: str, json_mode: bool) -> None:
    assert code in (0, 3), err
    assert "Traceback" not in err and not re.search(r"\b(nan|inf|infinity)\b", out.lower())
    assert all(line.startswith("gpufleet ") for line in err.splitlines()), err
    if code == 3 and not out:
        assert err.count("\n") == 1
    if json_mode and out:
        strict(out)


COMMANDS = {
    "jobstats": ["jobstats", "42"],
    "report idle (recorded)": ["report", "idle"],
    "report idle (raw)": ["report", "idle", "--threshold", "5"],
}


@pytest.mark.parametrize("json_mode", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("command", COMMANDS)
def test_property_hostile_numbers_give_a_defined_report(
    api: Callable[[Callable[[str], str]], FakeApi],
    capsys: pytest.CaptureFixture[str],
    command: str,
    json_mode: bool,
) -> None:
    made = 0
    for seed in SEEDS:
        api(hostile_picker(random.Random(f"26-10-{command}-{seed}")))
        argv = [*COMMANDS[command], "--prometheus", "http://prom:9090"]
        code, out, err = run(capsys, *argv, *(["--json"] if json_mode else []))
        assert_defined(code, out, err, json_mode)
        made += bool(out)
    assert made >= len(SEEDS) // 4  # the property was tried on reports, not only refusals


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-1", "1e308"])
def test_a_nan_figure_prints_a_dash(
    api: Callable[[Callable[[str], str]], FakeApi], capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """The finding: a NaN figure ended the text report with exit 2."""
    sane = {"count": "2", "time": str(START), "threshold": "5"}
    api(lambda kind: sane.get(kind, value))
    code, out, err = run(capsys, "jobstats", "42", "--prometheus", "http://prom:9090")
    assert code == 0, err
    assert "verdict: no data" in out and "g1:0" in out and " - " in out
    code, out, err = run(capsys, "jobstats", "42", "--prometheus", "http://prom:9090", "--json")
    assert code == 0 and strict(out)["gpus"][0]["util_mean"] is None


@pytest.mark.parametrize("value", ["+Inf", "NaN", "-Inf", "1e300"])
def test_report_idle_leaves_out_what_is_no_number_of_hours(
    api: Callable[[Callable[[str], str]], FakeApi], capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """The finding: +Inf GPU-hours failed the text report and printed Infinity as JSON."""
    picks = iter([value] + ["7"] * 100)
    api(lambda kind: next(picks) if kind == "hours" else {"count": "1", "threshold": "5"}[kind])
    code, out, err = run(capsys, "report", "idle", "--prometheus", "http://prom:9090", "--json")
    assert code == 0, err
    result = strict(out)
    assert [row["gpu_hours"] for row in result["by_user"]] == [7, 7]
    assert "1 values left out: not a number of GPU-hours" in err
    code, out, err = run(capsys, "report", "idle", "--prometheus", "http://prom:9090")
    assert code == 0 and "7.0" in out


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), None])
def test_render_helpers_print_no_figure_for_what_is_none(value: float | None) -> None:
    assert render.bar(value) == "[" + " " * render.BAR_WIDTH + "]"
    assert render.duration(value) == "-"  # type: ignore[arg-type]
    assert render._num(value, ".1f") == "-" and render._gib(value) == "-"
    assert render._clock(value) == "-"  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-1.0, 0.0, 1e-320, 1e308, -1e308])
def test_render_helpers_are_total_on_finite_extremes(value: float) -> None:
    assert render.bar(value).count("#") in (0, render.BAR_WIDTH)
    assert render.duration(value) in ("-", "0h 00m")
    assert render._clock(value) in ("-", "1970-01-01 00:00:00 UTC")
    assert render._num(value, ".1f") and render._gib(value)


def test_strict_dumps_maps_every_non_finite_to_null() -> None:
    value = {"a": [float("nan"), (float("inf"), -float("inf"))], "b": {"c": 1.5}}
    assert strict(strict_dumps(value)) == {"a": [None, [None, None]], "b": {"c": 1.5}}
    assert finite_tree(float("nan")) is None


# --- the epilog's summary --------------------------------------------------------------


def test_property_a_summary_of_hostile_figures_is_strict_and_decodes() -> None:
    rng = random.Random(2610)
    numbers = [float(v) for v in HOSTILE] + [None, 5.0, 1e18, 1e19]
    for _ in range(200):
        summary = Summary(
            job_id="42",
            start=float(START),
            end=float(END),
            threshold=rng.choice(numbers),
            nodes={"g1": (2, {f: rng.choice(numbers) for f in ("cpu_mean", "mem_total")})},
            gpus={
                ("g1", g): {f: rng.choice(numbers) for _, f in FIGURES if f != "cpus"} for g in "01"
            },
        )
        text = encode(summary)
        back = decode(text, "42")
        for values in back.gpus.values():
            assert all(v is not None and 0 <= v <= 1e18 for v in values.values())


@pytest.mark.parametrize("when", [float("nan"), float("inf"), -1.0, 1e300])
def test_a_summary_with_no_time_is_one_line(when: float) -> None:
    summary = Summary(job_id="42", start=when, end=float(END), nodes={"g1": (1, {})})
    with pytest.raises(SummaryError, match="not a Unix time"):
        encode(summary)


def test_the_epilog_drops_figures_that_are_no_figure() -> None:
    class Client:
        def query(self, expr: str, at: float) -> list[tuple[dict[str, str], float]]:
            if "gpu_utilization_percent:max{job_id" in expr:
                return [({"node": "g1", "gpu": "0"}, 1.0)]
            return [({"node": "g1", "gpu": "0"}, -5.0), ({"node": "g1"}, 1e300)]

    part = Summary("42", start=float(START), end=float(END), nodes={"g1": (1, {})})
    gather.figures(Client(), part, START, END)  # type: ignore[arg-type]
    assert part.gpus == {("g1", "0"): {}} and part.nodes["g1"][1] == {}


def test_property_the_epilog_reads_hostile_answers_through_the_one_client(
    api: Callable[[Callable[[str], str]], FakeApi],
) -> None:
    """The epilog asks through the same client as jobstats, which gives NaN and +/-Inf as
    they come: what it stores is still a summary the reader takes, every figure a number."""
    config = epilog.Config(instances=[("prom", ["http://prom:9090"])])
    made = 0
    for seed in SEEDS:
        fake = api(hostile_picker(random.Random(f"26-10-epilog-{seed}")))
        summary, down = epilog.summarize(config, "42", END + 10.0)
        assert down == [] and fake.queries[0] == "vector(1)"
        if not summary.nodes:
            continue
        back = decode(encode(summary), "42")
        made += 1
        assert back.threshold is None or 0 <= back.threshold <= 100
        for _, values in back.nodes.values():
            assert all(v is not None and 0 <= v <= 1e18 for v in values.values())
        for values in back.gpus.values():
            assert all(v is not None and 0 <= v <= 1e18 for v in values.values())
    assert made >= len(SEEDS) // 4


# --- job ids ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "canonical"), [("0042", "42"), ("42", "42"), ("000000000001", "1")]
)
def test_a_job_id_with_leading_zeros_is_the_job_slurm_reads(given: str, canonical: str) -> None:
    assert canonical_job_id(given) == canonical


@pytest.mark.parametrize("given", ["0", "0000", str(MAX_JOB_ID + 1), "99999999999", "+42", "4 2"])
def test_what_no_slurm_job_id_can_be_is_refused_in_one_line(given: str) -> None:
    with pytest.raises(ValueError, match="is not a Slurm job id") as raised:
        canonical_job_id(given)
    assert "\n" not in str(raised.value)


def test_jobstats_0042_asks_for_job_42(
    api: Callable[[Callable[[str], str]], FakeApi], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = api(lambda kind: {"count": "2", "time": str(START)}.get(kind, "40"))
    code, out, err = run(capsys, "jobstats", "0042", "--prometheus", "http://prom:9090")
    assert code == 0, err
    assert out.startswith("job 42 ")
    assert 'job_id="42"' in fake.queries[0] and "0042" not in " ".join(fake.queries)


def test_the_epilog_takes_0042_as_job_42(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text('{"prometheus": [{"urls": ["http://127.0.0.1:1"]}], "timeout": 1}')
    assert epilog.main(["--config", str(cfg), "--job-id", "0"]) == 2
    assert "'0' is not a Slurm job id" in capsys.readouterr().err
    assert epilog.main(["--config", str(cfg), "--job-id", "0042"]) == 1  # asked, refused
    assert "job 42:" in capsys.readouterr().err


# --- stored summaries ------------------------------------------------------------------


def summary_text(util: float) -> str:
    return encode(
        Summary(
            job_id="42",
            start=float(START),
            end=float(END),
            nodes={"g1": (1, {})},
            gpus={("g1", "0"): {"util_mean": util, "util_max": util}},
        )
    )


@pytest.mark.parametrize(
    "corrupt", ["GF1:!!!", "GF1:" + "A" * 40, summary_text(1.0).replace('"', "")[:-8]]
)
def test_a_corrupt_last_line_does_not_hide_an_earlier_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], corrupt: str
) -> None:
    text = f"{summary_text(60.0)}\n{corrupt}\n"
    found, notes = stored.from_text(text, "42", "sacct")
    assert found.gpus[("g1", "0")]["util_mean"] == 60.0
    assert len(notes) == 1 and "summary 2 of 2 unreadable" in notes[0]
    path = tmp_path / "42.txt"
    path.write_text(text, encoding="utf-8")
    code, out, err = run(capsys, "jobstats", "0042", "--summary", str(path))
    assert code == 0 and "60.0 %" in out
    assert err.count("\n") == 1 and "showing summary 1, the newest readable" in err


def test_the_newest_readable_summary_wins_and_none_readable_is_one_line() -> None:
    found, notes = stored.from_text(f"{summary_text(10.0)}\n{summary_text(70.0)}", "42", "x")
    assert found.gpus[("g1", "0")]["util_mean"] == 70.0 and notes == []
    with pytest.raises(stored.NoSummary) as raised:
        stored.from_text("GF1:!!\nGF1:??\n", "42", "sacct")
    assert "none of its 2 summaries is readable" in str(raised.value)
    assert "\n" not in str(raised.value)
