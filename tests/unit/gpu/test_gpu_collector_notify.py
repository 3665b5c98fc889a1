"""The --interval loop speaks systemd's notify protocol (Type=notify, WatchdogSec=).

The loop runs as a real process with NOTIFY_SOCKET pointing at a real AF_UNIX datagram
socket these tests bind, as systemd does; SO_PASSCRED tells which process sent each
message (systemd's NotifyAccess=main takes only the main process's).
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_helpers import COLLECTOR_ZIPAPP, gc, values_of

CREDENTIALS = struct.calcsize("3i")  # struct ucred: pid, uid, gid


class NotifySocket:
    """systemd's side of $NOTIFY_SOCKET: a datagram socket that knows each sender's pid."""

    def __init__(self, address: str) -> None:
        self.env_value = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(b"\0" + address[1:].encode() if address[0] == "@" else address)

    def receive(self, timeout: float) -> tuple[bytes, int]:
        """(message, sender pid); socket.timeout when nothing comes in time."""
        self.sock.settimeout(timeout)
        message, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(CREDENTIALS))
        ((level, kind, data),) = ancillary
        assert (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS)
        pid, _, _ = struct.unpack("3i", data[:CREDENTIALS])
        return message, pid

    def close(self) -> None:
        self.sock.close()


def bind(kind: str, tmp_path: Path) -> NotifySocket:
    if kind == "path":
        return NotifySocket(str(tmp_path / "notify"))
    # What systemd itself uses: NOTIFY_SOCKET=@/org/freedesktop/systemd1/notify/...
    return NotifySocket(f"@gpufleet-test/notify/{uuid.uuid4().hex}")


@pytest.fixture
def notify_socket(tmp_path) -> Iterator[NotifySocket]:
    sock = bind("abstract", tmp_path)
    yield sock
    sock.close()


@pytest.fixture
def start_loop(fake_smi, tmp_path, notify_socket):
    """Start the collector's loop as systemd's service would; stopped at teardown."""
    procs: list[subprocess.Popen] = []
    out = tmp_path / "out"
    out.mkdir()
    # The vendor tool records whether it inherited NOTIFY_SOCKET.
    seen_env = tmp_path / "smi-notify-socket.log"
    wrapper = tmp_path / "bin" / "nvidia-smi-wrapper"
    wrapper.write_text(
        f'#!/bin/sh\necho "${{NOTIFY_SOCKET-unset}}" >> "{seen_env}"\nexec "{fake_smi.bin}" "$@"\n'
    )
    wrapper.chmod(0o755)

    def start(*extra: str) -> subprocess.Popen:
        argv = [sys.executable, str(COLLECTOR_ZIPAPP), "--nvidia-smi", str(wrapper)]
        argv += ["--textfile-dir", str(out), "--state-dir", "", "--xid-source", "none", *extra]
        env = {**os.environ, "NOTIFY_SOCKET": notify_socket.env_value}
        # In tmp_path: a core dump (SIGABRT below) lands there, if the host writes one.
        proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    start.output = out / "gpufleet_gpu.prom"
    start.seen_env = seen_env
    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()


@pytest.mark.parametrize(
    ("value", "address"),
    [
        ("/run/systemd/notify", b"/run/systemd/notify"),
        ("@/org/freedesktop/systemd1/notify/123", b"\0/org/freedesktop/systemd1/notify/123"),
        ("", None),
        ("@", None),
        ("vsock:2:1234", None),
        ("run/relative", None),
    ],
)
def test_notify_address(value, address):
    assert gc.notify_address(value) == address


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_notifier_sends_one_datagram_per_message(kind, tmp_path):
    notify_socket = bind(kind, tmp_path)
    try:
        notifier = gc.Notifier(gc.notify_address(notify_socket.env_value))
        assert notifier.send("READY=1\nWATCHDOG=1")
        assert notifier.send("WATCHDOG=1")
        assert notify_socket.receive(5) == (b"READY=1\nWATCHDOG=1", os.getpid())
        assert notify_socket.receive(5) == (b"WATCHDOG=1", os.getpid())
    finally:
        notify_socket.close()


def test_notifier_without_a_socket_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert gc.Notifier.from_environ().send("WATCHDOG=1") is False


def test_a_vanished_socket_is_logged_not_fatal(tmp_path, capsys):
    notifier = gc.Notifier(str(tmp_path / "gone").encode())
    assert notifier.send("WATCHDOG=1") is False
    assert "cannot notify systemd" in capsys.readouterr().err


def test_loop_is_ready_after_its_first_cycle_then_pings_the_watchdog(start_loop, notify_socket):
    proc = start_loop("--interval", "0.2")
    message, pid = notify_socket.receive(30)
    assert message == b"READY=1\nWATCHDOG=1"
    assert pid == proc.pid  # the main process itself (NotifyAccess=main)
    # READY=1 comes after the first cycle: the output is there and complete.
    assert values_of(start_loop.output.read_text(), "node_gpu_collector_success") == [1]
    for _ in range(3):
        assert notify_socket.receive(30) == (b"WATCHDOG=1", proc.pid)
    # Taken out of the environment before the first vendor tool ran.
    assert set(start_loop.seen_env.read_text().split()) == {"unset"}
    proc.terminate()
    assert proc.wait(timeout=10) == 0


def test_a_hung_vendor_tool_still_ends_the_cycle_and_pings(start_loop, notify_socket, fake_smi):
    """nvidia-smi that never answers is killed at --timeout: cycles keep completing,
    as failures, so the watchdog (a few intervals) is not what ends them."""
    fake_smi.set(mode="hang")
    proc = start_loop("--interval", "0.5", "--timeout", "1")
    started = time.monotonic()
    assert notify_socket.receive(30)[0] == b"READY=1\nWATCHDOG=1"
    for _ in range(2):
        assert notify_socket.receive(30) == (b"WATCHDOG=1", proc.pid)
    # Three cycles, each cut at its 1 s deadline.
    assert time.monotonic() - started < 15
    text = start_loop.output.read_text()
    assert values_of(text, "node_gpu_collector_success") == [0]
    assert values_of(text, "node_gpu_collector_error_info", reason="timeout") == [1]


def test_a_wedged_loop_stops_pinging(start_loop, notify_socket):
    """What systemd's watchdog sees of a loop that stopped (here SIGSTOP): silence."""
    proc = start_loop("--interval", "0.2")
    assert notify_socket.receive(30)[0] == b"READY=1\nWATCHDOG=1"
    proc.send_signal(signal.SIGSTOP)
    stat = Path(f"/proc/{proc.pid}/stat")
    deadline = time.monotonic() + 10
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    notify_socket.sock.settimeout(0)
    while True:  # drop a ping sent before the stop landed
        try:
            notify_socket.sock.recv(4096)
        except BlockingIOError:
            break
    with pytest.raises(TimeoutError):
        notify_socket.receive(2)  # ten intervals
    proc.send_signal(signal.SIGCONT)
    assert notify_socket.receive(30) == (b"WATCHDOG=1", proc.pid)


