"""Limits, the parsed-GPU model, the cycle's error and every metric family."""

from __future__ import annotations

from typing import NamedTuple

PREFIX = "node_gpu_"
DEFAULT_OUTPUT = "gpufleet_gpu.prom"
DEFAULT_STATE_DIR = "/var/lib/gpufleet-gpu-collector"
MIB = 1048576.0

# Bounds of one cycle (docs/gpu-collector.md). More GPU rows than MAX_GPUS, or
# more output than a limit, fails the cycle with its own reason.
MAX_GPUS = 64  # GPUs on one node; the largest servers have 8 to 20
MAX_COMPUTE_APPS = 4096  # compute-process rows (64 GPUs x 64 processes)
NVIDIA_MAX_BYTES = 1 << 20  # one nvidia-smi answer; 8 GPUs need about 10 KiB
AMD_MAX_BYTES = 4 << 20  # one amd-smi/rocm-smi JSON document
JOURNAL_MAX_BYTES = 8 << 20  # journalctl: the newest 8 MiB of a backlog are read
XID_FILE_MAX_BYTES = 8 << 20  # --xid-source FILE: bytes read per cycle
STATE_MAX_BYTES = 4 << 20  # state files and the previous .prom file
MAX_LINE_CHARS = 64 << 10  # one CSV line
MAX_FIELD_CHARS = 1024  # one CSV field (names, UUIDs and numbers are far shorter)
KILL_GRACE_SECONDS = 0.5  # of a command's budget, kept for killing and reaping it
JOURNAL_RESERVE_SECONDS = 2.0  # of the cycle's deadline, kept for journalctl


class Sample(NamedTuple):
    name: str  # without PREFIX
    labels: tuple[tuple[str, str], ...]
    value: float


# (metric name, extra labels, value) of one GPU
Value = tuple[str, tuple[tuple[str, str], ...], float]


class GpuData(NamedTuple):
    """One GPU as parsed from a vendor tool: identity plus label-less values."""

    gpu: str
    uuid: str
    vendor: str
    info: dict[str, str]
    # (metric name, extra labels, value); base labels are added by to_samples()
    values: list[tuple[str, tuple[tuple[str, str], ...], float]]
    unreadable: int | None = None  # fields answered with an error (NVIDIA only)


