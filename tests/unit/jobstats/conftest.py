"""A real Prometheus (Debian sid's) on loopback, backfilled with jobstats_scenario's jobs."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/unit: sid_deb

import sid_deb
from jobstats_scenario import write_series
from jobstats_synth import Job, backfill, prometheus

ROOT = Path(__file__).resolve().parents[3]


def sid_binary(package: str, cache: str, name: str) -> Path:
    try:
        return sid_deb.unpacked(package, ROOT / ".cache" / cache) / "usr" / "bin" / name
    except sid_deb.DebUnavailable as error:
        pytest.fail(
            f"{error}; the jobstats tests run a real Prometheus (needs apt access to a "
            "Debian mirror, see molecule/testbed/debian_suite.py)",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    return sid_binary("prometheus", "prometheus", "prometheus")


@pytest.fixture(scope="session")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Job, Job]:
    """(the OpenMetrics file, the finished job, the running job) of the known scenario."""
    work = tmp_path_factory.mktemp("jobstats-tsdb")
    job, other = write_series(work / "series.om", time.time())
    return work / "series.om", job, other


@pytest.fixture(scope="session")
def prom(scenario: tuple[Path, Job, Job]) -> Iterator[tuple[str, Job, Job]]:
    """(URL, the finished job, the running job) of a backfilled Prometheus."""
    promtool = sid_binary("promtool", "promtool", "promtool")
    binary = sid_binary("prometheus", "prometheus", "prometheus")
    series, job, other = scenario
    backfill(promtool, series, series.parent / "tsdb", max_block="2h")
    with prometheus(binary, series.parent / "tsdb") as url:
        yield url, job, other
