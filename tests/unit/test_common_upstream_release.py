"""roles/_common/tasks/upstream_release.yml: the one download-and-verify of gpufleet.

A role says what to install in its vars/main.yml, _<role>_release, and includes the
shared task file from its install step (roles/_common/tasks/repository_key.yml does the
same for a repository's signing key, from _<role>_repository_key).

Rendered: the architecture map, the pin keys, the URLs and the cache of each artifact
kind, and each caller's settings. Run for real (ansible-playbook on this machine, through
a stand-in calling role, artifacts served from file:// URLs): a tarball and a zip
installed and reinstalled without change, check mode, and a tampered artifact refused
with the installed binary left in place.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from render_role import (
    ROLES,
    TRUSTED_FILES,
    evaluate,
    template_value,
)

REPO = ROLES.parent
COMMON = ROLES / "_common" / "tasks"
PIECE = COMMON / "upstream_release.yml"
KEY_PIECE = COMMON / "repository_key.yml"
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
PIN = "a" * 64
# The calling role of the rendered tests that need none of a real role's variables.
CALLER = "caller"


def all_tasks(items: list | None) -> Iterator[dict]:
    """Tasks, the ones in blocks included."""
    for item in items or []:
        yield item
        for key in ("block", "rescue", "always"):
            yield from all_tasks(item.get(key))


def load(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())


def task_named(items: list[dict], name: str) -> dict:
    for task in all_tasks(items):
        if task.get("name") == name:
            return task
    raise AssertionError(f"no task {name!r}")


@functools.cache
def _piece_vars(path: Path) -> dict:
    """The variables the shared file's outer block defines, trusted as Ansible loads them."""
    (outer,) = DataLoader().load_from_file(str(path), **TRUSTED_FILES)
    return dict(outer["vars"])


def piece_vars(path: Path = PIECE) -> dict:
    return dict(_piece_vars(path))


def in_role(role: str, expression: str, overrides: dict, path: Path = PIECE):
    """A value of the shared file, included from ``role`` (its defaults and vars loaded;
    _common: from the stand-in CALLER, whose variables are the overrides)."""
    parent = CALLER if role == "_common" else role
    variables = {**piece_vars(path), "ansible_parent_role_names": [parent], **overrides}
    return evaluate(role, expression, "localhost", variables)


def value(expression: str, arch: str = "x86_64", family: str = "Debian", **release):
    """A value of the shared file for a role whose _<role>_release is ``release`` (its
    download_dir set: the default's lookup reads this machine's HOME)."""
    overrides = {
        "ansible_facts": {"architecture": arch, "os_family": family},
        f"_{CALLER}_release": {"download_dir": "/cache", **release},
    }
    return in_role("_common", expression, overrides)


# --- rendered -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("machine", "upstream"),
    [("x86_64", "amd64"), ("aarch64", "arm64"), ("armv7l", "armv7"), ("ppc64le", "ppc64le")],
)
def test_architecture_map_gives_the_upstream_spelling(machine: str, upstream: str) -> None:
    assert value("__common_release_arch", machine) == upstream


def test_unmapped_architecture_is_refused_in_one_line() -> None:
    check = task_named(load(PIECE), "Check that the host's architecture has an upstream name")
    assert value(check["ansible.builtin.assert"]["that"], "riscv64") is False
    assert value(check["ansible.builtin.assert"]["that"], "x86_64") is True
    message = template_value(
        "_common",
        check["ansible.builtin.assert"]["fail_msg"],
        "localhost",
        {
            **piece_vars(),
            "ansible_parent_role_names": [CALLER],
            "ansible_facts": {"architecture": "riscv64"},
            f"_{CALLER}_release": {"name": "loki"},
        },
    ).strip()
    assert "\n" not in message
    assert message.startswith("loki: no upstream architecture for riscv64 ")
    assert "x86_64, aarch64" in message


