"""One collection cycle and what survives between cycles."""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from ..exposition import write_textfile
from .health import pci_map_of, rejected_samples, with_minor_numbers, xid_samples
from .metrics import (
    compute_app_samples,
    health_samples,
    previous_last_success,
    render_metrics,
    to_samples,
)
from .model import JOURNAL_RESERVE_SECONDS, CollectorError, GpuData, Sample
from .nvidia import nvidia_gpus_and_notes
from .query import FieldMemory, binary_identity, query_amd, query_compute_apps, query_nvidia_gpus
from .run import Deadline
from .slurm import SluidResolver, _read_text, job_of_pid, jobs_by_gpu
from .state import (
    boot_id,
    load_xid_baseline,
    load_xid_state,
    log,
    save_json,
    xid_baseline_document,
)
from .verdict import jobs_by_gpu_index, verdict_checks, verdict_document, verdict_samples
from .xid import collect_xids


def resolve_tools(args: argparse.Namespace) -> str:
    """Pick the vendor; fills args.*_resolved. Returns 'nvidia', 'amd' or ''."""
    args.nvidia_smi_resolved = args.nvidia_smi or shutil.which("nvidia-smi") or ""
    args.amd_smi_resolved = args.amd_smi or shutil.which("amd-smi") or ""
    args.rocm_smi_resolved = args.rocm_smi or shutil.which("rocm-smi") or ""
    if args.vendor == "nvidia" or (args.vendor == "auto" and args.nvidia_smi_resolved):
        return "nvidia"
    if args.vendor in ("amd", "auto") and (args.amd_smi_resolved or args.rocm_smi_resolved):
        return "amd"
    return ""


def state_file(args: argparse.Namespace, name: str) -> str | None:
    return os.path.join(args.state_dir, name) if args.state_dir else None


def collect_gpu_samples(
    args: argparse.Namespace,
    memory: FieldMemory | None,
    deadline: Deadline | None = None,
    vendor: str = "",
) -> tuple[list[Sample], list[GpuData], bool | None]:
    """The vendor part of a cycle: (samples, gpus, compute-apps ok or None).

    ``vendor``: what resolve_tools(args) answered before; looked up when empty.
    """
    deadline = deadline or Deadline(args.timeout)
    vendor = vendor or resolve_tools(args)
    if vendor == "amd":
        gpus = query_amd(args, deadline)
        return to_samples(gpus), gpus, None
    if vendor != "nvidia":
        raise CollectorError("no_vendor_tool", "no nvidia-smi, amd-smi or rocm-smi found")
    if memory is None:
        memory = FieldMemory(None, "")
    answer = query_nvidia_gpus(args.nvidia_smi_resolved, memory, deadline)
    gpus, notes = nvidia_gpus_and_notes(answer.text, answer.fields)
    gpus = with_minor_numbers(gpus, args.proc_root)
    samples = to_samples(gpus) + notes
    try:
        apps = query_compute_apps(args.nvidia_smi_resolved, deadline)
    except CollectorError as exc:
        log(f"compute apps: {exc}")
        return samples, gpus, False
    resolver = SluidResolver(args.proc_root)
    root = getattr(args, "slurm_cgroup_root", "")
    rejected: set[int] = set()
    jobs = jobs_by_gpu(apps, lambda pid: job_of_pid(args.proc_root, pid, resolver, root, rejected))
    samples += compute_app_samples(gpus, apps, jobs, resolver.ids)
    return [*samples, Sample("job_cgroups_rejected", (), float(len(rejected)))], gpus, True


