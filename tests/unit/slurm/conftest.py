"""Shared helpers for the Slurm exporter tests (package gpufleet_node.slurm_exporter)."""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest

from gpufleet_node import build, commands, exposition, hostlist, webconfig
from gpufleet_node.slurm_exporter import cli, collect, metrics, model, parsers, server, shards
from gpufleet_node.slurm_exporter.parsers import common, jobs, sdiag, sinfo, squeue, sshare

ROOT = Path(__file__).resolve().parents[3]
ROLE_DIR = ROOT / "roles" / "slurm_exporter"
FIXTURES = ROOT / "tests" / "fixtures" / "slurm"

# fixture file name for each exporter command name
FILES = {
    "sinfo_version": "sinfo_version.txt",
    "sinfo_nodes": "sinfo_nodes.txt",
    "squeue": "squeue.txt",
    "scontrol_jobs": "scontrol_jobs.txt",
    "sdiag": "sdiag.txt",
    "sshare": "sshare.txt",
}
# the Slurm binary each command runs
BINARIES = {"sinfo", "squeue", "scontrol", "sdiag", "sshare"}

# The exporter's modules, by concern; ``exp`` holds their public names together so a test
# reads ``exp.parse_squeue`` whichever module defines it. Patch a name where it is defined
# (e.g. ``shards.MAX_NODE_MAP_NODES``), not on ``exp``.
MODULES = (
    hostlist,
    exposition,
    commands,
    webconfig,
    model,
    parsers,
    common,
    sinfo,
    squeue,
    jobs,
    sdiag,
    sshare,
    metrics,
    shards,
    collect,
    server,
    cli,
)
exp = types.SimpleNamespace(
    **{
        name: value
        for module in MODULES
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
)


def _build_zipapp() -> Path:
    """The zipapp the role ships, built once per test session: the tests run what nodes run."""
    out = Path(tempfile.mkdtemp(prefix="gpufleet-zipapp-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    path = out / "gpufleet-slurm-exporter.pyz"
    build.write(path, build.archive("slurm_exporter"))
    return path


EXPORTER = _build_zipapp()


@pytest.fixture
def ex():
    return exp


def run_exporter(*args: str) -> subprocess.CompletedProcess:
    """The exporter's command line, as the role's unit and ``validate:`` run it (the zipapp)."""
    return subprocess.run(
        [sys.executable, str(EXPORTER), *args], capture_output=True, text=True, timeout=60
    )


def fixture_text(*parts: str) -> str:
    return FIXTURES.joinpath(*parts).read_text()


def write_fake_slurm(bin_dir: Path, fixture_dir: Path, overrides: dict[str, str] | None = None):
    """Fake sinfo/squeue/scontrol/sdiag/sshare that cat the capture matching their arguments.

    ``overrides`` maps a binary name to a whole shell script body.
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    overrides = overrides or {}
    scripts = {
        "sinfo": f"""case "$1" in
  --version) cat '{fixture_dir}/sinfo_version.txt' ;;
  *) cat '{fixture_dir}/sinfo_nodes.txt' ;;
esac""",
        "squeue": f"cat '{fixture_dir}/squeue.txt'",
        "scontrol": f"cat '{fixture_dir}/scontrol_jobs.txt'",
        "sdiag": f"cat '{fixture_dir}/sdiag.txt'",
        "sshare": f"cat '{fixture_dir}/sshare.txt'",
    }
    scripts.update(overrides)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


def runner_for(
    sources: dict[str, str | Path] | str,
    fail: dict[str, str] | None = None,
    texts: dict[str, str] | None = None,
    calls: list[str] | None = None,
):
    """A Collector runner answering each command from captures.

    ``sources`` is a fixture directory name, or {command name: directory or file} with the key
    "*" as the default. Command names are those of COMMANDS plus "scontrol_jobs_json" for
    `scontrol show job -d --json` (file scontrol_jobs_json.txt as capture.sh names it, else
    scontrol_jobs.json). ``texts`` gives a command's output inline, ``fail`` its error
    instead; ``calls`` collects the names run.
    """
    by_argv = {tuple(argv): name for name, argv in exp.COMMANDS.items()}
    by_argv[tuple(exp.JOB_JSON_COMMAND)] = "scontrol_jobs_json"
    files = {**FILES, "scontrol_jobs_json": "scontrol_jobs_json.txt"}
    if isinstance(sources, str):
        sources = {"*": sources}
    fail = fail or {}
    texts = texts or {}

    def run(argv: list[str], timeout: float) -> exp.CommandResult:
        name = by_argv[tuple(argv)]
        if calls is not None:
            calls.append(name)
        if name in fail:
            return exp.CommandResult("", 0.01, fail[name])
        if name in texts:
            return exp.CommandResult(texts[name], 0.01, None)
        src = str(sources.get(name, sources.get("*")))
        path = Path(src) if src.endswith((".txt", ".json")) else FIXTURES / src / files[name]
        if name == "scontrol_jobs_json" and not path.exists():
            path = path.with_name("scontrol_jobs.json")
        return exp.CommandResult(path.read_text(), 0.01, None)

    return run


def metric_samples(text: str) -> dict[str, float]:
    """exposition text -> {'name{labels}': value} (labels as rendered)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out


def assert_samples(m: dict[str, float], expected: str) -> None:
    """Each sample of ``expected`` (exposition text, indented; ``#`` lines are comments)
    is in ``m`` with that value."""
    want = metric_samples("\n".join(line.strip() for line in expected.splitlines()))
    assert want, "no samples expected"
    assert {key: m.get(key) for key in want} == want


@pytest.fixture
def fake_path(monkeypatch, tmp_path):
    """Put a directory first on PATH and return it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return bin_dir


def wait_for(predicate, timeout: float = 5.0) -> bool:
    """Whether predicate() became true within timeout seconds (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
