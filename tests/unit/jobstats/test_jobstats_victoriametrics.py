"""``gpufleet jobstats`` and ``gpufleet report idle`` against VictoriaMetrics (MetricsQL)
give the numbers they give against Prometheus, on the same backfilled scenario.

Debian's ``victoria-metrics`` (scripts/packages.txt; bootstrap installs it) is started on
loopback and fed the scenario's OpenMetrics file through /api/v1/import/prometheus.
Skipped only where that binary is absent.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobstats_synth import Job
from sid_deb import listening_port

from gpufleet.cli import main

BINARY = shutil.which("victoria-metrics")
pytestmark = pytest.mark.skipif(
    BINARY is None, reason="victoria-metrics not installed (scripts/bootstrap installs it)"
)


def prometheus_text(openmetrics: Path) -> bytes:
    """OpenMetrics (seconds) as the Prometheus text format VictoriaMetrics imports (ms)."""
    lines = []
    for line in openmetrics.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            continue
        series, value, stamp = line.rsplit(" ", 2)
        lines.append(f"{series} {value} {int(stamp) * 1000}\n")
    return "".join(lines).encode()


def wait_ready(url: str, process: subprocess.Popen[bytes], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"victoria-metrics did not start (exit {process.poll()})")


@pytest.fixture(scope="module")
def victoria(scenario: tuple[Path, Job, Job]) -> Iterator[str]:
    """The URL of a VictoriaMetrics holding the scenario."""
    assert BINARY
    with tempfile.TemporaryDirectory(prefix="jobstats-vm.") as data:
        process = subprocess.Popen(
            [
                BINARY,
                f"-storageDataPath={data}",
                "-httpListenAddr=127.0.0.1:0",  # the kernel picks a free port
                "-retentionPeriod=30d",
                "-search.disableCache",
                # By default it hides the last 30 s from queries at "now" (docs/jobstats.md):
                # the running job's last samples would then depend on the test's timing.
                "-search.latencyOffset=0s",
                "-loggerLevel=ERROR",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{listening_port(process, None, seconds=30)}"
            wait_ready(url, process)
            request = urllib.request.Request(
                f"{url}/api/v1/import/prometheus", data=prometheus_text(scenario[0])
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.status == 204
            with urllib.request.urlopen(f"{url}/internal/force_flush", timeout=30):
                pass
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)


def json_of(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> Any:
    """The --json answer, its URLs (where it came from) replaced by URL."""
    code = main([*argv, "--prometheus", url, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out.replace(url, "URL"))


def assert_same(vm: Any, prom: Any, path: str = "") -> None:
    """Equal structure and strings; numbers equal to a relative 1e-9."""
    if isinstance(prom, dict):
        assert isinstance(vm, dict) and vm.keys() == prom.keys(), path
        for key in prom:
            assert_same(vm[key], prom[key], f"{path}.{key}")
    elif isinstance(prom, list):
        assert isinstance(vm, list) and len(vm) == len(prom), path
        for i, (a, b) in enumerate(zip(vm, prom, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(prom, float) and not isinstance(prom, bool):
        assert vm == pytest.approx(prom, rel=1e-9), path
    else:
        assert vm == prom, path


@pytest.mark.parametrize("which", [1, 2], ids=["finished", "running"])
def test_job_report_same_as_prometheus(
    victoria: str,
    prom: tuple[str, Job, Job],
    capsys: pytest.CaptureFixture[str],
    which: int,
) -> None:
    # The default lookback, 30 days, is over VictoriaMetrics 1.79's 30,000 points per
    # subquery at 60 s: the span is found at a coarser step first.
    argv = ["jobstats", prom[which].job_id]
    from_prom = json_of(capsys, prom[0], *argv)
    from_vm = json_of(capsys, victoria, *argv)
    assert from_prom["gpus"], from_prom  # the comparison is of a real report
    assert_same(from_vm, from_prom)


@pytest.mark.parametrize("extra", [[], ["--threshold", "10"]], ids=["recorded", "threshold"])
def test_idle_report_same_as_prometheus(
    victoria: str,
    prom: tuple[str, Job, Job],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
) -> None:
    argv = ["report", "idle", "--since", "24h", *extra]
    from_prom = json_of(capsys, prom[0], *argv)
    from_vm = json_of(capsys, victoria, *argv)
    assert from_prom["by_user"], from_prom
    assert_same(from_vm, from_prom)
