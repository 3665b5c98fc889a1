#!/usr/bin/env python3
"""Slurm exporter job sources at scale: memory, collection time and scrape latency.

    .venv/bin/python bench/slurm_jobs_bench.py [--jobs 10000,30000] [--sources json,text]
        [--src DIR] [--running 0.2]

Generates job tables shaped like the Slurm 24.11 captures (tests/fixtures/slurm/24.11): a
RUNNING job (one node, gpu:a100:2(IDX:0-1)) and a PENDING one, copied with fresh ids and
node names; --running is the share of running jobs. For each size it writes
`scontrol show job -d --json` (8.4 KB a job, as the captures), `scontrol show job -d -o`
and squeue's output, and fake Slurm commands that print them (the other commands print
the captures). For each source a fresh process runs the exporter's Collector on them
through the real runner (real pipes), serves /metrics with the real server, and a
separate scraper process asks for /metrics every 50 ms. It prints, per source and size:
peak RSS of the exporter process, its RSS after the collection (what it keeps between
collections), the collection's wall time, the slowest scrape during it, and the
per-job series exported. --src runs another checkout's package (a before/after
comparison: `git archive <rev> src | tar -x -C DIR` and --src DIR/src). On 2 cores the
default run takes about 2 minutes (3 with a --src of the previous, whole-document code).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import resource
import select
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CAPTURES = REPO / "tests" / "fixtures" / "slurm" / "24.11"
RUNNING_ID, PENDING_ID = 2, 5  # the capture's jobs used as templates
NODE = "gpufleet-slurm-gpu1"


def _templates() -> tuple[str, str, str, str]:
    """(running JSON, pending JSON, running text, pending text), ids and node as markers."""
    doc = json.loads((CAPTURES / "scontrol_jobs_json.txt").read_text())
    by_id = {j["job_id"]: j for j in doc["jobs"]}

    def as_json(job_id: int) -> str:
        text = json.dumps(by_id[job_id], indent=2)
        text = "\n".join("    " + line for line in text.split("\n"))  # the capture's depth
        return text.replace(f'"job_id": {job_id},', '"job_id": @ID@,').replace(NODE, "@NODE@")

    lines = (CAPTURES / "scontrol_jobs.txt").read_text().split("\n")
    by_line = {int(re.match(r"JobId=(\d+)", x).group(1)): x for x in lines if x}

    def as_text(job_id: int) -> str:
        line = by_line[job_id].replace(f"JobId={job_id} ", "JobId=@ID@ ")
        return line.replace(NODE, "@NODE@")

    return as_json(RUNNING_ID), as_json(PENDING_ID), as_text(RUNNING_ID), as_text(PENDING_ID)


def generate(out: Path, jobs: int, running_share: float) -> dict[str, int]:
    """Write scontrol_jobs_json.txt, scontrol_jobs.txt and squeue.txt for ``jobs`` jobs."""
    run_json, pend_json, run_text, pend_text = _templates()
    every = max(1, round(1 / running_share)) if running_share > 0 else 0
    with (
        open(out / "scontrol_jobs_json.txt", "w") as js,
        open(out / "scontrol_jobs.txt", "w") as tx,
        open(out / "squeue.txt", "w") as sq,
    ):
        js.write('{\n  "jobs": [\n')
        for n in range(jobs):
            job_id = 100000 + n
            running = bool(every) and n % every == 0
            node = f"gpu{n // 4:05d}"
            tmpl_j, tmpl_t = (run_json, run_text) if running else (pend_json, pend_text)
            one = tmpl_j.replace("@ID@", str(job_id)).replace("@NODE@", node)
            js.write(("" if n == 0 else ",\n") + one)
            tx.write(tmpl_t.replace("@ID@", str(job_id)).replace("@NODE@", node) + "\n")
            state = "RUNNING" if running else "PENDING"
            sq.write(f"{job_id}|{job_id}|{state}|gpu|alice|physics|1|1|None\n")
        js.write('\n  ],\n  "last_backfill": {"set": true, "infinite": false, "number": 0},')
        js.write('\n  "meta": {},\n  "errors": [],\n  "warnings": []\n}\n')
    return {p.name: p.stat().st_size for p in out.glob("*.txt")}


def fake_slurm(bin_dir: Path, data: Path) -> None:
    bin_dir.mkdir(exist_ok=True)
    scripts = {
        "sinfo": f"""case "$1" in
  --version) cat '{CAPTURES}/sinfo_version.txt' ;;
  *) cat '{CAPTURES}/sinfo_nodes.txt' ;;
esac""",
        "squeue": f"cat '{data}/squeue.txt'",
        "scontrol": f"""case "$*" in
  *--json*) cat '{data}/scontrol_jobs_json.txt' ;;
  *) cat '{data}/scontrol_jobs.txt' ;;
