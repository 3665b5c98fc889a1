"""dcgm-exporter's counters file carries every DCGM field gpufleet's rules read.

The rules (roles/prometheus/files/rules/*.rules.yml) read each DCGM quantity by the name
dcgm-exporter <= 4.8 (and gpufleet's counters file) writes, `or` by the name DCGM 4.7 /
dcgm-exporter 4.9 gives it (docs/dcgm-exporter.md, "dcgm-exporter 4.9 names"). A field the
rules read that the rendered dcgm-counters.csv lacks is never collected: the rule reads
nothing and its alert never fires (GpuThrottlingSustained without the clock-event bitmask,
GpuTemperatureNearLimit falling back to a flat 85 C without the slowdown temperature).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
import yaml
from render_role import render

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((ROOT / "roles" / "prometheus" / "files" / "rules").glob("*.rules.yml"))
DOC = ROOT / "docs" / "dcgm-exporter.md"
# A GPU node of tests/golden/example-inventory.json (dcgm-exporter is per node).
HOST = "gpu001"

# Old name (dcgm-exporter <= 4.8, DCGM <= 4.5) -> DCGM 4.7 / dcgm-exporter 4.9 name, for
# the fields the rules read. Names from NVIDIA/DCGM testing/python3/dcgm_fields.py
# (commit 28bfbd4, its table of deprecated names) and NVIDIA/go-dcgm
# pkg/dcgm/alias_resolution_test.go; the _BYTES / _RATIO fields (new ids 1613, 1626-1628,
# other units) from the anchors (section 3.2) and the DCGM 4.7 Field Identifiers as quoted
# there. The rules convert the new unit to the old one.
RENAMES_4_9 = {
    "DCGM_FI_DEV_GPU_UTIL": "DCGM_FI_DEV_GPU_UTIL_RATIO",
    "DCGM_FI_DEV_FB_USED": "DCGM_FI_DEV_FB_USED_BYTES",
    "DCGM_FI_DEV_FB_FREE": "DCGM_FI_DEV_FB_FREE_BYTES",
    "DCGM_FI_DEV_FB_RESERVED": "DCGM_FI_DEV_FB_RESERVED_BYTES",
    "DCGM_FI_DEV_POWER_USAGE": "DCGM_FI_DEV_BOARD_POWER_WATTS",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS",
    "DCGM_FI_DEV_GPU_TEMP": "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
    "DCGM_FI_DEV_MEMORY_TEMP": "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
    "DCGM_FI_DEV_SLOWDOWN_TEMP": "DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS",
    "DCGM_FI_DEV_XID_ERRORS": "DCGM_FI_DEV_XID_ERROR",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "DCGM_FI_DEV_ROW_REMAP_FAILED",
    "DCGM_FI_DEV_MINOR_NUMBER": "DCGM_FI_DEV_GPU_MINOR_NUMBER",
}
NEW_NAMES = frozenset(RENAMES_4_9.values())
# Two names of one DCGM field (112), both known to every DCGM 4: a counters file needs one.
ALIASES = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}

DCGM_NAME = re.compile(r"\bDCGM_(?:FI|EXP)_[A-Z0-9_]+\b")
NAME_REGEX = re.compile(r'__name__\s*=~\s*"([^"]*)"')


def rule_reads(expr: str) -> list[frozenset[str]]:
    """The DCGM names an expression reads, each as the set of names any one of which
    feeds it: a `__name__=~"A|B"` selector is one read of A or B, any other name (a
    metric or a label field) one read of itself."""
    reads = []
    for match in NAME_REGEX.finditer(expr):
        names = frozenset(DCGM_NAME.findall(match.group(1)))
        if names:
            reads.append(names)
    rest = NAME_REGEX.sub("", expr)
    reads.extend(frozenset({name}) for name in DCGM_NAME.findall(rest))
    return reads


def all_rule_reads() -> dict[str, list[frozenset[str]]]:
    """Per rule (file: name), what it reads of DCGM."""
    out = {}
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            for rule in group["rules"]:
                reads = rule_reads(rule["expr"])
                if reads:
                    out[f"{path.name}: {rule.get('record') or rule.get('alert')}"] = reads
    return out


def missing_from(fields: set[str], reads: dict[str, list[frozenset[str]]]) -> list[str]:
    """Each read of an old-generation name the counters file does not collect, as
    "rule: names". A read of 4.9 names only is left out (the counters file writes old
    names; test_every_renamed_read_covers_both_generations pairs them)."""
    collected = fields | {alias for alias, name in ALIASES.items() if name in fields}
    problems = []
    for rule, rule_reads_ in reads.items():
        for names in rule_reads_:
            old = names - NEW_NAMES
            if old and not old & collected:
                problems.append(f"{rule}: {' or '.join(sorted(old))}")
    return problems


def counter_fields(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return [row[0] for row in csv.reader(lines, skipinitialspace=True)]


@pytest.fixture(scope="module")
def default_csv() -> str:
    return render("dcgm_exporter", "dcgm-counters.csv.j2", HOST)


def test_rules_read_dcgm_fields_at_all() -> None:
    """Guards the parser: an empty reading would pass every test below."""
    names = {name for reads in all_rule_reads().values() for group in reads for name in group}
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_SLOWDOWN_TEMP"} <= names
    assert {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"} <= names


def test_counters_file_collects_every_field_the_rules_read(default_csv: str) -> None:
    fields = set(counter_fields(default_csv))
    assert not missing_from(fields, all_rule_reads())


def test_a_site_list_cannot_drop_what_the_rules_read() -> None:
    text = render("dcgm_exporter", "dcgm-counters.csv.j2", HOST, {"dcgm_exporter_counters": []})
    fields = counter_fields(text)
    assert not missing_from(set(fields), all_rule_reads())
    assert len(fields) == len(set(fields)), "duplicate rows"


def test_the_check_fails_on_a_missing_field(default_csv: str) -> None:
    fields = set(counter_fields(default_csv))
    problems = missing_from(fields - {"DCGM_FI_DEV_SLOWDOWN_TEMP"}, all_rule_reads())
    assert any("DCGM_FI_DEV_SLOWDOWN_TEMP" in problem for problem in problems), problems
    problems = missing_from(fields - {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}, all_rule_reads())
    assert any("GpuThrottling" in p or "clock_event" in p for p in problems), problems


def test_one_row_for_the_clock_event_bitmask(default_csv: str) -> None:
    """Field 112 once: under its current name, or under the alias a site listed."""
    fields = counter_fields(default_csv)
    assert fields.count("DCGM_FI_DEV_CLOCKS_EVENT_REASONS") == 1
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in fields
    site = render(
        "dcgm_exporter",
        "dcgm-counters.csv.j2",
        HOST,
        {
            "dcgm_exporter_extra_counters": [
                {"field": "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "type": "gauge", "help": "x"}
            ]
        },
    )
    fields = counter_fields(site)
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" not in fields
    assert fields.count("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") == 1


def test_every_renamed_read_covers_both_generations() -> None:
    """A rule that reads a renamed field reads it under both names (and a 4.9 name only
    next to its old one), so a node of either generation feeds it."""
    for rule, reads in all_rule_reads().items():
        names = {name for group in reads for name in group}
        for old, new in RENAMES_4_9.items():
            if old in names:
                assert new in names, f"{rule} reads {old} but not its 4.9 name {new}"
            if new in names:
                assert old in names, f"{rule} reads {new} but not the old name {old}"


def test_rename_table_is_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## dcgm-exporter 4.9 names") :]
    for old, new in RENAMES_4_9.items():
        assert re.search(rf"`{old}`.*`{new}`", section), f"docs/dcgm-exporter.md: {old} -> {new}"
