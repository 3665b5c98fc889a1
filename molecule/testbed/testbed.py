#!/usr/bin/env python3
"""gpufleet test bed: real systemd hosts as podman containers, built from Debian.

No container registry is reachable from the build machines, so the base image is
made with debootstrap and imported into podman. Hosts are systemd containers on a
podman network with static addresses, reachable from the controller over SSH.

    testbed.py setup                       configure podman (scripts/bootstrap installs it)
    testbed.py image [--suite S]...        build the base images once (cached per suite and recipe)
    testbed.py up --network NET [--suite S] NAME=ADDR...
                                           create hosts (idempotent), print JSON
    testbed.py up --network NET --platforms JSON
                                           the same for molecule platforms, each with its own
                                           suite and extra podman arguments
    testbed.py restart NAME                reboot a host (systemd stop/start)
    testbed.py down --network NET NAME     remove hosts and, when empty, the network

Standard library only: it runs before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATE_DIR = Path(os.environ.get("GPUFLEET_TESTBED_DIR", REPO / ".cache" / "testbed"))
PUBKEY = STATE_DIR / "id_ed25519.pub"  # ssh_key()'s public half, root's login on every host
# Debian 12 and 13: the platforms meta/main.yml claims and CI runs.
SUITES = ("bookworm", "trixie")
DEFAULT_SUITE = "bookworm"
IMAGE_REPO = "localhost/gpufleet-testbed"
NETAVARK = ("/usr/lib/podman/netavark", "/usr/lib/podman/aardvark-dns")
# Installed in the image: what every managed host has before Ansible touches it.
BASE_PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-apt",
    "iproute2",
    "procps",
    "curl",
    "ca-certificates",
    "sudo",
    "gnupg",
    "openssh-server",
    "less",
]
# Downloaded into the image's apt cache, not installed: the roles install them for
# real, but every host fetching the same .debs would be slow.
PRECACHED_PACKAGES = [
    "prometheus-node-exporter",
    "prometheus",
    "prometheus-alertmanager",
    "slurmctld",
    "slurmd",
    "slurm-client",
    "munge",
    "victoria-metrics",
    "nftables",
    # The Slurm exporter checks basic auth passwords with it.
    "python3-bcrypt",
]
CONTAINERS_CONF = """\
# Written by gpufleet's test bed: crun fails on these hosts (hybrid cgroups) and the
# default ulimits exceed what an unprivileged sandbox may set.
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
# Name resolution between the hosts of a network (aardvark-dns); CNI has none here.
[network]
network_backend = "netavark"
"""
SSHD_KEYGEN_DROPIN = """\
[Service]
# Host keys are made on first boot, so no two test hosts share them.
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
"""


def log(message: str) -> None:
    print(f"testbed: {message}", file=sys.stderr, flush=True)


def run(
    cmd: list[str],
    *,
    check: bool = True,
    capture: bool = False,
    timeout: float | None = 900,
    **kwargs,
) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd,
        check=check,
        text=True,
        timeout=timeout,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        **kwargs,
    )


def ssh_key() -> Path:
    key = STATE_DIR / "id_ed25519"
    if not key.exists():
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "gpufleet-testbed",
                "-f",
                str(key),
            ]
        )
    return key


def setup() -> None:
    missing = [
        tool
        for tool in ("podman", "runc", "iptables", "debootstrap", "ssh-keygen", "newuidmap")
        if shutil.which(tool) is None
    ]
    missing += [path for path in NETAVARK if not Path(path).exists()]
    if missing:
        raise SystemExit(
            f"testbed: {', '.join(missing)} missing: scripts/bootstrap installs the test bed's "
            "packages (scripts/packages.txt)"
        )
    conf = Path("/etc/containers/containers.conf")
    if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(CONTAINERS_CONF)
    ssh_key()


def recipe_digest(suite: str) -> str:
    recipe = json.dumps(
        {
            "suite": suite,
            "base": BASE_PACKAGES,
            "cached": PRECACHED_PACKAGES,
            "dropin": SSHD_KEYGEN_DROPIN,
            "version": 4,
        },
        sort_keys=True,
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def image_repo(suite: str) -> str:
    if suite not in SUITES:
        raise SystemExit(f"testbed: unknown suite {suite!r} (one of {', '.join(SUITES)})")
    return f"{IMAGE_REPO}-{suite}"


def image_tag(suite: str = DEFAULT_SUITE) -> str:
    return f"{image_repo(suite)}:{recipe_digest(suite)}"


def image_exists(tag: str) -> bool:
    return run(["podman", "image", "exists", tag], check=False).returncode == 0


def prepare_rootfs(rootfs: Path) -> None:
    # The login key is mounted at start (start_host), not baked in: one image serves every
    # checkout of the machine, each with its own key.
    (rootfs / "root" / ".ssh").mkdir(mode=0o700, parents=True, exist_ok=True)
    for host_key in (rootfs / "etc" / "ssh").glob("ssh_host_*"):
        host_key.unlink()
    dropin = rootfs / "etc" / "systemd" / "system" / "ssh.service.d"
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "gpufleet-keygen.conf").write_text(SSHD_KEYGEN_DROPIN)
    # systemd makes a fresh machine-id per container when the file is empty.
    (rootfs / "etc" / "machine-id").write_text("")
    (rootfs / "etc" / "apt" / "apt.conf.d" / "00gpufleet-keep-debs").write_text(
        'APT::Keep-Downloaded-Packages "true";\n'
        'Binary::apt::APT::Keep-Downloaded-Packages "true";\n'
    )
    shutil.copy("/etc/resolv.conf", rootfs / "etc" / "resolv.conf")
    run(["chroot", str(rootfs), "apt-get", "update", "-qq"])
    run(
        [
            "chroot",
            str(rootfs),
            "apt-get",
            "install",
            "-y",
            "-qq",
            "--download-only",
            *PRECACHED_PACKAGES,
        ]
    )
    # Lists stay, so roles can install from the cache without a slow update.


def build_image(suite: str = DEFAULT_SUITE) -> str:
    tag = image_tag(suite)
    if image_exists(tag):
        return tag
    log(f"building {tag} with debootstrap (about a minute)")
    with tempfile.TemporaryDirectory(prefix="gpufleet-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                suite,
                str(rootfs),
            ],
            capture=True,
        )
        prepare_rootfs(rootfs)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        run(
            ["podman", "import", "--change", 'CMD ["/sbin/init"]', "-", tag],
            stdin=tar.stdout,
            capture=True,
        )
        if tar.wait() != 0:
            raise SystemExit("testbed: tar of the root file system failed")
    prune_images(image_repo(suite), keep=tag)
    return tag


def prune_images(repo: str, keep: str) -> None:
    """Drop the suite's images of older recipes (about 600 MB each); in-use ones stay."""
    listed = run(
        [
            "podman",
            "images",
            "--format",
            "{{.Repository}}:{{.Tag}}",
            "--filter",
            f"reference={repo}",
        ],
        check=False,
        capture=True,
    ).stdout
    for old in set(listed.split()) - {keep}:
        run(["podman", "rmi", old], check=False, capture=True)


