"""Job summaries that outlive retention: the format, the slurmctld epilog against a real
Prometheus and a fake sacctmgr, and ``gpufleet jobstats`` reading them back."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import random
import socket
import stat
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from jobstats_scenario import CPU, GIB, MEM_USED_GIB, UTIL
from jobstats_synth import Job, free_port

from gpufleet.cli import main as gpufleet_main
from gpufleet.jobstats import stored
from gpufleet_node import build
from gpufleet_node.job_summary import cli as epilog
from gpufleet_node.job_summary import gather
from gpufleet_node.job_summary.prom import PromClient, PromError
from gpufleet_node.job_summary.summary import (
    DIGITS,
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


@pytest.mark.parametrize(
    ("util_max", "threshold"), [(4.996, 5.0), (4.9996, 5.0), (4.35, 4.35), (4.349, 4.35)]
)
def test_the_stored_peak_gives_the_live_idle_verdict(util_max: float, threshold: float) -> None:
    """Rounded to nearest, 4.996 was stored as 5.00: an idle GPU became busy."""
    summary = small()
    summary.gpus[("n1.example", "0")]["util_max"] = util_max
    back = decode(encode(summary), "77").gpus[("n1.example", "0")]["util_max"]
    assert (back < threshold) == (util_max < threshold)
    assert back == pytest.approx(util_max, abs=0.001)


def test_what_no_reader_would_accept_is_cleaned_when_written() -> None:
    summary = small()
    summary.user = "eve\x1b[2J" + "x" * 300
    summary.gpus[("n1.example", "0")] = {"util_mean": -3.0, "util_max": float("nan")}
    back = decode(encode(summary), "77")
    assert back.user == "eve?[2J" + "x" * 121
    assert back.gpus[("n1.example", "0")] == {}


def test_a_huge_job_is_cut_to_the_size_bound() -> None:
    """Realistic rows (FQDNs, every figure): 16,000 GPUs inflate past the reader's MAX_JSON
    before they are cut; the cut text is what must fit, and does."""
    rng = random.Random(7)
    summary = Summary(job_id="9", start=0.0, end=3600.0)
    gpus_per_node, nodes = 8, 2000
    for n in range(nodes):
        node = f"gpu-node-{n:05d}.rack{n // 40:03d}.cluster.example.org"
        summary.nodes[node] = (gpus_per_node, {
            "cpu_mean": rng.random(), "cpu_max": rng.random(), "mem_max": rng.random(),
            "mem_total": 2.0e12 + rng.random() * 1e9, "cpus": 128.0,
        })  # fmt: skip
        for g in range(gpus_per_node):
            summary.gpus[(node, str(g))] = {
                "util_mean": rng.random() * 100,
                "util_max": rng.random() * 100,
                "mem_used_max": rng.random() * 8.5e10,
                "mem_total": 85899345920.0,
                "power_mean": rng.random() * 700,
                "power_max": rng.random() * 700,
            }
    text = encode(summary)
    assert len(text) <= MAX_ENCODED
    back = decode(text, "9")
    assert back.dropped > 0 and len(back.gpus) + back.dropped == 16000
    assert len(back.nodes) == nodes  # every node stays; GPU rows go first


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
    "deep nesting": PREFIX + base64.b64encode(zlib.compress(b"[" * 200000, 9)).decode(),
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
    "a threshold over 100 %": pack(doc(threshold=101)),
    "a string threshold": pack(doc(threshold="5")),
    "a NaN threshold": pack(doc(threshold=float("nan"))),
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=list(HOSTILE))
def test_hostile_text_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(SummaryError) as caught:
        decode(text, "77")
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


def test_the_valid_document_of_the_hostile_cases_decodes() -> None:
    """The cases above differ from this one by the hostile change only."""
    assert decode(pack(doc()), "77").nodes["n1"][0] == 1
    assert decode(pack(doc(threshold=12.5)), "77").threshold == 12.5
    assert decode(pack(doc()), "77").threshold is None  # stored before the threshold was


# --- the epilog ---------------------------------------------------------------------------


def fake(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{script}\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture()
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bin directory on PATH with a sacctmgr that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake(bin_dir, "sacctmgr", f'printf "%s\\n" "$@" > "{tmp_path}/sacctmgr.args"')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def config(tmp_path: Path, *urls: str, **extra: object) -> str:
    path = tmp_path / "job-summary.json"
    instances = [{"name": f"shard-{k}", "urls": [url]} for k, url in enumerate(urls)]
    document = {"prometheus": instances, "timeout": 10, **extra}
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


def stored_comment(work: Path, job_id: str, target: str | None = None) -> str:
    args = (work / "sacctmgr.args").read_text(encoding="utf-8").splitlines()
    assert args[:6] == ["-i", "update", "job", "where", f"jobid={target or job_id}", "set"]
    assert args[6].startswith("AdminComment=") and len(args) == 7
    return args[6].removeprefix("AdminComment=")


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


def test_epilog_of_a_job_shorter_than_a_minute_has_its_span() -> None:
    """No whole-minute point saw a job of 40 s: its span comes from the last samples at
    1 s, first to last, not (now, last sample), a range Prometheus refuses."""
    now = 1_700_000_030.0
    first, last = now - 45, now - 5

    class Answers:
        def query(self, expr: str, at: float) -> list[tuple[dict[str, str], float]]:
            assert at == now
            if expr.startswith("max_over_time(slurm_job_gpus_allocated"):
                return [({"node": "n1", "user": "alice"}, 2.0)]
            if ":1s]" not in expr:
                return []  # the whole-minute points: none while the job ran
            return [({}, first if expr.startswith("min(") else last)]

    part = gather.find(cast(PromClient, Answers()), "77", 86400, now)
    assert (part.start, part.end, part.user) == (first, last, "alice")


def test_epilog_of_a_job_without_gpu_series_stores_nothing(prom: Prom, slurm: Path) -> None:
    url, _, _ = prom
    assert epilog.main(["--config", config(slurm, url), "--job-id", "999999"]) == 0
    assert not (slurm / "sacctmgr.args").exists()


def test_epilog_with_prometheus_down_fails(slurm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(slurm, f"http://127.0.0.1:{free_port()}")
    assert epilog.main(["--config", cfg, "--job-id", "4242"]) == 1
    assert not (slurm / "sacctmgr.args").exists()
    assert capsys.readouterr().err.count("\n") == 1


def test_epilog_reports_a_failed_sacctmgr(
    prom: Prom, slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, job, _ = prom
    fake(slurm / "bin", "sacctmgr", 'echo "Problem talking to the database" >&2; exit 1')
    assert epilog.main(["--config", config(slurm, url), "--job-id", job.job_id]) == 1
    assert "Problem talking to the database" in capsys.readouterr().err


def test_epilog_names_why_sacctmgr_could_not_run(
    prom: Prom, slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, job, _ = prom
    cfg = config(slurm, url, sacctmgr=str(slurm / "bin/no-such-sacctmgr"))
    assert epilog.main(["--config", cfg, "--job-id", job.job_id]) == 1
    err = capsys.readouterr().err
    assert "no-such-sacctmgr: No such file or directory" in err and err.count("\n") == 1, err


def test_epilog_retries_until_slurmdbd_has_the_job(
    prom: Prom, slurm: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmdbd may get the job's record after the epilog starts: sacctmgr then modifies
    nothing (exit 0); the epilog tries again, and says so when it never appears."""
    url, job, _ = prom
    monkeypatch.setattr(epilog, "SACCTMGR_RETRY_S", 0.01)
    tries = slurm / "tries"
    fake(
        slurm / "bin",
        "sacctmgr",
        f'echo x >> "{tries}"; [ "$(wc -l < "{tries}")" -ge 2 ] && echo " Modified job" '
        '|| echo " Nothing modified"',
    )
    assert epilog.main(["--config", config(slurm, url), "--job-id", job.job_id]) == 0
    assert tries.read_text(encoding="utf-8").count("x") == 2
    fake(slurm / "bin", "sacctmgr", 'echo " Nothing modified"')
    assert epilog.main(["--config", config(slurm, url), "--job-id", job.job_id]) == 1
    assert "slurmdbd has no record of it" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("env", "target"),
    [
        ({"SLURM_ARRAY_JOB_ID": "4000", "SLURM_ARRAY_TASK_ID": "7"}, "4000_7"),
        ({"SLURM_HET_JOB_ID": "5000", "SLURM_HET_JOB_OFFSET": "1"}, "5000+1"),
        ({"SLURM_ARRAY_JOB_ID": "4000", "SLURM_ARRAY_TASK_ID": "7;x"}, None),
    ],
)
def test_epilog_updates_only_the_array_task_or_het_component(
    prom: Prom,
    slurm: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    target: str | None,
) -> None:
    """jobid=<array job id> would overwrite every task's AdminComment."""
    url, job, _ = prom
    monkeypatch.setenv("SLURM_JOB_ID", job.job_id)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert epilog.main(["--config", config(slurm, url)]) == 0
    assert decode(stored_comment(slurm, job.job_id, target), job.job_id).nodes


