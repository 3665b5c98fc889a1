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
# A library's logger: the node programs log it where they log; a command that sets up
# no logging (gpufleet jobstats) says its errors itself, once, not through Python's
# last-resort handler too.
LOG.addHandler(logging.NullHandler())

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
    truncated: bool = False  # keep_tail: older output was dropped (error stays None)


Runner = Callable[[list[str], float], CommandResult]
# A runner that hands standard output to a sink as it arrives (run_command's ``sink``).
StreamRunner = Callable[[list[str], float, Callable[[bytes], None]], CommandResult]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class StreamSink:
    """Passes a stream on as it arrives instead of keeping it; ``limit`` bytes at most."""

    tail = False

    def __init__(self, limit: int, sink: Callable[[bytes], None]) -> None:
        self.limit = limit
        self.sink = sink
        self.seen = 0
        self.overflow = False

    def add(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        self.overflow = self.overflow or self.seen > self.limit
        if chunk and not self.overflow:
            self.sink(chunk)


class BoundedBuffer:
    """Collects a stream up to ``limit`` bytes: the first bytes (head) or the last
    ones (tail, whole lines only). ``overflow`` tells that bytes were dropped."""

    def __init__(self, limit: int, tail: bool = False) -> None:
        self.limit = limit
        self.tail = tail
        self.data = bytearray()
        self.overflow = False
        self.mid_line = False  # tail: the kept bytes start inside a line

    def add(self, chunk: bytes) -> None:
        if self.tail:
            self.data += chunk
            if len(self.data) > 2 * self.limit:
                self._trim()
            return
        room = self.limit - len(self.data)
        self.data += chunk[: max(room, 0)]
        self.overflow = self.overflow or len(chunk) > room

    def _trim(self) -> None:
        cut = len(self.data) - self.limit
        self.mid_line = self.data[cut - 1] != ord("\n")
        del self.data[:cut]
        self.overflow = True

    def text(self) -> str:
        if self.tail and len(self.data) > self.limit:
            self._trim()
        start = self.data.find(b"\n") + 1 if self.mid_line else 0
        return bytes(self.data[start:]).decode("utf-8", "replace")


def _read_bounded(
    proc: subprocess.Popen[bytes],
    deadline: float,
    out: BoundedBuffer | StreamSink,
    err: BoundedBuffer,
) -> str | None:
    """Read stdout and stderr until both close: None, or the error that stopped it
    (a head-kept stdout over its limit stops the read; a tail-kept one never does)."""
    assert proc.stdout is not None and proc.stderr is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            for key, _ in sel.select(timeout=left):
                chunk = os.read(key.fd, _CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                key.data.add(chunk)
            if out.overflow and not out.tail:
                return "output_limit"
    return None


def run_command(
    argv: list[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    max_output: int = DEFAULT_MAX_OUTPUT,
    keep_tail: bool = False,
    reap_wait: float = _REAP_WAIT,
    sink: Callable[[bytes], None] | None = None,
) -> CommandResult:
    """Run ``argv`` in its own process group; kill the whole group on timeout or when its
    standard output exceeds ``max_output`` bytes. Never raises for the command's failures.

    ``keep_tail``: standard output over ``max_output`` is not an error; its newest bytes
    (whole lines) are kept and ``truncated`` says so (a log backlog). ``reap_wait``: how long
    a killed group is waited for, so a caller with one deadline can keep that time inside it.
    ``sink``: standard output goes to it chunk by chunk as it arrives and is not kept
    (``stdout`` is then empty): a large output is parsed without ever being held whole."""
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
    except FileNotFoundError as exc:
        return CommandResult("", time.monotonic() - start, "not_found", exc.strerror or str(exc))
    except OSError as exc:
        LOG.warning("cannot run %s: %s", argv[0], exc)
        return CommandResult("", time.monotonic() - start, "exec_error", exc.strerror or str(exc))
    # Not `with proc`: its exit waits without a bound, and a killed process stuck in the
    # kernel (a hung NFS mount) outlives SIGKILL; the cycle must not wait for it.
    out: BoundedBuffer | StreamSink = (
        StreamSink(max_output, sink) if sink is not None else BoundedBuffer(max_output, keep_tail)
    )
    err = BoundedBuffer(MAX_STDERR)
    try:
        error = _read_bounded(proc, start + timeout, out, err)
        if error is not None:
            _kill_group(proc)
        try:
            proc.wait(timeout=reap_wait if error else max(0.0, start + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            # Its pipes closed but it lives on (or a killed one is stuck in the kernel).
            _kill_group(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=reap_wait)
            error = error or "timeout"
    except BaseException:
        # A caller's own deadline (an alarm's exception) or Ctrl-C: the command is in a
        # session of its own, so nothing else would end it.
        _kill_group(proc)
        raise
    finally:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    duration = time.monotonic() - start
    stderr = err.text().strip()
    what = " ".join(argv[:3])
    if error == "timeout":
        LOG.warning("%s timed out after %.1fs", what, timeout)
        return CommandResult("", duration, error, stderr, proc.returncode)
    if error == "output_limit":
        LOG.warning("%s printed more than %d bytes", what, max_output)
        return CommandResult("", duration, error, stderr, proc.returncode)
    stdout, truncated = (
        (out.text(), out.overflow) if isinstance(out, BoundedBuffer) else ("", False)
    )
    if proc.returncode != 0:
        LOG.warning("%s exited %d: %s", what, proc.returncode, stderr[:300])
        return CommandResult(stdout, duration, "exit_code", stderr, proc.returncode, truncated)
    return CommandResult(stdout, duration, None, stderr, proc.returncode, truncated)
