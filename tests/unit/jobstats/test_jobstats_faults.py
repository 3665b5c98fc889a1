"""``gpufleet jobstats`` says when a GPU of the job, or one of its nodes, faulted during the
run (issue 23 item 4): the GPU collector's ``node_gpu_health_check{state="fail"}`` over
the job's span, through the stand-in for the Prometheus API (fake_prom), and the faults'
way through the stored summary. tests/unit/jobstats/test_jobstats_live.py runs the query
against a real Prometheus, test_jobstats_victoriametrics.py against VictoriaMetrics."""

from __future__ import annotations

import base64
import json
import random
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_prom import END, START, FakeApi

from gpufleet.cli import main
from gpufleet.jobstats.collect import Figures
from gpufleet.jobstats.discover import JobPlace
from gpufleet.jobstats.report import FAULT_ADVICE, build_report
from gpufleet_node.job_summary import gather, prom
from gpufleet_node.job_summary.summary import (
    HEALTH_SERIES,
    MAX_FAULTS,
    MAX_TEXT,
    Fault,
    Summary,
    SummaryError,
    decode,
    encode,
    fault_query,
    faults_of,
)

SANE = {"count": "2", "threshold": "5", "figure": "40", "time": str(START)}
XID = {"node": "g1", "gpu": "1", "check": "xid", "state": "fail"}
XID79 = {**XID, "reason": "xid79 (fallen off the bus)"}
NODE = {"node": "g1", "check": "gpu_count", "state": "fail", "reason": "7 of 8 GPUs present"}
TARGET = {"cluster": "c1", "instance": "g1:9100", "job": "node", "rack": "r1"}


def vector(*samples: tuple[dict[str, str], float | str]) -> dict[str, Any]:
    result = [{"metric": labels, "value": [END, str(value)]} for labels, value in samples]
    return {"resultType": "vector", "result": result}


def job_42(health: dict[str, Any]) -> Callable[[str, str], Any]:
    """Job 42 from START to END (FakeApi's node g1, GPUs 0 and 1) and ``health``, the
    answer to the fault query."""

    def extra(path: str, query: str) -> Any:
        if path.endswith("query_range"):  # present at every step: no requeue
            values = [[t, "2"] for t in range(START, END + 1, 60)]
            return {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}
        if HEALTH_SERIES in query:
            return health
        if query.startswith("min(min_over_time(timestamp("):
            return vector(({}, START))
        if query.startswith("max(max_over_time(timestamp("):
            return vector(({}, END))
        return None

    return extra


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeApi]:
    def install(*samples: tuple[dict[str, str], float | str]) -> FakeApi:
        fake = FakeApi(SANE.__getitem__, job_42(vector(*samples)))
        monkeypatch.setattr(
            prom.PromClient, "_get", lambda client, path, params: fake.get(path, params)
        )
        return fake

    return install


