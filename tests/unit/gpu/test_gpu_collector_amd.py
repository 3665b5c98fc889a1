"""AMD: rocm-smi and amd-smi JSON into the same node_gpu_ family."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from gpu_helpers import DATA, gc, values_of

MIB = 1048576


def _load(name: str):
    return json.loads((DATA / name).read_text())


def _values(gpu):
    return {(n, extra): v for n, extra, v in gpu.values}


def test_rocm_smi_mi100():
    card0, card1 = gc.parse_rocm_smi(_load("rocm-smi-mi100.json"))
    values = _values(card0)
    assert (card0.gpu, card0.vendor, card0.uuid) == ("0", "amd", "0x79ccd55167a2124a")
    assert card0.info == {
        "model": "Arcturus GL-XL [Instinct MI100]",
        "pci_bus_id": "0000:83:00.0",
        "driver_version": "6.3.6",
        "vbios_version": "113-D3431401-101",
    }
    assert values[("memory_total_bytes", ())] == 34342961152
    assert values[("memory_used_bytes", ())] == 6750208
    assert values[("temperature_celsius", ())] == 53
    assert values[("hotspot_temperature_celsius", ())] == 55
    assert values[("memory_temperature_celsius", ())] == 53
    assert values[("power_draw_watts", ())] == 36
    assert values[("power_limit_watts", ())] == 290
    assert values[("utilization_percent", ())] == 0
    assert values[("sm_clock_hertz", ())] == 300e6
    assert values[("memory_clock_hertz", ())] == 1200e6
    values1 = _values(card1)
    assert card1.uuid == ""
    assert values1[("temperature_celsius", ())] == 71  # edge N/A -> junction
    assert ("memory_temperature_celsius", ()) not in values1


@pytest.mark.parametrize("wrap", [True, False], ids=["gpu_data", "bare-list"])
def test_amd_smi_both_top_levels(wrap):
    metric = _load("amd-smi-metric.json")
    if not wrap:
        metric = metric["gpu_data"]
    gpu0, gpu1 = gc.parse_amd_smi(metric, _load("amd-smi-static.json"))
    values = _values(gpu0)
    assert gpu0.info["model"] == "AMD Instinct MI300X"
    assert gpu0.info["pci_bus_id"] == "0000:0c:00.0"
    assert values[("utilization_percent", ())] == 87
    assert values[("memory_utilization_ratio", ())] == pytest.approx(0.23)
    assert values[("power_draw_watts", ())] == 512
    assert values[("power_limit_watts", ())] == 700
    assert values[("temperature_celsius", ())] == 64  # edge N/A on MI300 -> hotspot
    assert values[("memory_total_bytes", ())] == 196592 * MIB
    assert values[("sm_clock_hertz", ())] == 2100e6
    assert values[("temperature_slowdown_threshold_celsius", (("sensor", "hotspot"),))] == 100
    assert values[("temperature_shutdown_threshold_celsius", (("sensor", "memory"),))] == 115
    assert (("temperature_slowdown_threshold_celsius", (("sensor", "edge"),))) not in values
    values1 = _values(gpu1)
    assert ("power_draw_watts", ()) not in values1
    assert values1[("power_limit_watts", ())] == 750


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_amd_end_to_end_with_promtool(run_collector, tmp_path):
    amd = _script(
        tmp_path / "amd-smi",
        f'case "$1" in metric) cat "{DATA}/amd-smi-metric.json";; '
        f'static) cat "{DATA}/amd-smi-static.json";; *) exit 2;; esac\n',
    )
    text = run_collector("--vendor", "amd", "--amd-smi", str(amd), "--expected-gpus", "2")
    assert values_of(text, "node_gpu_devices") == [2]
    assert values_of(text, "node_gpu_power_draw_watts", gpu="0", vendor="amd") == [512]
    assert "node_gpu_compute_processes" not in text
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(promtool).exists():
        pytest.skip("promtool not installed")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_rocm_smi_with_warning_line(run_collector, tmp_path):
    rocm = _script(
        tmp_path / "rocm-smi",
        'echo "WARNING: AMD GPU device(s) is/are in a low-power state."\n'
        f'cat "{DATA}/rocm-smi-mi100.json"\n',
    )
    text = run_collector("--vendor", "amd", "--rocm-smi", str(rocm), "--amd-smi", "")
    assert values_of(text, "node_gpu_memory_total_bytes", gpu="1", vendor="amd") == [34342961152]
