"""Node-side hostlist: what Slurm prints, expanded within bounds."""

from __future__ import annotations

import pytest

from gpufleet_node.hostlist import (
    BoundExceeded,
    HostBudget,
    expand_hostlist,
    expand_ranges,
    split_top_level,
)


def test_expand_hostlist_products_padding_and_lists():
    assert expand_hostlist("gpu[01-03,7],vm") == ["gpu01", "gpu02", "gpu03", "gpu7", "vm"]
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]


@pytest.mark.parametrize("bad", ["gpu[1-", "gpu]1[", "gpu[2-1]", "gpu[]", "gpu[a]", "g[[1]]"])
def test_malformed_hostlists_raise_value_error(bad):
    with pytest.raises(ValueError):
        expand_hostlist(bad)


def test_size_is_checked_before_expanding():
    with pytest.raises(BoundExceeded):
        expand_hostlist("n[0-999999999]", limit=1000)
    budget = HostBudget(5)
    expand_hostlist("n[1-3]", budget)
    with pytest.raises(BoundExceeded):
        expand_hostlist("n[1-3]", budget)
    assert budget.remaining == 2


def test_split_top_level_respects_parentheses_and_brackets():
    assert split_top_level("gpu:a100:2(IDX:0,3),n[1,2], ,x") == [
        "gpu:a100:2(IDX:0,3)",
        "n[1,2]",
        "x",
    ]


def test_expand_ranges_bounds():
    assert expand_ranges("0-1,3", limit=10, max_value=10) == [0, 1, 3]
    with pytest.raises(BoundExceeded):
        expand_ranges("0-20", limit=10, max_value=100)
    with pytest.raises(BoundExceeded):
        expand_ranges("200", limit=10, max_value=100)