def ensure_network(name: str, addresses: list[str]) -> None:
    if run(["podman", "network", "exists", name], check=False).returncode == 0:
        return
    subnet = ipaddress.ip_network(f"{addresses[0]}/24", strict=False)
    if any(ipaddress.ip_address(a) not in subnet for a in addresses):
        raise SystemExit(f"testbed: all addresses of network {name} must be in {subnet}")
    run(["podman", "network", "create", "--subnet", str(subnet), name], capture=True)


def container_running(name: str) -> bool:
    result = run(
        ["podman", "inspect", "--format", "{{.State.Running}}", name], check=False, capture=True
    )
    return result.returncode == 0 and result.stdout.strip() == "true"


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    suite: str = DEFAULT_SUITE
    # Extra `podman run` arguments a scenario needs (e.g. Slurm's job cgroups).
    podman_args: tuple[str, ...] = ()


SHAPE_LABEL = "gpufleet.testbed.shape"


def shape(host: Host, network: str) -> str:
    """What a running host must have been started with to be kept as it is."""
    wanted = [host.suite, host.address, network, str(PUBKEY), *host.podman_args]
    return hashlib.sha256(json.dumps(wanted).encode()).hexdigest()[:16]


def start_host(host: Host, network: str, tag: str, by_hand: bool = False) -> None:
    name, address = host.name, host.address
    if container_running(name):
        started_as = run(
            ["podman", "inspect", "--format", f'{{{{ index .Config.Labels "{SHAPE_LABEL}" }}}}',
             name], check=False, capture=True,
        ).stdout.strip()  # fmt: skip
        if started_as != shape(host, network):
            raise SystemExit(
                f"testbed: {name} runs with another suite, address, network, login key or "
                "podman arguments than asked (an older test bed?): remove it first (scripts/demo "
                "down, or molecule destroy)"
            )
        return
    run(["podman", "rm", "-f", name], check=False, capture=True)
    options, command = systemd_mode(host, by_hand)
    run(
        [
            "podman",
            "run",
            "-d",
            "--name",
            name,
            "--hostname",
            name,
            "--network",
            network,
            "--ip",
            address,
            *options,
            "--stop-signal",
            "SIGRTMIN+3",
            # Services under test use systemd sandboxing, which needs mount namespaces.
            "--cap-add",
            "SYS_ADMIN",
            # exporter_firewall loads an nftables table in the host's network namespace.
            "--cap-add",
            "NET_ADMIN",
            "--security-opt",
            "seccomp=unconfined",
            "--label",
            "gpufleet.testbed=1",
            "--label",
            f"{SHAPE_LABEL}={shape(host, network)}",
            "--volume",
            f"{PUBKEY}:/root/.ssh/authorized_keys:ro",
            *host.podman_args,
            tag,
            *command,
        ],
        capture=True,
    )


