"""amd-smi and rocm-smi JSON parsers."""

from __future__ import annotations

import math
import re
from typing import Any

from .model import MIB, CollectorError, GpuData, Value
from .nvidia import INDEX_RE
from .values import MAX_NUMBER_CHARS, clean_label, parse_number


def _amd_value(node: Any) -> float | None:
    """amd-smi: {"value": 12, "unit": "W"} | 12 | "12 W" | "N/A"; rocm-smi: strings."""
    if isinstance(node, dict):
        node = node.get("value")
    if isinstance(node, bool):
        return None
    if isinstance(node, (int, float)):
        return float(node) if math.isfinite(node) else None
    if isinstance(node, str):
        return parse_number(node)
    return None


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _first(data: Any, *paths: tuple[str, ...]) -> float | None:
    for path in paths:
        value = _amd_value(_get(data, *path))
        if value is not None:
            return value
    return None


def _amd_entries(doc: Any) -> list[dict[str, Any]]:
    """amd-smi JSON top level is a list of per-GPU objects or {"gpu_data": [...]}."""
    if isinstance(doc, dict):
        doc = doc.get("gpu_data", [])
    return [e for e in doc if isinstance(e, dict)] if isinstance(doc, list) else []


# (metric, scale, candidate paths) for amd-smi metric --json
AMD_SMI_METRICS: tuple[tuple[str, float, tuple[tuple[str, ...], ...]], ...] = (
    ("utilization_percent", 1.0, (("usage", "gfx_activity"),)),
    ("memory_utilization_ratio", 0.01, (("usage", "umc_activity"),)),
    ("power_draw_watts", 1.0, (("power", "socket_power"), ("power", "average_socket_power"))),
    ("temperature_celsius", 1.0, (("temperature", "edge"), ("temperature", "hotspot"))),
    ("hotspot_temperature_celsius", 1.0, (("temperature", "hotspot"),)),
    ("memory_temperature_celsius", 1.0, (("temperature", "mem"),)),
    # amd-smi labels MiB as "MB" (MI300X total_vram 196592 "MB" = 192 GiB)
    ("memory_total_bytes", MIB, (("mem_usage", "total_vram"),)),
    ("memory_used_bytes", MIB, (("mem_usage", "used_vram"),)),
    ("memory_free_bytes", MIB, (("mem_usage", "free_vram"),)),
    ("sm_clock_hertz", 1e6, (("clock", "gfx_0", "clk"),)),
    ("memory_clock_hertz", 1e6, (("clock", "mem_0", "clk"),)),
    ("pcie_link_width_lanes", 1.0, (("pcie", "width"),)),
    ("fan_speed_ratio", 0.01, (("fan", "usage"),)),
)
AMD_SMI_STATIC: tuple[tuple[str, float, tuple[tuple[str, ...], ...]], ...] = (
    ("power_limit_watts", 1.0, (("limit", "socket_power"), ("limit", "max_power"))),
    ("power_max_limit_watts", 1.0, (("limit", "max_power"),)),
)
AMD_THRESHOLDS = (("edge", "edge"), ("hotspot", "hotspot"), ("vram", "memory"))


def _amd_threshold_values(
    static: dict[str, Any],
) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    out: list[Value] = []
    for kind in ("slowdown", "shutdown"):
        for key, sensor in AMD_THRESHOLDS:
            value = _amd_value(_get(static, "limit", f"{kind}_{key}_temperature"))
            if value is not None:
                out.append((f"temperature_{kind}_threshold_celsius", (("sensor", sensor),), value))
    return out


