#!/usr/bin/env python3
"""Generate gpufleet's Grafana dashboards (the *.json files next to this script).

    .venv/bin/python roles/grafana/files/dashboards/generate.py            # rewrite the JSON
    .venv/bin/python roles/grafana/files/dashboards/generate.py --check    # exit 1 if they differ
    .venv/bin/python roles/grafana/files/dashboards/generate.py --queries  # print every query

The dashboards are built with Grafana's typed builders (grafana-foundation-sdk, pinned in
pyproject.toml's `test` extra) in boards/: queries.py holds the selectors and queries,
panels.py the panel style, frame.py the variables, layout and dashboard settings, and one
module per dashboard its rows.
The panels read the recording rules of roles/prometheus/files/rules (fed by both the
gpufleet GPU collector and dcgm-exporter), the Slurm exporter, node_exporter and
Prometheus/Alertmanager self-metrics. No instance, host or port appears in a query: the
template variables select cluster, rack, partition, node and GPU by inventory labels.
tests/unit/test_dashboards.py checks that the committed JSON equals this output, that
every PromQL query parses (promtool) and that every metric it names exists.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from boards import (
    cluster_overview,
    logs,
    monitoring_health,
    node_detail,
    slurm_job,
    slurm_jobs,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

HERE = Path(__file__).resolve().parent
DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "cluster-overview.json": cluster_overview.build,
    "node-detail.json": node_detail.build,
    "slurm-jobs.json": slurm_jobs.build,
    "slurm-job.json": slurm_job.build,
    "monitoring-health.json": monitoring_health.build,
    "logs.json": logs.build,
}


def render(build: Callable[[], Dashboard]) -> str:
    return json.dumps(build(), cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"


def print_queries(name: str, text: str) -> None:
    for panel in json.loads(text)["panels"]:
        for query in panel.get("targets", []):
            kind = query["datasource"]["type"]
            print(f"{name}\t{panel['title']}\t{kind}\t{query['expr']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--queries", action="store_true", help="print every query")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        text, path = render(build), HERE / name
        if args.queries:
            print_queries(name, text)
        elif args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("out of date: " + ", ".join(stale) + " (run generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
