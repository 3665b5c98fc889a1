"""Pure parsing functions of the GPU collector."""

from __future__ import annotations

import pytest
from gpu_helpers import gc

MIB = 1048576


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("69.85 W", 69.85),
        ("69.85", 69.85),
        ("81559 MiB", 81559.0),
        ("0 %", 0.0),
        ("212553937 us", 212553937.0),
        ("0x0000000000000004", 4.0),
        ("0x00000000000001FF", 511.0),
        ("-8", -8.0),
        ("(1200Mhz)", 1200.0),
    ],
)
def test_parse_number_values(raw, expected):
    assert gc.parse_number(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "[N/A]",
        "N/A",
        "",
        "  ",
        "[Not Supported]",
        "[Unknown Error]",
        "[Insufficient Permissions]",
        "[Requested functionality has been deprecated]",
        "[Function Not Found]",
        "[GPU is lost]",
        "P0",
        "Enabled",
        "1.2.3",
        None,
    ],
)
def test_sentinels_and_non_numbers_are_absent(raw):
    assert gc.parse_number(raw) is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Enabled", 1.0),
        ("Disabled", 0.0),
        ("Active", 1.0),
        ("Not Active", 0.0),
        ("Yes", 1.0),
        ("No", 0.0),
        ("[N/A]", None),
        ("Default", None),
    ],
)
def test_parse_bool(raw, expected):
    assert gc.parse_bool(raw) == expected


def test_pstate_and_recovery_action():
    assert gc.parse_pstate("P0") == 0.0
    assert gc.parse_pstate("P8") == 8.0
    assert gc.parse_pstate("[N/A]") is None
    assert gc.parse_recovery_action("None") == 0.0
    assert gc.parse_recovery_action("GPU Reset") == 1.0
    assert gc.parse_recovery_action("Drain and Reset") == 4.0
    assert gc.parse_recovery_action("[N/A]") is None
    assert gc.parse_recovery_action("Something New") is None


WITH_UNITS = (
    "index, uuid, pci.bus_id, memory.total [MiB], power.draw [W], clocks.current.sm [MHz], "
    "clocks_throttle_reasons.active, fan.speed [%], temperature.memory\n"
    "0, GPU-a, 00000000:3B:00.0, 81559 MiB, 69.85 W, 345 MHz, 0x0000000000000004, 38 %, N/A\n"
)
NO_UNITS = (
    "index, uuid, pci.bus_id, memory.total, power.draw, clocks.current.sm, "
    "clocks_event_reasons.active, fan.speed, temperature.memory\n"
    "0, GPU-a, 00000000:3B:00.0, 81559, 69.85, 345, 0x0000000000000004, 38, [N/A]\n"
)


@pytest.mark.parametrize("text", [WITH_UNITS, NO_UNITS], ids=["units", "nounits"])
def test_both_header_styles_give_the_same_values(text):
    (gpu,) = gc.parse_nvidia_gpus(text)
    values = {(n, extra): v for n, extra, v in gpu.values}
    assert gpu.gpu == "0"
    assert gpu.uuid == "GPU-a"
    assert values[("memory_total_bytes", ())] == 81559 * MIB
    assert values[("power_draw_watts", ())] == 69.85
    assert values[("sm_clock_hertz", ())] == 345e6
    assert values[("fan_speed_ratio", ())] == pytest.approx(0.38)
    assert ("memory_temperature_celsius", ()) not in values
    active = {
        dict(extra)["reason"]: v for n, extra, v in gpu.values if n == "clock_event_reason_active"
    }
    assert active["sw_power_cap"] == 1.0
    assert active["gpu_idle"] == 0.0
    assert len(active) == len(gc.CLOCK_EVENT_BITS)


def test_supported_mask_limits_the_reason_series():
    row = {"clocks_event_reasons.active": "0x1", "clocks_event_reasons.supported": "0x5"}
    reasons = [dict(extra)["reason"] for _, extra, _ in gc.clock_event_values(row)]
    assert reasons == ["gpu_idle", "sw_power_cap"]


