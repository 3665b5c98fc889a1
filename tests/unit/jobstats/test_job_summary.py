"""Job summaries that outlive retention: the format, the slurmctld epilog against a real
Prometheus and a fake scontrol, and ``gpufleet jobstats`` reading them back."""

from __future__ import annotations

import base64
import json
import os
import random
import stat
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from jobstats_scenario import CPU, GIB, MEM_USED_GIB, UTIL
from jobstats_synth import Job, free_port

from gpufleet.cli import main as gpufleet_main
from gpufleet_node import build
from gpufleet_node.job_summary import cli as epilog
from gpufleet_node.job_summary import gather
from gpufleet_node.job_summary.prom import PromClient
from gpufleet_node.job_summary.summary import (
    MAX_ENCODED,
    PREFIX,
    Summary,
    SummaryError,
    decode,
    encode,
)

Prom = tuple[str, Job, Job]


def small() -> Summary:
    return Summary(
        job_id="77",
        user="alice",
        account="physics",
        partition="gpu",
        cluster="c1",
        start=1_764_115_200.0,
        end=1_764_122_400.4,
        nodes={"n1.example": (2, {"cpu_mean": 0.25123456, "cpus": 64.0, "mem_total": 5e11})},
        gpus={
            ("n1.example", "0"): {"util_mean": 80.04321, "util_max": 90.0, "power_mean": 300.06},
            ("n1.example", "1"): {"util_max": 1.0, "mem_used_max": 1073741824.4},
        },
    )


def pack(document: object) -> str:
    raw = json.dumps(document).encode()
    return PREFIX + base64.b64encode(zlib.compress(raw)).decode()


def test_round_trip_keeps_the_figures() -> None:
    text = encode(small())
    assert text.startswith(PREFIX) and len(text) < 400
    back = decode(text, "77")
    assert (back.user, back.account, back.partition, back.cluster) == (
        "alice",
        "physics",
        "gpu",
        "c1",
    )
    assert (back.start, back.end) == (1_764_115_200.0, 1_764_122_401.0)
    count, node = back.nodes["n1.example"]
    assert count == 2 and node["cpu_mean"] == pytest.approx(0.2512) and node["cpus"] == 64
    assert back.gpus[("n1.example", "0")]["util_mean"] == pytest.approx(80.04)
    assert back.gpus[("n1.example", "1")] == {"util_max": 1.0, "mem_used_max": 1073741824.0}
    assert back.dropped == 0


def test_what_no_reader_would_accept_is_cleaned_when_written() -> None:
    summary = small()
    summary.user = "eve\x1b[2J" + "x" * 300
    summary.gpus[("n1.example", "0")] = {"util_mean": -3.0, "util_max": float("nan")}
    back = decode(encode(summary), "77")
    assert back.user == "eve?[2J" + "x" * 121
    assert back.gpus[("n1.example", "0")] == {}


def test_a_huge_job_is_cut_to_the_size_bound() -> None:
    rng = random.Random(7)
    summary = Summary(job_id="9", start=0.0, end=3600.0)
    for n in range(2000):
        summary.nodes[f"gpu{n:05d}"] = (8, {"cpu_mean": rng.random()})
        for g in range(8):
            summary.gpus[(f"gpu{n:05d}", str(g))] = {
                name: rng.random() * 100 for name in ("util_mean", "util_max", "power_mean")
            }
    text = encode(summary)
    assert len(text) <= MAX_ENCODED
    back = decode(text, "9")
    assert back.dropped > 0 and len(back.gpus) + back.dropped == 16000
    assert len(back.nodes) == 2000  # every node stays; GPU rows go first