class CollectorError(Exception):
    """A cycle failure; ``reason`` is one of a small fixed set (label value).

    ``samples`` are health series the failure still reports (e.g. the number of
    duplicate GPU rows that made the cycle fail).
    """

    def __init__(self, reason: str, detail: str = "", samples: list[Sample] | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.samples = samples or []


# The values of node_gpu_collector_error_info{reason}: docs/gpu-collector.md lists each.
ERROR_REASONS = (
    "not_found",
    "exec_error",
    "timeout",
    "exit_code",
    "invalid_field",
    "parse_error",  # not CSV/JSON at all (no header, a csv module error, empty)
    "bad_row",  # a row that does not fit the header, or whose GPU index is not a number
    "duplicate_gpu",  # two rows with the same GPU index
    "too_many_gpus",  # more than MAX_GPUS rows
    "output_too_large",  # the vendor tool printed more than its byte limit
    "no_vendor_tool",
    "internal_error",  # a bug in the collector; the log has the exception
)

# name -> help. Every emitted family must be listed here. Its type follows the name
# (family_type): counters, and only counters, end in _total, as OpenMetrics names them.
FAMILIES: dict[str, str] = {
    "info": "GPU identity (model, uuid, PCI bus id, driver, VBIOS, device minor); value is 1.",
    "devices": "Number of GPUs the vendor tool reported in this cycle.",
    "unreadable_fields": (
        "Queried fields nvidia-smi answered with an error (ERR!, [Unknown Error], [GPU is "
        "lost]...) or an unparseable value; those series are absent."
    ),
    "expected_devices": "Number of GPUs this node must have, from the inventory.",
    "memory_total_bytes": "Total framebuffer memory in bytes.",
    "memory_used_bytes": "Used framebuffer memory in bytes.",
    "memory_free_bytes": "Free framebuffer memory in bytes.",
    "memory_reserved_bytes": "Framebuffer memory reserved by the driver in bytes.",
    "utilization_percent": "GPU utilization (percent of time a kernel ran), 0-100.",
    "memory_utilization_ratio": "Memory controller busy ratio, 0-1.",
    "encoder_utilization_ratio": "Video encoder utilization ratio, 0-1.",
    "decoder_utilization_ratio": "Video decoder utilization ratio, 0-1.",
    "temperature_celsius": "GPU core (AMD: edge, else hotspot) temperature in celsius.",
    "memory_temperature_celsius": "GPU memory (HBM) temperature in celsius.",
    "hotspot_temperature_celsius": "GPU junction/hotspot temperature in celsius.",
    "temperature_tlimit_margin_celsius": (
        "Degrees below the GPU's T.Limit (max operating) temperature; lower is hotter."
    ),
    "temperature_slowdown_threshold_celsius": (
        "Temperature at which the GPU slows down, per sensor, in celsius."
    ),
    "temperature_shutdown_threshold_celsius": (
        "Temperature at which the GPU shuts down, per sensor, in celsius."
    ),
    "power_draw_watts": "Current power draw in watts.",
    "power_limit_watts": "Software power limit in watts.",
    "power_enforced_limit_watts": "Power limit actually enforced in watts.",
    "power_default_limit_watts": "Default power limit in watts.",
    "power_max_limit_watts": "Maximum settable power limit in watts.",
    "sm_clock_hertz": "Current SM (AMD: sclk) clock in hertz.",
    "sm_clock_max_hertz": "Maximum SM clock in hertz.",
    "graphics_clock_hertz": "Current graphics clock in hertz.",
    "memory_clock_hertz": "Current memory clock in hertz.",
    "memory_clock_max_hertz": "Maximum memory clock in hertz.",
    "pcie_link_generation": "Current PCIe link generation.",
    "pcie_link_generation_max": "Maximum PCIe link generation of GPU and system.",
    "pcie_link_width_lanes": "Current PCIe link width in lanes.",
    "pcie_link_width_max_lanes": "Maximum PCIe link width in lanes.",
    "fan_speed_ratio": "Intended fan speed as a ratio of maximum, 0-1 (may exceed 1).",
    "performance_state": "Performance state number (P0=0 fastest .. P12=12).",
    "clock_event_reason_active": (
        "1 if this clock event (throttle) reason is active, else 0 (from the bitmask)."
    ),
    "clock_event_reason_seconds_total": (
        "Time this clock event (throttle) reason has been active, in seconds."
    ),
    "ecc_mode_enabled": "1 if ECC is enabled.",
    "ecc_mode_pending_enabled": "1 if ECC will be enabled after the next reset.",
    "ecc_corrected_errors_total": (
        "Corrected ECC errors (scope volatile: since driver load; aggregate: lifetime)."
    ),
    "ecc_uncorrected_errors_total": (
        "Uncorrected ECC errors (scope volatile: since driver load; aggregate: lifetime)."
    ),
    "retired_pages": "Retired framebuffer pages by cause (pre-Ampere).",
    "retired_pages_pending": "1 if pages are pending retirement at the next reboot.",
    "remapped_rows": "Remapped memory rows by cause (Ampere and later).",
    "remapped_rows_pending": "1 if a row remap is pending (reset the GPU).",
    "remapped_rows_failure": "1 if a row remap has failed (replace the GPU).",
    "recovery_action": (
        "Recovery action the driver asks for: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, "
        "4 drain and reset."
    ),
    "mig_mode_enabled": "1 if MIG mode is enabled.",
    "mig_mode_pending_enabled": "1 if MIG mode will be enabled after the next reset.",
    "persistence_mode_enabled": "1 if persistence mode is enabled.",
    "compute_processes": "Number of compute processes on the GPU.",
    "compute_processes_used_memory_bytes": "GPU memory used by compute processes in bytes.",
    "slurm_job_info": (
        "A Slurm job has a compute process on this GPU (label sluid: Slurm 26.05+ job cgroup "
        "name); value is 1."
    ),
    "xid_errors_total": "NVIDIA XID errors read from the kernel log, by GPU and XID code.",
    "xid_records_rejected_total": (
        "Kernel log records with XID-like text that were not counted as XIDs, by reason: "
        "not_kernel (not the kernel's own record), unanchored (the text is not at the start "
        "of the record, e.g. inside a user-chosen cgroup path), malformed."
    ),
    "job_cgroups_rejected": (
        "GPU compute processes in the last cycle whose cgroup looks like a Slurm job's "
        "(job_<id>, slurmstepd.scope) but is not in slurmd's own hierarchy: attributed to no job."
    ),
    "health_check": (
        "A health check of a GPU (no gpu label: the node) that is not ok: its state (warn, "
        "fail, unknown) and reason; value is 1. docs/health.md lists the checks."
    ),
    "health_verdict": "1 for the node's worst health state (fail > unknown > warn > ok).",
    "collector_success": "1 if the last collection succeeded, else 0.",
    "collector_error_info": "Reason of the last collection failure; value is 1.",
    "collector_last_success_timestamp_seconds": "Unix time of the last successful collection.",
    "collector_duration_seconds": "Wall time of the last collection in seconds.",
    "collector_compute_apps_success": "1 if the compute-process query succeeded.",
    "collector_xid_success": "1 if the kernel log could be read for XID errors.",
    "collector_skipped_lines": (
        "Lines of nvidia-smi output that were messages, not GPU rows (e.g. a lost GPU)."
    ),
    "collector_duplicate_gpu_rows": (
        "GPU rows that repeated an earlier row's index (the cycle then fails: duplicate_gpu)."
    ),
}


def family_type(name: str) -> str:
    """The exposition type of a family in FAMILIES."""
    return "counter" if name.endswith("_total") else "gauge"