esac""",
        "sdiag": f"cat '{CAPTURES}/sdiag.txt'",
        "sshare": f"cat '{CAPTURES}/sshare.txt'",
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _gc_pauses() -> list[float]:
    """Wall time of each cyclic garbage collection from now on (it holds the GIL)."""
    pauses: list[float] = []
    began = [0.0]

    def log(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.monotonic()
        else:
            pauses.append(time.monotonic() - began[0])

    gc.callbacks.append(log)
    return pauses


def child(bin_dir: str, source: str) -> None:
    """One exporter process: two collections (the second measured) while being scraped."""
    from gpufleet_node.slurm_exporter.collect import Collector
    from gpufleet_node.slurm_exporter.server import make_server

    pauses = _gc_pauses()
    collector = Collector(bin_dir=bin_dir, job_source=source, command_timeout=300.0)
    server = make_server("127.0.0.1:0", collector)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    scraper = subprocess.Popen(
        [sys.executable, __file__, "--scrape", str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    collector.collect()
    pauses.clear()
    idle_from = time.time()
    time.sleep(2.0)  # scrapes of the full snapshot with no collection running
    idle_to = start_wall = time.time()
    start = time.monotonic()
    body = collector.collect()
    wall = time.monotonic() - start
    end_wall = time.time()
    after = rss_mib()
    time.sleep(0.3)
    assert scraper.stdin is not None and scraper.stdout is not None
    scraper.stdin.close()
    answers = [tuple(map(float, x.split())) for x in scraper.stdout.read().split("\n") if x]
    scraper.wait(timeout=60)
    # A scrape counts for the collection when it overlaps it.
    worst = max((d for t, d in answers if t + d >= start_wall and t <= end_wall), default=0.0)
    idle = max((d for t, d in answers if t >= idle_from and t + d <= idle_to), default=0.0)
    series = re.search(rb"^slurm_exporter_job_series (\S+)$", body, re.M)
    errors = sorted(
        set(re.findall(rb'command_errors_total\{command="scontrol_jobs",reason="(\w+)"', body))
    )
    print(
        json.dumps(
            {
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "rss_after_mib": after,
                "collect_s": wall,
                "worst_scrape_s": worst,
                "idle_scrape_s": idle,
                "gc_pause_s": max(pauses, default=0.0),
                "job_series": float(series.group(1)) if series else None,
                "errors": [e.decode() for e in errors],
            }
        )
    )
    server.shutdown()


def scrape(port: int) -> None:
    """GET /metrics every 50 ms until stdin closes; print each one's start and seconds."""
    url = f"http://127.0.0.1:{port}/metrics"
    while not select.select([sys.stdin], [], [], 0.05)[0]:
        started, start = time.time(), time.monotonic()
        with urllib.request.urlopen(url, timeout=60) as resp:
            resp.read()
        print(f"{started:.4f} {time.monotonic() - start:.4f}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", default="10000,30000")
    p.add_argument("--sources", default="json,text")
    p.add_argument("--running", type=float, default=0.2)
    p.add_argument("--src", default=str(REPO / "src"), help="the package's parent directory")
    p.add_argument("--child", nargs=2, metavar=("BIN_DIR", "SOURCE"), help=argparse.SUPPRESS)
    p.add_argument("--scrape", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.scrape:
        scrape(args.scrape)
        return 0
    if args.child:
        child(*args.child)
        return 0
    print(f"# {platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, package {args.src}")
    env = {**os.environ, "PYTHONPATH": args.src}
    for jobs in (int(x) for x in args.jobs.split(",")):
        with tempfile.TemporaryDirectory(prefix="slurm-jobs-bench-") as tmp:
            data = Path(tmp)
            sizes = generate(data, jobs, args.running)
            fake_slurm(data / "bin", data)
            mib = {k: round(v / 2**20, 1) for k, v in sizes.items()}
            print(f"{jobs} jobs ({args.running:.0%} running): MiB {mib}")
            for source in args.sources.split(","):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(data / "bin"), source],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if out.returncode != 0:
                    print(f"  {source}: failed: {out.stderr.strip().splitlines()[-1:]}")
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(
                    f"  {source:4}: peak RSS {r['peak_rss_mib']:7.1f} MiB,"
                    f" after {r['rss_after_mib']:6.1f} MiB,"
                    f" collection {r['collect_s']:6.2f} s, slowest scrape"
                    f" {r['worst_scrape_s'] * 1000:7.1f} ms (idle {r['idle_scrape_s'] * 1000:.1f},"
                    f" longest GC pause {r['gc_pause_s'] * 1000:.0f}),"
                    f" job series {r['job_series']},"
                    f" job command errors {r['errors'] or 'none'}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
