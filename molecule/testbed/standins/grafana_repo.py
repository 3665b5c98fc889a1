#!/usr/bin/env python3
"""A signed apt repository holding a stand-in ``grafana`` .deb, built on the controller.

TEST FIXTURE: apt.grafana.com is unreachable from the test bed, so the ``grafana``
molecule scenario serves a repository of the same shape (``Suites: stable``,
``Components: main``, ``gpg.key`` at the root, ``InRelease`` clear-signed) from the
controller. Its only package is ``grafana`` with the stand-in server ``grafana.py``
(see its docstring for what it imitates) laid out like the upstream .deb:

* ``/usr/share/grafana/bin/grafana`` (the stand-in) and ``/usr/sbin/grafana`` pointing
  to it; ``/usr/share/grafana/`` as the home path (``conf/``, ``public/``);
* ``/etc/grafana/grafana.ini`` (a conffile), ``/etc/default/grafana-server``;
* ``/lib/systemd/system/grafana-server.service`` shaped like upstream's (User=grafana,
  EnvironmentFile, ``server --config=${CONF_FILE} ... cfg:default.paths.*``, hardening);
* a postinst that creates the grafana system user and group (home /usr/share/grafana)
  when missing, and the data and log directories, and starts nothing, like upstream's.

Not imitated: the real Grafana binary, ``grafana-server``/``grafana-cli`` wrappers,
the rpm repository, ``Release.gpg`` signatures by Grafana's own key, package upgrades.

Signing keys are throwaway ed25519 keys made in a temporary GNUPGHOME under /tmp (short
path: gpg-agent's socket path is limited) and deleted after signing; only their public
halves and fingerprints leave this script.

    grafana_repo.py build --root DIR [--version V] [--other-root DIR2]

builds the repository in DIR signed by key A; DIR/gpg.key holds key A followed by an
unrelated key B (a key file with an extra key: the role must install only the pinned
one). With --other-root, DIR2 gets the same package signed by key B, with only key B in
its gpg.key (a repository whose key does not match the pin). Prints JSON:
``{"version", "fingerprint", "other_fingerprint", "deb", "deb_sha256"}``.
"""

from __future__ import annotations

import argparse
import email.utils
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
DEFAULTS = REPO / "roles" / "grafana" / "defaults" / "main.yml"
ARCH = "amd64"

CONTROL = """\
Package: grafana
Version: {version}
Architecture: {arch}
Maintainer: gpufleet test bed <testbed@invalid>
Installed-Size: {size}
Depends: python3, passwd
Section: default
Priority: optional
Homepage: https://grafana.com
Description: Grafana stand-in (gpufleet test double)
 Imitates the HTTP API subset, provisioning checks and packaging of Grafana that
 gpufleet's grafana role uses. Not Grafana. For the gpufleet test bed only.
"""

POSTINST = """\
#!/bin/sh
# Like upstream's postinst: system user and group, data and log directories; the
# service is not started on first install.
set -e
[ -f /etc/default/grafana-server ] && . /etc/default/grafana-server
GRAFANA_USER=${GRAFANA_USER:-grafana}
GRAFANA_GROUP=${GRAFANA_GROUP:-grafana}
if [ "$1" = configure ]; then
  getent group "$GRAFANA_GROUP" >/dev/null || groupadd --system "$GRAFANA_GROUP"
  if ! getent passwd "$GRAFANA_USER" >/dev/null; then
    useradd --system --gid "$GRAFANA_GROUP" --home-dir /usr/share/grafana \\
      --no-create-home --shell /bin/false "$GRAFANA_USER"
  fi
  mkdir -p /var/log/grafana /var/lib/grafana /var/lib/grafana/plugins
  chown -R "$GRAFANA_USER:$GRAFANA_GROUP" /var/log/grafana /var/lib/grafana
  chmod 755 /var/log/grafana /var/lib/grafana
  chown root:"$GRAFANA_GROUP" /etc/grafana /etc/grafana/grafana.ini
  chmod 755 /etc/grafana
  chmod 640 /etc/grafana/grafana.ini
  if [ -z "$2" ]; then
    echo "### NOT starting on installation, please execute the following statements"
    echo "### to configure grafana to start automatically using systemd"
    echo " sudo /bin/systemctl daemon-reload"
    echo " sudo /bin/systemctl enable grafana-server"
  fi
fi
exit 0
"""

DEFAULT_ENV = """\
GRAFANA_USER=grafana
GRAFANA_GROUP=grafana
GRAFANA_HOME=/usr/share/grafana
LOG_DIR=/var/log/grafana
DATA_DIR=/var/lib/grafana
MAX_OPEN_FILES=10000
CONF_DIR=/etc/grafana
CONF_FILE=/etc/grafana/grafana.ini
RESTART_ON_UPGRADE=true
PLUGINS_DIR=/var/lib/grafana/plugins
PROVISIONING_CFG_DIR=/etc/grafana/provisioning
# Only used on systemd systems
PID_FILE_DIR=/var/run/grafana
"""

