"""Fixtures for the GPU health tests (helpers live in health_helpers.py)."""

from __future__ import annotations

import os

import pytest

from gpufleet_node.gpu_health import cli


@pytest.fixture(autouse=True)
def _restore_locale(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector's main() sets LC_ALL=C in this process; undone after each test."""
    monkeypatch.setenv("LC_ALL", os.environ.get("LC_ALL", "C"))


@pytest.fixture(autouse=True)
def journal(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """What the health program logs to the journal, kept here instead of syslog."""
    seen: list[tuple[int, str]] = []
    monkeypatch.setattr(cli.syslog, "openlog", lambda *_a, **_k: None)
    monkeypatch.setattr(
        cli.syslog, "syslog", lambda priority, message: seen.append((priority, message))
    )
    return seen
