"""XID counters and their series (the grammar: kernlog), and device minor numbers."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from .kernlog import REJECT_REASONS, normalize_pci_id
from .kernlog import parse_xid_lines as parse_xid_lines  # the role tests' entry point
from .model import GpuData, Sample
from .nvidia import PCI_BUS_ID_RE
from .slurm import _read_bytes
from .xidcatalog import CRITICAL_XIDS


def nvidia_pci_form(key: str) -> str:
    """'0000:3b:00' -> '00000000:3B:00.0', the form nvidia-smi and DCGM label with."""
    domain, bus, device = key.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{device.upper()}.0"


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


def rejected_samples(rejected: dict[str, int]) -> list[Sample]:
    """node_gpu_xid_records_rejected_total by reason, every reason (0 included): an
    alert on its increase sees the first one."""
    return [
        Sample("xid_records_rejected_total", (("reason", reason),), float(rejected.get(reason, 0)))
        for reason in REJECT_REASONS
    ]
