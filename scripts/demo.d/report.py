#!/usr/bin/env python3
"""The demo's ending: wait (bounded) until SlurmJobGpuIdle fires, then print
`gpufleet jobstats` for every running job and the firing alert as Alertmanager has it.

    report.py --prometheus URL --alertmanager URL --inventory DIR [--wait SECONDS]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.parse
from typing import Any

# gpufleet's one HTTP client: one deadline for the whole exchange, a bound on the body.
from gpufleet_node.httpclient import FetchError, fetch

ALERT = "SlurmJobGpuIdle"
FIRING = f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}'
TIMEOUT_S = 10.0


class NotAnswering(OSError):
    """No usable answer (refused, timeout, HTTP error, not JSON); one line."""


def get_json(url: str, timeout: float = TIMEOUT_S) -> Any:
    try:
        answer = fetch(url, timeout)
    except FetchError as error:
        raise NotAnswering(f"{url.split('?')[0]}: {error}") from error
    if not answer.ok:
        raise NotAnswering(f"{url.split('?')[0]}: HTTP {answer.status} {answer.reason}")
    try:
        return json.loads(answer.body)
    except (ValueError, RecursionError) as error:
        raise NotAnswering(f"{url.split('?')[0]}: answer is not JSON") from error


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    answer = get_json(url)
    result = answer.get("data", {}).get("result") if isinstance(answer, dict) else None
    if not isinstance(result, list):
        raise NotAnswering(f"{prometheus}: not a Prometheus API answer")
    return result


def am_alerts(alertmanager: str) -> list[dict[str, Any]]:
    matcher = urllib.parse.urlencode({"filter": f'alertname="{ALERT}"'})
    url = f"{alertmanager}/api/v2/alerts?{matcher}"
    alerts = get_json(url)
    if not isinstance(alerts, list):
        raise NotAnswering(f"{alertmanager}: not an Alertmanager API answer")
    return alerts


def progress(prometheus: str) -> str:
    """One line on what Prometheus holds so far, for the waiting messages."""
    jobs = {s["metric"].get("job_id") for s in query(prometheus, "slurm_job_gpus_allocated")}
    gpus = query(prometheus, "slurm_job_gpu:gpu_utilization_percent:max")
    pending = query(prometheus, f'ALERTS{{alertname="{ALERT}",alertstate="pending"}}')
    return f"{len(jobs)} Slurm jobs, {len(gpus)} job GPUs measured, {len(pending)} alerts pending"


def wait_for(what: str, ready: Any, deadline: float, status: Any) -> Any:
    """Poll ready() every 5 s until it returns something truthy or the deadline passes."""
    left = max(0, int(deadline - time.monotonic()))
    print(f"demo: waiting for {what} (up to {left} s)", flush=True)
    last_note = time.monotonic()
    while True:
        try:
            found = ready()
        except OSError as error:  # not up yet (refused, timeout, HTTP error)
            found, note = None, f"not answering: {error}"
        else:
            note = ""
        if found:
            return found
        if time.monotonic() >= deadline:
            raise SystemExit(f"demo: gave up waiting for {what} ({note or safely(status)})")
        if time.monotonic() - last_note >= 30:
            print(f"demo:   still waiting: {note or safely(status)}", flush=True)
            last_note = time.monotonic()
        time.sleep(5)


def safely(status: Any) -> str:
    """status()'s line, or why there is none: a status query must not end the wait."""
    try:
        return str(status())
    except (OSError, ValueError, KeyError) as error:
        return f"no status: {error}"


def job_ids(prometheus: str) -> list[str]:
    """The running jobs' ids (digits only: each goes on a command line)."""
    samples = query(prometheus, "slurm_job_gpus_allocated")
    ids = {str(s.get("metric", {}).get("job_id", "")) for s in samples}
    return sorted(
        (job for job in ids if job.isascii() and job.isdigit()), key=lambda job: (len(job), job)
    )


def describe(alert: dict[str, Any]) -> str:
    labels = alert["labels"]
    receivers = ", ".join(r["name"] for r in alert.get("receivers", []))
    return (
        f"{labels['alertname']} [{alert['status']['state']}] since {alert['startsAt'][:19]}Z\n"
        f"  {alert['annotations'].get('summary', '')}\n"
        f"  job_id={labels.get('job_id')} user={labels.get('user')} account={labels.get('account')}"
        f" partition={labels.get('partition')} node={labels.get('node')}\n"
        f"  routed to: {receivers}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--alertmanager", required=True)
    parser.add_argument("--inventory", required=True)
    parser.add_argument("--wait", type=int, default=360, help="seconds to wait for the alert")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.wait

    wait_for(f"{ALERT} to fire in Prometheus", lambda: query(args.prometheus, FIRING), deadline,
             lambda: progress(args.prometheus))  # fmt: skip
    alerts = wait_for(f"{ALERT} in Alertmanager", lambda: am_alerts(args.alertmanager),
                      time.monotonic() + 60, lambda: "not received yet")  # fmt: skip

    status = 0
    for job in job_ids(args.prometheus):
        command = ["gpufleet", "jobstats", job, "-i", args.inventory]
        print(f"\n$ {' '.join(command)}", flush=True)
        code = subprocess.run(command, check=False).returncode
        status = max(status, code if code >= 0 else 128 - code)  # a signal's death fails too
    print(f"\nFiring in Alertmanager ({args.alertmanager}):")
    for alert in alerts:
        print(describe(alert))
    return status


if __name__ == "__main__":
    sys.exit(main())
