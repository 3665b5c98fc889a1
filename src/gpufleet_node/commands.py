"""One bounded subprocess runner: timeout, output byte cap, the process group killed.

Every node program runs its external commands (Slurm's, nvidia-smi, dcgmi) through
:func:`run_command`: the command gets its own session (process group), and when it runs past
its timeout or prints more than its byte cap the whole group is killed, so a hung or
runaway command never outlives the cycle that started it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

LOG = logging.getLogger(__name__)

DEFAULT_MAX_OUTPUT = 256 * 1024 * 1024  # bytes of stdout kept; more kills the command
MAX_STDERR = 64 * 1024  # bytes of stderr kept for the log; the rest is read and dropped
_CHUNK = 65536
_REAP_WAIT = 2.0  # seconds to wait for a killed group's pipes to close
# CommandResult.error values, also the `reason` label of the command error counters.
ERRORS = ("timeout", "not_found", "exit_code", "exec_error", "output_limit")


@dataclass(frozen=True)
class CommandResult:
    stdout: str
    duration: float
    error: str | None  # None on success; else one of ERRORS
    stderr: str = ""
    returncode: int | None = None


Runner = Callable[[list[str], float], CommandResult]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _read_bounded(
    proc: subprocess.Popen[bytes], deadline: float, max_output: int
) -> tuple[bytes, bytes, str | None]:
    """Read stdout and stderr until both close: (stdout, stderr head, error or None)."""
    assert proc.stdout is not None and proc.stderr is not None
    out = bytearray()
    err = bytearray()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(out), bytes(err), "timeout"
            for key, _ in sel.select(timeout=left):
                chunk = os.read(key.fd, _CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf: bytearray = key.data
                if buf is out:
                    out += chunk
                    if len(out) > max_output:
                        return bytes(out[:max_output]), bytes(err), "output_limit"
                elif len(err) < MAX_STDERR:
                    err += chunk[: MAX_STDERR - len(err)]
    finally:
        sel.close()
    return bytes(out), bytes(err), None


def run_command(
    argv: list[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    max_output: int = DEFAULT_MAX_OUTPUT,
) -> CommandResult:
    """Run ``argv`` in its own process group; kill the whole group on timeout or when its
    standard output exceeds ``max_output`` bytes. Never raises for the command's failures."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=dict(env) if env is not None else None,
        )
    except FileNotFoundError:
        return CommandResult("", time.monotonic() - start, "not_found")
    except OSError as exc:
        LOG.warning("cannot run %s: %s", argv[0], exc)
        return CommandResult("", time.monotonic() - start, "exec_error")
    # Not `with proc`: its exit waits without a bound, and a killed process stuck in the
    # kernel (a hung NFS mount) outlives SIGKILL; the cycle must not wait for it.
    try:
        out, err, error = _read_bounded(proc, start + timeout, max_output)
        if error is not None:
            _kill_group(proc)
        try:
            proc.wait(timeout=_REAP_WAIT if error else max(0.0, start + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            # Its pipes closed but it lives on (or a killed one is stuck in the kernel).
            _kill_group(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_REAP_WAIT)
            error = error or "timeout"
    finally:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    duration = time.monotonic() - start
    stderr = err.decode("utf-8", "replace").strip()
    what = " ".join(argv[:3])
    if error == "timeout":
        LOG.warning("%s timed out after %.1fs", what, timeout)
        return CommandResult("", duration, error, stderr, proc.returncode)
    if error == "output_limit":
        LOG.warning("%s printed more than %d bytes", what, max_output)
        return CommandResult("", duration, error, stderr, proc.returncode)
    stdout = out.decode("utf-8", "replace")
    if proc.returncode != 0:
        LOG.warning("%s exited %d: %s", what, proc.returncode, stderr[:300])
        return CommandResult(stdout, duration, "exit_code", stderr, proc.returncode)
    return CommandResult(stdout, duration, None, stderr, proc.returncode)
