#!/usr/bin/env python3
"""Build release-shaped Loki and Alloy artifacts around the stand-ins (controller side).

Loki's release zip and Alloy's .deb cannot be downloaded on the test bed. This packs the
stand-ins next to this file (loki.py, alloy.py: test doubles, see their docstrings)
into files with the names, layout and package metadata of the upstream releases, under
a mirror root in GitHub's release-download paths, which is what roles/loki and
roles/alloy download from (`<base_url>/v<version>/<file>`):

    <root>/grafana/loki/releases/download/v<V>/loki-linux-<arch>.zip
        one member, loki-linux-<arch> (the stand-in, mode 0755)
    <root>/grafana/alloy/releases/download/v<V>/alloy-<V>-1.<arch>.deb
        Package alloy, Version <V>-1: /usr/bin/alloy (the stand-in), conffiles
        /etc/alloy/config.alloy and /etc/default/alloy (CONFIG_FILE, CUSTOM_ARGS),
        /usr/lib/systemd/system/alloy.service shaped like upstream's (Type=notify,
        User=alloy, EnvironmentFile, WorkingDirectory, ExecStart with $CUSTOM_ARGS
        --storage.path=/var/lib/alloy/data $CONFIG_FILE, ExecReload sending SIGHUP), and
        a postinst that, like upstream's, creates the alloy system group and user (home
        /var/lib/alloy) when missing, adds the user to adm and systemd-journal, and
        creates /var/lib/alloy/data.

    build.py loki-zip  --root DIR --version V [--arch amd64] [--tamper]
    build.py alloy-deb --root DIR --version V [--arch amd64] [--tamper]
    build.py all       --root DIR --loki-version V --alloy-version V [--arch amd64] [--tamper]

Each prints JSON: version, arch, url_path (relative to root), sha256 of the artifact and
binary_sha256 of the stand-in inside it (`all`: {"loki": {...}, "alloy": {...}}).
--tamper builds a different file at the same path (the stand-in with a trailing
comment), for wrong-checksum tests. Builds are reproducible: the same inputs give the
same bytes. Needs dpkg-deb (Debian's dpkg) for the .deb.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
EPOCH = 315532800  # 1980-01-01, the earliest time a zip entry can hold
TAMPER = b"\n# tampered: this is not the file the checksum was taken from\n"
VERSION_LINE = 'VERSION = "0.0.0-standin"'

ALLOY_UNIT = """\
[Unit]
Description=Vendor-agnostic OpenTelemetry Collector distribution with programmable pipelines
Documentation=https://grafana.com/docs/alloy
Wants=network-online.target
After=network-online.target

[Service]
Type=notify
Restart=always
User=alloy
Environment=HOSTNAME=%H
Environment=ALLOY_DEPLOY_MODE=deb
EnvironmentFile=/etc/default/alloy
WorkingDirectory=/var/lib/alloy
ExecStart=/usr/bin/alloy run $CUSTOM_ARGS --storage.path=/var/lib/alloy/data $CONFIG_FILE
ExecReload=/usr/bin/env kill -HUP $MAINPID
TimeoutStopSec=20s

[Install]
WantedBy=multi-user.target
"""

ALLOY_ENVIRONMENT = """\
# Settings of the alloy service (read by alloy.service as its EnvironmentFile).
# gpufleet test stand-in package: same variables as the upstream package's file.

# The Alloy configuration file.
CONFIG_FILE="/etc/alloy/config.alloy"

# Extra arguments for `alloy run`.
CUSTOM_ARGS=""

# Restart the service when the package is upgraded.
RESTART_ON_UPGRADE=true
"""

ALLOY_SAMPLE_CONFIG = """\
// Sample configuration of the alloy package (gpufleet test stand-in).
// Replace it with your own; see https://grafana.com/docs/alloy
logging {
  level = "warn"
}
"""

ALLOY_POSTINST = """\
#!/bin/sh
# gpufleet test stand-in: does what the upstream alloy package's postinst does.
set -e

[ -f /etc/default/alloy ] && . /etc/default/alloy

case "$1" in
    configure)
        ALLOY_USER="${ALLOY_USER:-alloy}"
        ALLOY_GROUP="${ALLOY_GROUP:-alloy}"
        if ! getent group "$ALLOY_GROUP" >/dev/null 2>&1; then
            groupadd -r "$ALLOY_GROUP"
        fi
        if ! getent passwd "$ALLOY_USER" >/dev/null 2>&1; then
            useradd -m -r -g "$ALLOY_GROUP" -d /var/lib/alloy -s /sbin/nologin \\
                -c "alloy user" "$ALLOY_USER"
        fi
        # Groups that may read logs.
        for group in adm systemd-journal; do
            if getent group "$group" >/dev/null 2>&1; then
                usermod -a -G "$group" "$ALLOY_USER"
            fi
        done
        for dir in /var/lib/alloy /var/lib/alloy/data; do
            if [ ! -d "$dir" ]; then
                mkdir "$dir"
                chown "$ALLOY_USER:$ALLOY_GROUP" "$dir"
                chmod 770 "$dir"
            fi
        done
        chown root:"$ALLOY_GROUP" /etc/alloy
        chmod 770 /etc/alloy
        if [ -n "$2" ] && [ "$RESTART_ON_UPGRADE" = "true" ] \\
            && command -v systemctl >/dev/null; then
            systemctl daemon-reload
            systemctl restart alloy
        fi
        ;;
