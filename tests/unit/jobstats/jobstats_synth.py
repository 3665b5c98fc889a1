"""Synthetic TSDBs for jobstats: OpenMetrics text -> promtool backfill -> real Prometheus.

The series are the ones ``gpufleet jobstats`` reads (the recorded ``gpu:*``/``node:*``
rollups and the Slurm exporter's per-job series, plus the idle GPU-hour rules), written
as a shard would hold them. Shared by tests/unit/jobstats and bench/jobstats_bench.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sid_deb import listening_port, wait_ready

# one series: its label text ({a="b",...}) and its value at a time, or None (no sample)
Series = tuple[str, Callable[[int], float | None]]


def labels(**pairs: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"


def write_family(out: IO[str], name: str, series: Iterable[Series], times: list[int]) -> int:
    """One gauge family, series after series, samples in time order; returns samples."""
    out.write(f"# TYPE {name} gauge\n")
    written = 0
    for label_text, value_at in series:
        prefix = f"{name}{label_text} "
        lines = []
        for t in times:
            value = value_at(t)
            if value is not None:
                lines.append(f"{prefix}{value:.12g} {t}\n")
        out.write("".join(lines))
        written += len(lines)
    return written


@dataclass(frozen=True)
class Job:
    job_id: str
    user: str
    account: str
    partition: str
    start: int
    end: int  # last sample at or before this
    gpus: dict[str, list[int]]  # node -> GPU indices

    def running_at(self, t: int) -> bool:
        return self.start <= t <= self.end


def job_families(jobs: list[Job]) -> dict[str, list[Series]]:
    """slurm_job_gpus_allocated and slurm_job_gpu_index_info of the jobs."""
    allocated: list[Series] = []
    index: list[Series] = []
    for job in jobs:

        def during(t: int, job: Job = job) -> float | None:
            return 1.0 if job.running_at(t) else None

        for node, gpus in job.gpus.items():
            count = float(len(gpus))
            allocated.append(
                (
                    labels(
                        account=job.account,
                        cluster="c1",
                        job_id=job.job_id,
                        node=node,
                        partition=job.partition,
                        user=job.user,
                    ),
                    lambda t, job=job, count=count: count if job.running_at(t) else None,
                )
            )
            for gpu in gpus:
                index.append(
                    (labels(cluster="c1", gpu=str(gpu), job_id=job.job_id, node=node), during)
                )
    return {"slurm_job_gpus_allocated": allocated, "slurm_job_gpu_index_info": index}


def backfill(promtool: Path, text_file: Path, tsdb: Path, max_block: str = "24h") -> None:
    result = subprocess.run(
        [
            str(promtool),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            f"--max-block-duration={max_block}",
            str(text_file),
            str(tsdb),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if result.returncode != 0:
        raise RuntimeError(f"promtool backfill of {text_file}: {result.stderr.strip()[-2000:]}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def prometheus(
    binary: Path, tsdb: Path, retention: str = "30d", host: str = "127.0.0.1"
) -> Iterator[str]:
    """A Prometheus on loopback (``host``: any of 127.0.0.0/8) serving ``tsdb``; its URL."""
    with tempfile.TemporaryDirectory(prefix="jobstats-prom.") as scratch:
        config = Path(scratch) / "prometheus.yml"
        config.write_text("global: {scrape_interval: 1m}\n", encoding="utf-8")
        log = open(Path(scratch) / "log", "w+", encoding="utf-8")  # noqa: SIM115
        process = subprocess.Popen(
            [
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={tsdb}",
                f"--storage.tsdb.retention.time={retention}",
                f"--web.listen-address={host}:0",  # the kernel picks a free port
                "--query.max-samples=500000000",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "GOMAXPROCS": os.environ.get("GOMAXPROCS", "2")},
        )
        try:
            url = f"http://{host}:{listening_port(process, log, seconds=120)}"
            wait_ready(url, process, log, seconds=120)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