def test_deprecated_and_error_tokens_make_fields_absent_not_zero():
    text = (
        "index, uuid, power.draw [W], power.limit [W], utilization.gpu [%], temperature.gpu, "
        "memory.used [MiB]\n"
        "0, GPU-a, [Requested functionality has been deprecated], [Unknown Error], "
        "[Insufficient Permissions], [Not Supported], \n"
    )
    (gpu,) = gc.parse_nvidia_gpus(text)
    assert gpu.values == []


def test_error_lines_between_rows_are_skipped():
    text = (
        "index, uuid, temperature.gpu\n"
        "0, GPU-a, 40\n"
        "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n"
        "2, GPU-c, 42\n"
    )
    assert [g.gpu for g in gc.parse_nvidia_gpus(text)] == ["0", "2"]


@pytest.mark.parametrize("text", ["", "garbage ### \x00\n1, 2\n", "lorem ipsum\n"])
def test_garbage_is_a_parse_error(text):
    with pytest.raises(gc.CollectorError) as err:
        gc.parse_nvidia_gpus(text)
    assert err.value.reason == "parse_error"


def test_compute_apps_parse_units_and_na():
    text = (
        "gpu_uuid, pid, used_memory [MiB]\n"
        "GPU-a, 11327, 2566 MiB\n"
        "GPU-a, 11328, [N/A]\n"
        "GPU-b, notapid, 1 MiB\n"
    )
    apps = gc.parse_compute_apps(text)
    assert apps == [
        gc.ComputeApp("GPU-a", 11327, 2566.0 * MIB),
        gc.ComputeApp("GPU-a", 11328, None),
    ]


def test_invalid_field_message():
    out = 'Field "gpu_recovery_action" is not a valid field to query.\n\n'
    assert gc.invalid_fields(out) == ["gpu_recovery_action"]


def test_query_fields_are_unique_and_include_the_six():
    fields = gc.all_query_fields()
    assert len(fields) == len(set(fields))
    for field in ("memory.total", "memory.used", "utilization.gpu", "temperature.gpu"):
        assert field in fields
    assert "power.draw" in fields and "power.limit" in fields


def test_effective_fields_apply_removals_and_aliases():
    fields = gc.effective_fields(["gpu_recovery_action"], ["clocks_event_reasons.active"])
    assert "gpu_recovery_action" not in fields
    assert "clocks_throttle_reasons.active" in fields
    assert "clocks_event_reasons.active" not in fields


def test_render_escapes_and_declares_every_family():
    samples = [
        gc.Sample("info", (("gpu", "0"), ("model", 'A "quoted"\\name')), 1.0),
        gc.Sample("power_draw_watts", (("gpu", "0"),), 69.85),
        gc.Sample("memory_total_bytes", (("gpu", "0"),), 81559.0 * MIB),
        gc.Sample("xid_errors_total", (("gpu", "0"), ("xid", "79")), 2.0),
    ]
    text = gc.render_metrics(samples)
    assert 'model="A \\"quoted\\"\\\\name"' in text
    assert 'node_gpu_power_draw_watts{gpu="0"} 69.85\n' in text
    assert 'node_gpu_memory_total_bytes{gpu="0"} 85520809984\n' in text
    assert "# TYPE node_gpu_power_draw_watts gauge" in text
    # The type follows the name: _total families are counters, memory_total_bytes is not.
    assert "# TYPE node_gpu_memory_total_bytes gauge" in text
    assert "# TYPE node_gpu_xid_errors_total counter" in text
    with pytest.raises(KeyError):
        gc.render_metrics([gc.Sample("not_declared", (), 1.0)])


def test_previous_last_success_is_read_back():
    text = "node_gpu_collector_last_success_timestamp_seconds 1700000000.5\n"
    assert gc.previous_last_success(text) == 1700000000.5
    assert gc.previous_last_success("") is None
