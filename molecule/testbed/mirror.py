#!/usr/bin/env python3
"""An artifact mirror for tests, in the upstream release layout, served on loopback.

Upstream release downloads are unreachable from the build machines, so tests build
release-shaped archives from the binaries Debian packages, compute their sha256, and
serve them the way an air-gapped site's mirror would (GitHub's paths under one root).

    mirror.py release --root DIR --package prometheus-node-exporter \
        --binary usr/bin/prometheus-node-exporter --project prometheus/node_exporter \
        --name node_exporter [--tamper]       prints {"version", "arch", "sha256", "url_path"}
    mirror.py release --root DIR --suite sid --project prometheus/prometheus --name prometheus \
        --file prometheus:usr/bin/prometheus:prometheus --file promtool:usr/bin/promtool:promtool
                                       several binaries, from packages of another Debian
                                       suite (sid has Prometheus 3); the version is the
                                       first package's upstream version
    mirror.py serve --root DIR --port N --pidfile F [--bind ADDR]
                                       start an HTTP server (default on loopback; a
                                       scenario's bridge address serves its test hosts)
    mirror.py stop --pidfile F
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

import debian_suite  # beside this file; scripts run from here find it first


def debian_member(package: str, member: str, suite: str) -> tuple[bytes, str]:
    """The file member of the suite's package (fetched and verified by apt) and the
    package's upstream version."""
    deb = debian_suite.fetch(package, suite)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True, timeout=120)
        version = subprocess.run(
            ["dpkg-deb", "-f", str(deb), "Version"], check=True, capture_output=True, text=True
        ).stdout.strip()
        return (Path(tmp) / member).read_bytes(), debian_suite.upstream_version(version)


def release_archive(name: str, version: str, arch: str, binaries: dict[str, bytes]) -> bytes:
    """A .tar.gz laid out like a Prometheus project release."""
    top = f"{name}-{version}.linux-{arch}"
    members = [(f"{top}/{member}", data, 0o755) for member, data in sorted(binaries.items())]
    members.append((f"{top}/LICENSE", b"Apache License 2.0\n", 0o644))
    buffer = io.BytesIO()
    # mtime=0 in the gzip header too: the same binaries always make the same archive.
    # Level 1: level 9 spent a minute of the cluster scenario on binaries of 100+ MB.
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=1) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        for path, data, mode in members:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def release_files(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(package, member, name in the archive) of every binary the release holds."""
    files = []
    if args.package:
        files.append((args.package, args.binary, args.name))
    for spec in args.file or []:
        parts = spec.split(":")
        if len(parts) != 3:
            raise SystemExit(f"mirror: --file wants PACKAGE:MEMBER:NAME, got {spec!r}")
        files.append((parts[0], parts[1], parts[2]))
    if not files:
        raise SystemExit("mirror: release needs --package/--binary or --file")
    return files


def release(args: argparse.Namespace) -> None:
    binaries: dict[str, bytes] = {}
    version = ""
    for package, member, name in release_files(args):
        data, package_version = debian_member(package, member, args.suite)
        binaries[name] = data
        version = version or package_version
    if args.tamper:
        first = sorted(binaries)[0]
        binaries[first] += b"\0tampered"
    arch = "amd64"
    url_path = (
        f"{args.project}/releases/download/v{version}/{args.name}-{version}.linux-{arch}.tar.gz"
    )
    archive = release_archive(args.name, version, arch, binaries)
    target = Path(args.root) / url_path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(archive)
    print(
        json.dumps(
            {
                "version": version,
                "arch": arch,
                "url_path": url_path,
                "sha256": hashlib.sha256(archive).hexdigest(),
            }
        )
    )


def serve(args: argparse.Namespace) -> None:
    stop(args)
    log = open(Path(args.pidfile).with_suffix(".log"), "ab")  # noqa: SIM115 - outlives us
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            str(args.port),
            "--bind",
            args.bind,
            "--directory",
            args.root,
        ],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    Path(args.pidfile).write_text(str(server.pid))
    for _ in range(50):
        try:
            urllib.request.urlopen(f"http://{args.bind}:{args.port}/", timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"mirror: server on {args.bind}:{args.port} did not start")


def stop(args: argparse.Namespace) -> None:
    pidfile = Path(args.pidfile)
    if pidfile.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
        pidfile.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("release")
    p.add_argument("--root", required=True)
    p.add_argument("--suite", default="bookworm", choices=debian_suite.SUITES)
    p.add_argument("--package", help="the package of a single-binary release")
    p.add_argument("--binary", help="that binary's path in the package")
    p.add_argument("--file", action="append", metavar="PACKAGE:MEMBER:NAME")
    p.add_argument("--project", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--tamper", action="store_true")
    p = sub.add_parser("serve")
    p.add_argument("--root", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pidfile", required=True)
    p.add_argument("--bind", default="127.0.0.1")
    p = sub.add_parser("stop")
    p.add_argument("--pidfile", required=True)
    args = parser.parse_args()
    {"release": release, "serve": serve, "stop": stop}[args.command](args)


if __name__ == "__main__":
    main()