def test_no_role_keeps_an_architecture_map_of_its_own() -> None:
    maps = {
        path.relative_to(ROLES).as_posix()
        for path in ROLES.glob("*/vars/main.yml")
        for name in yaml.safe_load(path.read_text()) or {}
        if re.search(r"_arch_map$", name)
    }
    # dcgm_exporter's map spells NVIDIA's repository paths (x86_64, sbsa), not artifacts.
    assert maps == {"dcgm_exporter/vars/main.yml"}
    # The repository keys' map is the releases' one.
    releases = yaml.safe_load(PIECE.read_text())[0]["vars"]["__common_release_arch_map"]
    keys = yaml.safe_load(KEY_PIECE.read_text())[0]["vars"]["__common_key_arch_map"]
    assert keys == releases


@pytest.mark.parametrize(
    ("kind", "arch", "key"),
    [
        ("tar.gz", "x86_64", "amd64"),
        ("zip", "aarch64", "arm64"),
        ("deb", "x86_64", "deb-amd64"),
        ("rpm", "aarch64", "rpm-arm64"),
    ],
)
def test_archives_are_pinned_per_arch_and_packages_per_kind_and_arch(kind, arch, key) -> None:
    pins = {"2.0.0": {key: PIN.upper()}, "1.0.0": {key: "b" * 64}}
    found = value("__common_release_pin", arch, kind=kind, version="2.0.0", sha256=pins)
    assert found == PIN
    other = {"2.0.0": {"amd64" if key != "amd64" else "arm64": PIN}}
    assert value("__common_release_pin", arch, kind=kind, version="2.0.0", sha256=other) == ""


def test_default_url_is_the_prometheus_layout_under_the_mirror() -> None:
    common = {"name": "node_exporter", "project": "prometheus/node_exporter", "version": "1.9.1"}
    assert value("__common_release_source", "aarch64", **common) == (
        "https://github.com/prometheus/node_exporter/releases/download/v1.9.1/node_exporter-1.9.1.linux-arm64.tar.gz"
    )
    mirrored = in_role(
        "_common",
        "__common_release_source",
        {
            "ansible_facts": {"architecture": "x86_64"},
            "gpufleet_mirror_url": "https://mirror.example/gh",
            f"_{CALLER}_release": common,
        },
    )
    assert mirrored == (
        "https://mirror.example/gh/prometheus/node_exporter/releases/download/v1.9.1/node_exporter-1.9.1.linux-amd64.tar.gz"
    )
    assert value("__common_release_top_dir", "x86_64", **common) == (
        "node_exporter-1.9.1.linux-amd64/"
    )


def test_the_download_directory_is_the_site_wide_one_unless_the_role_names_one() -> None:
    def download_dir(release: dict, **site: str) -> str:
        return in_role(
            "_common",
            "__common_release_download_dir",
            {f"_{CALLER}_release": release, **site},
        ).strip()

    assert download_dir({}, gpufleet_download_dir="/srv/mirror") == "/srv/mirror"
    assert download_dir({}).endswith("/.cache/gpufleet/downloads")
    assert download_dir({"download_dir": "/role"}, gpufleet_download_dir="/srv") == "/role"


@pytest.mark.parametrize(
    ("kind", "url", "file", "unpacked"),
    [
        (
            "zip",
            "https://m/grafana/loki/releases/download/v3.7.8/loki-linux-{arch}.zip",
            "loki-linux-arm64.zip",
            "unpacked/",
        ),
        (
            "deb",
            "https://m/alloy/v1.18.1/alloy-1.18.1-1.{arch}.deb",
            "alloy-1.18.1-1.arm64.deb",
            "unpacked/",
        ),
        (
            "rpm",
            "https://m/pool/grafana-13.0.4-1.x86_64.rpm?x=1",
            "grafana-13.0.4-1.x86_64.rpm",
            "unpacked/",
        ),
    ],
)
def test_artifact_is_cached_under_its_checksum(kind, url, file, unpacked) -> None:
    artifact = value(
        "__common_release_resolved",
        "aarch64",
        name="r",
        kind=kind,
        url=url,
        version="1",
        sha256={"1": {"arm64" if kind == "zip" else f"{kind}-arm64": PIN}},
    )
    assert artifact["url"] == url.replace("{arch}", "arm64")
    assert artifact["sha256"] == PIN
    # Another build of the same version (another checksum) never finds this one's files.
    assert artifact["cache"] == f"/cache/r/{PIN}"
    assert artifact["file"] == f"/cache/r/{PIN}/{file}"
    assert artifact["unpacked"] == f"/cache/r/{PIN}/{unpacked}"


