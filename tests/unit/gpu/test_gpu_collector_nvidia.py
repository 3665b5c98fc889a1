"""The collector end to end against the fake nvidia-smi and the real captures."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from gpu_helpers import (
    ALL_CAPTURES,
    COLLECTOR_ZIPAPP,
    FAKE_SMI,
    H100_MIG,
    H200,
    L40S,
    RTX2080,
    RTX4080,
    gc,
    names_of,
    stateless_argv,
    values_of,
)

MIB = 1048576
SIX = (
    "node_gpu_memory_total_bytes",
    "node_gpu_memory_used_bytes",
    "node_gpu_utilization_percent",
    "node_gpu_temperature_celsius",
    "node_gpu_power_draw_watts",
    "node_gpu_power_limit_watts",
)
PROMTOOL = shutil.which("promtool") or (
    "/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None
)


def promtool_check(text: str) -> None:
    if PROMTOOL is None:
        pytest.skip("promtool not installed")
    result = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


def one(text: str, name: str, **labels: str) -> float:
    values = values_of(text, name, **labels)
    assert len(values) == 1, (name, labels, values)
    return values[0]


@pytest.mark.parametrize("state", ["idle", "load"])
@pytest.mark.parametrize("capture", ALL_CAPTURES, ids=lambda p: p.name.split("__")[1])
def test_every_capture_parses_and_passes_promtool(capture, state, fake_smi, run_collector):
    fake_smi.set(capture=capture, state=state)
    text = run_collector()
    assert one(text, "node_gpu_collector_success") == 1
    assert one(text, "node_gpu_devices") == 1
    mig = "mig" in capture.name
    for name in SIX:
        if mig and name == "node_gpu_utilization_percent":
            continue  # nvidia-smi prints [N/A] with MIG on
        assert one(text, name, gpu="0", vendor="nvidia") >= 0, name
    promtool_check(text)


def test_h100_idle_exact_values(fake_smi, run_collector):
    text = run_collector()
    gpu = {"gpu": "0", "uuid": "GPU-00000000-0000-0000-0000-000000000000", "vendor": "nvidia"}
    expected = {
        "node_gpu_memory_total_bytes": 81559 * MIB,
        "node_gpu_memory_used_bytes": 0,
        "node_gpu_memory_reserved_bytes": 479 * MIB,
        "node_gpu_utilization_percent": 0,
        "node_gpu_temperature_celsius": 41,
        "node_gpu_memory_temperature_celsius": 48,
        "node_gpu_temperature_tlimit_margin_celsius": 46,
        "node_gpu_power_draw_watts": 69.85,
        "node_gpu_power_limit_watts": 700,
        "node_gpu_sm_clock_hertz": 345e6,
        "node_gpu_sm_clock_max_hertz": 1980e6,
        "node_gpu_memory_clock_hertz": 2619e6,
        "node_gpu_pcie_link_generation": 5,
        "node_gpu_pcie_link_width_max_lanes": 16,
        "node_gpu_performance_state": 0,
        "node_gpu_ecc_mode_enabled": 1,
        "node_gpu_remapped_rows_pending": 0,
        "node_gpu_recovery_action": 0,
        "node_gpu_mig_mode_enabled": 0,
        "node_gpu_compute_processes": 0,
    }
    assert {name: one(text, name, **gpu) for name in expected} == expected
    assert one(text, "node_gpu_clock_event_reason_active", reason="gpu_idle") == 1
    assert one(text, "node_gpu_clock_event_reason_active", reason="sw_power_cap") == 0
    assert one(text, "node_gpu_ecc_uncorrected_errors_total", scope="aggregate") == 0
    assert one(text, "node_gpu_remapped_rows", cause="uncorrectable") == 0
    info = 'node_gpu_info{gpu="0",uuid="GPU-00000000-0000-0000-0000-000000000000",vendor="nvidia",'
    assert (
        info + 'driver_version="590.48.01",model="NVIDIA H100 80GB HBM3",'
        'pci_bus_id="00000000:00:09.0",vbios_version="96.00.A5.00.01"} 1\n'
    ) in text
    # [N/A] on the H100: fan (passive), retired pages (Hopper remaps rows instead)
    names = names_of(text)
    assert "node_gpu_fan_speed_ratio" not in names
    assert "node_gpu_retired_pages" not in names
    assert "node_gpu_retired_pages_pending" not in names


def test_h100_load_exact_values(fake_smi, run_collector):
    fake_smi.set(state="load")
    text = run_collector()
    assert one(text, "node_gpu_memory_used_bytes") == 19818 * MIB
    assert one(text, "node_gpu_utilization_percent") == 100
    assert one(text, "node_gpu_memory_utilization_ratio") == pytest.approx(0.11)
    assert one(text, "node_gpu_power_draw_watts") == 631.95
    assert one(text, "node_gpu_temperature_celsius") == 59
    assert one(text, "node_gpu_sm_clock_hertz") == 1980e6
    assert one(text, "node_gpu_compute_processes") == 3
    assert one(text, "node_gpu_compute_processes_used_memory_bytes") == (2566 + 1542 + 15690) * MIB


def test_h200_device_machine_capture_idle_and_load(fake_smi, run_collector):
    """gpufleet's own H200 capture (driver 580.159.04, one torch bf16 matmul process):
    every field read, and the load visible in utilization, power, clocks and events."""
    fake_smi.set(capture=H200, state="idle")
    idle = run_collector("--expected-gpus", "1")
    fake_smi.set(state="load")
    load = run_collector("--expected-gpus", "1")
    for text in (idle, load):
        assert one(text, "node_gpu_collector_success") == 1
        assert one(text, "node_gpu_devices") == 1
        assert one(text, "node_gpu_unreadable_fields") == 0
        assert one(text, "node_gpu_memory_total_bytes") == 143771 * MIB
        assert one(text, "node_gpu_memory_reserved_bytes") == 616 * MIB
        assert one(text, "node_gpu_power_limit_watts") == 700
        assert one(text, "node_gpu_ecc_mode_enabled") == 1
        assert "node_gpu_fan_speed_ratio" not in names_of(text)  # [N/A]: passive cooling
        assert "node_gpu_retired_pages" not in names_of(text)  # [N/A]: Hopper remaps rows
    assert 'model="NVIDIA H200"' in idle and 'driver_version="580.159.04"' in idle
    assert one(idle, "node_gpu_utilization_percent") == 0
    assert one(load, "node_gpu_utilization_percent") == 100
    assert one(load, "node_gpu_utilization_percent") > 50
    assert one(idle, "node_gpu_memory_used_bytes") == 0
    assert one(load, "node_gpu_memory_used_bytes") == 11341 * MIB
    assert one(load, "node_gpu_memory_utilization_ratio") == pytest.approx(0.25)
    assert one(idle, "node_gpu_power_draw_watts") == 75.94
    assert one(load, "node_gpu_power_draw_watts") == 692.59
    assert one(load, "node_gpu_power_draw_watts") > one(idle, "node_gpu_power_draw_watts")
    assert one(idle, "node_gpu_temperature_celsius") == 34
    assert one(load, "node_gpu_temperature_celsius") == 57
    assert one(load, "node_gpu_memory_temperature_celsius") == 51
    assert one(load, "node_gpu_temperature_tlimit_margin_celsius") == 27
    assert one(idle, "node_gpu_sm_clock_hertz") == 345e6
    assert one(load, "node_gpu_sm_clock_hertz") == 1455e6  # held under 1980 by the power cap
    assert one(idle, "node_gpu_clock_event_reason_active", reason="gpu_idle") == 1
    assert one(load, "node_gpu_clock_event_reason_active", reason="gpu_idle") == 0
    assert one(load, "node_gpu_clock_event_reason_active", reason="sw_power_cap") == 1
    seconds = one(load, "node_gpu_clock_event_reason_seconds_total", reason="sw_power_cap")
    assert seconds == pytest.approx(16.708383)
    # supported mask 0x1FF: the display_clocks_setting bit is reported too
    assert one(idle, "node_gpu_clock_event_reason_active", reason="display_clocks_setting") == 0
    assert one(idle, "node_gpu_compute_processes") == 0
    assert one(load, "node_gpu_compute_processes") == 1
    assert one(load, "node_gpu_compute_processes_used_memory_bytes") == 11332 * MIB


def test_consumer_cards_fan_zero_is_present_and_ecc_absent(fake_smi, run_collector):
    fake_smi.set(capture=RTX4080)
    text = run_collector()
    assert one(text, "node_gpu_fan_speed_ratio") == 0  # "0 %" is a value, not absent
    assert one(text, "node_gpu_performance_state") == 8
    names = names_of(text)
    for absent in (
        "node_gpu_ecc_mode_enabled",
        "node_gpu_ecc_corrected_errors_total",
        "node_gpu_remapped_rows",
        "node_gpu_mig_mode_enabled",
        "node_gpu_memory_temperature_celsius",  # bare N/A
        "node_gpu_temperature_tlimit_margin_celsius",
    ):
        assert absent not in names, absent


def test_rtx2080_throttle_bitmask_and_counters(fake_smi, run_collector):
    fake_smi.set(capture=RTX2080)
    text = run_collector()
    assert one(text, "node_gpu_clock_event_reason_active", reason="sw_power_cap") == 1
    assert one(text, "node_gpu_clock_event_reason_active", reason="gpu_idle") == 0
    seconds = one(text, "node_gpu_clock_event_reason_seconds_total", reason="sw_power_cap")
    assert seconds == pytest.approx(212.553937)
    assert one(text, "node_gpu_fan_speed_ratio") == pytest.approx(0.38)
    assert one(text, "node_gpu_memory_total_bytes") == 8192 * MIB


def test_l40s_memory_temperature_bare_na_is_absent(fake_smi, run_collector):
    fake_smi.set(capture=L40S, state="load")
    text = run_collector()
    assert "node_gpu_memory_temperature_celsius" not in names_of(text)
    assert one(text, "node_gpu_power_draw_watts") == 110.23
    assert one(text, "node_gpu_power_limit_watts") == 350
    assert one(text, "node_gpu_encoder_utilization_ratio") == pytest.approx(0.6)


def test_mig_capture(fake_smi, run_collector):
    fake_smi.set(capture=H100_MIG, state="load")
    text = run_collector()
    names = names_of(text)
    assert one(text, "node_gpu_mig_mode_enabled") == 1
    assert one(text, "node_gpu_mig_mode_pending_enabled") == 1
    for absent in (
        "node_gpu_utilization_percent",
        "node_gpu_memory_utilization_ratio",
        "node_gpu_remapped_rows",
        "node_gpu_remapped_rows_pending",
    ):
        assert absent not in names, absent
    assert one(text, "node_gpu_memory_used_bytes") == 11125 * MIB
    # compute apps carry the parent GPU's UUID under MIG
    assert one(text, "node_gpu_compute_processes", gpu="0") == 3
    assert one(text, "node_gpu_compute_processes_used_memory_bytes") == (2296 + 1272 + 7484) * MIB


def test_eight_gpu_node_with_exactly_two_calls(fake_smi, run_collector):
    fake_smi.set(state="load", gpus=8)
    text = run_collector("--expected-gpus", "8")
    assert one(text, "node_gpu_devices") == 8
    assert one(text, "node_gpu_expected_devices") == 8
    for index in range(8):
        assert one(text, "node_gpu_power_draw_watts", gpu=str(index)) == 631.95
        assert one(text, "node_gpu_compute_processes", gpu=str(index)) == 3
    info = [line for line in text.splitlines() if line.startswith("node_gpu_info{")]
    assert len(info) == 8
    assert len({line.split('uuid="')[1].split('"')[0] for line in info}) == 8
    assert len({line.split('pci_bus_id="')[1].split('"')[0] for line in info}) == 8
    calls = fake_smi.calls()
    assert len(calls) == 2
    assert calls[0][0].startswith("--query-gpu=") and calls[0][1] == "--format=csv,nounits"
    assert calls[1][0].startswith("--query-compute-apps=")
    promtool_check(text)


def _fake_smi_processes(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if str(FAKE_SMI).encode() in cmdline and marker.encode() in environ:
            pids.append(int(entry))
    return pids


def test_hang_is_killed_and_gpu_series_disappear(fake_smi, run_collector, tmp_path):
    first = run_collector()
    last_success = one(first, "node_gpu_collector_last_success_timestamp_seconds")
    fake_smi.set(mode="hang")
    start = time.monotonic()
    text = run_collector("--timeout", "1", expect_success=False)
    assert time.monotonic() - start < 6
    assert one(text, "node_gpu_collector_success") == 0
    assert one(text, "node_gpu_collector_error_info", reason="timeout") == 1
    assert one(text, "node_gpu_collector_last_success_timestamp_seconds") == last_success
    # killing and reaping the hung tool is part of the 1 s budget
    assert 0.5 <= one(text, "node_gpu_collector_duration_seconds") <= 1.5
    assert not any(name in names_of(text) for name in SIX)
    assert "node_gpu_info" not in names_of(text)
    assert "node_gpu_compute_processes" not in names_of(text)
    assert _fake_smi_processes(str(tmp_path)) == []  # the whole process group was killed
    calls = [c[0].split("=")[0] for c in fake_smi.calls()]
    # first cycle: query-gpu + compute-apps; hung cycle: query-gpu only, no compute-apps
    assert calls == ["--query-gpu", "--query-compute-apps", "--query-gpu"]
    promtool_check(text)


@pytest.mark.parametrize(("mode", "reason"), [("crash", "exit_code"), ("garbage", "parse_error")])
def test_crash_and_garbage(mode, reason, fake_smi, run_collector):
    run_collector()
    fake_smi.set(mode=mode)
    text = run_collector(expect_success=False)
    assert one(text, "node_gpu_collector_success") == 0
    assert one(text, "node_gpu_collector_error_info", reason=reason) == 1
    assert not any(name in names_of(text) for name in SIX)
    promtool_check(text)


def test_missing_binary(run_collector, tmp_path):
    text = run_collector("--nvidia-smi", str(tmp_path / "nope"), expect_success=False)
    assert one(text, "node_gpu_collector_error_info", reason="not_found") == 1
    assert "node_gpu_collector_last_success_timestamp_seconds" not in names_of(text)


def test_no_devices_is_zero_gpus_not_a_failure(run_collector, tmp_path):
    script = tmp_path / "nodev-smi"
    script.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    script.chmod(0o755)
    text = run_collector("--nvidia-smi", str(script), "--expected-gpus", "8")
    assert one(text, "node_gpu_devices") == 0
    assert one(text, "node_gpu_expected_devices") == 8


def test_unknown_field_is_retried_once_and_remembered(fake_smi, run_collector):
    fake_smi.set(unknown_fields="gpu_recovery_action")
    text = run_collector()
    assert "node_gpu_recovery_action" not in names_of(text)
    assert one(text, "node_gpu_power_draw_watts") == 69.85
    calls = fake_smi.calls()
    assert [c[0].split("=")[0] for c in calls] == [
        "--query-gpu",
        "--query-gpu",
        "--query-compute-apps",
    ]
    assert "gpu_recovery_action" in calls[0][0]
    assert "gpu_recovery_action" not in calls[1][0]
    # the next run (a new process under the timer) makes one query-gpu call
    run_collector()
    assert len(fake_smi.calls()) == 5
    assert "gpu_recovery_action" not in fake_smi.calls()[3][0]


def test_old_driver_throttle_names(fake_smi, run_collector):
    fake_smi.set(unknown_fields="clocks_event_reasons.supported,clocks_event_reasons.active")
    text = run_collector()
    assert one(text, "node_gpu_clock_event_reason_active", reason="gpu_idle") == 1
    retry = fake_smi.calls()[1][0]
    assert "clocks_throttle_reasons.active" in retry
    assert "clocks_event_reasons.active" not in retry


def test_two_unknown_fields_converge_over_cycles(fake_smi, run_collector):
    fake_smi.set(unknown_fields="gpu_recovery_action,temperature.gpu.tlimit")
    text = run_collector(expect_success=False)
    assert one(text, "node_gpu_collector_error_info", reason="invalid_field") == 1
    text = run_collector()
    assert one(text, "node_gpu_collector_success") == 1
    assert one(text, "node_gpu_temperature_celsius") == 41


def test_field_memory_resets_when_the_binary_changes(tmp_path):
    path = str(tmp_path / "fields.json")
    memory = gc.FieldMemory(path, "nvidia-smi:1:1")
    assert memory.forget("gpu_recovery_action")
    assert not memory.forget("not_a_field_we_asked_for")
    assert "gpu_recovery_action" not in gc.FieldMemory(path, "nvidia-smi:1:1").fields()
    assert "gpu_recovery_action" in gc.FieldMemory(path, "nvidia-smi:2:2").fields()


def test_atomic_write(tmp_path, monkeypatch):
    target = tmp_path / "gpufleet_gpu.prom"
    gc.write_textfile(target, "old 1\n", durable=False)
    assert target.read_text() == "old 1\n"
    assert oct(target.stat().st_mode & 0o777) == "0o644"

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(gc.os, "replace", broken_replace)
    with pytest.raises(OSError):
        gc.write_textfile(target, "new 1\n", durable=False)
    assert target.read_text() == "old 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpufleet_gpu.prom"]


def test_output_name_must_be_a_prom_file():
    with pytest.raises(SystemExit):
        gc.parse_args(["--output-name", "x.txt"])


def test_cli_once_as_a_subprocess(fake_smi, tmp_path):
    out = tmp_path / "tf"
    out.mkdir()
    argv = ["python3", str(COLLECTOR_ZIPAPP), "--once", *stateless_argv(fake_smi.bin, out)]
    result = subprocess.run(
        [*argv, "--output-name", "gpu.prom"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "node_gpu_power_draw_watts" in (out / "gpu.prom").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["gpu.prom"]


def test_loop_mode_runs_cycles_until_sigterm(fake_smi, tmp_path):
    out = tmp_path / "tf"
    out.mkdir()
    argv = [
        "python3",
        str(COLLECTOR_ZIPAPP),
        *stateless_argv(fake_smi.bin, out),
        "--interval",
        "0.2",
    ]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while len(fake_smi.calls()) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(fake_smi.calls()) >= 4
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_loop_looks_the_tool_up_once_and_again_when_it_fails_to_run(
    fake_smi, tmp_path, monkeypatch
):
    """A long-running loop does not search PATH every cycle, but a tool that moved
    (not_found) is searched for again at the next cycle."""
    monkeypatch.setenv("PATH", f"{fake_smi.bin.parent}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "tf"
    out.mkdir()
    args = gc.parse_args(["--textfile-dir", str(out), "--state-dir", "", "--vendor", "nvidia"])
    collector = gc.Collector(args)
    lookups: list[str] = []
    which = shutil.which
    monkeypatch.setattr(gc.shutil, "which", lambda name: lookups.append(name) or which(name))
    assert collector.cycle() and collector.cycle()
    assert lookups.count("nvidia-smi") == 1
    moved = fake_smi.bin.with_name("moved")
    fake_smi.bin.rename(moved)
    assert not collector.cycle()
    assert values_of((out / "gpufleet_gpu.prom").read_text(), "node_gpu_collector_error_info")
    moved.rename(fake_smi.bin)
    assert collector.cycle()
    assert lookups.count("nvidia-smi") == 2
