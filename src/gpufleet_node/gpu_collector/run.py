"""Bounded tool runs (the shared runner) within the cycle's deadline; atomic writes."""

from __future__ import annotations

import contextlib
import os
import time

from .. import commands
from ..commands import CommandResult
from .model import KILL_GRACE_SECONDS, NVIDIA_MAX_BYTES, CollectorError


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


def run_command(
    argv: list[str], timeout: float, max_bytes: int = NVIDIA_MAX_BYTES, keep_tail: bool = False
) -> CommandResult:
    """The shared runner (a hard timeout, the output read up to ``max_bytes``, the process
    group killed), with the time to kill and reap it inside ``timeout``: a process stuck in
    the driver (D state) cannot be reaped, and the collector must still write its failure
    file before systemd's TimeoutStartSec. ``keep_tail``: only the newest ``max_bytes``.
    A tool that cannot be started fails the cycle (CollectorError)."""
    grace = min(KILL_GRACE_SECONDS, max(timeout, 0.0) / 4)
    result = commands.run_command(
        argv, timeout - grace, max_output=max_bytes, keep_tail=keep_tail, reap_wait=max(grace, 0.01)
    )
    if result.error in ("not_found", "exec_error"):
        raise CollectorError(str(result.error), argv[0])
    return result


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
    if result.error == "output_limit":
        raise CollectorError("output_too_large", f"{what} printed more than the byte limit")
    if result.error == "timeout":
        raise CollectorError("timeout", f"{what} killed at the timeout")
    return result.stdout
