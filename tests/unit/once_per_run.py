"""Expensive test inputs made once per test run, also under pytest-xdist, and early.

A module- or session-scoped fixture runs once in each xdist worker that runs one of its
tests, and the scheduler may split a module's tests between workers: an input that takes
an ansible-playbook run of a minute would then be made twice, the same way, on the same
files. ``once_per_run`` makes it once: the first worker to ask makes it in a directory
shared by the run's workers (the session's base temporary directory without xdist), the
others wait for it and read the same result.

``start_early`` starts such an input's command when the session starts (tests/conftest.py
does, for the fixtures a test module lists in START_EARLY and a selected test uses), as a
process of its own beside the first tests, instead of when the first test that needs it
runs; ``once_per_run`` then waits for that run and makes the result from its output. The
process holds the input's lock until it ends, so an asker waits for it and never starts
a second run; one that died without its exit status is made again, as without it. The
command's environment is the session's at its start, before any test changes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The early commands this process started, to reap (or, in an aborted session, end).
_STARTED: list[subprocess.Popen[bytes]] = []
# sh runs the command in the input's directory and leaves its exit status there.
_EARLY_SH = (
    'out=$1; shift; "$@" >"$out/.early-stdout" 2>"$out/.early-stderr"; echo $? >"$out/.early-rc"'
)


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's base temporary directory (each xdist worker's is popen-gwN in it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _locked(root: Path, name: str, wait: bool = True) -> Iterator[int | None]:
    with open(root / f".{name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield lock.fileno()


def once_per_run(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    make: Callable[[Path], Any],
    finish: Callable[[Path, int, str, str], Any] | None = None,
) -> Any:
    """``make(directory)``'s result (JSON data) and the files it left in ``directory``,
    made once for this test run; or, if start_early ran the command, ``finish(directory,
    exit status, stdout, stderr)``'s. A ``make`` that raises is not remembered: the next
    ask makes it again (and fails the same way, in its own test)."""
    root = shared_root(tmp_path_factory)
    with _locked(root, name):
        result_file = root / f"{name}.json"
        if result_file.exists():
            return json.loads(result_file.read_text())
        directory = root / name
        status = directory / ".early-rc"
        if finish is not None and status.exists():
            result = finish(
                directory,
                int(status.read_text()),
                (directory / ".early-stdout").read_text(),
                (directory / ".early-stderr").read_text(),
            )
        else:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            result = make(directory)
        result_file.write_text(json.dumps(result))
        return result


def start_early(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    command: Callable[[Path], tuple[list[str], dict[str, str], Path]],
) -> None:
    """Start ``command(directory)`` (argv, environment, working directory) now, in the
    background, unless this run has made or is making ``name`` already."""
    root = shared_root(tmp_path_factory)
    with _locked(root, name, wait=False) as lock:
        directory = root / name
        if lock is None or directory.exists() or (root / f"{name}.json").exists():
            return  # another worker is making it, or it is made
        directory.mkdir()
        argv, env, cwd = command(directory)
        _STARTED.append(
            subprocess.Popen(
                ["sh", "-c", _EARLY_SH, "sh", str(directory), *argv],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(lock,),  # the lock is held until the command has ended
                start_new_session=True,
            )
        )


def end_early() -> None:
    """Reap the early commands; one still running when the session ends (an aborted run)
    is ended with its process group, and whoever still asks for it makes it again."""
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()
