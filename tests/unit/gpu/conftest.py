"""Fixtures for the GPU collector tests (helpers live in gpu_helpers.py)."""

from __future__ import annotations

import os

import pytest
from gpu_helpers import FakeSmi, gc


@pytest.fixture
def collector():
    return gc


@pytest.fixture
def fake_smi(tmp_path, monkeypatch) -> FakeSmi:
    return FakeSmi(tmp_path, monkeypatch)


@pytest.fixture
def run_collector(tmp_path, fake_smi):
    """Run one in-process collection cycle; returns the .prom text."""
    textfile_dir = tmp_path / "textfile"
    textfile_dir.mkdir()
    state_dir = tmp_path / "state"

    def run(*extra: str, expect_success: bool | None = True) -> str:
        argv = [
            "--once",
            "--nvidia-smi",
            str(fake_smi.bin),
            "--textfile-dir",
            str(textfile_dir),
            "--state-dir",
            str(state_dir),
            "--proc-root",
            str(tmp_path / "no-proc"),
            *extra,
        ]
        rc = gc.main(argv)
        if expect_success is not None:
            assert rc == (0 if expect_success else 1)
        return (textfile_dir / "gpufleet_gpu.prom").read_text()

    run.textfile_dir = textfile_dir
    run.state_dir = state_dir
    return run


@pytest.fixture(autouse=True)
def _restore_locale(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector tests run with LC_ALL=C unless it is set; main() sets LC_ALL=C for its
    vendor tools, in this process when a test calls it. Undone after each test, so later
    tests' Ansible keeps its UTF-8 locale (gpu_helpers set LC_ALL=C for the whole process
    when imported, which failed every later Ansible run unless LC_ALL was exported)."""
    monkeypatch.setenv("LC_ALL", os.environ.get("LC_ALL", "C"))