class Collector:
    """Holds what survives between cycles in loop mode (field memory, last success)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.output = os.path.join(args.textfile_dir, args.output_name)
        nvidia = args.nvidia_smi or shutil.which("nvidia-smi") or ""
        self.memory = FieldMemory(state_file(args, "nvidia_fields.json"), binary_identity(nvidia))
        self.last_success = previous_last_success(_read_text(self.output))
        self.xid_path = state_file(args, "xid_state.json")
        self.xid_state = load_xid_state(self.xid_path) if args.xid_source != "none" else {}
        if args.xid_source != "none" and not self.xid_path:
            log("no --state-dir: XID counters restart with every process")
        self.vendor = ""  # the tools found; searched on PATH again when one fails to run
        self.boot_id = boot_id(args.proc_root)
        self.baseline_path = state_file(args, "xid_baseline.json")
        self.verdict_path = state_file(args, "health.json")
        self.baseline_boot: str | None = None
        self.xid_baseline: dict[str, int] = {}
        self.xid_baseline = self.load_baseline()
        self.reported: dict[str, str] = {}  # topic -> the problem last logged

    def load_baseline(self) -> dict[str, int]:
        """The XID counts the health verdict counts from. Read every cycle (``gpufleet-gpu-
        health clear`` rewrites it); a new boot, or none yet, starts from the counts now,
        before this boot's kernel log is read: a reboot clears XIDs. Once taken, the
        baseline is kept in memory too: a file that cannot be written or read again never
        moves it up to counts that already hold new XIDs."""
        found = load_xid_baseline(self.baseline_path)
        if found is not None and found[0] == self.boot_id:
            self.baseline_boot = self.boot_id
            return found[1]
        if self.baseline_boot == self.boot_id:
            return self.xid_baseline
        counts = dict(self.xid_state.get("counts", {}))
        save_json(self.baseline_path, xid_baseline_document(self.boot_id, counts))
        self.baseline_boot = self.boot_id
        return counts

    def health(self, samples: list[Sample], error: CollectorError | None) -> list[Sample]:
        """The verdict's series; its document for the health program goes to the state
        directory."""
        xids = self.args.xid_source != "none"
        if xids:
            self.xid_baseline = self.load_baseline()
        checks = verdict_checks(
            samples,
            error.reason if error else None,
            self.args.expected_gpus,
            self.xid_state.get("counts", {}) if xids else None,
            self.xid_baseline,
            self.xid_state.get("pci_map", {}),
        )
        if self.verdict_path:
            document = verdict_document(
                checks, time.time(), self.boot_id, jobs_by_gpu_index(samples)
            )
            try:
                write_textfile(Path(self.verdict_path), document, durable=False)
                self.report("verdict", "")
            except OSError as exc:
                self.report("verdict", f"cannot write {self.verdict_path}: {exc.strerror or exc}")
        return verdict_samples(checks)

    def journal_reserve(self) -> float:
        """Seconds of the cycle kept for journalctl after the vendor tool."""
        if self.args.xid_source != "journald":
            return 0.0
        return min(JOURNAL_RESERVE_SECONDS, float(self.args.timeout) / 4)

    def update_xids(self, gpus: list[GpuData], ok: bool, deadline: Deadline) -> list[Sample]:
        state = dict(self.xid_state)
        if ok:  # keep GPUs that vanished: their XIDs (79) must still map to them
            state["pci_map"] = {**state.get("pci_map", {}), **pci_map_of(gpus)}
        state, xid_ok = collect_xids(self.args.xid_source, state, deadline.left())
        if state != self.xid_state:
            save_json(self.xid_path, state)
            self.xid_state = state
        samples = xid_samples(state.get("counts", {}), state.get("pci_map", {}))
        samples += rejected_samples(state.get("rejected", {}))
        return [*samples, Sample("collector_xid_success", (), 1.0 if xid_ok else 0.0)]

    def collect(self, deadline: Deadline) -> tuple[list[Sample], list[GpuData], bool | None]:
        """collect_gpu_samples; any other exception becomes internal_error, so a
        bug can never leave the last cycle's success file in place."""
        if not self.vendor:
            self.vendor = resolve_tools(self.args)
        try:
            return collect_gpu_samples(self.args, self.memory, deadline, self.vendor)
        except CollectorError as exc:
            if exc.reason in ("not_found", "exec_error"):
                self.vendor = ""
            raise
        except Exception as exc:  # reported as reason internal_error
            raise CollectorError("internal_error", f"{type(exc).__name__}: {exc}") from exc

    def cycle(self) -> bool:
        args = self.args
        start = time.monotonic()
        deadline = Deadline(args.timeout)  # the whole cycle, journalctl included
        extra: list[Sample] = []
        if args.expected_gpus is not None:
            extra.append(Sample("expected_devices", (), float(args.expected_gpus)))
        try:
            samples, gpus, apps_ok = self.collect(deadline.before(self.journal_reserve()))
            error: CollectorError | None = None
        except CollectorError as exc:
            samples, gpus, apps_ok, error = [], [], None, exc
            extra.extend(exc.samples)
            log(str(exc))
        if args.xid_source != "none":
            extra.extend(self.update_xids(gpus, error is None, deadline))
        if apps_ok is not None:
            extra.append(Sample("collector_compute_apps_success", (), 1.0 if apps_ok else 0.0))
        if error is None:
            self.last_success = time.time()
        health = health_samples(
            error is None,
            time.monotonic() - start,
            self.last_success,
            error.reason if error else None,
        )
        verdict = self.health(samples + extra, error)
        text = render_metrics(samples + extra + health + verdict)
        return self.write_output(text) and error is None

    def write_output(self, text: str) -> bool:
        """The .prom file; a missing or unwritable directory is one log line (again only
        once it changes) and a failed cycle, never an exception: the loop keeps running
        and writes again once the directory is back."""
        try:
            write_textfile(Path(self.output), text, durable=False)
        except OSError as exc:
            self.report("output", f"cannot write {self.output}: {exc.strerror or exc}")
            return False
        self.report("output", "")
        return True

    def report(self, topic: str, message: str) -> None:
        """Log ``message`` when it differs from the last one of ``topic`` ('' = resolved)."""
        if message and message != self.reported.get(topic):
            log(message)
        self.reported[topic] = message
