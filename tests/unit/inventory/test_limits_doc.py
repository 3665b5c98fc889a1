"""docs/inventory.md ("Limits") states the numbers of src/gpufleet/limits.py.

Each limit is looked up in the table's row that names what it bounds, written as the
document writes numbers (thousands separators, MiB, seconds); a limit added to limits.py
without a row here fails until it is documented.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpufleet import limits

DOC = Path(__file__).resolve().parents[3] / "docs" / "inventory.md"

# limit name -> (a phrase of its row's "What" cell, the text its "Limit" cell holds)
DOCUMENTED = {
    "MAX_HOSTS": ("Hosts a node list defines", f"{limits.MAX_HOSTS:,}"),
    "MAX_NAMES": ("Names all hostlist expressions", f"{limits.MAX_NAMES:,}"),
    "MAX_NUMBER_DIGITS": ("A number in a hostlist bracket", f"{limits.MAX_NUMBER_DIGITS} digits"),
    "MAX_NAME_LENGTH": ("An expanded host name", f"{limits.MAX_NAME_LENGTH} characters"),
    "MAX_SHARDS": ("`monitoring.shards`", f"1..{limits.MAX_SHARDS}"),
    "MAX_REPLICAS": ("`monitoring.replicas`", f"1..{limits.MAX_REPLICAS}"),
    "MAX_IMBALANCE": ("`monitoring.max_imbalance`", f"1.0..{limits.MAX_IMBALANCE}"),
    "MAX_REBALANCE_MARGIN": (
        "`monitoring.rebalance_margin`",
        f"0.0..{limits.MAX_REBALANCE_MARGIN}",
    ),
    "MAX_CPUS": ("`cpus`", f"{limits.MAX_CPUS:,} / "),
    "MAX_GPUS": ("`gpu.count`", f" / {limits.MAX_GPUS:,} / "),
    "MAX_EXPECTED_SERIES": ("`expected_series`", f" / {limits.MAX_EXPECTED_SERIES:,}"),
    "MAX_TOKEN_LENGTH": ("`cluster`, `rack`", f"{limits.MAX_TOKEN_LENGTH} characters"),
    "MAX_ADDRESS_PATTERN_LENGTH": (
        "`address` (literal or pattern)",
        f"{limits.MAX_ADDRESS_PATTERN_LENGTH} characters",
    ),
    "MAX_NUM_WIDTH": ("`address` (literal or pattern)", f"(N 1..{limits.MAX_NUM_WIDTH})"),
    "MAX_VALUE_NODES": ("An entry's `vars`", f"{limits.MAX_VALUE_NODES:,} values"),
    "MAX_VALUE_DEPTH": ("An entry's `vars`", f"{limits.MAX_VALUE_DEPTH} levels deep"),
    "MAX_FILE_BYTES": ("The node list file", f"{limits.size_text(limits.MAX_FILE_BYTES)} each"),
    "MAX_INCLUDE_DEPTH": ("`slurm.conf` `Include`", f"{limits.MAX_INCLUDE_DEPTH} levels deep"),
    "MAX_INCLUDE_FILES": ("`slurm.conf` `Include`", f"{limits.MAX_INCLUDE_FILES} files in all"),
    "MAX_CONSTRUCT_EXPRESSIONS": (
        "`keyed_groups` expressions",
        f"{limits.MAX_CONSTRUCT_EXPRESSIONS:,}",
    ),
    "MAX_CONSTRUCT_EVALUATIONS": (
        "template evaluations",
        f"{limits.MAX_CONSTRUCT_EVALUATIONS:,}",
    ),
    "MAX_CONSTRUCTED_GROUPS": (
        "Groups the constructed options add",
        f"{limits.MAX_CONSTRUCTED_GROUPS:,}",
    ),
    "CONSTRUCT_DEADLINE_S": (
        "Templating the constructed options",
        f"{limits.CONSTRUCT_DEADLINE_S:g} s",
    ),
}


def limits_table() -> list[tuple[str, str]]:
    """(What, Limit) of every row of the table under "### Limits"."""
    section = DOC.read_text(encoding="utf-8").split("\n### Limits\n", 1)[1]
    section = section.split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]
    return [(what, limit) for what, limit in cells[2:]]  # past the header and its rule


def test_every_limit_has_a_documented_row() -> None:
    names = {name for name in vars(limits) if name.startswith(("MAX_", "CONSTRUCT_"))}
    assert names == set(DOCUMENTED), "document the new limit in docs/inventory.md and here"


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_the_table_states_the_limit(name: str) -> None:
    phrase, text = DOCUMENTED[name]
    rows = [limit for what, limit in limits_table() if phrase in what]
    assert rows, f"no row of docs/inventory.md 'Limits' names {phrase!r}"
    assert any(text in limit for limit in rows), f"{name}: {text!r} not in {rows}"
