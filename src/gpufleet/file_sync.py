"""Which of a role's files a host lacks, from one look at the destination directory.

A loop of ``copy`` over N files makes two module calls per file on every run, also when
nothing changed (a stat, then the attributes). One ``find`` with ``get_checksum`` answers
for the whole directory; :func:`stale_sources` (filter gpufleet_stale_sources) names the
files whose copy there is missing or differs in content, mode, owner or group, and only
those go through ``copy``, which still writes and reports them as before;
:func:`stale_contents` (filter gpufleet_stale_contents) does the same for files written
from content (``copy: content:``), keyed by their destination path, and
:func:`stale_directories` (filter gpufleet_stale_directories) for a loop of directories,
from one ``stat`` of them all (:data:`STAT_FORMAT`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

# What the directory look prints per path: ``stat --printf STAT_FORMAT -- PATH...``.
STAT_FORMAT = "%n\t%F\t%a\t%U\t%G\n"


def sha1_of(path: str) -> str:
    """The SHA-1 of a file's bytes, as Ansible's find and stat report checksums."""
    digest = hashlib.sha1(usedforsecurity=False)  # Ansible's checksum
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def _differs(
    entry: Mapping[str, Any] | None, checksum: str, mode: str, owner: str, group: str
) -> bool:
    return entry is None or (
        str(entry.get("checksum", "")) != checksum
        or str(entry.get("mode", "")).lstrip("0") != mode.lstrip("0")
        or entry.get("pw_name") != owner
        or entry.get("gr_name") != group
    )


def stale_sources(
    sources: Iterable[str],
    dest_dir: str,
    found: Iterable[Mapping[str, Any]],
    mode: str,
    owner: str,
    group: str,
) -> list[str]:
    """The sources (controller paths) whose copy in dest_dir (same base name) is not
    there with the same content, mode, owner and group; ``found`` is find's ``files``
    for dest_dir, run with ``get_checksum: true``."""
    present = {str(entry.get("path")): entry for entry in found}
    return [
        source
        for source in sources
        if _differs(
            present.get(os.path.join(dest_dir, os.path.basename(source))),
            sha1_of(source),
            mode,
            owner,
            group,
        )
    ]


def stale_contents(
    wanted: Mapping[str, str],
    found: Iterable[Mapping[str, Any]],
    mode: str,
    owner: str,
    group: str,
) -> list[str]:
    """The destination paths of ``wanted`` ({path: content}) that are not there with that
    content (UTF-8), mode, owner and group; ``found`` as for :func:`stale_sources`."""
    present = {str(entry.get("path")): entry for entry in found}
    return [
        path
        for path, content in wanted.items()
        if _differs(
            present.get(path),
            hashlib.sha1(str(content).encode(), usedforsecurity=False).hexdigest(),
            mode,
            owner,
            group,
        )
    ]


def stale_directories(
    wanted: Iterable[Mapping[str, Any]], stat_lines: Iterable[str]
) -> list[Mapping[str, Any]]:
    """The entries of ``wanted`` ({path, mode, owner, group}; an owner or group that is
    missing or None is not compared) that ``stat`` (:data:`STAT_FORMAT`) did not report as
    a directory with that mode, owner and group: the ``file`` task makes or fixes those,
    and fails on a path that is something else."""
    seen: dict[str, tuple[str, str, str, str]] = {}
    for line in stat_lines:
        parts = str(line).split("\t")
        if len(parts) == 5:
            seen[parts[0]] = (parts[1], parts[2], parts[3], parts[4])
    stale = []
    for entry in wanted:
        found = seen.get(str(entry["path"]))
        if (
            found is None
            or found[0] != "directory"
            or found[1].lstrip("0") != str(entry["mode"]).lstrip("0")
            or entry.get("owner") not in (None, found[2])
            or entry.get("group") not in (None, found[3])
        ):
            stale.append(entry)
    return stale