UNIT = """\
[Unit]
Description=Grafana instance
Documentation=http://docs.grafana.org
Wants=network-online.target
After=network-online.target
After=postgresql.service mariadb.service mysql.service influxdb.service

[Service]
EnvironmentFile=/etc/default/grafana-server
User=grafana
Group=grafana
Type=simple
Restart=on-failure
WorkingDirectory=/usr/share/grafana
RuntimeDirectory=grafana
RuntimeDirectoryMode=0750
ExecStart=/usr/share/grafana/bin/grafana server                                     \\
                            --config=${CONF_FILE}                                   \\
                            --pidfile=${PID_FILE_DIR}/grafana-server.pid            \\
                            --packaging=deb                                         \\
                            cfg:default.paths.logs=${LOG_DIR}                       \\
                            cfg:default.paths.data=${DATA_DIR}                      \\
                            cfg:default.paths.plugins=${PLUGINS_DIR}                \\
                            cfg:default.paths.provisioning=${PROVISIONING_CFG_DIR}

LimitNOFILE=10000
TimeoutStopSec=20
CapabilityBoundingSet=
DeviceAllow=
LockPersonality=true
MemoryDenyWriteExecute=false
NoNewPrivileges=true
PrivateDevices=true
PrivateTmp=true
ProtectClock=true
ProtectControlGroups=true
ProtectHome=true
ProtectHostname=true
ProtectKernelLogs=true
ProtectKernelModules=true
ProtectKernelTunables=true
ProtectProc=invisible
ProtectSystem=full
RemoveIPC=true
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
RestrictNamespaces=true
RestrictRealtime=true
RestrictSUIDSGID=true
SystemCallArchitectures=native
UMask=0027

[Install]
WantedBy=multi-user.target
"""

GRAFANA_INI = """\
##################### Grafana Configuration (gpufleet stand-in package) #####################
# The packaged default: everything commented out, as upstream ships it.
;app_mode = production

#################################### Paths ####################################
[paths]
;data = /var/lib/grafana
;logs = /var/log/grafana
;plugins = /var/lib/grafana/plugins
;provisioning = conf/provisioning

#################################### Server ####################################
[server]
;http_addr =
;http_port = 3000

#################################### Security ####################################
[security]
;admin_user = admin
;admin_password = admin
"""


def default_version() -> str:
    """grafana_version from the role's defaults (no YAML library needed for one line)."""
    match = re.search(r'^grafana_version:\s*"?([^"\s]+)"?', DEFAULTS.read_text(), re.MULTILINE)
    if not match:
        raise SystemExit(f"grafana_repo: no grafana_version in {DEFAULTS}")
    return match.group(1)


def gpg(home: str, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["gpg", "--homedir", home, "--batch", "--quiet", "--pinentry-mode", "loopback", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout


def make_key(home: str, name: str) -> str:
    """A new ed25519 signing key without passphrase; its fingerprint."""
    uid = f"gpufleet test bed {name} (throwaway) <testbed-{name}@invalid>"
    gpg(home, "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
    for line in gpg(home, "--with-colons", "--list-keys", uid).splitlines():
        if line.startswith("fpr:"):
            return line.split(":")[9]
    raise SystemExit(f"grafana_repo: key {name} was not created")


def build_deb(version: str, out: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="grafana-deb-") as tmp:
        root = Path(tmp) / "root"
        home = root / "usr/share/grafana"
        (home / "bin").mkdir(parents=True)
        (home / "conf/provisioning/datasources").mkdir(parents=True)
        (home / "conf/provisioning/dashboards").mkdir(parents=True)
        (home / "public").mkdir()
        (home / "VERSION").write_text(f"{version}\n")
        (home / "public/README").write_text("The stand-in has no UI.\n")
        source = (HERE / "grafana.py").read_text()
        binary = source.replace('VERSION = "0.0.0-standin"', f'VERSION = "{version}"', 1)
        if binary == source:
            raise SystemExit("grafana_repo: VERSION line not found in grafana.py")
        (home / "bin/grafana").write_text(binary)
        (home / "bin/grafana").chmod(0o755)
        (root / "usr/sbin").mkdir(parents=True)
        (root / "usr/sbin/grafana").symlink_to("../share/grafana/bin/grafana")
        (root / "etc/grafana").mkdir(parents=True)
        (root / "etc/grafana/grafana.ini").write_text(GRAFANA_INI)
        (root / "etc/grafana/grafana.ini").chmod(0o640)
        (root / "etc/default").mkdir(parents=True)
        (root / "etc/default/grafana-server").write_text(DEFAULT_ENV)
        (root / "lib/systemd/system").mkdir(parents=True)
        (root / "lib/systemd/system/grafana-server.service").write_text(UNIT)
        size_kib = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) // 1024 + 1
        debian = root / "DEBIAN"
        debian.mkdir()
        (debian / "control").write_text(CONTROL.format(version=version, arch=ARCH, size=size_kib))
        (debian / "conffiles").write_text("/etc/grafana/grafana.ini\n/etc/default/grafana-server\n")
        (debian / "postinst").write_text(POSTINST)
        (debian / "postinst").chmod(0o755)
        for path in root.rglob("*"):
            if path.is_dir():
                path.chmod(0o755)
        deb = out / f"grafana_{version}_{ARCH}.deb"
        deb.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)],
            check=True,
            capture_output=True,
            timeout=120,
        )
    return deb


