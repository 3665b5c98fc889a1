"""The report math and the missing-data lines of ``gpufleet jobstats`` (no Prometheus)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.cli import main
from gpufleet.jobstats.collect import Figures, span_seconds
from gpufleet.jobstats.discover import JobPlace, check_job_id
from gpufleet.jobstats.idle import (
    THRESHOLD_SERIES,
    add,
    parse_since,
    raw_expr,
    recorded_expr,
    rows,
    site_threshold,
)
from gpufleet.jobstats.render import bar, clean, duration
from gpufleet.jobstats.report import GpuStat, build_report, mean_utilization, ranges, verdict
from gpufleet_node.job_summary.gpuids import minor_map, nvml_indices
from gpufleet_node.job_summary.prom import Sample
from gpufleet_node.job_summary.summary import node_regex

GIB = 1024.0**3


def gpu(index: int, mean: float | None, peak: float | None = None, mem: float = 40.0) -> GpuStat:
    return GpuStat(
        node="g1",
        gpu=str(index),
        util_mean=mean,
        util_max=peak if peak is not None else mean,
        mem_used_max=mem * GIB,
        mem_total=80 * GIB,
    )


@pytest.mark.parametrize(
    ("indices", "text"),
    [([], ""), (["3"], "3"), (["0", "1", "2"], "0-2"), (["5", "0", "2", "3"], "0,2-3,5")],
)
def test_ranges(indices: list[str], text: str) -> None:
    assert ranges(indices) == text


def test_idle_gpus_give_the_count_to_request() -> None:
    word, advice = verdict([gpu(0, 80, 95), gpu(1, 70, 90), gpu(2, 0.5, 3), gpu(3, 0)], 5.0)
    assert word == "idle GPUs"
    assert advice[:2] == [
        "g1: GPUs 2-3 stayed under 5 % utilization for the whole run",
        "request 2 GPUs instead of 4",
    ]


def test_a_gpu_that_peaked_once_is_not_idle() -> None:
    word, advice = verdict([gpu(0, 2, 60), gpu(1, 80)], 5.0)
    assert word == "good"
    assert not any("stayed under" in line for line in advice)


def test_all_idle_says_the_job_used_no_gpu() -> None:
    word, advice = verdict([gpu(0, 0), gpu(1, 1, 2)], 5.0)
    assert word == "idle GPUs"
    assert "GPUs 0-1" in advice[0]
    assert advice[1].startswith("the job used none of its GPUs")


def test_underused_and_low_memory() -> None:
    word, advice = verdict([gpu(0, 12, 40, mem=8), gpu(1, 15, 50, mem=10)], 5.0)
    assert word == "underused"
    assert any("averaged 14 % utilization" in line for line in advice)
    assert any("memory peaked at 12% of the GPU" in line for line in advice)


def test_good_job() -> None:
    assert verdict([gpu(0, 85, 100), gpu(1, 90, 100)], 5.0) == (
        "good",
        ["the job used its GPUs well"],
    )


def test_threshold_moves_the_verdict() -> None:
    gpus = [gpu(0, 8, 9), gpu(1, 90)]
    assert verdict(gpus, 5.0)[0] != "idle GPUs"
    assert verdict(gpus, 10.0)[0] == "idle GPUs"


def test_no_data_at_all() -> None:
    word, advice = verdict([GpuStat("g1", "0"), GpuStat("g1", "1")], 5.0)
    assert word == "no data"
    assert advice == ["no GPU figures for this job: see the missing-data lines"]
    assert mean_utilization([GpuStat("g1", "0")]) is None


def test_gpus_without_data_are_left_out_of_the_mean_and_named() -> None:
    place = JobPlace("7", start=0, end=3600, gpus_allocated={"g1": 2, "g2": 2})
    place.gpu_indices = {"g1": ["0", "1"], "g2": ["0"]}
    figures = Figures(
        gpus={("g1", "0"): {"util_mean": 50.0, "util_max": 60.0}},
        nodes={"g1": {"cpu_mean": 0.5}},
    )
    report = build_report(place, figures, 5.0, running=False)
    assert [(g.node, g.gpu) for g in report.gpus] == [("g1", "0"), ("g1", "1"), ("g2", "0")]
    assert report.util_mean == 50.0
    assert report.missing == [
        "g2: 1 of 2 GPU indices unknown (the Slurm exporter reports none for shared GRES or "
        "when its series cap is reached)",
        "no GPU utilization for g1:1, g2:0 (GPU collector down, MIG, or the node's shard "
        "lost the data)",
        "no CPU figures for g2 (node_exporter not scraped)",
    ]


def test_merge_of_two_shards_parts() -> None:
    a = JobPlace("9", "u", "a", "p", "c", 100, 500, {"g1": 8}, {"g1": ["0"]})
    b = JobPlace("9", "u", "a", "p", "c", 90, 520, {"g2": 4}, {"g2": ["1"]})
    merged = JobPlace("9").merge(a).merge(b)
    assert (merged.start, merged.end) == (90, 520)
    assert merged.gpus_allocated == {"g1": 8, "g2": 4}
    assert span_seconds(merged) == 430
    assert span_seconds(JobPlace("9", start=5, end=5)) == 60


@pytest.mark.parametrize("job_id", ["1", "123456"])
def test_job_ids(job_id: str) -> None:
    assert check_job_id(job_id) == job_id


@pytest.mark.parametrize("job_id", ["123_4", "77+1"])
def test_array_and_het_ids_ask_for_the_jobid(job_id: str) -> None:
    """The exporter labels jobs by their own JobId: 123_4 would never be found."""
    with pytest.raises(ValueError, match="give its own JobId"):
        check_job_id(job_id)


@pytest.mark.parametrize("job_id", ["", "abc", '1"} or up{x="', "1 ", "12_", "-1", "1" * 13])
def test_hostile_job_ids_refused(job_id: str) -> None:
    with pytest.raises(ValueError, match="not a Slurm job id"):
        check_job_id(job_id)


def test_slurm_indices_are_device_minors_not_nvml_indices() -> None:
    """jobstats issue #34: n1's minors are its NVML indices reversed; Slurm's IDX 0-1 are
    /dev/nvidia0-1, NVML GPUs 3 and 2. n2 reports no minors: IDX = NVML index."""
    samples = [{"node": "n1", "gpu": str(gpu), "minor": str(3 - gpu)} for gpu in range(4)]
    minors = minor_map(samples)
    assert minors[("n1", "0")] == "3"
    assert nvml_indices({"n1": ["0", "1"], "n2": ["1", "0"]}, minors) == {
        "n1": ["2", "3"],
        "n2": ["0", "1"],
    }


def test_a_node_whose_minors_are_all_ambiguous_is_not_taken_as_index_equals_minor() -> None:
    """A map that changed inside the window (GPU replaced, rollout): both pairs of a minor
    appear; the node reported minors, so nothing is guessed."""
    samples = [{"node": "n1", "gpu": str(g), "minor": str(m)} for g, m in ((0, 0), (3, 0))]
    minors = minor_map(samples)
    assert minors == {}
    assert nvml_indices({"n1": ["0"]}, minors, {"n1"}) == {"n1": []}
    assert nvml_indices({"n1": ["0"]}, minors) == {"n1": ["0"]}  # never reported: fallback


def test_gpus_without_figures_are_not_counted_as_busy() -> None:
    def stat(gpu: str, util_max: float | None) -> GpuStat:
        mean = None if util_max is None else util_max / 2
        return GpuStat("n1", gpu, mean, util_max, None, None, None)

    gpus = [stat("0", 1.0), stat("1", 2.0), stat("2", None), stat("3", None)]
    _word, advice = verdict(gpus, 5.0)
    assert not any("request" in line for line in advice), advice
    assert any("2 of the job's GPUs have no figures" in line for line in advice), advice


def test_an_ambiguous_or_hostile_minor_maps_nothing() -> None:
    samples = [
        {"node": "n1", "gpu": "0", "minor": "0"},
        {"node": "n1", "gpu": "1", "minor": "0"},  # two GPUs claim /dev/nvidia0
        {"node": "n1", "gpu": "2", "minor": "2"},
        {"node": "n1", "gpu": "3", "minor": "1|.*"},
    ]
    minors = minor_map(samples)
    assert minors == {("n1", "2"): "2"}
    # n1 reports minors: an index that names no GPU for sure is dropped, not guessed.
    assert nvml_indices({"n1": ["0", "2"]}, minors) == {"n1": ["2"]}


def test_node_regex_escapes_dots() -> None:
    assert node_regex(["b.x", "a"]) == "a|b\\\\.x"


@pytest.mark.parametrize(("text", "seconds"), [("24h", 86400), ("7d", 604800), ("2w", 1209600)])
def test_since(text: str, seconds: int) -> None:
    assert parse_since(text) == seconds


@pytest.mark.parametrize("text", ["7", "0d", "1.5d", "7x", "-1d", "401d", "7d;drop"])
def test_bad_since(text: str) -> None:
    with pytest.raises(ValueError):
        parse_since(text)


def test_idle_queries_follow_the_rules_convention() -> None:
    assert recorded_expr("global_", "user", 7 * 86400) == (
        "sum by (user) (sum_over_time(global_slurm_user:gpu_hours_allocated_idle:sum1h"
        "[604740s:1h]))"
    )
    assert raw_expr(86400, 7.5) == (
        "sum by (user, account) (count_over_time((max_over_time("
        "slurm_job_gpu:gpu_utilization_percent:max[5m]) < 7.5)[86400s:5m])) * 0.0833333"
    )


def test_idle_rows_add_shards_and_sort() -> None:
    total = add([{"user": {"a": 1.0, "b": 0.0}}, {"user": {"a": 2.0, "c": 5.0}}])
    assert rows(total["user"], "user") == [
        {"user": "c", "gpu_hours": 5.0},
        {"user": "a", "gpu_hours": 3.0},
    ]


def test_render_helpers() -> None:
    assert bar(0.25, 8) == "[##......]"
    assert bar(1.7, 4) == "[####]" and bar(-1, 4) == "[....]" and bar(None, 2) == "[  ]"
    assert duration(3 * 86400 + 3720) == "3d 1h 02m"
    assert clean("evil\x1b[2Juser") == "evil?[2Juser"


@pytest.mark.parametrize(
    "argv",
    [
        ["jobstats", "1", "--prometheus", "http://x", "--threshold", "nan"],
        ["jobstats", "1", "--prometheus", "http://x", "--threshold", "101"],
        ["report", "idle", "--prometheus", "http://x", "--threshold", "-1"],
        ["report", "idle", "--prometheus", "http://x", "--timeout", "0"],
        ["jobstats", "1", "--prometheus", "http://x", "-i", "inv"],  # two sources
    ],
)
def test_bad_arguments_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_no_source_without_sacct(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without --prometheus/-i the stored summary is read with sacct; none here."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["jobstats", "1"]) == 2
    assert capsys.readouterr().err == (
        "gpufleet jobstats: give --prometheus URL, -i INVENTORY or --summary FILE\n"
    )


def test_summary_file_excludes_prometheus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobstats", "1", "--summary", "f", "--prometheus", "http://x"]) == 2
    assert "--summary reads no Prometheus" in capsys.readouterr().err


def test_bad_lookback_names_its_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobstats", "1", "--prometheus", "http://x", "--lookback", "3x"]) == 2
    assert capsys.readouterr().err == (
        "gpufleet jobstats: --lookback '3x': use whole hours, days or weeks (24h, 7d, 2w)\n"
    )


class ThresholdStub:
    """A Prometheus holding the rules' threshold series (or not)."""

    url = "http://prom:9090"

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        assert expr == f"max({THRESHOLD_SERIES})"
        return self.samples


def test_site_threshold_from_the_rules_else_5_with_a_note() -> None:
    assert site_threshold(ThresholdStub([Sample({}, 12.5)]), 0.0) == (12.5, [])  # type: ignore[arg-type]
    for samples in ([], [Sample({}, float("nan"))], [Sample({}, 250.0)]):
        value, notes = site_threshold(ThresholdStub(samples), 0.0)  # type: ignore[arg-type]
        assert value == 5.0
        assert notes == [
            f"http://prom:9090: no {THRESHOLD_SERIES} (gpufleet-slurm rules older than this "
            "gpufleet, or not loaded): the default idle threshold, 5 %"
        ]
