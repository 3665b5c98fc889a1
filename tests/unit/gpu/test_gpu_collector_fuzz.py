"""Bounded, seeded fuzzing of the parsers with mutations of the real captures.

Every mutated input must parse or fail with a CollectorError whose reason is a
known label value, never another exception, and quickly. The seed is fixed, so a
failure reproduces; FUZZ_ITERATIONS can be raised locally for a longer run.
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
import time
from pathlib import Path

import pytest
from gpu_helpers import ALL_CAPTURES, FAKE_SMI, gc

SEED = 20261125
ITERATIONS = int(os.environ.get("FUZZ_ITERATIONS", "300"))
SECONDS_PER_INPUT = 1.0
REASONS = set(gc.ERROR_REASONS) | {"too_many_processes"}
TOKENS = [
    '"',
    ",",
    ", ",
    "\n",
    "\r",
    "\x00",
    "\u2028",
    "[N/A]",
    "N/A",
    "ERR!",
    "[Unknown Error]",
    "[GPU is lost]",
    "nan",
    "-inf",
    "1e999",
    "0x",
    "0xFFFFFFFFFFFFFFFFFFFF",
    "-1",
    "٣",
    "²",
    "P99",
    "Enabled",
    "\\",
    "}",
    "{",
    "index",
    "job_1",
    "/slurm/uid_1/",
]


def _load_fake():
    spec = importlib.util.spec_from_file_location("fake_nvidia_smi_for_fuzz", FAKE_SMI)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _corpus() -> list[str]:
    """Per capture and state: the full captured CSV sections and the collector's query."""
    fake = _load_fake()
    query = "--query-gpu=" + ",".join(gc.all_query_fields())
    texts = []
    for capture in ALL_CAPTURES:
        for state in ("idle", "load"):
            secs = fake.sections(capture.read_text(encoding="utf-8"))
            for prefix in (f"{state} :: query-gpu", f"{state} :: query-compute-apps"):
                texts.append("\n".join(fake.find_section(secs, prefix)) + "\n")
            for gpus in ("1", "4"):
                config = {"CAPTURE": str(capture), "STATE": state, "GPUS": gpus}
                texts.append(fake.answer([query, "--format=csv,nounits"], config)[1])
                apps = "--query-compute-apps=" + ",".join(gc.COMPUTE_APPS_FIELDS)
                texts.append(fake.answer([apps, "--format=csv,nounits"], config)[1])
    return texts


def mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 3)):
        lines = text.split("\n")
        op = rng.choices(range(8), weights=(6, 3, 4, 2, 2, 1, 1, 1))[0]
        pos = rng.randrange(len(text) + 1)
        if op == 0:  # insert a token
            text = text[:pos] + rng.choice(TOKENS) + text[pos:]
        elif op == 1:  # delete a span
            text = text[:pos] + text[pos + rng.randint(1, 40) :]
        elif op == 2:  # one random code point
            text = text[:pos] + chr(rng.randrange(1, 0x3000)) + text[pos + 1 :]
        elif op == 3:  # duplicate a line
            line = rng.randrange(len(lines))
            lines.insert(line, lines[line])
            text = "\n".join(lines)
        elif op == 4:  # swap two lines
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
        elif op == 5:  # truncate
            text = text[:pos]
        elif op == 6:  # a long run (fields over the bounds)
            text = text[:pos] + rng.choice('x,"9 ') * rng.choice((100, 2000, 140_000)) + text[pos:]
        else:  # repeat the body (more rows)
            text = text + "\n".join(lines[1:]) * rng.randint(1, 30)
    return text


def _check(call, *args) -> object:
    try:
        return call(*args)
    except gc.CollectorError as exc:
        assert exc.reason in REASONS, exc.reason
        return None


def test_fuzz_csv_parsers_with_mutated_captures():
    rng = random.Random(SEED)
    corpus = _corpus()
    worst = 0.0
    for _ in range(ITERATIONS):
        # the collector never parses more than it reads from nvidia-smi
        text = mutate(rng, rng.choice(corpus))[: gc.NVIDIA_MAX_BYTES]
        start = time.monotonic()
        gpus = _check(gc.parse_nvidia_gpus, text)
        if gpus is not None:
            assert len(gpus) <= gc.MAX_GPUS
            assert len({g.gpu for g in gpus}) == len(gpus)
            gc.render_metrics(gc.to_samples(gpus))
        apps = _check(gc.parse_compute_apps, text)
        if apps is not None:
            assert len(apps) <= gc.MAX_COMPUTE_APPS
        worst = max(worst, time.monotonic() - start)
    assert worst < SECONDS_PER_INPUT, worst


def test_fuzz_cgroup_parser():
    rng = random.Random(SEED + 1)
    seeds = [
        "6:freezer:/slurm_gpu01/uid_1000/job_3/step_batch\n0::/\n",
        "4:memory:/slurm/uid_1000/job_12345/step_0/task_0\n",
        "0::/system.slice/slurmstepd.scope/job_840392/step_0/user/task_0\n",
        "0::/system.slice/n1_slurmstepd.scope/sEKNKTV3WPV500/step_extern/user\n",
    ]
    for _ in range(ITERATIONS):
        text = mutate(rng, rng.choice(seeds))
        start = time.monotonic()
        job = gc.parse_slurm_cgroup(text)
        assert time.monotonic() - start < SECONDS_PER_INPUT
        if job is not None:
            assert job.job_id == "" or 0 < int(job.job_id) <= gc.MAX_JOB_ID
            assert job.job_id or gc.SLUID_RE.fullmatch(job.sluid)


@pytest.mark.parametrize("seed", range(3))
def test_fuzz_environ_parser(seed):
    rng = random.Random(SEED + 10 + seed)
    for _ in range(ITERATIONS):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        data += b"SLURM_JOB_ID=" + bytes(rng.choice(b"0123456789\0x") for _ in range(12))
        job_id = gc.environ_job_id(data)
        assert job_id == "" or 0 < int(job_id) <= gc.MAX_JOB_ID


@pytest.mark.parametrize(
    "text",
    [
        "gpu_uuid, pid, used_memory [MiB" + " " * 100_000 + "\n",  # was quadratic
        "index, name [" + "[" * 60_000 + "\n",
    ],
)
def test_long_headers_are_linear(text):
    start = time.monotonic()
    with pytest.raises(gc.CollectorError):
        gc.parse_nvidia_gpus(text)
    assert time.monotonic() - start < 0.5


def test_long_numbers_in_amd_json_are_linear():
    start = time.monotonic()
    doc = {"card0": {"GPU use (%)": "1" * 1_000_000 + "x", "sclk clock speed:": "9" * 1_000_000}}
    (gpu,) = gc.parse_rocm_smi(doc)
    assert gpu.values == []
    assert time.monotonic() - start < 0.5


def test_every_error_reason_is_documented():
    """The reasons a failed cycle can give are the ones docs/gpu-collector.md explains."""
    docs = Path(__file__).resolve().parents[3] / "docs" / "gpu-collector.md"
    table = docs.read_text(encoding="utf-8").split("| reason | when |", 1)[1].split("\n\n")[0]
    documented = set(
        re.findall(r"`([a-z_]+)`", "".join(row.split("|")[1] for row in table.splitlines()[2:]))
    )
    assert documented == set(gc.ERROR_REASONS)
