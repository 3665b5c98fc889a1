"""The --interval loop as a systemd Type=notify service with its watchdog."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from .collect import Collector
from .state import log


def notify_address(value: str) -> bytes | None:
    """$NOTIFY_SOCKET -> an AF_UNIX address: a path, or '@name' in the abstract
    namespace (a leading NUL byte). Other forms (vsock:...) are not used."""
    if value.startswith("/"):
        return os.fsencode(value)
    if value.startswith("@") and len(value) > 1:
        return b"\0" + os.fsencode(value[1:])
    return None


class Notifier:
    """sd_notify(3): one datagram per message to systemd's socket; a no-op without one."""

    def __init__(self, address: bytes | None) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if address else None

    @classmethod
    def from_environ(cls) -> Notifier:
        # Taken out of the environment, as sd_notify does: the vendor tools inherit it.
        return cls(notify_address(os.environ.pop("NOTIFY_SOCKET", "")))

    def send(self, message: str) -> bool:
        if self.sock is None or self.address is None:
            return False
        try:
            self.sock.sendto(message.encode(), self.address)
        except OSError as exc:
            log(f"cannot notify systemd: {exc}")
            return False
        return True


class Stop(BaseException):
    """SIGTERM: the loop ends where it is (every file is replaced atomically)."""


def _stop(_signum: int, _frame: Any) -> None:
    raise Stop


def run_loop(collector: Collector, interval: float, notifier: Notifier) -> None:
    """A cycle every ``interval`` seconds until SIGTERM.

    systemd hears READY=1 after the first cycle (the output exists) and WATCHDOG=1
    after every cycle, failed ones too: a loop that stops completing cycles (a
    cycle itself ends within --timeout) is killed and restarted by its watchdog.
    """
    ready = "READY=1\n"
    next_run = time.monotonic()
    while True:
        collector.cycle()
        notifier.send(ready + "WATCHDOG=1")
        ready = ""
        # An overrun skips the missed ticks instead of bursting.
        next_run = max(next_run + interval, time.monotonic())
        time.sleep(max(next_run - time.monotonic(), 0.0))