def test_a_shard_failing_mid_run_loses_its_part_only(
    prom: Prom, slurm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, job, _ = prom
    other = url.replace("127.0.0.1", "localhost")  # the same Prometheus, as a second shard
    figures = gather.figures

    def failing(client: PromClient, *args: Any) -> None:
        if client.url == other:
            raise PromError(f"{other}: HTTP 503 Service Unavailable")
        figures(client, *args)

    monkeypatch.setattr(gather, "figures", failing)
    assert epilog.main(["--config", config(slurm, url, other), "--job-id", job.job_id]) == 1
    summary = decode(stored_comment(slurm, job.job_id), job.job_id)
    assert summary.down == ["shard-1"] and summary.nodes and summary.gpus


def test_sacctmgr_gets_the_configured_slurm_conf(
    prom: Prom, slurm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmctld gives its epilog no SLURM_CONF: a site's slurm.conf comes from the config."""
    url, job, _ = prom
    fake(slurm / "bin", "sacctmgr", f'echo "$SLURM_CONF" > "{slurm}/conf"')
    monkeypatch.delenv("SLURM_CONF", raising=False)
    cfg = config(
        slurm, url, slurm_conf="/etc/slurm/site.conf", sacctmgr=str(slurm / "bin/sacctmgr")
    )
    monkeypatch.setenv("PATH", "/nonexistent")
    assert epilog.main(["--config", cfg, "--job-id", job.job_id]) == 0
    assert (slurm / "conf").read_text(encoding="utf-8") == "/etc/slurm/site.conf\n"


@pytest.fixture()
def drip() -> Iterator[Callable[[bytes], str]]:
    """A server that answers with ``head`` then one more byte every 0.2 s, forever."""
    stop = threading.Event()
    servers: list[socket.socket] = []

    def feed(conn: socket.socket, head: bytes) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(head)
                while not stop.wait(0.2):
                    conn.sendall(b" ")
            except OSError:
                pass

    def serve(server: socket.socket, head: bytes) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=feed, args=(conn, head), daemon=True).start()

    def start(head: bytes) -> str:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)
        threading.Thread(target=serve, args=(server, head), daemon=True).start()
        return f"http://127.0.0.1:{server.getsockname()[1]}"

    yield start
    stop.set()
    for server in servers:
        server.close()