def parse_amd_smi(metric_doc: Any, static_doc: Any) -> list[GpuData]:
    statics = {str(e.get("gpu")): e for e in _amd_entries(static_doc)}
    gpus = []
    for entry in _amd_entries(metric_doc):
        index = str(entry.get("gpu", ""))
        if not INDEX_RE.fullmatch(index):
            continue
        static = statics.get(index, {})
        values: list[Value] = []
        for table, source in ((AMD_SMI_METRICS, entry), (AMD_SMI_STATIC, static)):
            for metric, scale, paths in table:
                value = _first(source, *paths)
                if value is not None:
                    values.append((metric, (), value * scale))
        values.extend(_amd_threshold_values(static))
        info = {
            "model": clean_label(str(_get(static, "asic", "market_name") or "")),
            "pci_bus_id": clean_label(str(_get(static, "bus", "bdf") or entry.get("bdf") or "")),
            "driver_version": clean_label(str(_get(static, "driver", "version") or "")),
            "vbios_version": clean_label(str(_get(static, "vbios", "version") or "")),
        }
        uuid = clean_label(str(_get(static, "asic", "asic_serial") or entry.get("uuid") or ""))
        gpus.append(GpuData(index, uuid, "amd", info, values))
    return sorted(gpus, key=lambda g: int(g.gpu))


ROCM_SMI_KEYS: tuple[tuple[str, float, tuple[str, ...]], ...] = (
    ("utilization_percent", 1.0, ("GPU use (%)",)),
    ("memory_utilization_ratio", 0.01, ("GPU memory use (%)",)),
    (
        "temperature_celsius",
        1.0,
        ("Temperature (Sensor edge) (C)", "Temperature (Sensor junction) (C)"),
    ),
    ("hotspot_temperature_celsius", 1.0, ("Temperature (Sensor junction) (C)",)),
    ("memory_temperature_celsius", 1.0, ("Temperature (Sensor memory) (C)",)),
    (
        "power_draw_watts",
        1.0,
        ("Average Graphics Package Power (W)", "Current Socket Graphics Package Power (W)"),
    ),
    ("power_limit_watts", 1.0, ("Max Graphics Package Power (W)",)),
    ("memory_total_bytes", 1.0, ("VRAM Total Memory (B)",)),
    ("memory_used_bytes", 1.0, ("VRAM Total Used Memory (B)",)),
    ("fan_speed_ratio", 0.01, ("Fan speed (%)",)),
)


def _rocm_clock(raw: Any) -> float | None:
    match = re.search(r"(\d+(?:\.\d+)?)\s*mhz", str(raw or "")[:MAX_NUMBER_CHARS], re.IGNORECASE)
    return float(match.group(1)) * 1e6 if match else None


def parse_rocm_smi(doc: Any) -> list[GpuData]:
    """``rocm-smi ... --json``: {"card0": {"GPU use (%)": "0", ...}, "system": {...}}."""
    if not isinstance(doc, dict):
        raise CollectorError("parse_error", "rocm-smi JSON is not an object")
    driver = clean_label(str(_get(doc, "system", "Driver version") or ""))
    gpus = []
    for key, card in doc.items():
        match = re.fullmatch(r"card([0-9]{1,4})", str(key))
        if not match or not isinstance(card, dict):
            continue
        values: list[Value] = []
        for metric, scale, names in ROCM_SMI_KEYS:
            value = next(
                (v for v in (_amd_value(card.get(n)) for n in names) if v is not None), None
            )
            if value is not None:
                values.append((metric, (), value * scale))
        for metric, key_name in (
            ("sm_clock_hertz", "sclk clock speed:"),
            ("memory_clock_hertz", "mclk clock speed:"),
        ):
            hertz = _rocm_clock(card.get(key_name))
            if hertz is not None:
                values.append((metric, (), hertz))
        info = {
            "model": clean_label(card.get("Card series") or card.get("Card model")),
            "pci_bus_id": clean_label(card.get("PCI Bus")),
            "driver_version": driver,
            "vbios_version": clean_label(card.get("VBIOS version")),
        }
        gpus.append(
            GpuData(match.group(1), clean_label(card.get("Unique ID")), "amd", info, values)
        )
    return sorted(gpus, key=lambda g: int(g.gpu))
