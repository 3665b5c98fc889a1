"""gpufleet.file_sync: which files a copy loop must still write, from one find."""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import subprocess
from pathlib import Path

from gpufleet.file_sync import (
    STAT_FORMAT,
    sha1_of,
    stale_contents,
    stale_directories,
    stale_sources,
)

DEST = "/var/lib/grafana/dashboards/gpufleet"


def sources(tmp_path: Path) -> list[str]:
    made = []
    for name, text in (("a.json", '{"a": 1}\n'), ("b.json", '{"b": "ü"}')):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        made.append(str(path))
    return made


def found(source: str, **changes: str) -> dict:
    """One file as ansible.builtin.find reports it with get_checksum: true."""
    entry = {
        "path": f"{DEST}/{Path(source).name}",
        "checksum": sha1_of(source),
        "mode": "0644",
        "pw_name": "root",
        "gr_name": "root",
    }
    return {**entry, **changes}


def test_the_checksum_is_sha1_of_the_bytes(tmp_path: Path) -> None:
    (first, _) = sources(tmp_path)
    assert sha1_of(first) == hashlib.sha1(Path(first).read_bytes()).hexdigest()


def test_nothing_is_stale_where_every_copy_matches(tmp_path: Path) -> None:
    files = sources(tmp_path)
    assert stale_sources(files, DEST, [found(f) for f in files], "0644", "root", "root") == []


def test_a_missing_or_different_copy_is_stale(tmp_path: Path) -> None:
    a, b = sources(tmp_path)
    assert stale_sources([a, b], DEST, [found(b)], "0644", "root", "root") == [a]
    assert stale_sources([a, b], DEST, [], "0644", "root", "root") == [a, b]
    for change in (
        {"checksum": "0" * 40},
        {"mode": "0664"},
        {"pw_name": "grafana"},
        {"gr_name": "grafana"},
        {"checksum": ""},  # find without get_checksum
    ):
        listed = [found(a, **change), found(b)]
        assert stale_sources([a, b], DEST, listed, "0644", "root", "root") == [a], change


def test_the_copy_is_matched_by_base_name_in_the_destination(tmp_path: Path) -> None:
    (a, _) = sources(tmp_path)
    elsewhere = found(a, path=f"/tmp/{Path(a).name}")
    assert stale_sources([a], DEST, [elsewhere], "0644", "root", "root") == [a]
    # The mode as find writes it, with or without its leading zero.
    assert stale_sources([a], DEST, [found(a, mode="644")], "0644", "root", "root") == []


def test_content_is_stale_unless_its_copy_matches_byte_for_byte() -> None:
    text = '[{"targets": ["10.0.0.1:9100"]}]\n'
    path = f"{DEST}/node.json"
    entry = {
        "path": path,
        "checksum": hashlib.sha1(text.encode()).hexdigest(),
        "mode": "0640",
        "pw_name": "root",
        "gr_name": "prometheus",
    }
    wanted = {path: text, f"{DEST}/dcgm.json": "[]\n"}
    assert stale_contents(wanted, [entry], "0640", "root", "prometheus") == [f"{DEST}/dcgm.json"]
    assert stale_contents({path: text.rstrip()}, [entry], "0640", "root", "prometheus") == [path]
    assert stale_contents({path: text}, [entry], "0644", "root", "prometheus") == [path]
    # Not ASCII: compared as the UTF-8 bytes copy writes.
    umlaut = "Grüße\n"
    entry["checksum"] = hashlib.sha1(umlaut.encode()).hexdigest()
    assert stale_contents({path: umlaut}, [entry], "0640", "root", "prometheus") == []


def stat_of(*paths: Path) -> list[str]:
    """What the roles' directory look prints for paths, from the real stat."""
    result = subprocess.run(
        ["stat", "--printf", STAT_FORMAT, "--", *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.splitlines()


def test_a_directory_is_stale_unless_stat_shows_it_as_wanted(tmp_path: Path) -> None:
    user = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    good, loose, plain = tmp_path / "good", tmp_path / "loose", tmp_path / "file"
    good.mkdir(mode=0o750)
    good.chmod(0o750)
    loose.mkdir()
    loose.chmod(0o777)
    plain.write_text("")
    plain.chmod(0o750)
    missing = tmp_path / "missing"
    wanted = [
        {"path": str(path), "mode": "0750", "owner": user, "group": group}
        for path in (good, loose, plain, missing)
    ]
    lines = stat_of(good, loose, plain, missing)
    assert len(lines) == 3  # stat says nothing of the missing path on stdout
    stale = stale_directories(wanted, lines)
    assert [entry["path"] for entry in stale] == [str(loose), str(plain), str(missing)]
    # Another owner is stale; an owner left out (check mode, no user yet) is not compared.
    other = {"path": str(good), "mode": "0750", "owner": "nobody-else", "group": group}
    assert stale_directories([other], lines) == [other]
    unowned = {"path": str(good), "mode": "750", "owner": None}
    assert stale_directories([unowned], lines) == []
