"""Helpers for the GPU collector tests: the collector module, the fake nvidia-smi, parsing."""

from __future__ import annotations

import atexit
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest

from gpufleet_node import build
from gpufleet_node.gpu_collector import (
    amd,
    cli,
    collect,
    files,
    health,
    kernlog,
    metrics,
    model,
    nvidia,
    query,
    run,
    service,
    slurm,
    state,
    values,
    xid,
)

REPO = Path(__file__).resolve().parents[3]
FAKE_SMI = REPO / "tests" / "gpu" / "fake_nvidia_smi.py"
CAPTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
DATA = Path(__file__).resolve().parent / "data"

H100 = CAPTURES / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H100_MIG = CAPTURES / "linux-x86_64__nvidia-h100-mig__590.48.01.txt"
# gpufleet's own capture: the lent device machine, 2026-11-27 (fixtures README)
H200 = CAPTURES / "linux-x86_64__nvidia-h200__580.159.04.txt"
L40S = CAPTURES / "linux-x86_64__nvidia-l40s__595.80.txt"
RTX4080 = CAPTURES / "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt"
RTX2080 = CAPTURES / "linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt"
ALL_CAPTURES = sorted(CAPTURES.glob("*.txt"))


def _facade() -> types.SimpleNamespace:
    """Every public name of the collector's modules in one namespace (the tests' ``gc``);
    a test that patches a name patches it in the module that uses it."""
    names: dict[str, object] = {}
    for module in MODULES:
        names.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
    return types.SimpleNamespace(**names)


def _build_zipapp() -> Path:
    """The shipped zipapp, built once per test session: what subprocess tests run."""
    folder = Path(tempfile.mkdtemp(prefix="gpufleet-gpu-collector-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "gpufleet-gpu-collector.pyz"
    build.write(path, build.archive("gpu_collector"))
    return path


MODULES = (
    model,
    files,
    values,
    nvidia,
    amd,
    kernlog,
    health,
    slurm,
    metrics,
    run,
    state,
    query,
    xid,
    collect,
    service,
    cli,
)
gc = _facade()
COLLECTOR_ZIPAPP = _build_zipapp()


class FakeSmi:
    """A fake nvidia-smi executable in tmp_path plus its environment."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bin = tmp_path / "bin" / "nvidia-smi"
        self.bin.parent.mkdir()
        self.bin.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_SMI}" "$@"\n')
        self.bin.chmod(0o755)
        self.call_log = tmp_path / "calls.log"
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("FAKE_NVIDIA_SMI_CONFIG", str(tmp_path / "no-such.conf"))
        monkeypatch.setenv("FAKE_NVIDIA_SMI_CALL_LOG", str(self.call_log))
        for key in ("STATE", "GPUS", "MODE", "UNKNOWN_FIELDS", "APPS", "APPS_FILE"):
            monkeypatch.delenv(f"FAKE_NVIDIA_SMI_{key}", raising=False)
        self.set(capture=H100, state="idle")

    def set(self, **values: object) -> None:
        for key, value in values.items():
            name = f"FAKE_NVIDIA_SMI_{key.upper()}"
            if value is None:
                self.monkeypatch.delenv(name, raising=False)
            else:
                self.monkeypatch.setenv(name, str(value))

    def calls(self) -> list[list[str]]:
        if not self.call_log.exists():
            return []
        return [line.split("\t") for line in self.call_log.read_text().splitlines()]

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin), *args], capture_output=True, text=True, timeout=30)


def stateless_argv(smi: Path, textfile_dir: Path) -> list[str]:
    """Collector arguments: this nvidia-smi, this textfile directory, no state directory."""
    return ["--nvidia-smi", str(smi), "--textfile-dir", str(textfile_dir), "--state-dir", ""]


def parse_prom(text: str) -> dict[tuple[str, frozenset], float]:
    """Exposition text -> {(name, frozenset(labels)): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        if "{" in head:
            name, rest = head.split("{", 1)
            labels = frozenset(
                tuple(part.split("=", 1)) for part in _split_labels(rest.rstrip("}"))
            )
            labels = frozenset((k, v.strip('"')) for k, v in labels)
        else:
            name, labels = head, frozenset()
        out[(name, labels)] = float(value)
    return out


def _split_labels(text: str) -> list[str]:
    parts, current, quoted = [], "", False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
    if current:
        parts.append(current)
    return parts


def values_of(text: str, name: str, **labels: str) -> list[float]:
    want = set(labels.items())
    return [v for (n, ls), v in parse_prom(text).items() if n == name and want <= set(ls)]


def names_of(text: str) -> set[str]:
    return {n for (n, _), _ in parse_prom(text).items()}