def wait_ready(name: str, address: str, deadline_s: float = 90) -> None:
    key = ssh_key()
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        state = run(
            ["podman", "exec", name, "systemctl", "is-system-running"], check=False, capture=True
        ).stdout.strip()
        if state in ("running", "degraded"):
            probe = run(
                [
                    "ssh",
                    "-i",
                    str(key),
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    "StrictHostKeyChecking=no",
                    "-o",
                    "UserKnownHostsFile=/dev/null",
                    "-o",
                    "ConnectTimeout=3",
                    "-o",
                    "LogLevel=ERROR",
                    f"root@{address}",
                    "true",
                ],
                check=False,
                capture=True,
                timeout=15,
            )
            if probe.returncode == 0:
                return
        time.sleep(1)
    raise SystemExit(f"testbed: {name} ({address}) did not come up within {deadline_s:.0f}s")


def parse_hosts(specs: list[str], suite: str = DEFAULT_SUITE) -> list[Host]:
    hosts = []
    for spec in specs:
        name, sep, address = spec.partition("=")
        if not sep:
            raise SystemExit(f"testbed: expected NAME=ADDRESS, got {spec!r}")
        ipaddress.ip_address(address)
        hosts.append(Host(name, address, suite))
    return hosts


def parse_platforms(text: str) -> list[Host]:
    """Molecule platforms as JSON: name, address, optional suite and podman_args."""
    hosts = []
    for platform in json.loads(text):
        args = platform.get("podman_args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise SystemExit(f"testbed: {platform.get('name')}: podman_args must be strings")
        ipaddress.ip_address(platform["address"])
        suite = platform.get("suite", DEFAULT_SUITE)
        image_repo(suite)
        hosts.append(Host(platform["name"], platform["address"], suite, tuple(args)))
    return hosts


def podman_major() -> int:
    answer = run(["podman", "--version"], check=False, capture=True).stdout.split()
    version = answer[-1] if answer else ""
    return int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0


def cgroup_v1() -> bool:
    """The kernel's cgroups are v1 or hybrid (no unified hierarchy at /sys/fs/cgroup)."""
    return not Path("/sys/fs/cgroup/cgroup.controllers").exists()


# What podman's systemd mode mounts for systemd (tmpfs /run, /run/lock, /tmp and
# /var/log/journal), spelled out for the hosts that run without it (systemd_mode).
SYSTEMD_TMPFS = ("/run", "/run/lock", "/tmp", "/var/log/journal")
# Their PID 1 before systemd: runc mounts the cgroup hierarchies read-only, and systemd
# needs to write its own (name=systemd) before it starts. If the remount fails, systemd
# still boots and logs that it cannot create its compat cgroups.
INIT_BY_HAND = ["/bin/sh", "-c", "mount -o remount,bind,rw /sys/fs/cgroup/systemd; exec /sbin/init"]


def systemd_by_hand() -> bool:
    """Podman 5 (Debian 13) refuses a private cgroup namespace in systemd mode on cgroup v1
    ("cgroup namespace is not supported with cgroup v1 and systemd mode"); Debian 12's
    podman 4 starts it."""
    return cgroup_v1() and podman_major() >= 5


def systemd_mode(host: Host, by_hand: bool) -> tuple[list[str], list[str]]:
    """The `podman run` options and command that run systemd as the host's PID 1: podman's
    `--systemd=always` and /sbin/init, or, for a host that needs a private cgroup
    namespace (Slurm's job cgroups) where podman refuses that in systemd mode
    (systemd_by_hand), `--systemd=false` with the tmpfs mounts systemd mode would add, and
    INIT_BY_HAND. runc then mounts every cgroup v1 hierarchy, name=systemd included, from
    inside the namespace: rooted at the container's own cgroups, so systemd and slurmd
    make theirs in the container's subtree, never at the host's roots. (Podman 4's systemd
    mode bind-mounts the host's whole name=systemd hierarchy instead, which a private
    namespace's systemd then writes at its root.) The stop signal is start_host's."""
    if by_hand and "--cgroupns=private" in host.podman_args:
        tmpfs = [
            arg for path in SYSTEMD_TMPFS for arg in ("--tmpfs", f"{path}:rw,nosuid,nodev,exec")
        ]
        return ["--systemd=false", *tmpfs], INIT_BY_HAND
    return ["--systemd=always"], ["/sbin/init"]


def up(network: str, hosts: list[Host]) -> None:
    setup()
    by_hand = systemd_by_hand()
    tags = {suite: build_image(suite) for suite in sorted({h.suite for h in hosts})}
    ensure_network(network, [h.address for h in hosts])
    for host in hosts:
        start_host(host, network, tags[host.suite], by_hand)
    for host in hosts:
        wait_ready(host.name, host.address)
    print(
        json.dumps(
            [
                {
                    "instance": host.name,
                    "address": host.address,
                    "user": "root",
                    "port": 22,
                    "identity_file": str(ssh_key()),
                }
                for host in hosts
            ]
        )
    )


def restart(name: str, address: str) -> None:
    run(["podman", "restart", "--time", "20", name], capture=True)
    wait_ready(name, address)


def probe(network: str, command: list[str]) -> None:
    """Run command on a throwaway host of the network: traffic from a peer, not the bridge."""
    result = run(
        ["podman", "run", "--rm", "--network", network, "--systemd=false", image_tag(), *command],
        check=False,
        timeout=120,
    )
    raise SystemExit(result.returncode)


def down(network: str, names: list[str]) -> None:
    """Remove the hosts, and the network with any other test bed host still on it."""
    on_network = run(
        [
            "podman",
            "ps",
            "-a",
            "-q",
            "--filter",
            f"network={network}",
            "--filter",
            "label=gpufleet.testbed=1",
        ],
        check=False,
        capture=True,
    ).stdout.split()
    for name in [*names, *on_network]:
        run(["podman", "rm", "-f", "--time", "5", name], check=False, capture=True)
    run(["podman", "network", "rm", "-f", network], check=False, capture=True)
    # Named volumes a scenario's hosts share (podman_args "--volume=<network>-NAME:PATH")
    # go with the network.
    volumes = run(["podman", "volume", "ls", "-q"], check=False, capture=True).stdout.split()
    for volume in volumes:
        if volume.startswith(f"{network}-"):
            run(["podman", "volume", "rm", "-f", volume], check=False, capture=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup")
    p_image = sub.add_parser("image")
    p_image.add_argument("--suite", action="append", choices=SUITES)
    sub.add_parser("key")
    p_up = sub.add_parser("up")
    p_up.add_argument("--network", required=True)
    p_up.add_argument("--suite", default=DEFAULT_SUITE, choices=SUITES)
    p_up.add_argument("--platforms", help="molecule platforms as a JSON list")
    p_up.add_argument("hosts", nargs="*", metavar="NAME=ADDRESS")
    p_restart = sub.add_parser("restart")
    p_restart.add_argument("host", metavar="NAME=ADDRESS")
    p_probe = sub.add_parser("probe")
    p_probe.add_argument("--network", required=True)
    p_probe.add_argument("probe_command", nargs=argparse.REMAINDER)
    p_down = sub.add_parser("down")
    p_down.add_argument("--network", required=True)
    p_down.add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "setup":
        setup()
    elif args.command == "image":
        setup()
        for suite in args.suite or [DEFAULT_SUITE]:
            print(build_image(suite))
    elif args.command == "key":
        print(ssh_key())
    elif args.command == "up":
        hosts = parse_hosts(args.hosts, args.suite)
        if args.platforms:
            hosts += parse_platforms(args.platforms)
        if not hosts:
            parser.error("up needs NAME=ADDRESS hosts or --platforms")
        up(args.network, hosts)
    elif args.command == "restart":
        (host,) = parse_hosts([args.host])
        restart(host.name, host.address)
    elif args.command == "probe":
        command = args.probe_command
        probe(args.network, command[1:] if command[:1] == ["--"] else command)
    elif args.command == "down":
        down(args.network, args.names)


if __name__ == "__main__":
    main()
