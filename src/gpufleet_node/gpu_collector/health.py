"""XID and fallen-off-the-bus lines from the kernel log, and device minor numbers."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from .model import GpuData, Sample
from .nvidia import PCI_BUS_ID_RE
from .slurm import _read_bytes

XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?\): (\d+),"
)
FALLEN_SINGLE_RE = re.compile(
    r"NVRM: GPU ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?: GPU has fallen off"
)
FALLEN_HEAD_RE = re.compile(
    r"NVRM: The NVIDIA GPU ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
)
FALLEN_TAIL = "fallen off the bus and is not responding"
# gpu-metrics.md 5.2 "critical / drain GPU or node" tier. 63, 92, 94 are the
# "warning" tier there (remap recorded, SBE storm, contained error): not critical.
CRITICAL_XIDS = frozenset(
    {46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 154, 155, 158}
    | set(range(144, 151))
)


def normalize_pci_id(raw: str) -> str:
    """'PCI:0000:3b:00', '00000000:3B:00.0' -> '0000:3b:00' (join key for XID lines)."""
    text = raw.strip().lower()
    text = text[4:] if text.startswith("pci:") else text
    parts = text.split(".")[0].split(":")
    if len(parts) != 3:
        return text
    try:
        domain, bus, device = (int(p, 16) for p in parts)
    except ValueError:
        return text
    return f"{domain:04x}:{bus:02x}:{device:02x}"


def nvidia_pci_form(key: str) -> str:
    """'0000:3b:00' -> '00000000:3B:00.0', the form nvidia-smi and DCGM label with."""
    domain, bus, device = key.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{device.upper()}.0"


def parse_xid_lines(lines: Iterable[str]) -> list[tuple[str, int]]:
    """Kernel log lines -> [(normalised pci id, xid)] in order.

    The multi-line and single-line "fallen off the bus" messages (printed without
    an Xid line on some drivers) count as XID 79.
    """
    events: list[tuple[str, int]] = []
    pending_head: str | None = None
    for line in lines:
        match = XID_RE.search(line)
        if match:
            events.append((normalize_pci_id(match.group(1)), int(match.group(2))))
            continue
        match = FALLEN_SINGLE_RE.search(line)
        if match:
            events.append((normalize_pci_id(match.group(1)), 79))
            continue
        match = FALLEN_HEAD_RE.search(line)
        if match:
            pending_head = normalize_pci_id(match.group(1))
        elif pending_head and FALLEN_TAIL in line:
            events.append((pending_head, 79))
            pending_head = None
    return events


def count_xids(counts: dict[str, int], events: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Pure: returns new counts keyed 'pci|xid'."""
    out = dict(counts)
    for pci, xid in events:
        key = f"{pci}|{xid}"
        out[key] = out.get(key, 0) + 1
    return out


def xid_samples(counts: dict[str, int], pci_map: dict[str, list[str]]) -> list[Sample]:
    samples = []
    for key in sorted(counts):
        pci, xid = key.split("|")
        gpu, uuid = (pci_map.get(pci) or ["unknown", "unknown"])[:2]
        labels = (
            ("gpu", gpu),
            ("uuid", uuid),
            ("vendor", "nvidia"),
            ("pci_bus_id", nvidia_pci_form(pci)),
            ("xid", xid),
            ("critical", "true" if int(xid) in CRITICAL_XIDS else "false"),
        )
        samples.append(Sample("xid_errors_total", labels, float(counts[key])))
    return samples


def pci_map_of(gpus: Iterable[GpuData]) -> dict[str, list[str]]:
    return {
        normalize_pci_id(g.info["pci_bus_id"]): [g.gpu, g.uuid]
        for g in gpus
        if g.vendor == "nvidia" and g.info.get("pci_bus_id")
    }


# Slurm's GRES index (IDX) names a device file, /dev/nvidia<minor>, and the minor
# need not equal nvidia-smi's index (jobstats issue #34). No --query-gpu field has
# it; the driver's per-GPU file does, without another command:
# <proc-root>/driver/nvidia/gpus/<domain:bus:device.function>/information.
DRIVER_INFO_MAX_BYTES = 4096  # the file is about 400 bytes
MAX_MINOR = 254  # /dev/nvidia255 is nvidiactl
DEVICE_MINOR_RE = re.compile(r"^Device Minor:[ \t]*([0-9]{1,3})[ \t]*$", re.MULTILINE)


def driver_info_dir(pci_bus_id: str) -> str | None:
    """'00000000:3B:00.0' -> '0000:3b:00.0' (the driver's directory name); None if malformed."""
    if not PCI_BUS_ID_RE.fullmatch(pci_bus_id):
        return None
    head, function = pci_bus_id.rsplit(".", 1)
    domain, bus, device = (int(part, 16) for part in head.split(":"))
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"


def parse_device_minor(text: str) -> str | None:
    """The one 'Device Minor:' line's number, 0..MAX_MINOR; None if absent, repeated or too big."""
    found = DEVICE_MINOR_RE.findall(text)
    if len(found) != 1 or int(found[0]) > MAX_MINOR:
        return None
    return str(int(found[0]))


def read_device_minor(proc_root: str, pci_bus_id: str) -> str | None:
    name = driver_info_dir(pci_bus_id)
    if name is None:
        return None
    path = os.path.join(proc_root, "driver", "nvidia", "gpus", name, "information")
    data = _read_bytes(path, DRIVER_INFO_MAX_BYTES + 1)
    if data is None or len(data) > DRIVER_INFO_MAX_BYTES:
        return None
    return parse_device_minor(data.decode("ascii", "replace"))


def with_minor_numbers(gpus: list[GpuData], proc_root: str) -> list[GpuData]:
    """NVIDIA GPUs get info label minor_number; a minor two GPUs claim is left out on both
    (a join on it would be ambiguous)."""
    minors = {g.gpu: read_device_minor(proc_root, g.info.get("pci_bus_id", "")) for g in gpus}
    claimed = [m for m in minors.values() if m is not None]
    out = []
    for gpu in gpus:
        minor = minors[gpu.gpu]
        if gpu.vendor == "nvidia" and minor is not None and claimed.count(minor) == 1:
            gpu = gpu._replace(info={**gpu.info, "minor_number": minor})
        out.append(gpu)
    return out
