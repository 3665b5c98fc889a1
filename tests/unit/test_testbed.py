"""The test bed's pure parts: Debian suites, molecule platforms, release archives."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "molecule" / "testbed"))

import debian_suite  # noqa: E402
import mirror  # noqa: E402
import testbed  # noqa: E402


@pytest.mark.parametrize(
    ("debian", "upstream"),
    [
        ("3.5.3+ds1-6", "3.5.3"),
        ("0.33.1-5", "0.33.1"),
        ("2:1.11.1-3", "1.11.1"),
        ("24.11.5-4+deb13u1", "24.11.5"),
        ("1.0~rc1-1", "1.0"),
    ],
)
def test_upstream_version_drops_epoch_repack_and_revision(debian, upstream):
    assert debian_suite.upstream_version(debian) == upstream


def test_mirror_url_follows_the_machines_apt_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example.internal/debian\nSuites: bookworm\n"
    )
    assert debian_suite.mirror_url(tmp_path) == "http://mirror.example.internal/debian"
    one_line = tmp_path / "one-line"
    one_line.mkdir()
    (one_line / "sources.list").write_text(
        "deb [signed-by=/usr/share/keyrings/x.gpg] http://ftp.example.org/debian bookworm main\n"
    )
    assert debian_suite.mirror_url(one_line) == "http://ftp.example.org/debian"
    assert debian_suite.mirror_url(tmp_path / "missing") == debian_suite.DEFAULT_MIRROR


def test_an_unknown_suite_is_refused():
    with pytest.raises(SystemExit, match="unknown suite"):
        debian_suite.suite_dir("buster")
    with pytest.raises(SystemExit, match="unknown suite"):
        testbed.image_repo("focal")


def test_each_suite_has_its_own_image_repository():
    assert testbed.image_repo("bookworm") != testbed.image_repo("trixie")


def test_platforms_carry_suite_and_podman_arguments():
    hosts = testbed.parse_platforms(
        '[{"name": "a", "address": "10.0.0.2"},'
        ' {"name": "b", "address": "10.0.0.3", "suite": "trixie",'
        '  "podman_args": ["--cgroupns=private"], "groups": ["x"]}]'
    )
    assert hosts == [
        testbed.Host("a", "10.0.0.2", "bookworm", ()),
        testbed.Host("b", "10.0.0.3", "trixie", ("--cgroupns=private",)),
    ]
    with pytest.raises(SystemExit, match="podman_args must be strings"):
        testbed.parse_platforms('[{"name": "c", "address": "10.0.0.4", "podman_args": "x"}]')


def test_every_scenario_names_a_known_suite():
    """scripts/test builds the images the scenarios name; a typo must not slip through."""
    seen = set()
    for molecule_yml in sorted((ROOT / "molecule").glob("*/molecule.yml")):
        for platform in (yaml.safe_load(molecule_yml.read_text()) or {}).get("platforms", []):
            seen.add(platform.get("suite", testbed.DEFAULT_SUITE))
    assert seen == set(testbed.SUITES)


def test_named_volumes_are_removed_with_their_scenario():
    """`down` removes the volumes named after the scenario's network (gpufleet-SCENARIO-*):
    any other named volume would outlive the scenario and carry data into the next run."""
    for molecule_yml in sorted((ROOT / "molecule").glob("*/molecule.yml")):
        network = f"gpufleet-{molecule_yml.parent.name}"
        for platform in (yaml.safe_load(molecule_yml.read_text()) or {}).get("platforms", []):
            for arg in platform.get("podman_args", []):
                if arg.startswith(("--volume=", "-v=", "--mount=")):
                    source = arg.split("=", 1)[1].split(":", 1)[0]
                    assert source.startswith(("/", f"{network}-")), (molecule_yml, arg)


def test_release_archive_is_reproducible_and_release_shaped():
    binaries = {"prometheus": b"\x7fELF-a", "promtool": b"\x7fELF-b"}
    first = mirror.release_archive("prometheus", "3.5.3", "amd64", binaries)
    assert first == mirror.release_archive("prometheus", "3.5.3", "amd64", dict(binaries))
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        names = {m.name: m for m in tar.getmembers()}
    top = "prometheus-3.5.3.linux-amd64"
    assert set(names) == {f"{top}/prometheus", f"{top}/promtool", f"{top}/LICENSE"}
    assert names[f"{top}/promtool"].mode == 0o755


def test_a_host_started_otherwise_is_not_kept() -> None:
    """A running host is kept only when it was started with the same suite, address,
    network and podman arguments (its shape label): an older demo's hosts are refused."""
    host = testbed.Host("demo-gpu01", "10.203.20.21", "trixie", ("--cgroupns=private",))
    same = testbed.shape(host, "gpufleet-demo")
    assert same == testbed.shape(
        testbed.Host("demo-gpu01", "10.203.20.21", "trixie", ("--cgroupns=private",)),
        "gpufleet-demo",
    )
    others = [
        testbed.Host("demo-gpu01", "10.203.20.21", "bookworm", ("--cgroupns=private",)),
        testbed.Host("demo-gpu01", "10.203.20.22", "trixie", ("--cgroupns=private",)),
        testbed.Host("demo-gpu01", "10.203.20.21", "trixie", ()),
    ]
    assert same not in {testbed.shape(other, "gpufleet-demo") for other in others}
    assert same != testbed.shape(host, "gpufleet-other")


