"""gpufleet.file_sync: which files a copy loop must still write, from one find."""

from __future__ import annotations

import hashlib
from pathlib import Path

from gpufleet.file_sync import sha1_of, stale_contents, stale_sources

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
