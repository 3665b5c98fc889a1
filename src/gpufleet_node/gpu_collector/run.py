"""Bounded tool runs (the shared runner) within the cycle's deadline."""

from __future__ import annotations

import time

from .. import commands
from ..commands import CommandResult
from .model import KILL_GRACE_SECONDS, NVIDIA_MAX_BYTES, CollectorError


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