def caller_release(role: str, expression: str, arch: str, family: str = "Debian", **overrides):
    """A value of the shared file included from ``role``, with its own _<role>_release."""
    facts = {"architecture": arch, "os_family": family}
    site = {"gpufleet_download_dir": "/cache"}  # the default's lookup reads HOME
    return in_role(role, expression, {"ansible_facts": facts, **site, **overrides})


def test_loki_armv7_is_the_upstream_arm_build() -> None:
    # Loki spells armv7 "arm" (loki-linux-arm.zip); the shared map says armv7.
    pins = {"3.7.8": {"arm": PIN}}
    artifact = caller_release(
        "loki", "__common_release_resolved", "armv7l", loki_binary_sha256=pins
    )
    assert artifact["url"].endswith("/v3.7.8/loki-linux-arm.zip")
    assert artifact["arch"] == "arm"  # the binary inside: loki-linux-arm
    assert artifact["sha256"] == PIN
    assert artifact["cache"] == f"/cache/loki/{PIN}"
    assert caller_release("loki", "__common_release_pin_key", "armv7l") == "arm"
    # Other architectures and other callers keep the shared spelling.
    assert caller_release("loki", "__common_release_source", "aarch64").endswith(
        "/loki-linux-arm64.zip"
    )
    assert value("__common_release_arch", "armv7l") == "armv7"


def test_grafanas_one_checksum_pins_the_key_of_the_hosts_package() -> None:
    for family, machine, key in (
        ("Debian", "x86_64", "deb-amd64"),
        ("RedHat", "aarch64", "rpm-arm64"),
    ):
        overrides = {
            "grafana_package_url": "https://m/grafana.{arch}",
            "grafana_package_sha256": PIN,
        }
        assert caller_release("grafana", "__common_release_pin_key", machine, family) == key
        assert (
            caller_release("grafana", "__common_release_pin", machine, family, **overrides) == PIN
        )


def test_missing_pin_message_names_the_variable_and_the_key() -> None:
    check = task_named(
        load(PIECE), "Check that a checksum is pinned for this version and architecture"
    )
    variables = {
        **piece_vars(),
        "ansible_parent_role_names": [CALLER],
        "ansible_facts": {"architecture": "aarch64"},
        f"_{CALLER}_release": {
            "download_dir": "/cache",
            "name": "alloy",
            "kind": "deb",
            "version": "1.18.1",
            "url": "https://m/alloy-1.18.1-1.{arch}.deb",
            "sha256": {"1.18.1": {"deb-amd64": PIN}},
            "sha256_variable": "alloy_package_sha256",
        },
    }
    that = check["ansible.builtin.assert"]["that"]
    assert (
        evaluate("_common", " and ".join(f"({t})" for t in that), "localhost", variables) is False
    )
    message = " ".join(
        template_value(
            "_common", check["ansible.builtin.assert"]["fail_msg"], "localhost", variables
        ).split()
    )
    pin = '{"1.18.1": {"deb-arm64": "<sha256 of alloy-1.18.1-1.arm64.deb>"}}'
    assert f"checksum file, to alloy_package_sha256 as {pin}" in message


def test_upstream_release_is_the_only_download_and_verify() -> None:
    downloads = {
        path.relative_to(ROLES).as_posix()
        for path in ROLES.glob("*/tasks/*.yml")
        if re.search(r"\b(get_url|checksum):", path.read_text())
    }
    assert downloads == {"_common/tasks/upstream_release.yml", "_common/tasks/repository_key.yml"}


