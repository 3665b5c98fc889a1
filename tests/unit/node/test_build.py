"""The zipapp builder: reproducible bytes, only the package's sources, runnable."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from gpufleet_node import build

ROOT = Path(__file__).resolve().parents[3]


def _copy_package(dest: Path) -> Path:
    pkg = dest / "gpufleet_node"
    for rel in build.sources():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((build.PACKAGE.parent / rel).read_bytes())
    return pkg


def test_the_same_source_gives_the_same_bytes(tmp_path):
    first = build.archive("slurm_exporter")
    # A copy with other mtimes, a __pycache__ and a build.py: same bytes.
    pkg = _copy_package(tmp_path / "a")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    assert (
        hashlib.sha256(build.archive("slurm_exporter", pkg)).digest()
        == hashlib.sha256(first).digest()
    )


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def test_in_a_checkout_only_tracked_modules_are_packed(tmp_path):
    pkg = _copy_package(tmp_path / "repo")
    _git(tmp_path / "repo", "init", "-q")
    _git(tmp_path / "repo", "add", "gpufleet_node")
    tracked = build.archive("slurm_exporter", pkg)
    # An untracked scratch module (and one in a new subpackage) is not shipped.
    (pkg / "scratch.py").write_text("SECRET = 1\n")
    (pkg / "tmp").mkdir()
    (pkg / "tmp" / "notes.py").write_text("x = 1\n")
    data = build.archive("slurm_exporter", pkg)
    assert hashlib.sha256(data).hexdigest() == hashlib.sha256(tracked).hexdigest()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
    assert "gpufleet_node/scratch.py" not in names
    assert "gpufleet_node/tmp/notes.py" not in names
    assert "gpufleet_node/exposition.py" in names
    # A tracked module deleted from the working tree is not packed either.
    (pkg / "exposition.py").unlink()
    assert "gpufleet_node/exposition.py" not in [p.as_posix() for p in build.sources(pkg)]


def test_outside_a_checkout_every_module_is_packed(tmp_path):
    pkg = _copy_package(tmp_path / "copy")
    (pkg / "extra.py").write_text("x = 1\n")
    assert Path("gpufleet_node/extra.py") in build.sources(pkg)


def test_this_checkout_packs_what_git_tracks():
    listed = subprocess.run(
        ["git", "-C", str(build.PACKAGE), "ls-files", "--", "*.py"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    tracked = {f"gpufleet_node/{name}" for name in listed.stdout.split()}
    tracked.discard("gpufleet_node/build.py")
    assert {p.as_posix() for p in build.sources()} == tracked


def test_a_source_change_changes_the_bytes(tmp_path):
    pkg = _copy_package(tmp_path / "b")
    (pkg / "exposition.py").write_text((pkg / "exposition.py").read_text() + "\n# changed\n")
    assert build.archive("slurm_exporter", pkg) != build.archive("slurm_exporter")


def test_entries_are_sorted_fixed_and_without_bytecode():
    data = build.archive("slurm_exporter")
    assert data.startswith(b"#!/usr/bin/python3\n")
    path_names = [p.as_posix() for p in build.sources()]
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    assert names == ["__main__.py", *path_names]
    assert path_names == sorted(path_names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert "gpufleet_node/build.py" not in names
    assert {i.date_time for i in infos} == {build.ZIP_TIME}
    assert {i.compress_type for i in infos} == {zipfile.ZIP_STORED}


def test_write_reports_change_only_once(tmp_path):
    out = tmp_path / "x.pyz"
    data = build.archive("slurm_exporter")
    assert build.write(out, data) is True
    assert build.write(out, data) is False
    assert out.read_bytes() == data


def test_the_zipapp_runs_without_the_source_tree(tmp_path):
    out = tmp_path / "gpufleet-slurm-exporter.pyz"
    assert build.main([str(out)]) == 0
    res = subprocess.run(
        [sys.executable, "-I", str(out), "--version"],  # -I: no PYTHONPATH, no site-packages
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert (res.returncode, res.stdout.strip()) == (0, "0.1.0"), res.stderr


def test_unknown_app_is_refused():
    with pytest.raises(ValueError):
        build.archive("nope")


def test_the_role_builds_and_runs_the_zipapp():
    role = ROOT / "roles" / "slurm_exporter"
    # Built on the controller by roles/_common/tasks/zipapp.yml (test_common_zipapp.py).
    zipapps = yaml.safe_load((role / "vars" / "main.yml").read_text())["_slurm_exporter_zipapps"]
    assert "slurm_exporter" in [z["app"] for z in zipapps]
    assert yaml.safe_load((role / "vars" / "main.yml").read_text())[
        "_slurm_exporter_zipapp_name"
    ].endswith(".pyz")
    assert not (role / "files" / "gpufleet_slurm_exporter.py").exists()  # not shipped twice