ROW = ["n1", 1, 0.5, 0.5, 0.5, 1.0, 64]
GPU = ["n1", "0", 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def doc(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "v": 1,
        "job": "77",
        "user": "u",
        "account": "a",
        "partition": "p",
        "cluster": "c",
        "start": 1,
        "end": 2,
        "nodes": [ROW],
        "gpus": [GPU],
        "dropped": 0,
    }
    base.update(changes)
    return base


HOSTILE = {
    "an admin's own comment": "please check this job",
    "not base64": PREFIX + "!!!!",
    "not zlib": PREFIX + base64.b64encode(b"plain bytes").decode(),
    "a zlib bomb": PREFIX + base64.b64encode(zlib.compress(b" " * (4 << 20), 9)).decode(),
    "truncated": PREFIX + base64.b64encode(zlib.compress(b'{"v": 1}')[:-3]).decode(),
    "not JSON": PREFIX + base64.b64encode(zlib.compress(b"\xff{")).decode(),
    "too long": PREFIX + "A" * MAX_ENCODED,
    "a list": pack([1, 2]),
    "schema 2": pack(doc(v=2)),
    "another job": pack(doc(job="78")),
    "a control character": pack(doc(user="eve\n\x1b[2J")),
    "a long account": pack(doc(account="x" * 500)),
    "a node that breaks PromQL": pack(doc(nodes=[['n1"}or vector(1)', *ROW[1:]]])),
    "NaN": pack(doc(nodes=[[*ROW[:2], float("nan"), *ROW[3:]]])),
    "a negative share": pack(doc(nodes=[[*ROW[:2], -1, *ROW[3:]]])),
    "a bool count": pack(doc(nodes=[["n1", True, *ROW[2:]]])),
    "a string figure": pack(doc(gpus=[[*GPU[:2], "80", *GPU[3:]]])),
    "a GPU of no node": pack(doc(gpus=[["n9", *GPU[1:]]])),
    "a GPU listed twice": pack(doc(gpus=[GPU, GPU])),
    "a GPU index that is no number": pack(doc(gpus=[["n1", "0;1", *GPU[2:]]])),
    "a short row": pack(doc(nodes=[ROW[:3]])),
    "too many rows": pack(doc(nodes=[[f"n{i}", *ROW[1:]] for i in range(20001)])),
    "start after end": pack(doc(start=5, end=2)),
    "a float time": pack(doc(start=1.5)),
    "a negative drop count": pack(doc(dropped=-1)),
    "a down instance with a newline": pack(doc(down=["shard-1\nmissing data: none"])),
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=list(HOSTILE))
def test_hostile_text_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(SummaryError) as caught:
        decode(text, "77")
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


def test_the_valid_document_of_the_hostile_cases_decodes() -> None:
    """The cases above differ from this one by the hostile change only."""
    assert decode(pack(doc()), "77").nodes["n1"][0] == 1


# --- the epilog ---------------------------------------------------------------------------


def fake(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{script}\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture()
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bin directory on PATH with an scontrol that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake(bin_dir, "scontrol", f'printf "%s\\n" "$@" > "{tmp_path}/scontrol.args"')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def config(tmp_path: Path, *urls: str) -> str:
    path = tmp_path / "job-summary.json"
    instances = [{"name": f"shard-{k}", "urls": [url]} for k, url in enumerate(urls)]
    path.write_text(json.dumps({"prometheus": instances, "timeout": 10}), encoding="utf-8")
    return str(path)


def stored_comment(work: Path, job_id: str) -> str:
    args = (work / "scontrol.args").read_text(encoding="utf-8").splitlines()
    assert args[:2] == ["update", f"job={job_id}"]
    assert args[2].startswith("AdminComment=") and len(args) == 3
    return args[2].removeprefix("AdminComment=")


def test_epilog_stores_the_jobs_figures(
    prom: Prom, slurm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, job, _ = prom
    monkeypatch.setenv("SLURM_JOB_ID", job.job_id)
    # A second shard that is down: the job's nodes are all on the first.
    assert epilog.main(["--config", config(slurm, url, f"http://127.0.0.1:{free_port()}")]) == 1
    summary = decode(stored_comment(slurm, job.job_id), job.job_id)
    assert (summary.user, summary.account, summary.partition) == ("alice", "physics", "gpu")
    assert summary.start == pytest.approx(job.start, abs=60) and summary.end == job.end
    assert set(summary.gpus) == {(node, str(gpu)) for node, gpu in UTIL}
    for (node, gpu), (mean, jitter) in UTIL.items():
        figures = summary.gpus[(node, str(gpu))]
        assert figures["util_mean"] == pytest.approx(mean, abs=0.5)
        assert figures["util_max"] == pytest.approx(mean + 2 * jitter)
        assert figures["mem_used_max"] == pytest.approx(MEM_USED_GIB.get((node, gpu), 1) * GIB)
    for node, cpu in CPU.items():
        assert summary.nodes[node][1]["cpu_mean"] == pytest.approx(cpu, abs=1e-3)
    assert summary.nodes["n1"][0] == 4
    assert summary.down == ["shard-1"]


def test_epilog_run_as_the_job_ends_keeps_its_last_samples(prom: Prom) -> None:
    """The epilog runs seconds after the last sample, which may be past the span's last
    whole-minute step: the summary still ends at that sample, as the live report would."""
    url, job, _ = prom
    client = PromClient(url, 10)
    # Seen 10 s after its sample at end - 30 (the scenario's step is 30 s), the job's last
    # whole-minute step is end - 60.
    part = gather.find(client, job.job_id, 30 * 86400, job.end - 10)
    assert part.end == job.end - 30
    assert gather.find(client, job.job_id, 30 * 86400, job.end + 600).end == job.end


def test_epilog_of_a_job_without_gpu_series_stores_nothing(prom: Prom, slurm: Path) -> None:
    url, _, _ = prom
    assert epilog.main(["--config", config(slurm, url), "--job-id", "999999"]) == 0
    assert not (slurm / "scontrol.args").exists()


def test_epilog_with_prometheus_down_fails(slurm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(slurm, f"http://127.0.0.1:{free_port()}")
    assert epilog.main(["--config", cfg, "--job-id", "4242"]) == 1
    assert not (slurm / "scontrol.args").exists()
    assert capsys.readouterr().err.count("\n") == 1


def test_epilog_reports_a_failed_scontrol(
    prom: Prom, slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, job, _ = prom
    fake(slurm / "bin", "scontrol", 'echo "Invalid job id specified" >&2; exit 1')
    assert epilog.main(["--config", config(slurm, url), "--job-id", job.job_id]) == 1
    assert "Invalid job id specified" in capsys.readouterr().err


@pytest.mark.parametrize("job_id", ["", "12_3", "1;reboot", "4242\n"])
def test_epilog_refuses_a_hostile_job_id(slurm: Path, job_id: str) -> None:
    cfg = config(slurm, "http://127.0.0.1:1")
    assert epilog.main(["--config", cfg, "--job-id", job_id]) == 2


@pytest.mark.parametrize(
    "document",
    [
        {},
        {"prometheus": []},
        {"prometheus": [{"urls": ["http://user:pw@mon:9090"]}]},
        {"prometheus": [{"urls": ["file:///etc/passwd"]}]},
        {"prometheus": [{"urls": ["http://mon:9090"]}], "timeout": -1},
        {"prometheus": [{"urls": ["http://mon:9090"], "name": "a\nb"}]},
    ],
)
def test_check_config_refuses_bad_files(tmp_path: Path, document: object) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    assert epilog.main(["--config", str(path), "--check-config"]) == 1


def test_the_zipapp_prints_the_summary(prom: Prom, tmp_path: Path) -> None:
    url, job, _ = prom
    app = tmp_path / "gpufleet-job-summary.pyz"
    app.write_bytes(build.archive("job_summary"))
    done = subprocess.run(
        [sys.executable, str(app), "--config", config(tmp_path, url), "--print"],
        env={**os.environ, "SLURM_JOB_ID": job.job_id},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert decode(done.stdout, job.job_id).nodes["n2"][0] == 2


# --- gpufleet jobstats reading it back ----------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = gpufleet_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_jobstats_falls_back_to_the_stored_summary(
    prom: Prom, slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, job, _ = prom
    assert epilog.main(["--config", config(slurm, url), "--job-id", job.job_id]) == 0
    comment = stored_comment(slurm, job.job_id)
    (slurm / "comment").write_text(f"{comment}\n", encoding="utf-8")
    fake(slurm / "bin", "sacct", f'cat "{slurm}/comment"')
    code, out, _ = run(capsys, "jobstats", job.job_id, "--prometheus", url, "--json")
    live = json.loads(out)
    # --lookback 1h: Prometheus no longer "holds" the job, as after the retention.
    argv = ["jobstats", job.job_id, "--prometheus", url, "--lookback", "1h", "--json"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert "unknown" in err and err.count("\n") == 1
    report = json.loads(out)
    assert report["sources"] == [
        "the summary stored at the job's end (its AdminComment, read with sacct)"
    ]
    assert report["verdict"] == live["verdict"] == "idle GPUs"
    assert report["advice"] == live["advice"]
    assert report["end"] == live["end"] and report["running"] is False
    for mine, theirs in zip(report["gpus"], live["gpus"], strict=True):
        assert (mine["node"], mine["gpu"], mine["idle"]) == (
            theirs["node"],
            theirs["gpu"],
            theirs["idle"],
        )
        for name in ("util_mean", "util_max", "mem_used_max", "mem_total", "power_mean"):
            assert mine[name] == pytest.approx(theirs[name], rel=1e-3, abs=0.01), name
    for mine, theirs in zip(report["nodes"], live["nodes"], strict=True):
        assert mine["cpu_mean"] == pytest.approx(theirs["cpu_mean"], abs=1e-4)
        assert mine["gpus_allocated"] == theirs["gpus_allocated"]
    # Text output says where the figures come from; without a Prometheus, sacct only.
    code, out, _ = run(capsys, "jobstats", job.job_id)
    assert code == 0 and "request 4 GPUs instead of 6" in out
    assert out.rstrip().endswith("source: the summary stored at the job's end (its "
                                 "AdminComment, read with sacct)")  # fmt: skip


def test_jobstats_reads_a_summary_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "77.txt"
    path.write_text(encode(small()), encoding="utf-8")
    code, out, err = run(capsys, "jobstats", "77", "--summary", str(path))
    assert code == 0, err
    assert f"source: the summary in {path}" in out and "n1.example:0" in out
    down = small()
    down.down = ["shard-3"]
    path.write_text(encode(down), encoding="utf-8")
    code, out, err = run(capsys, "jobstats", "77", "--summary", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["missing"] == [
        "shard-3: did not answer when the summary was stored (the job's nodes there are missing)"
    ]


@pytest.mark.parametrize("text", [HOSTILE["a zlib bomb"], HOSTILE["another job"], "x" * 70000])
def test_jobstats_refuses_a_hostile_summary_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "s.txt"
    path.write_text(text, encoding="utf-8")
    code, out, err = run(capsys, "jobstats", "77", "--summary", str(path))
    assert code == 3 and out == "" and err.count("\n") == 1


def test_jobstats_without_summary_or_sacct_names_both(
    prom: Prom, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, job, _ = prom
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake(bin_dir, "sacct", "exit 0")  # the job has no AdminComment
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    argv = ["jobstats", job.job_id, "--prometheus", url, "--lookback", "1h"]
    code, out, err = run(capsys, *argv)
    assert code == 3 and out == "" and err.count("\n") == 1
    assert "raise --lookback" in err and "sacct holds no gpufleet summary" in err