# Every role that includes a shared download: (role, file, its install tags, piece).
CALLERS = [
    (
        "node_exporter",
        "install_binary.yml",
        ["node_exporter", "node_exporter_install"],
        "upstream_release",
    ),
    ("prometheus", "install.yml", ["prometheus", "prometheus_install"], "upstream_release"),
    ("alertmanager", "install.yml", ["alertmanager", "alertmanager_install"], "upstream_release"),
    ("loki", "install.yml", ["loki", "loki_install"], "upstream_release"),
    ("alloy", "install.yml", ["alloy", "alloy_install"], "upstream_release"),
    ("grafana", "install_package.yml", ["grafana", "grafana_install"], "upstream_release"),
    ("grafana", "install_repository.yml", ["grafana", "grafana_install"], "repository_key"),
    (
        "dcgm_exporter",
        "install_package.yml",
        ["dcgm_exporter", "dcgm_exporter_install"],
        "repository_key",
    ),
]
# What each piece reads from _<role>_release / _<role>_repository_key: the keys a role
# must give, and the ones it may.
RELEASE_KEYS = {"name", "version", "notify"}
RELEASE_OPTIONAL = {
    "kind", "project", "url", "base_url", "arch_names", "sha256", "sha256_variable",
    "binaries", "install_dir", "download_dir",
}  # fmt: skip
KEY_KEYS = {"name", "url", "fingerprint", "dest"}
KEY_OPTIONAL = {"download_dir", "arch_names"}


def internal(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "vars" / "main.yml").read_text()) or {}


@pytest.mark.parametrize(("role", "file", "tags", "piece"), CALLERS)
def test_callers_include_the_shared_file_with_their_tags(role, file, tags, piece) -> None:
    (call,) = [
        task
        for task in load(ROLES / role / "tasks" / file)
        if (task.get("ansible.builtin.include_role") or {}).get("tasks_from") == piece
    ]
    include = call["ansible.builtin.include_role"]
    assert include["name"] == "_common"
    # Without apply, a --tags run of the role would skip every included task.
    assert include["apply"]["tags"] == tags
    # ansible-lint refuses vars passed to a role named _*: the role's vars/main.yml says.
    assert "vars" not in call and "vars" not in include


@pytest.mark.parametrize(("role", "file", "tags", "piece"), CALLERS)
def test_callers_say_what_to_install_in_their_vars(role, file, tags, piece) -> None:
    if piece == "upstream_release":
        settings = internal(role)[f"_{role}_release"]
        assert RELEASE_KEYS <= set(settings) <= RELEASE_KEYS | RELEASE_OPTIONAL, sorted(settings)
        # A handler of the role listens on what the install notifies.
        assert settings["notify"] == f"restart {role}"
        # The message of a missing pin names the variable users add it to.
        assert "sha256" in settings and f"{role}_" in settings["sha256_variable"]
    else:
        settings = internal(role)[f"_{role}_repository_key"]
        assert KEY_KEYS <= set(settings) <= KEY_KEYS | KEY_OPTIONAL, sorted(settings)


def test_every_caller_is_in_the_list_above() -> None:
    callers = set()
    for path in ROLES.glob("*/tasks/*.yml"):
        for task in all_tasks(load(path)):
            include = task.get("ansible.builtin.include_role") or {}
            if include.get("tasks_from") in ("upstream_release", "repository_key"):
                callers.add((path.parent.parent.name, path.name))
    assert callers == {(role, file) for role, file, _, _ in CALLERS}
    assert not (ROLES / "upstream_release").exists()