def test_a_dripping_answer_is_bounded_by_the_query_timeout(drip: Callable[[bytes], str]) -> None:
    """The socket timeout never fires on a byte per 0.2 s; the deadline between reads must."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 999999\r\n\r\n"
    client = PromClient(drip(head), timeout=1)
    failed: list[Exception] = []

    def ask() -> None:
        try:
            client.query("vector(1)", 0)
        except PromError as err:
            failed.append(err)

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(15)
    assert not asking.is_alive() and failed and "timeout" in str(failed[0])


@pytest.mark.parametrize(
    ("timeout", "deadline_s", "message"),
    [
        (1, 20, "timeout: no complete answer in 1 s"),  # issue 26 finding 9: headers count
        (30, 2, "not done in 2s (deadline_s)"),
    ],
)
def test_the_epilog_gives_up_at_its_deadline(
    drip: Callable[[bytes], str], tmp_path: Path, timeout: int, deadline_s: int, message: str
) -> None:
    """Headers dripped forever: the query's timeout, or the run's deadline, ends it."""
    url = drip(b"HTTP/1.1 200 OK\r\nX-Drip: ")
    cfg = config(tmp_path, url, timeout=timeout, deadline_s=deadline_s)
    code = (
        "import sys; from gpufleet_node.job_summary.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code, "--config", cfg, "--job-id", "4242"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and time.monotonic() - started < 15
    assert message in done.stderr and done.stderr.count("\n") == 1


def test_the_epilog_skips_when_every_slot_is_taken(
    prom: Prom, slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, job, _ = prom
    cfg = config(slurm, url, run_dir=str(slurm), slots=1, slot_wait_s=0.5)
    with open(slurm / "slot-0", "ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert epilog.main(["--config", cfg, "--job-id", job.job_id]) == 1
    assert not (slurm / "sacctmgr.args").exists()
    err = capsys.readouterr().err
    assert "1 job summaries already running" in err and err.count("\n") == 1
    # The slot free again: the summary is stored.
    assert epilog.main(["--config", cfg, "--job-id", job.job_id]) == 0
    assert decode(stored_comment(slurm, job.job_id), job.job_id).nodes


def test_the_epilog_asks_the_instances_in_parallel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each ask returns only once all four are being asked at the same time: asked one after
    # another, the first would wait for the others in vain. (This was a 1 s sleep in each
    # and a wall-clock bound of 3 s, which a loaded machine could break.)
    together = threading.Barrier(4)

    def slow(urls: list[str], make: object, name: str) -> tuple[object, str]:
        together.wait(timeout=30)
        return None, f"{name}: no replica answers"

    monkeypatch.setattr(gather, "first_answer", slow)
    cfg = epilog.load_config(config(tmp_path, *[f"http://127.0.0.1:{k + 1}" for k in range(4)]))
    summary, down = epilog.summarize(cfg, "4242", time.time())
    assert len(down) == 4 and summary.down == ["shard-0", "shard-1", "shard-2", "shard-3"]
    assert not together.broken


def test_the_lookback_starts_at_the_jobs_start_where_slurm_gives_it(tmp_path: Path) -> None:
    cfg = epilog.load_config(config(tmp_path, "http://127.0.0.1:1"))
    now = 1_764_122_400.0
    assert epilog.lookback(cfg, {"SLURM_JOB_START_TIME": str(int(now) - 3600)}, now) == 4200
    assert epilog.lookback(cfg, {}, now) == 30 * 86400
    assert epilog.lookback(cfg, {"SLURM_JOB_START_TIME": "-5"}, now) == 30 * 86400
    assert epilog.lookback(cfg, {"SLURM_JOB_START_TIME": str(int(now) - 10**9)}, now) == 30 * 86400


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
        {"prometheus": [{"urls": ["http://mon:9090"]}], "slots": 0.5},
        {"prometheus": [{"urls": ["http://mon:9090"]}], "deadline_s": float("inf")},
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
    (slurm / "comment").write_text(f"{job.job_id}|{comment}\n", encoding="utf-8")
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
    # Every field of every row, within its stored rounding (summary.DIGITS).
    for mine_rows, their_rows in ((report["gpus"], live["gpus"]), (report["nodes"], live["nodes"])):
        for mine, theirs in zip(mine_rows, their_rows, strict=True):
            assert set(mine) == set(theirs)
            for name, value in theirs.items():
                if isinstance(value, float) and name in DIGITS:
                    assert mine[name] == pytest.approx(value, abs=10.0 ** -DIGITS[name]), name
                else:
                    assert mine[name] == value, name
    # Text output says where the figures come from; without a Prometheus, sacct only.
    code, out, _ = run(capsys, "jobstats", job.job_id)
    assert code == 0 and "request 4 GPUs instead of 6" in out
    assert out.rstrip().endswith("source: the summary stored at the job's end (its "
                                 "AdminComment, read with sacct)")  # fmt: skip


def test_the_stored_summary_keeps_the_jobs_faults(
    prom: Prom, slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Job 4343: its GPU n2:3 and its node n2 failed a health check (jobstats_scenario);
    the summary read back reports them as the live report does."""
    url, _, running = prom
    assert epilog.main(["--config", config(slurm, url), "--job-id", running.job_id]) == 0
    (slurm / "comment").write_text(stored_comment(slurm, running.job_id), encoding="utf-8")
    code, out, err = run(capsys, "jobstats", running.job_id, "--prometheus", url, "--json")
    assert code == 0, err
    live = json.loads(out)
    argv = ["jobstats", running.job_id, "--summary", str(slurm / "comment"), "--json"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    report = json.loads(out)
    assert [(f["node"], f["gpu"], f["check"]) for f in live["faults"]] == [
        ("n2", "3", "xid"),
        ("n2", None, "gpu_count"),
    ]
    assert report["faults"] == live["faults"] and report["advice"] == live["advice"]


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
    assert code == 3, err  # holes: EXIT_NO_DATA, as a live report with a shard down
    assert json.loads(out)["missing"] == [
        "shard-3: did not answer when the summary was stored (the job's nodes there are missing)"
    ]


def test_gpus_dropped_to_fit_are_said_to_be(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not "GPU indices unknown (shared GRES...)": the rows were left out when stored."""
    cut = small()
    cut.nodes["n2.example"] = (4, {"cpu_mean": 0.5})
    cut.dropped = 4
    path = tmp_path / "77.txt"
    path.write_text(encode(cut), encoding="utf-8")
    _, out, _ = run(capsys, "jobstats", "77", "--summary", str(path), "--json")
    missing = json.loads(out)["missing"]
    assert missing[0].startswith("n2.example: 4 of 4 GPU indices unknown (GPU rows left out")
    assert not any("shared GRES" in line for line in missing)


def test_a_stored_summary_with_dropped_rows_exits_as_one_with_holes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = small()
    cut.dropped = 5
    path = tmp_path / "77.txt"
    path.write_text(encode(cut), encoding="utf-8")
    code, out, _ = run(capsys, "jobstats", "77", "--summary", str(path))
    assert code == 3 and "n1.example:0" in out


@pytest.mark.parametrize(
    "text", [HOSTILE["a zlib bomb"], HOSTILE["another job"], HOSTILE["deep nesting"], "x" * 70000]
)
def test_jobstats_refuses_a_hostile_summary_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "s.txt"
    path.write_text(text, encoding="utf-8")
    code, out, err = run(capsys, "jobstats", "77", "--summary", str(path))
    assert code == 3 and out == "" and err.count("\n") == 1


def test_jobstats_reads_the_jobs_own_row_of_sacct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """sacct -j of an array's id lists every task: the row whose JobIDRaw is the job counts,
    not the last line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    other = small()
    other.job_id = "78"
    rows = f"76|{PREFIX}junk\n77|{encode(small())}\n78|{encode(other)}\n"
    (tmp_path / "rows").write_text(rows, encoding="utf-8")
    fake(bin_dir, "sacct", f'cat "{tmp_path}/rows"')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    code, out, err = run(capsys, "jobstats", "77", "--json")
    assert code == 0, err
    assert json.loads(out)["job_id"] == "77"
    code, out, err = run(capsys, "jobstats", "79")
    assert code == 3 and "sacct does not list the job" in err


def test_jobstats_bounds_what_it_reads_of_sacct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sacct that never stops is cut off at the bound, not read to the timeout."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake(bin_dir, "sacct", "exec yes 77")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(stored, "SACCT_TIMEOUT_S", 30)
    started = time.monotonic()
    code, out, err = run(capsys, "jobstats", "77")
    assert code == 3 and out == "" and "sacct printed more than" in err and err.count("\n") == 1
    assert time.monotonic() - started < 20


def test_a_failing_sacct_is_one_line_from_the_command(tmp_path: Path) -> None:
    """The bounded runner logs a failed command; the jobstats command says it once."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake(bin_dir, "sacct", 'echo "sacct: error: Problem talking to the database" >&2; exit 1')
    code = "import sys; from gpufleet.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "jobstats", "77", "--prometheus", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
    )
    assert done.returncode == 3 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and "Problem talking to the database" in done.stderr, (
        done.stderr
    )


def test_jobstats_without_summary_or_sacct_names_both(
    prom: Prom, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, job, _ = prom
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake(bin_dir, "sacct", 'echo "$2|"')  # the job has no AdminComment
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    argv = ["jobstats", job.job_id, "--prometheus", url, "--lookback", "1h"]
    code, out, err = run(capsys, *argv)
    assert code == 3 and out == "" and err.count("\n") == 1
    assert "raise --lookback" in err and "sacct holds no gpufleet summary" in err
