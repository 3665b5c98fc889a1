"""Expensive test inputs made once per test run, also under pytest-xdist.

A module- or session-scoped fixture runs once in each xdist worker that runs one of its
tests, and the scheduler may split a module's tests between workers: an input that takes
an ansible-playbook run of a minute would then be made twice, the same way, on the same
files. ``once_per_run`` makes it once: the first worker to ask makes it in a directory
shared by the run's workers, the others wait for it and read the same result.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def once_per_run(
    tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Any]
) -> Any:
    """``make(directory)``'s result (JSON data) and the files it left in ``directory``,
    made once for this test run. A ``make`` that raises is not remembered: the next ask
    makes it again (and fails the same way, in its own test)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make(tmp_path_factory.mktemp(name))
    # Each worker's base temporary directory is popen-gwN in the run's own one.
    shared = tmp_path_factory.getbasetemp().parent
    with open(shared / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result_file = shared / f"{name}.json"
        if result_file.exists():
            return json.loads(result_file.read_text())
        directory = shared / name
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        result = make(directory)
        result_file.write_text(json.dumps(result))
        return result