def test_package_install_waits_for_the_verified_copy_and_is_check_mode_safe() -> None:
    main = load(PIECE)[0]["block"]
    names = [t["name"] for t in main]
    assert names.index("Download and verify the artifacts on the controller") < names.index(
        "Install the package"
    )
    block = task_named(main, "Install the package")["block"]
    for task, module in ((block[2], "ansible.builtin.apt"), (block[3], "ansible.builtin.dnf")):
        assert module in task
        assert "__common_release_package_file.dest" in str(task[module])
        assert (
            "not (ansible_check_mode and __common_release_package_file is changed)" in task["when"]
        )
    controller = task_named(main, "Download and verify the artifacts on the controller")
    assert (controller["run_once"], controller["delegate_to"], controller["check_mode"]) == (
        True,
        "localhost",
        False,
    )
    download = task_named(main, "Download the artifacts")["ansible.builtin.get_url"]
    assert download["checksum"] == "sha256:{{ item.sha256 }}"
    # What the roles' later tasks read (loki's and alloy's configuration check).
    report = task_named(main, "Report whether anything was installed")
    assert "upstream_release_changed" in report["ansible.builtin.set_fact"]


# --- run for real -------------------------------------------------------------------

PLAYBOOK = """
- name: Install a release as a calling role does
  hosts: all
  gather_facts: true
  gather_subset: [min]
  roles: [release_caller]
"""
# A stand-in for a role that installs a release: its _<role>_release is the test's.
CALLER_TASKS = """
- name: Install
  ansible.builtin.include_role:
    name: _common
    tasks_from: upstream_release
"""
CALLER_VARS = """
_release_caller_release: "{{ release }}"
"""

ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "")


def served_release(
    tmp: Path, name: str, version: str, kind: str, file: str, pin: str, binaries: list
) -> dict:
    """_<role>_release for a file served as tmp/served/file, pinned to ``pin`` for this
    machine, installed into tmp/bin and cached under tmp/cache."""
    return {
        "name": name,
        "version": version,
        "kind": kind,
        "url": f"file://{tmp / 'served'}/{file}",
        "sha256": {version: {ARCH: pin}},
        "binaries": binaries,
        "install_dir": str(tmp / "bin"),
        "download_dir": str(tmp / "cache"),
    }


def script(text: str) -> bytes:
    return f"#!/bin/sh\necho {text}\n".encode()