def test_podman_5_on_cgroup_v1_runs_systemd_by_hand_for_a_private_cgroupns(monkeypatch) -> None:
    """Podman 5 refuses a private cgroup namespace in systemd mode on cgroup v1: a host that
    needs one (Slurm's job cgroups) runs systemd without podman's systemd mode, with the
    tmpfs mounts that mode would add; every other host, and every host on podman 4 or
    cgroup v2, keeps `--systemd=always`."""
    ctl = testbed.Host("slurm-ctl", "10.203.13.10", "trixie", ())
    gpu = testbed.Host("slurm-gpu1", "10.203.13.11", "trixie", ("--cgroupns=private",))
    options, command = testbed.systemd_mode(gpu, by_hand=True)
    assert options == [
        "--systemd=false",
        "--tmpfs", "/run:rw,nosuid,nodev,exec",
        "--tmpfs", "/run/lock:rw,nosuid,nodev,exec",
        "--tmpfs", "/tmp:rw,nosuid,nodev,exec",
        "--tmpfs", "/var/log/journal:rw,nosuid,nodev,exec",
    ]  # fmt: skip
    assert command == [
        "/bin/sh", "-c", "mount -o remount,bind,rw /sys/fs/cgroup/systemd; exec /sbin/init"
    ]  # fmt: skip
    systemd_mode = (["--systemd=always"], ["/sbin/init"])
    assert testbed.systemd_mode(ctl, by_hand=True) == systemd_mode
    assert testbed.systemd_mode(gpu, by_hand=False) == systemd_mode

    monkeypatch.setattr(testbed, "cgroup_v1", lambda: True)
    monkeypatch.setattr(testbed, "podman_major", lambda: 5)
    assert testbed.systemd_by_hand()
    monkeypatch.setattr(testbed, "podman_major", lambda: 4)
    assert not testbed.systemd_by_hand()  # Debian 12's podman 4 starts it in systemd mode
    monkeypatch.setattr(testbed, "podman_major", lambda: 5)
    monkeypatch.setattr(testbed, "cgroup_v1", lambda: False)
    assert not testbed.systemd_by_hand()  # cgroup v2: podman 5 starts it in systemd mode


def test_start_host_passes_the_translated_systemd_arguments(monkeypatch) -> None:
    """The `podman run` of a host carries systemd_mode's options in place of
    `--systemd=always` and its command in place of /sbin/init, and the host's own podman
    arguments unchanged."""
    calls: list[list[str]] = []
    monkeypatch.setattr(testbed, "container_running", lambda name: False)
    monkeypatch.setattr(testbed, "run", lambda cmd, **kwargs: calls.append(cmd))
    gpu = testbed.Host("slurm-gpu1", "10.203.13.11", "trixie", ("--cgroupns=private",))
    testbed.start_host(gpu, "gpufleet-slurm", "localhost/img:1", by_hand=True)
    started = calls[-1]
    assert started[:2] == ["podman", "run"]
    assert "--systemd=always" not in started
    assert "--systemd=false" in started
    assert started[-5:-3] == ["--cgroupns=private", "localhost/img:1"]
    assert started[-3:] == testbed.INIT_BY_HAND
    assert started[started.index("--stop-signal") + 1] == "SIGRTMIN+3"
    testbed.start_host(gpu, "gpufleet-slurm", "localhost/img:1", by_hand=False)
    assert "--systemd=always" in calls[-1]
    assert "--systemd=false" not in calls[-1]
    assert calls[-1][-3:] == ["--cgroupns=private", "localhost/img:1", "/sbin/init"]
