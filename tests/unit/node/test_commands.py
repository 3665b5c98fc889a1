"""The bounded subprocess runner every node program uses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gpufleet_node.commands import ERRORS, CommandResult, run_command

PY = sys.executable


def test_success_returns_stdout_and_stderr():
    res = run_command([PY, "-c", "import sys; print('out'); print('err', file=sys.stderr)"], 10)
    assert (res.stdout, res.stderr, res.error, res.returncode) == ("out\n", "err", None, 0)


def test_a_failing_command_keeps_its_output_and_says_exit_code():
    res = run_command([PY, "-c", "print('partial'); raise SystemExit(3)"], 10)
    assert (res.stdout, res.error, res.returncode) == ("partial\n", "exit_code", 3)


def test_missing_binary_is_not_found():
    res = run_command(["/nonexistent/gpufleet-no-such-binary"], 10)
    assert res == CommandResult("", res.duration, "not_found", "No such file or directory")


def test_not_executable_is_exec_error(tmp_path):
    script = tmp_path / "x"
    script.write_text("#!/bin/sh\n")
    res = run_command([str(script)], 10)
    assert (res.error, res.stderr) == ("exec_error", "Permission denied")


def test_an_exception_in_the_caller_kills_the_command(tmp_path):
    """An alarm's exception (the epilog's deadline) or Ctrl-C while the command runs: the
    command, in a session of its own, is killed, not left running."""
    import signal

    class DeadlineExceeded(Exception):
        pass

    def expire(signum, frame):
        raise DeadlineExceeded

    marker = tmp_path / "still-ran"
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        started = time.monotonic()
        try:
            run_command(["sh", "-c", f"sleep 2; touch {marker}"], 30)
        except DeadlineExceeded:
            pass
        else:
            raise AssertionError("the alarm did not interrupt the command")
        assert time.monotonic() - started < 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    # Until the command is gone: at once if it was killed, after its `touch` (2 s) if it
    # was left running. (This was a 2.5 s sleep in every run.)
    gone_by = time.monotonic() + 30
    while running_with(str(marker)) and time.monotonic() < gone_by:
        time.sleep(0.05)
    assert not running_with(str(marker))
    assert not marker.exists()


def running_with(text: str) -> list[int]:
    """The processes whose command line holds ``text`` (a zombie's is empty)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if text.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    # The grandchild holds no pipe of ours: only the group kill ends it.
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen(['sleep', '60'],\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    res = run_command([PY, "-c", code], 1.0)
    assert res.error == "timeout" and res.stdout == ""
    assert time.monotonic() - start < 10
    pid = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the grandchild outlived the timeout")


def test_output_beyond_the_cap_kills_the_command():
    start = time.monotonic()
    res = run_command(
        [PY, "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"], 30, max_output=100_000
    )
    assert res.error == "output_limit" and res.stdout == ""
    assert time.monotonic() - start < 10


def test_output_at_the_cap_is_kept():
    res = run_command([PY, "-c", "import sys; sys.stdout.write('y' * 1000)"], 10, max_output=1000)
    assert (res.error, len(res.stdout)) == (None, 1000)


def test_stderr_is_bounded_but_drained():
    # Far more stderr than a pipe buffer: the runner must keep reading or the child blocks.
    code = "import sys; sys.stderr.write('e' * 2_000_000); print('done')"
    res = run_command([PY, "-c", code], 20)
    assert res.stdout == "done\n" and res.error is None
    assert 0 < len(res.stderr) <= 64 * 1024


def test_env_is_passed():
    res = run_command(
        [PY, "-c", "import os; print(os.environ['GPUFLEET_X'])"], 10, env={"GPUFLEET_X": "1"}
    )
    assert res.stdout == "1\n"


def test_error_names_are_the_documented_set():
    assert ERRORS == ("timeout", "not_found", "exit_code", "exec_error", "output_limit")


def test_a_process_that_outlives_sigkill_is_not_waited_for(monkeypatch):
    """A command stuck in the kernel (a hung NFS mount) survives SIGKILL: every wait on it
    times out. run_command must still return, never waiting without a bound."""
    waits: list[float | None] = []

    def stuck_wait(self, timeout=None):
        waits.append(timeout)
        if timeout is None:
            raise AssertionError("an unbounded wait on a process that cannot die")
        raise subprocess.TimeoutExpired(self.args, timeout)

    monkeypatch.setattr(subprocess.Popen, "wait", stuck_wait)
    started = time.monotonic()
    result = run_command(["sleep", "30"], timeout=0.3)
    assert result.error == "timeout"
    assert None not in waits and len(waits) >= 1
    assert time.monotonic() - started < 10
