"""bench/shard_scale_bench.py: the parts that need no Prometheus (payload synthesis,
the generated node list, the recorded fixture)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "shard_scale_bench", ROOT / "bench" / "shard_scale_bench.py"
)
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench  # dataclasses look their module up
spec.loader.exec_module(bench)

PAYLOAD = """\
# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.
# TYPE node_cpu_seconds_total counter
node_cpu_seconds_total{cpu="0",mode="idle"} 10
node_cpu_seconds_total{cpu="0",mode="user"} 1
node_cpu_seconds_total{cpu="1",mode="idle"} 20
node_cpu_seconds_total{cpu="1",mode="user"} 2
# HELP node_load1 1m load average.
# TYPE node_load1 gauge
node_load1 0.5
# HELP node_gpu_power_draw_watts Power draw.
# TYPE node_gpu_power_draw_watts gauge
node_gpu_power_draw_watts{gpu="0",uuid="GPU-0"} 100
node_gpu_power_draw_watts{gpu="1",uuid="GPU-1"} 200
# HELP node_gpu_devices GPUs seen.
# TYPE node_gpu_devices gauge
node_gpu_devices 2
"""


def samples(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_cpus_are_replicated_from_the_recorded_ones():
    out = bench.replicate_label(PAYLOAD, "cpu", 5)
    lines = samples(out, "node_cpu_seconds_total")
    assert len(lines) == 10
    assert bench.label_values(out, "cpu") == [0, 1, 2, 3, 4]
    # cpu 2 copies cpu 0, cpu 3 copies cpu 1
    assert 'node_cpu_seconds_total{cpu="2",mode="idle"} 10' in lines
    assert 'node_cpu_seconds_total{cpu="3",mode="user"} 2' in lines
    # the rest is untouched, and each family stays in one block after its comments
    assert samples(out, "node_gpu_power_draw_watts") == samples(
        PAYLOAD, "node_gpu_power_draw_watts"
    )
    assert "node_load1 0.5" in out.splitlines()
    lines_all = out.splitlines()
    first = lines_all.index("# TYPE node_cpu_seconds_total counter")
    assert all(
        line.startswith("node_cpu_seconds_total") for line in lines_all[first + 1 : first + 11]
    )


def test_fewer_values_drop_the_rest_and_gpus_replicate_alike():
    assert bench.label_values(bench.replicate_label(PAYLOAD, "cpu", 1), "cpu") == [0]
    out = bench.synthesize_payload(PAYLOAD, cpus=None, gpus=8)
    assert bench.label_values(out, "gpu") == list(range(8))
    assert bench.series_count(out) == 4 + 1 + 8 + 1
    assert bench.synthesize_payload(PAYLOAD, None, None) == PAYLOAD


def test_payload_summary_splits_per_cpu_per_gpu_and_fixed():
    summary = bench.payload_summary(PAYLOAD)
    assert summary == {
        "series": 8,
        "cpus": 2,
        "gpus": 2,
        "fixed": 2,
        "per_cpu_total": 4,
        "per_gpu_total": 2,
        "series_per_cpu": 2,
        "series_per_gpu": 1,
    }


@pytest.mark.parametrize("nodes", [1, 250, 251, 1000])
def test_node_list_puts_every_node_on_its_own_loopback_address(nodes):
    data = yaml.safe_load(bench.node_list(nodes, gpus=8, cpus=64))
    assert data["plugin"] == "gpufleet" and data["monitoring"]["shards"] == 1
    total = 0
    for block, entry in enumerate(data["nodes"], start=1):
        assert entry["address"] == f"127.1.{block}.{{num}}"
        assert entry["gpu"] == {"vendor": "nvidia", "model": "H100", "count": 8}
        assert entry["cpus"] == 64
        first, last = entry["hosts"].split("[")[1].rstrip("]").split("-")
        assert first == "1" and 1 <= int(last) <= 250
        total += int(last)
    assert total == nodes


def test_percentile_and_durations():
    assert bench.percentile([float(v) for v in range(1, 101)], 0.99) == 99.0
    assert bench.percentile([3.0], 0.5) == 3.0
    assert bench.parse_duration("15s") == 15 and bench.parse_duration("1m30s") == 90
    with pytest.raises(ValueError):
        bench.parse_duration("15x")


def test_the_recorded_payload_matches_its_sidecar():
    payloads = ROOT / "bench" / "payloads"
    sidecar = json.loads((payloads / "gpu-node-h100x8.json").read_text())
    text = bench.read_payload(payloads / "gpu-node-h100x8.prom")
    summary = bench.payload_summary(text)
    assert {k: sidecar[k] for k in summary} == summary
    assert summary["gpus"] == 8