def jobstats(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    code = main(["jobstats", "42", "--prometheus", "http://prom:9090", *extra])
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err
    return out


def test_the_query_is_one_per_job_over_its_span(
    api: Callable[..., FakeApi], capsys: pytest.CaptureFixture[str]
) -> None:
    fake = api()
    jobstats(capsys)
    [query] = [q for q in fake.queries if HEALTH_SERIES in q]
    assert query == fault_query(["g1"], START, END)
    assert f'{HEALTH_SERIES}{{state="fail",node=~"g1"}}' in query
    assert "[7200s:60s]" in query and "max_over_time(" in query and "[7200s])" in query


def test_a_long_job_is_asked_at_a_step_victoriametrics_takes() -> None:
    """30 days at 60 s would be 43,200 subquery points; VictoriaMetrics refuses 30,000."""
    query = fault_query(["n1", "n2.x"], 0, 30 * 86400)
    assert "[2592000s:130s]" in query and 'node=~"n1|n2\\\\.x"' in query


def test_a_job_without_faults_prints_what_it_printed_before(
    api: Callable[..., FakeApi], capsys: pytest.CaptureFixture[str]
) -> None:
    """No health series, or only checks that are not the job's (another GPU of its node,
    another node, a warning): the same text, no fault line, the verdict unchanged; JSON
    has an empty ``faults``."""
    api()
    before = jobstats(capsys)
    assert "fault" not in before and "verdict: good" in before
    others = (
        ({**XID79, "gpu": "5", **TARGET}, START + 60),  # another GPU of g1
        ({**XID79, "node": "g9"}, START + 60),  # another node
        ({**XID79, "state": "warn"}, START + 60),  # not a failure
        ({**XID79, "gpu": "1;0"}, START + 60),  # no GPU index
        ({"node": "g1", "gpu": "1", "state": "fail"}, START + 60),  # no check
    )
    api(*others)
    assert jobstats(capsys) == before
    assert json.loads(jobstats(capsys, "--json"))["faults"] == []


def test_a_fault_on_another_gpu_of_the_node_is_not_the_jobs(
    api: Callable[..., FakeApi], capsys: pytest.CaptureFixture[str]
) -> None:
    api(({**XID79, "gpu": "3"}, START + 600), ({**XID79, **TARGET}, START + 720))
    out = jobstats(capsys)
    assert "GPU 3" not in out
    assert (
        "GPU 1 on g1 faulted during the run: xid79 (fallen off the bus), "
        "first seen 2025-11-26 00:12 UTC"
    ) in out.splitlines()


def test_a_node_fault_is_reported_for_the_node_and_the_verdict_says_so(
    api: Callable[..., FakeApi], capsys: pytest.CaptureFixture[str]
) -> None:
    api((NODE, START + 3600), (XID79, START + 720))
    out = jobstats(capsys)
    lines = out.splitlines()
    faults = [line for line in lines if "faulted" in line]
    assert faults == [
        "GPU 1 on g1 faulted during the run: xid79 (fallen off the bus), "
        "first seen 2025-11-26 00:12 UTC",
        "node g1 faulted during the run: 7 of 8 GPUs present, first seen 2025-11-26 01:00 UTC",
    ]
    # after the node table, before the verdict; the verdict itself is the figures'
    assert lines.index(faults[-1]) < lines.index("verdict: good (mean GPU utilization 40.0 %)")
    assert lines[lines.index("verdict: good (mean GPU utilization 40.0 %)") + 1] == (
        f"  - {FAULT_ADVICE}"
    )
    report = json.loads(jobstats(capsys, "--json"))
    assert report["faults"] == [
        {
            "node": "g1",
            "gpu": "1",
            "check": "xid",
            "reason": "xid79 (fallen off the bus)",
            "first_seen": START + 720,
        },
        {
            "node": "g1",
            "gpu": None,
            "check": "gpu_count",
            "reason": "7 of 8 GPUs present",
            "first_seen": START + 3600,
        },
    ]
    assert report["verdict"] == "good" and report["advice"][0] == FAULT_ADVICE
    assert [g["util_mean"] for g in report["gpus"]] == [40.0, 40.0]  # the math unchanged


def test_hostile_label_text_is_cleaned_and_bounded(
    api: Callable[..., FakeApi], capsys: pytest.CaptureFixture[str]
) -> None:
    reason = "xid79\x1b[2J\r\nverdict: good\x00" + "x" * 100_000
    check = "x\u202eid\n" * 1000
    api(({**XID, "reason": reason}, START + 60), ({**NODE, "check": check, "reason": ""}, END))
    out = jobstats(capsys)
    assert "\x1b" not in out and "\x00" not in out and "\r" not in out and "\u202e" not in out
    [xid, node] = [line for line in out.splitlines() if "faulted" in line]
    assert xid.startswith("GPU 1 on g1 faulted during the run: xid79?[2J??verdict: good?xxx")
    assert len(xid) < 250 and len(node) < 250
    assert node.startswith("node g1 faulted during the run: x?id?x?id?")  # no reason: check
    assert [line for line in out.splitlines() if line.startswith("verdict")] == [
        "verdict: good (mean GPU utilization 40.0 %)"
    ]
    for fault in json.loads(jobstats(capsys, "--json"))["faults"]:
        assert len(fault["reason"]) <= MAX_TEXT and len(fault["check"]) <= MAX_TEXT
        assert all(ch.isprintable() for ch in fault["reason"] + fault["check"])


def test_a_fault_seen_only_between_steps_and_one_from_before_the_job(
    api: Callable[..., FakeApi], capsys: pytest.CaptureFixture[str]
) -> None:
    """-1: max_over_time saw the series, no subquery step did. A check failing when the job
    started (its sample before the span) is first seen at the job's start."""
    api((XID79, -1), ({**XID79, "gpu": "0"}, START - 200), (NODE, "NaN"))
    out = jobstats(capsys)
    faults = [line for line in out.splitlines() if "faulted" in line]
    assert faults == [
        "GPU 0 on g1 faulted during the run: xid79 (fallen off the bus), "
        "first seen 2025-11-26 00:00 UTC",
        "node g1 faulted during the run: 7 of 8 GPUs present, seen only between the "
        "query's steps (a brief fault)",
        "GPU 1 on g1 faulted during the run: xid79 (fallen off the bus), seen only between "
        "the query's steps (a brief fault)",
    ]
    report = json.loads(jobstats(capsys, "--json"))
    assert [f["first_seen"] for f in report["faults"]] == [START, None, None]


def test_many_faults_are_counted_past_twenty_lines(
    api: Callable[..., FakeApi], capsys: pytest.CaptureFixture[str]
) -> None:
    api(*(({**NODE, "check": f"c{k:02d}"}, START + k) for k in range(25)))
    out = jobstats(capsys)
    assert len([line for line in out.splitlines() if "faulted" in line]) == 20
    assert "... and 5 more faults (--json lists them all)" in out
    assert len(json.loads(jobstats(capsys, "--json"))["faults"]) == 25


def test_one_fault_per_check_the_first_seen() -> None:
    """An ECC count that grows is one series per reason: one fault, the first reason."""
    ecc = {"node": "n1", "gpu": "0", "check": "ecc_uncorrectable", "state": "fail"}
    samples = [
        ({**ecc, "reason": "3 uncorrectable ECC errors"}, 500.0),
        ({**ecc, "reason": "1 uncorrectable ECC errors", "instance": "b"}, 200.0),
        ({**ecc, "reason": "1 uncorrectable ECC errors", "instance": "a"}, 200.0),
        ({**ecc, "check": "xid", "reason": "xid48"}, float("inf")),
    ]
    faults = faults_of(samples, {"n1": ["0"]}, 100.0, 1000.0)
    assert faults == [
        Fault("n1", "0", "ecc_uncorrectable", "1 uncorrectable ECC errors", 200.0),
        Fault("n1", "0", "xid", "xid48", None),
    ]
    # a job whose indices on the node are unknown: only the node's own checks are its
    assert faults_of([*samples, (NODE | {"node": "n1"}, 300.0)], {"n1": []}, 0, 1e4) == [
        Fault("n1", None, "gpu_count", "7 of 8 GPUs present", 300.0)
    ]


# --- the stored summary ---------------------------------------------------------------


def summary(*faults: Fault, dropped: int = 0) -> Summary:
    return Summary(
        job_id="42",
        start=float(START),
        end=float(END),
        nodes={"g1": (2, {})},
        gpus={("g1", "0"): {"util_mean": 40.0, "util_max": 40.0}},
        faults=list(faults),
        faults_dropped=dropped,
    )


def test_faults_round_trip_through_the_summary() -> None:
    faults = [
        Fault("g1", "1", "xid", "xid79 (fallen off the bus)", START + 720.7),
        Fault("g1", None, "gpu_count", "7 of 8 GPUs present", None),
    ]
    back = decode(encode(summary(*faults)), "42")
    assert back.faults == [
        Fault("g1", "1", "xid", "xid79 (fallen off the bus)", float(START + 720)),
        Fault("g1", None, "gpu_count", "7 of 8 GPUs present", None),
    ]
    assert back.faults_dropped == 0


def test_a_summary_without_faults_is_the_same_text_as_before() -> None:
    """No "faults" key at all: what an older reader, or this one, reads as before."""
    document = json.loads(zlib.decompress(base64.b64decode(encode(summary())[4:])))
    assert "faults" not in document and "faults_dropped" not in document
    assert decode(encode(summary()), "42").faults == []


def test_hostile_fault_text_is_cleaned_when_stored_and_many_are_counted() -> None:
    hostile = Fault("g1", "0", "xid\n", "\x1b[2J" + "y" * 10_000, START + 1.0)
    many = [Fault("g1", None, f"c{k:03d}", "r", START + 10.0 + k) for k in range(100)]
    back = decode(encode(summary(hostile, *many, dropped=3)), "42")
    assert back.faults[0] == Fault("g1", "0", "xid?", "?[2J" + "y" * 124, START + 1.0)
    assert len(back.faults) == MAX_FAULTS and back.faults_dropped == 100 + 1 - MAX_FAULTS + 3
    assert back.faults[-1].check == f"c{MAX_FAULTS - 2:03d}"  # the first seen are kept


def test_faults_go_after_the_gpu_rows_when_nothing_else_fits() -> None:
    rng = random.Random(23)
    many = [
        Fault("g1", None, f"c{k:03d}", rng.randbytes(50).hex(), START + k)
        for k in range(MAX_FAULTS)
    ]
    text = encode(summary(*many), limit=700)
    back = decode(text, "42", limit=700)
    assert back.faults == [] and back.faults_dropped == MAX_FAULTS and back.dropped == 1


def _pack(document: dict[str, Any]) -> str:
    return "GF1:" + base64.b64encode(zlib.compress(json.dumps(document).encode())).decode()


def _doc(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "v": 1,
        "job": "42",
        "start": 1,
        "end": 2,
        "nodes": [["g1", 2, None, None, None, None, None]],
        "gpus": [],
        "faults": [["g1", "0", "xid", "xid79", 1]],
    }
    base.update(changes)
    return base


HOSTILE = {
    "a fault of no node": _doc(faults=[["g9", "0", "xid", "r", 1]]),
    "a GPU that is no index": _doc(faults=[["g1", "0|1", "xid", "r", 1]]),
    "a control character": _doc(faults=[["g1", "0", "xid", "r\x1b[2J", 1]]),
    "a long reason": _doc(faults=[["g1", "0", "xid", "r" * 500, 1]]),
    "no check": _doc(faults=[["g1", "0", "", "r", 1]]),
    "a float time": _doc(faults=[["g1", "0", "xid", "r", 1.5]]),
    "a short row": _doc(faults=[["g1", "0", "xid", "r"]]),
    "listed twice": _doc(faults=[["g1", None, "x", "r", 1], ["g1", None, "x", "s", 2]]),
    "too many": _doc(faults=[["g1", None, f"c{k}", "r", 1] for k in range(MAX_FAULTS + 1)]),
    "not a list": _doc(faults={"g1": 1}),
    "a negative count": _doc(faults_dropped=-1),
}


@pytest.mark.parametrize("document", HOSTILE.values(), ids=list(HOSTILE))
def test_hostile_stored_faults_are_refused_in_one_line(document: dict[str, Any]) -> None:
    assert decode(_pack(_doc()), "42").faults == [Fault("g1", "0", "xid", "xid79", 1.0)]
    with pytest.raises(SummaryError) as caught:
        decode(_pack(document), "42")
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


def test_jobstats_shows_the_stored_faults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "42.txt"
    xid = Fault("g1", "1", "xid", "xid79 (fallen off the bus)", START + 720.0)
    path.write_text(encode(summary(xid, dropped=2)), encoding="utf-8")
    code = main(["jobstats", "42", "--summary", str(path)])
    out, err = capsys.readouterr()
    assert code == 3, err  # a hole, as GPU rows left out are
    assert (
        "GPU 1 on g1 faulted during the run: xid79 (fallen off the bus), "
        "first seen 2025-11-26 00:12 UTC"
    ) in out.splitlines()
    assert f"  - {FAULT_ADVICE}" in out
    assert "2 GPU faults left out of the stored summary" in out


def test_the_epilog_stores_the_jobs_faults_only() -> None:
    """The epilog's figures: the same query, GPUs the job held, its nodes' own checks."""

    class Client:
        def __init__(self) -> None:
            self.asked: list[str] = []

        def query(self, expr: str, at: float) -> list[tuple[dict[str, str], float]]:
            self.asked.append(expr)
            if "gpu_utilization_percent:max{job_id" in expr:
                return [({"node": "g1", "gpu": "1"}, 1.0)]
            if HEALTH_SERIES in expr:
                return [(XID79, START + 720.0), ({**XID79, "gpu": "0"}, START), (NODE, -1.0)]
            return []

    client = Client()
    part = Summary("42", start=float(START), end=float(END), nodes={"g1": (1, {})})
    gather.figures(client, part, START, END)  # type: ignore[arg-type]
    assert fault_query(["g1"], START, END) in client.asked
    assert part.faults == [
        Fault("g1", "1", "xid", "xid79 (fallen off the bus)", START + 720.0),
        Fault("g1", None, "gpu_count", "7 of 8 GPUs present", None),
    ]
    whole = gather.merge("42", [part, Summary("42")])
    assert whole.faults == part.faults


def test_a_fault_two_parts_both_hold_is_one() -> None:
    """Two shards that both scrape a node: one fault, the first seen, live and stored."""
    early = Fault("g1", "1", "xid", "xid48", START + 60.0)
    late = Fault("g1", "1", "xid", "xid79", START + 600.0)
    place = JobPlace("42", start=START, end=END, gpus_allocated={"g1": 2})
    place.gpu_indices = {"g1": ["0", "1"]}
    report = build_report(place, Figures({}, {}, [late, early]), 5.0, running=False)
    assert report.faults == [early]
    assert decode(encode(summary(late, early)), "42").faults == [early]
    assert gather.merge("42", [summary(late), summary(early)]).faults == [early]
