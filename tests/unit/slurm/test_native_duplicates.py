"""Slurm 26.05's own metrics beside gpufleet's exporter: no figure twice.

The registry's `slurmctld.exporter_duplicates` lists each family of slurmctld's endpoints
that the exporter serves already (the same name, or the same figure under another name);
the `slurmctld` scrape job drops them. Checked on real output: slurmctld 26.05.5's five
endpoints and the exporter's answer, both from the same cluster's captures
(tests/fixtures/slurm/26.05, molecule slurm_sid).
"""

from __future__ import annotations

import re

import yaml
from conftest import ROOT, exp, fixture_text, runner_for

from gpufleet.scrape_targets import scrape_job_defaults

ENDPOINTS = ("jobs", "jobs-users-accts", "nodes", "partitions", "scheduler")
REGISTRY = yaml.safe_load((ROOT / "roles" / "_exporters" / "defaults" / "main.yml").read_text())[
    "exporters_registry"
]
DUPLICATES: dict[str, str] = REGISTRY["slurmctld"]["exporter_duplicates"]


def families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


NATIVE = set().union(*(families(fixture_text("26.05", f"openmetrics_{e}.txt")) for e in ENDPOINTS))
# The exporter on the same 26.05 cluster, and on 24.11's captures (taken after backfill
# cycles, so its backfill figures are there too).
EXPORTER = set().union(
    *(families(exp.Collector(runner=runner_for(d)).collect().decode()) for d in ("26.05", "24.11"))
)


def test_each_listed_duplicate_is_a_family_of_both() -> None:
    assert len(NATIVE) > 200 and len(EXPORTER) > 50
    assert sorted(set(DUPLICATES) - NATIVE) == []
    assert sorted(set(DUPLICATES.values()) - EXPORTER) == []


def test_after_the_drop_no_family_is_served_by_both() -> None:
    assert sorted((NATIVE - set(DUPLICATES)) & EXPORTER) == []
    # The exporter's names themselves: 25 families of Slurm's carry them.
    assert len(NATIVE & EXPORTER) == 25


def test_the_scrape_job_drops_exactly_the_duplicates() -> None:
    (drop,) = scrape_job_defaults(REGISTRY)["slurmctld"]["metric_relabel_configs"]
    assert (drop["source_labels"], drop["action"]) == (["__name__"], "drop")
    # Prometheus anchors a relabel regex at both ends: fullmatch.
    dropped = {name for name in NATIVE if re.fullmatch(drop["regex"], name)}
    assert dropped == set(DUPLICATES)
