"""Shared helpers for the Slurm exporter tests (the exporter is a single stdlib file)."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXPORTER = ROOT / "roles" / "slurm_exporter" / "files" / "gpufleet_slurm_exporter.py"
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


def _load():
    spec = importlib.util.spec_from_file_location("gpufleet_slurm_exporter", EXPORTER)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpufleet_slurm_exporter"] = mod
    spec.loader.exec_module(mod)
    return mod


exp = _load()


@pytest.fixture
def ex():
    return exp


def run_exporter(*args: str) -> subprocess.CompletedProcess:
    """The exporter's command line, as the role's unit and ``validate:`` run it."""
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
