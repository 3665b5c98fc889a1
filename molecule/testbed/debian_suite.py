#!/usr/bin/env python3
"""Debian packages of another suite (trixie, sid), downloaded by apt from that suite's
signed index into a cache of the test bed, without touching this machine's apt setup.

The build machines run Debian 12; newer upstream versions (Prometheus 3, Alertmanager
0.33, node_exporter 1.11) are only reachable as Debian packages of sid. apt verifies
every file it downloads against the suite's Release file, signed with the Debian archive
keys, so what the tests unpack is what Debian published.

    debian_suite.py fetch --suite sid PACKAGE      print the path of the cached .deb
    debian_suite.py version --suite sid PACKAGE    print the candidate's version
    debian_suite.py missing --suite trixie PACKAGE...  print those the suite lacks

sid moves: a version is replaced (and removed) when a new one is uploaded, so the index
is refreshed when it is older than a day, and callers assert major versions only.
Standard library only: it runs before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("GPUFLEET_DEBIAN_CACHE", REPO / ".cache" / "debian"))
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITES = ("bookworm", "trixie", "sid")
INDEX_MAX_AGE_S = 24 * 3600
# The URI of a deb822 `URIs:` field or a one-line `deb [options] URI` entry.
SOURCE_URI = re.compile(r"(?m)^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+/debian)/?\s")


def mirror_url(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine's apt uses (so a site's proxy or mirror is kept)."""
    paths = [*sorted(sources_dir.glob("sources.list.d/*.sources")), sources_dir / "sources.list"]
    for path in paths:
        try:
            text = path.read_text()
        except OSError:
            continue
        match = SOURCE_URI.search(text)
        if match:
            return match.group(1)
    return DEFAULT_MIRROR


def suite_dir(suite: str) -> Path:
    if suite not in SUITES:
        raise SystemExit(f"debian_suite: unknown suite {suite!r} (one of {', '.join(SUITES)})")
    return CACHE / suite


def apt_options(suite: str) -> list[str]:
    """apt -o options that point every state and cache directory into the suite's cache."""
    base = suite_dir(suite)
    for sub in ("lists/partial", "archives/partial", "debs"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    sources = base / "sources.list"
    line = f"deb [signed-by={KEYRING}] {mirror_url()} {suite} main\n"
    if not sources.exists() or sources.read_text() != line:
        sources.write_text(line)
    status = base / "status"
    status.touch()
    return [
        f"-oDir::Etc::SourceList={sources}",
        "-oDir::Etc::SourceParts=-",
        f"-oDir::State::Lists={base / 'lists'}",
        f"-oDir::State::Status={status}",
        f"-oDir::Cache={base}",
        f"-oDir::Cache::Archives={base / 'archives'}",
        "-oAcquire::Languages=none",
        "-oAPT::Architecture=amd64",
        "-oAPT::Architectures=amd64",
    ]


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"debian_suite: {' '.join(cmd[:2])} failed: {last}")
    return result.stdout


@contextlib.contextmanager
def _suite_lock(suite: str) -> Iterator[None]:
    """One apt run per suite cache at a time: parallel test workers and scenarios share it."""
    base = suite_dir(suite)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def update(suite: str) -> None:
    """Refresh the suite's index when it is missing or older than a day."""
    options = apt_options(suite)
    lists = suite_dir(suite) / "lists"
    indexes = list(lists.glob("*_Packages*"))
    if indexes and time.time() - min(p.stat().st_mtime for p in indexes) < INDEX_MAX_AGE_S:
        return
    _run(["apt-get", *options, "update", "-qq"])
    if not list(lists.glob("*_Packages*")):  # apt only warns when the mirror does not answer
        raise SystemExit(
            f"debian_suite: apt-get update fetched no index of {suite} from {mirror_url()}"
        )


def version(package: str, suite: str) -> str:
    """The version apt would download for package from suite."""
    with _suite_lock(suite):
        return _version(package, suite)


def _version(package: str, suite: str) -> str:
    update(suite)
    shown = _run(["apt-cache", *apt_options(suite), "show", "--no-all-versions", package])
    match = re.search(r"(?m)^Version: (\S+)$", shown)
    if not match:
        raise SystemExit(f"debian_suite: {package} has no version in {suite}")
    return match.group(1)


def missing(packages: list[str], suite: str) -> list[str]:
    """Those of packages with no installable version in suite's index (main, amd64): not
    there at all, or only a virtual name that other packages provide."""
    with _suite_lock(suite):
        update(suite)
        policy = _run(["apt-cache", *apt_options(suite), "policy", *packages])
    candidates: dict[str, str] = {}
    name = ""
    for line in policy.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            name = line[:-1]
        elif line.strip().startswith("Candidate:") and name:
            candidates[name] = line.split(":", 1)[1].strip()
    return [p for p in packages if candidates.get(p, "(none)") == "(none)"]


def fetch(package: str, suite: str) -> Path:
    """The suite's current .deb of package, downloaded once and verified by apt."""
    with _suite_lock(suite):
        return _fetch(package, suite)


def _fetch(package: str, suite: str) -> Path:
    wanted = _version(package, suite)
    debs = suite_dir(suite) / "debs"
    epochless = wanted.split(":", 1)[-1]
    for deb in debs.glob(f"{package}_*.deb"):
        if deb.name.split("_")[1].replace("%3a", ":").split(":", 1)[-1] == epochless:
            return deb
    for stale in debs.glob(f"{package}_*.deb"):
        stale.unlink()
    _run(["apt-get", *apt_options(suite), "download", f"{package}={wanted}"], cwd=debs)
    found = sorted(debs.glob(f"{package}_*.deb"))
    if not found:
        raise SystemExit(f"debian_suite: apt-get download {package} from {suite} left no .deb")
    return found[0]


def upstream_version(debian_version: str) -> str:
    """2:3.5.3+ds1-2 -> 3.5.3 (epoch, repack suffix and Debian revision dropped)."""
    return re.split(r"[+~-]", debian_version.split(":", 1)[-1], maxsplit=1)[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("fetch", "version", "missing"))
    parser.add_argument("--suite", required=True, choices=SUITES)
    parser.add_argument("package", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "missing":
        for package in missing(args.package, args.suite):
            print(package)
        return
    if len(args.package) != 1:
        parser.error(f"{args.command} takes one package")
    if args.command == "fetch":
        print(fetch(args.package[0], args.suite))
    else:
        print(version(args.package[0], args.suite))


if __name__ == "__main__":
    sys.exit(main())
