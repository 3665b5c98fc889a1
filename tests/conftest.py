"""Session-wide test set-up."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "unit"))  # once_per_run

from once_per_run import end_early


@pytest.fixture(scope="session", autouse=True)
def _slow_inputs_start_with_the_session(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A test module's START_EARLY names fixtures whose input is one slow command (an
    ansible-playbook run of a minute) and the function that starts it (once_per_run's
    start_early): when a selected test uses such a fixture, the command starts now, beside
    the first tests, and the fixture then waits for it and reads its output."""
    if not request.config.getoption("collectonly"):
        started = set()
        for item in request.session.items:
            for fixture, start in getattr(getattr(item, "module", None), "START_EARLY", {}).items():
                if fixture in getattr(item, "fixturenames", ()) and start not in started:
                    started.add(start)
                    start(tmp_path_factory)
    yield
    end_early()
