"""The CSV header is found by its exact expected content (issue 26, finding 7).

nvidia-smi may print messages before its CSV (an infoROM warning, a driver notice);
the header is the line holding exactly the fields asked for, whatever comes before
it. Lines before it are counted in node_gpu_collector_skipped_lines.
"""

from __future__ import annotations

import random

import pytest
from gpu_helpers import gc, values_of
from test_gpu_collector_hardening import one, real_csv, scripted_smi

SEED = 20261127
INFOROM = "WARNING: infoROM is corrupted at gpu 0000:18:00.0"
STRAY = [
    INFOROM,
    "index",  # a lone word: header grammar, not the expected header
    "index, uuid",  # a header of other fields
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver, maybe",
    "0, GPU-deadbeef, 1.0",  # a row-shaped line before the header
    '"unterminated, quote',
    "Failed to initialize NVML: Unknown Error",
    "x" * 70_000,  # over the line bound
]


def fields() -> list[str]:
    return gc.all_query_fields()


@pytest.mark.parametrize("stray", STRAY, ids=range(len(STRAY)))
def test_stray_line_before_the_header_keeps_the_gpus(stray, fake_smi, run_collector, tmp_path):
    good = real_csv(fake_smi, gpus=4)
    script = scripted_smi(tmp_path, stray + "\n" + good)
    text = run_collector("--nvidia-smi", str(script), "--expected-gpus", "4")
    assert one(text, "node_gpu_collector_success") == 1
    assert one(text, "node_gpu_devices") == 4
    assert one(text, "node_gpu_collector_skipped_lines") == 1


def test_stray_lines_before_compute_apps_header(fake_smi, run_collector, tmp_path):
    good = real_csv(fake_smi, gpus=1)
    uuid = gc.parse_nvidia_gpus(good)[0].uuid
    apps = f"{INFOROM}\ngpu_uuid, pid, used_gpu_memory [MiB]\n{uuid}, 4242, 100\n"
    text = run_collector("--nvidia-smi", str(scripted_smi(tmp_path, good, apps)))
    assert one(text, "node_gpu_collector_compute_apps_success") == 1
    assert one(text, "node_gpu_compute_processes", gpu="0") == 1


def test_no_expected_header_is_a_parse_error():
    with pytest.raises(gc.CollectorError) as info:
        gc.parse_nvidia_gpus("index, uuid\n0, GPU-1\n", fields())
    assert info.value.reason == "parse_error"


def test_header_aliases_and_units_compare_equal():
    assert gc.find_header(["gpu_uuid, pid, used_gpu_memory [MiB]"], gc.COMPUTE_APPS_FIELDS) == 0
    old = ["index", "clocks_throttle_reasons.active"]
    assert gc.find_header(["x", "index, clocks_event_reasons.active"], old) == 1


def test_stray_lines_property(fake_smi):
    """Any mix of stray lines before the header: the same GPUs, every stray line counted."""
    good = real_csv(fake_smi, gpus=2)
    want = gc.parse_nvidia_gpus(good, fields())
    header, body = good.split("\n", 1)
    rng = random.Random(SEED)
    alphabet = "abcXYZ019 ,.:[]_-\"'\t"
    for _ in range(300):
        stray = [
            rng.choice([*STRAY[:-1], "".join(rng.choices(alphabet, k=rng.randrange(1, 60)))])
            for _ in range(rng.randrange(1, 6))
        ]
        stray = [line for line in stray if line.strip() and line.strip() != header.strip()]
        gpus, notes = gc.nvidia_gpus_and_notes("\n".join([*stray, header, body]), fields())
        assert gpus == want
        assert notes[0].name == "collector_skipped_lines" and notes[0].value == len(stray)


def test_no_devices_found_is_zero_gpus(fake_smi, run_collector, tmp_path):
    script = scripted_smi(tmp_path, "No devices were found\n", rc=6)
    text = run_collector("--nvidia-smi", str(script))
    assert values_of(text, "node_gpu_devices") == [0]