def test_sigterm_ends_the_loop_at_once_even_in_a_long_sleep(start_loop, notify_socket):
    proc = start_loop("--interval", "3600")
    assert notify_socket.receive(30)[0] == b"READY=1\nWATCHDOG=1"
    started = time.monotonic()
    proc.terminate()
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - started < 5
    assert sorted(p.name for p in start_loop.output.parent.iterdir()) == ["gpufleet_gpu.prom"]


def test_the_watchdogs_abort_leaves_a_traceback(start_loop, notify_socket):
    """systemd ends a loop that missed its watchdog with SIGABRT: the journal then
    shows where the loop was."""
    proc = start_loop("--interval", "3600")
    assert notify_socket.receive(30)[0] == b"READY=1\nWATCHDOG=1"
    proc.send_signal(signal.SIGABRT)
    assert proc.wait(timeout=10) == -signal.SIGABRT
    stderr = proc.stderr.read()
    assert "Fatal Python error: Aborted" in stderr
    assert "run_loop" in stderr


def test_once_mode_does_not_notify(fake_smi, tmp_path, notify_socket):
    """The timer's oneshot service is not Type=notify: --once sends nothing."""
    out = tmp_path / "tf"
    out.mkdir()
    argv = [sys.executable, str(COLLECTOR_ZIPAPP), "--once", "--nvidia-smi", str(fake_smi.bin)]
    argv += ["--textfile-dir", str(out), "--state-dir", ""]
    env = {**os.environ, "NOTIFY_SOCKET": notify_socket.env_value}
    assert subprocess.run(argv, env=env, capture_output=True, timeout=60).returncode == 0
    with pytest.raises(TimeoutError):
        notify_socket.receive(0.5)
