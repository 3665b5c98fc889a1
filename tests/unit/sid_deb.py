"""Debian sid packages for tests: downloaded and verified by apt, unpacked once.

The download is molecule/testbed/debian_suite.py's (apt checks the suite's signatures); this
module unpacks the .deb under ``.cache/<name>/<deb stem>/`` and returns that directory, so
tests can run sid's promtool or prometheus without installing them, and waits for such a
daemon to be ready.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_SUITE = ROOT / "molecule" / "testbed" / "debian_suite.py"


class DebUnavailable(Exception):
    """The package could not be downloaded (no apt access to a Debian mirror)."""


def load_module(name: str, path: Path) -> ModuleType:
    """The Python file at ``path`` (not on sys.path, e.g. a role's plugin) as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _debian_suite() -> ModuleType:
    return load_module("gpufleet_debian_suite", DEBIAN_SUITE)


@functools.cache
def unpacked(package: str, cache: Path, suite: str = "sid") -> Path:
    """The root of ``package``'s unpacked .deb; older versions under ``cache`` are removed.

    Asked once per process: each ask runs apt-cache on the suite's index (about a second
    of CPU), and several modules and session fixtures (each promtool- or amtool-using
    module, both jobstats fixtures) want the same binary. A failure is not cached."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    # pytest-xdist workers share the cache: one of them downloads and unpacks, the rest wait.
    with open(cache.parent / f".{cache.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _unpacked(package, cache, suite)


def _unpacked(package: str, cache: Path, suite: str) -> Path:
    try:
        deb = _debian_suite().fetch(package, suite)
    except (SystemExit, OSError, subprocess.SubprocessError) as error:
        raise DebUnavailable(f"cannot fetch {package} from Debian {suite} ({error})") from error
    target = cache / deb.stem
    if not target.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        for stale in cache.iterdir():  # older versions, interrupted unpacks
            shutil.rmtree(stale, ignore_errors=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{deb.stem}.", dir=cache))
        subprocess.run(
            ["dpkg-deb", "-x", str(deb), str(partial)], check=True, capture_output=True, timeout=120
        )
        partial.rename(target)
    return target


def listening_port(process: subprocess.Popen[bytes], log: IO[str] | None, seconds: float) -> int:
    """The TCP port a daemon started on port 0 listens on, once it does (read from /proc:
    the listening socket among its own). Port 0 lets the kernel pick a free port at
    bind time; a port picked free beforehand can be taken before the daemon binds it,
    and another server on it would then answer for the daemon."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        ports = _listening_ports(process.pid)
        if len(ports) == 1:
            return ports.pop()
        if len(ports) > 1:
            raise RuntimeError(f"{process.args[0]} listens on several ports: {sorted(ports)}")
        time.sleep(0.05)
    tail = ""
    if log is not None:
        log.seek(0)
        tail = log.read()[-2000:]
    state = "listens on no port" if process.poll() is None else "exited"
    raise RuntimeError(f"{process.args[0]} {state}: {tail}")


def _listening_ports(pid: int) -> set[int]:
    sockets = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                sockets.add(target[len("socket:[") : -1])
        tables = [Path(f"/proc/{pid}/net/{name}").read_text() for name in ("tcp", "tcp6")]
    except OSError:  # not started or already gone
        return set()
    ports = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            # local address, state (0A: LISTEN), inode
            if fields[3] == "0A" and fields[9] in sockets:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def wait_ready(url: str, process: subprocess.Popen[bytes], log: IO[str], seconds: float) -> None:
    """Until ``url``/-/ready answers (Prometheus and Alertmanager both serve it); ``log`` is
    the daemon's output, whose tail says why it exited or never got ready."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    log.seek(0)
    state = "not ready" if process.poll() is None else "exited"
    raise RuntimeError(f"{process.args[0]} {state}: {log.read()[-2000:]}")
