"""Bounded command runs and the cycle's deadline; the textfile written atomically."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from typing import Any

from .model import (
    KILL_GRACE_SECONDS,
    NVIDIA_MAX_BYTES,
    STDERR_MAX_BYTES,
    CollectorError,
    CommandResult,
)

# ------------------------------------------------------------------------- I/O


def write_atomic(path: str, text: str, durable: bool = True) -> None:
    """tmp file in the same directory + os.replace: readers never see half a file.

    ``durable`` also fsyncs file and directory, for state that must survive a crash
    (XID counters). The textfile is not: it is rewritten every cycle, and a new
    cycle starts seconds after a reboot. The tmp name does not end in .prom, so
    node_exporter's *.prom glob ignores it.
    """
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(fd, 0o644)  # whatever the umask
            if durable:
                os.fsync(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        with contextlib.suppress(OSError):
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


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


def run_command(
    argv: list[str], timeout: float, max_bytes: int = NVIDIA_MAX_BYTES, keep_tail: bool = False
) -> CommandResult:
    """Run with a hard timeout and a bound on the output read.

    On expiry, or when stdout passes ``max_bytes`` (unless ``keep_tail``: then
    only the newest ``max_bytes`` are kept), the whole process group is killed.
    The time to kill and reap it is part of ``timeout``: a process stuck in the
    driver (D state) cannot be reaped, and the collector must still write its
    failure file before systemd's TimeoutStartSec.
    """
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # the environment: see main()
        )
    except FileNotFoundError as exc:
        raise CollectorError("not_found", str(exc)) from exc
    except OSError as exc:
        raise CollectorError("exec_error", str(exc)) from exc
    grace = min(KILL_GRACE_SECONDS, max(timeout, 0.0) / 4)
    out, err = BoundedBuffer(max_bytes, keep_tail), BoundedBuffer(STDERR_MAX_BYTES)
    try:
        finished = _read_streams(proc, {proc.stdout: out, proc.stderr: err}, timeout - grace)
        rc = _reap(proc, finished, grace)
    finally:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return CommandResult(rc, out.text(), err.text(), out.overflow)


def _read_streams(
    proc: subprocess.Popen[bytes], buffers: dict[Any, BoundedBuffer], seconds: float
) -> bool:
    """Read until both pipes close (True), the time is up or stdout overflows (False)."""
    end = time.monotonic() + max(seconds, 0.01)
    stdout = buffers.get(proc.stdout)
    with selectors.DefaultSelector() as selector:
        for stream, buffer in buffers.items():
            selector.register(stream, selectors.EVENT_READ, buffer)
        while selector.get_map():
            left = end - time.monotonic()
            if left <= 0:
                return False
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                key.data.add(chunk)
            if stdout is not None and stdout.overflow and not stdout.tail:
                return False
    return True


def _reap(proc: subprocess.Popen[bytes], finished: bool, grace: float) -> int | None:
    """Exit status; None if the process was killed (or outlived its pipes)."""
    if finished:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=max(grace, 0.01))
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=max(grace, 0.01))
    return None


class Deadline:
    """One deadline for a whole cycle; every command gets what is left of it."""

    def __init__(self, seconds: float, end: float | None = None) -> None:
        self.end = time.monotonic() + seconds if end is None else end

    def left(self) -> float:
        return self.end - time.monotonic()

    def before(self, reserve: float) -> Deadline:
        """A deadline ``reserve`` seconds earlier (time kept for a later step)."""
        return Deadline(0.0, self.end - reserve)


def _checked(result: CommandResult, what: str) -> str:
    if result.truncated:
        raise CollectorError("output_too_large", f"{what} printed more than the byte limit")
    if result.rc is None:
        raise CollectorError("timeout", f"{what} killed at the timeout")
    return result.stdout