def packages_entry(deb: Path, filename: str) -> str:
    control = subprocess.run(
        ["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True
    ).stdout.rstrip("\n")
    data = deb.read_bytes()
    return (
        f"{control}\nFilename: {filename}\nSize: {len(data)}\n"
        f"MD5sum: {hashlib.md5(data).hexdigest()}\n"
        f"SHA1: {hashlib.sha1(data).hexdigest()}\n"
        f"SHA256: {hashlib.sha256(data).hexdigest()}\n\n"
    )


def write_repository(root: Path, deb: Path, gnupghome: str, fingerprint: str, keys: list[str]):
    """pool/, dists/stable/{Release,InRelease,Release.gpg}, Packages(.gz), gpg.key."""
    if root.exists():
        shutil.rmtree(root)
    pool = root / "pool/main/g/grafana"
    pool.mkdir(parents=True)
    shutil.copy(deb, pool / deb.name)
    dist = root / "dists/stable"
    binary = dist / f"main/binary-{ARCH}"
    binary.mkdir(parents=True)
    packages = packages_entry(pool / deb.name, f"pool/main/g/grafana/{deb.name}").encode()
    (binary / "Packages").write_bytes(packages)
    (binary / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    lines = []
    for name in ("Packages", "Packages.gz"):
        data = (binary / name).read_bytes()
        lines.append(
            f" {hashlib.sha256(data).hexdigest()} {len(data):>16} main/binary-{ARCH}/{name}"
        )
    release = (
        "Origin: gpufleet test bed\nLabel: grafana stand-in\nSuite: stable\nCodename: stable\n"
        f"Date: {email.utils.formatdate(usegmt=True)}\nArchitectures: {ARCH}\n"
        "Components: main\nDescription: Grafana stand-in for gpufleet's tests\n"
        "SHA256:\n" + "\n".join(lines) + "\n"
    )
    (dist / "Release").write_text(release)
    release_file = str(dist / "Release")
    gpg(
        gnupghome,
        "--local-user",
        fingerprint,
        "--clearsign",
        "-o",
        str(dist / "InRelease"),
        release_file,
    )
    gpg(
        gnupghome,
        "--local-user",
        fingerprint,
        "--armor",
        "--detach-sign",
        "-o",
        str(dist / "Release.gpg"),
        release_file,
    )
    (root / "gpg.key").write_text(gpg(gnupghome, "--armor", "--export", *keys))


def build(args: argparse.Namespace) -> None:
    version = args.version or default_version()
    out = Path(args.root)
    with tempfile.TemporaryDirectory(prefix="gfk-", dir="/tmp") as gnupghome:
        os.chmod(gnupghome, 0o700)
        try:
            key_a = make_key(gnupghome, "a")
            key_b = make_key(gnupghome, "b")
            with tempfile.TemporaryDirectory(prefix="grafana-pool-") as pool:
                deb = build_deb(version, Path(pool))
                deb_sha256 = hashlib.sha256(deb.read_bytes()).hexdigest()
                write_repository(out, deb, gnupghome, key_a, [key_a, key_b])
                if args.other_root:
                    write_repository(Path(args.other_root), deb, gnupghome, key_b, [key_b])
        finally:
            subprocess.run(
                ["gpgconf", "--homedir", gnupghome, "--kill", "all"], check=False, timeout=30
            )
    print(
        json.dumps(
            {
                "version": version,
                "fingerprint": key_a,
                "other_fingerprint": key_b,
                "deb": f"pool/main/g/grafana/{deb.name}",
                "deb_sha256": deb_sha256,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build")
    p.add_argument("--root", required=True)
    p.add_argument("--version")
    p.add_argument("--other-root")
    args = parser.parse_args()
    build(args)


if __name__ == "__main__":
    main()