def tarball(path: Path, top: str, files: dict[str, bytes]) -> str:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode, info.uid, info.gid = len(data), 0o755, 1234, 1234
            archive.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def zipped(path: Path, files: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recap(output: str) -> dict[str, int]:
    match = re.search(r"^localhost\s+:\s+(ok=.*)$", output, re.MULTILINE)
    assert match, output[-3000:]
    return {key: int(count) for key, count in (item.split("=") for item in match.group(1).split())}


def play(tmp: Path, release: dict, *args: str) -> tuple[int, str]:
    playbook = tmp / "play.yml"
    playbook.write_text(PLAYBOOK)
    # Next to the playbook, where Ansible looks for roles first; _common comes from
    # ansible.cfg's roles_path.
    caller = tmp / "roles" / "release_caller"
    for part, text in (("tasks", CALLER_TASKS), ("vars", CALLER_VARS)):
        (caller / part).mkdir(parents=True, exist_ok=True)
        (caller / part / "main.yml").write_text(f"---{text}")
    extra = tmp / "release.yml"
    extra.write_text(yaml.safe_dump({"release": release}))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        # Facts cached under tmp, as ansible.cfg caches them (jsonfile, gathering=smart): a
        # test's later runs reuse its first run's facts, as a rerun does, and no facts
        # cached elsewhere (a test bed's) come in.
        "ANSIBLE_CACHE_PLUGIN": "jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp / "facts"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
        "ANSIBLE_HOME": str(tmp / "ansible-home"),
        "ANSIBLE_DEPRECATION_WARNINGS": "0",
    }
    run = subprocess.run(
        [
            str(ANSIBLE_PLAYBOOK),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "-e",
            f"@{extra}",
            str(playbook),
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return run.returncode, run.stdout + run.stderr


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not ARCH, reason="installs root-owned files; amd64 or arm64 only"
)


@needs_root
def test_tarball_installs_once_and_a_tampered_one_leaves_the_old_binary(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    top = f"node_exporter-1.0.0.linux-{ARCH}"
    genuine = tarball(
        served / f"{top}.tar.gz", top, {"node_exporter": script("genuine"), "LICENSE": b"x"}
    )
    installed = tmp_path / "bin" / "node_exporter"
    release = served_release(
        tmp_path,
        "node_exporter",
        "1.0.0",
        "tar.gz",
        "node_exporter-1.0.0.linux-{arch}.tar.gz",
        genuine,
        ["node_exporter-1.0.0.linux-{arch}/node_exporter"],
    )
    installed.parent.mkdir()

    # Check mode on a fresh host: reported, nothing installed.
    rc, output = play(tmp_path, release, "--check")
    assert rc == 0, output[-4000:]
    assert recap(output)["changed"] > 0 and not installed.exists()

    rc, output = play(tmp_path, release)
    assert rc == 0, output[-4000:]
    assert installed.read_bytes() == script("genuine")
    assert installed.stat().st_mode & 0o777 == 0o755
    assert not (installed.parent / "LICENSE").exists(), "only the named binaries"

    rc, output = play(tmp_path, release)
    assert rc == 0, output[-4000:]
    assert recap(output)["changed"] == 0, output[-4000:]

    # The mirror now serves another file under the pinned name: refused on the
    # controller, the binary of the last good run stays, and the file is not kept.
    tarball(served / f"{top}.tar.gz", top, {"node_exporter": script("tampered")})
    tampered = {**release, "download_dir": str(tmp_path / "fresh-cache")}
    rc, output = play(tmp_path, tampered)
    flat = " ".join(output.split())
    assert rc != 0
    assert "node_exporter 1.0.0 could not be fetched and verified" in flat
    assert "checksum" in flat.lower() and "nothing was installed" in flat
    assert installed.read_bytes() == script("genuine")
    assert not list((tmp_path / "fresh-cache").rglob("*.tar.gz")), "a refused file was kept"
    assert recap(output)["changed"] == 1, "only the empty cache directory was created"


@needs_root
def test_zip_binary_is_installed_under_the_callers_name(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    pin = zipped(served / f"loki-linux-{ARCH}.zip", {f"loki-linux-{ARCH}": script("loki")})
    release = served_release(
        tmp_path,
        "loki",
        "3.7.8",
        "zip",
        "loki-linux-{arch}.zip",
        pin,
        [{"src": "loki-linux-{arch}", "dest": "loki"}],
    )
    (tmp_path / "bin").mkdir()
    rc, output = play(tmp_path, release)
    assert rc == 0, output[-4000:]
    assert (tmp_path / "bin" / "loki").read_bytes() == script("loki")
    assert (tmp_path / "cache" / "loki" / pin / f"loki-linux-{ARCH}.zip").exists()
    rc, output = play(tmp_path, release)
    assert rc == 0 and recap(output)["changed"] == 0, output[-4000:]

    # A tampered zip, the cache directory already there: refused, and nothing at all
    # changed (no unpack directory is made before the download is verified).
    zipped(served / f"loki-linux-{ARCH}.zip", {f"loki-linux-{ARCH}": script("tampered")})
    prepared = tmp_path / "c3" / "loki" / pin
    prepared.mkdir(parents=True)
    prepared.chmod(0o755)
    rc, output = play(tmp_path, {**release, "download_dir": str(tmp_path / "c3")})
    assert rc != 0 and recap(output)["changed"] == 0, output[-4000:]
    assert (tmp_path / "bin" / "loki").read_bytes() == script("loki")
    assert list(prepared.iterdir()) == []

    # A pin for another architecture only: refused before anything is fetched.
    rc, output = play(
        tmp_path,
        {**release, "sha256": {"3.7.8": {"s390x": pin}}, "download_dir": str(tmp_path / "c2")},
    )
    flat = " ".join(output.split())
    assert rc != 0 and f"No sha256 is pinned for loki 3.7.8 (zip, {ARCH})" in flat
    assert not (tmp_path / "c2").exists()