esac
"""

ALLOY_PRERM = """\
#!/bin/sh
# gpufleet test stand-in: stop the service before the package is removed.
set -e
if [ "$1" = "remove" ] && command -v systemctl >/dev/null; then
    systemctl stop alloy.service >/dev/null 2>&1 || :
fi
"""


def standin(name: str, version: str, tamper: bool) -> bytes:
    source = (HERE / f"{name}.py").read_text()
    if source.count(VERSION_LINE) != 1:
        raise SystemExit(f"build.py: {name}.py must contain exactly one line {VERSION_LINE}")
    data = source.replace(VERSION_LINE, f'VERSION = "{version}"').encode()
    return data + TAMPER if tamper else data


def write(root: str, url_path: str, data: bytes, binary: bytes, version: str, arch: str) -> dict:
    target = Path(root) / url_path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return {
        "version": version,
        "arch": arch,
        "url_path": url_path,
        "sha256": hashlib.sha256(data).hexdigest(),
        "binary_sha256": hashlib.sha256(binary).hexdigest(),
    }


def loki_zip(root: str, version: str, arch: str, tamper: bool) -> dict:
    binary = standin("loki", version, tamper)
    member = f"loki-linux-{arch}"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        info = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
        info.create_system = 3  # unix, so the mode below is honoured by unzip
        info.external_attr = 0o100755 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        archive.writestr(info, binary)
    url_path = f"grafana/loki/releases/download/v{version}/{member}.zip"
    return write(root, url_path, buffer.getvalue(), binary, version, arch)


def alloy_deb(root: str, version: str, arch: str, tamper: bool) -> dict:
    binary = standin("alloy", version, tamper)
    files = {
        "usr/bin/alloy": (binary, 0o755),
        "etc/alloy/config.alloy": (ALLOY_SAMPLE_CONFIG.encode(), 0o644),
        "etc/default/alloy": (ALLOY_ENVIRONMENT.encode(), 0o644),
        "usr/lib/systemd/system/alloy.service": (ALLOY_UNIT.encode(), 0o644),
        "DEBIAN/conffiles": (b"/etc/alloy/config.alloy\n/etc/default/alloy\n", 0o644),
        "DEBIAN/postinst": (ALLOY_POSTINST.encode(), 0o755),
        "DEBIAN/prerm": (ALLOY_PRERM.encode(), 0o755),
    }
    installed_kib = sum(len(data) for path, (data, _) in files.items() if "DEBIAN" not in path)
    control = (
        "Package: alloy\n"
        f"Version: {version}-1\n"
        "License: Apache 2.0\n"
        "Vendor: Grafana Labs\n"
        f"Architecture: {arch}\n"
        "Maintainer: gpufleet test bed <gpufleet-testbed@invalid>\n"
        f"Installed-Size: {installed_kib // 1024 + 1}\n"
        "Depends: python3\n"
        "Section: default\n"
        "Priority: optional\n"
        "Homepage: https://github.com/grafana/alloy\n"
        "Description: Grafana Alloy (gpufleet TEST STAND-IN, not the real Alloy)\n"
        " A Python test double of /usr/bin/alloy (fmt refusing a marker, run with\n"
        " /-/ready, /metrics, reload on SIGHUP) in a package shaped like the upstream\n"
        " .deb. It runs no components. Built by molecule/testbed/standins/build.py.\n"
    )
    files["DEBIAN/control"] = (control.encode(), 0o644)
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        for path, (data, mode) in files.items():
            target = tree / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(mode)
        for path in sorted(tree.rglob("*"), reverse=True):
            if path.is_dir():
                path.chmod(0o755)
            os.utime(path, (EPOCH, EPOCH))
        deb = Path(tmp) / "alloy.deb"
        subprocess.run(
            ["dpkg-deb", "--build", "--root-owner-group", "-Zxz", str(tree), str(deb)],
            check=True,
            capture_output=True,
            env={**os.environ, "SOURCE_DATE_EPOCH": str(EPOCH)},
            timeout=120,
        )
        data = deb.read_bytes()
    url_path = f"grafana/alloy/releases/download/v{version}/alloy-{version}-1.{arch}.deb"
    return write(root, url_path, data, binary, version, arch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("loki-zip", "alloy-deb", "all"):
        p = sub.add_parser(name)
        p.add_argument("--root", required=True, help="mirror root (GitHub's paths below it)")
        if name == "all":
            p.add_argument("--loki-version", required=True)
            p.add_argument("--alloy-version", required=True)
        else:
            p.add_argument("--version", required=True)
        p.add_argument("--arch", default="amd64")
        p.add_argument("--tamper", action="store_true", help="a different file, same path")
    args = parser.parse_args()
    if args.command == "loki-zip":
        result = loki_zip(args.root, args.version, args.arch, args.tamper)
    elif args.command == "alloy-deb":
        result = alloy_deb(args.root, args.version, args.arch, args.tamper)
    else:
        result = {
            "loki": loki_zip(args.root, args.loki_version, args.arch, args.tamper),
            "alloy": alloy_deb(args.root, args.alloy_version, args.arch, args.tamper),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
