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
