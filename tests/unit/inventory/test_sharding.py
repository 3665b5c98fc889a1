"""Sharding guarantees, checked on synthetic heterogeneous clusters of 1,000+ hosts.

The guarantees (issue 3) and the exact form in which they hold are documented in
docs/inventory.md, section "Sharding".
"""

from __future__ import annotations

import random
import time

import pytest
from inventory_helpers import racks_of, synthetic_cluster

from gpufleet.sharding import (
    ShardingError,
    diff_assignments,
    imbalance,
    place,
    plan_hosts,
    shard_loads,
    shard_scores,
)

SEEDS = range(4)
SHARD_COUNTS = (2, 3, 4, 5, 6, 8, 12, 16)
NO_CAP = float("inf")  # pure rendezvous hashing, no bounded-load correction


def hosts_per_shard_cluster(seed: int, shards: int) -> dict[str, int]:
    """At least 1,000 hosts and at least 125 per shard (the documented regime)."""
    return synthetic_cluster(seed, max(1000, 125 * shards))


def moved(old: dict[str, int], new: dict[str, int]) -> list[str]:
    return [host for host in old if host in new and old[host] != new[host]]


# -- pure building blocks ---------------------------------------------------------------


def test_scores_are_stable_and_independent_of_shard_count() -> None:
    assert shard_scores("gpu001", 8)[:4] == shard_scores("gpu001", 4)
    assert shard_scores("gpu001", 4) == shard_scores("gpu001", 4)
    assert shard_scores("gpu001", 4) != shard_scores("gpu002", 4)


def test_placement_does_not_depend_on_input_order() -> None:
    weights = synthetic_cluster(1)
    shuffled = list(weights.items())
    random.Random(3).shuffle(shuffled)
    assert plan_hosts(weights, 8) == plan_hosts(dict(shuffled), 8)


def test_one_shard_takes_everything() -> None:
    assert set(plan_hosts({"a": 1, "b": 2}, 1).values()) == {0}


def test_shards_below_one_are_refused() -> None:
    with pytest.raises(ShardingError, match="shards must be >= 1, got 0"):
        place({"a": 1}, 0)


def test_diff_assignments_reports_moves_additions_and_removals() -> None:
    moves = diff_assignments({"a": 0, "b": 1, "c": 1}, {"a": 0, "b": 0, "d": 1})
    assert [(m.host, m.old_shard, m.new_shard) for m in moves] == [
        ("b", 1, 0),
        ("c", 1, None),
        ("d", None, 1),
    ]


# -- guarantee 1: the host is the unit ---------------------------------------------------


def test_every_host_has_exactly_one_shard_in_range() -> None:
    weights = synthetic_cluster(0)
    assignment = plan_hosts(weights, 7)
    assert assignment.keys() == weights.keys()
    assert all(isinstance(s, int) and 0 <= s < 7 for s in assignment.values())


# -- guarantee 2: balance ------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shards", SHARD_COUNTS)
def test_heaviest_shard_is_at_most_105_percent_of_mean(seed: int, shards: int) -> None:
    weights = synthetic_cluster(seed)
    assignment = plan_hosts(weights, shards)
    assert imbalance(shard_loads(assignment, weights, shards)) <= 1.05


def test_pure_hashing_alone_would_not_be_balanced() -> None:
    """Why the correction exists: plain rendezvous misses 1.05 on these clusters."""
    weights = synthetic_cluster(0)
    assignment = plan_hosts(weights, 8, max_imbalance=NO_CAP)
    assert imbalance(shard_loads(assignment, weights, 8)) > 1.05


# -- guarantee 3: stability ----------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shards", range(1, 16))
def test_growing_by_one_shard_moves_at_most_one_share_plus_2_5pp(seed: int, shards: int) -> None:
    weights = hosts_per_shard_cluster(seed, shards + 1)
    before, after = plan_hosts(weights, shards), plan_hosts(weights, shards + 1)
    assert len(moved(before, after)) / len(weights) <= 1 / (shards + 1) + 0.025


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shards", (2, 4, 8, 16))
def test_shrinking_by_one_shard_moves_at_most_one_share_plus_2pp(seed: int, shards: int) -> None:
    weights = hosts_per_shard_cluster(seed, shards)
    before, after = plan_hosts(weights, shards), plan_hosts(weights, shards - 1)
    assert len(moved(before, after)) / len(weights) <= 1 / shards + 0.02


def test_hashmod_baseline_moves_far_more() -> None:
    """Reference point from the issue: hashmod moves N/(N+1) of hosts for N -> N+1."""
    weights = synthetic_cluster(0)
    ours = moved(plan_hosts(weights, 4), plan_hosts(weights, 5))
    hashmod = [h for h in weights if hash_mod(h, 4) != hash_mod(h, 5)]
    assert len(ours) < len(hashmod) / 3
    assert len(hashmod) / len(weights) > 0.75


def hash_mod(value: str, modulus: int) -> int:
    import hashlib

    return int.from_bytes(hashlib.md5(value.encode()).digest()[8:], "big") % modulus


def single_host_changes(weights: dict[str, int], seed: int, count: int):
    """``count`` alternating events: add one new host / remove one existing host."""
    rnd = random.Random(seed)
    names = sorted(weights)
    for event in range(count):
        changed = dict(weights)
        if event % 2:
            del changed[rnd.choice(names)]
        else:
            changed[f"new{event:03d}-gpu001"] = rnd.choice(list(weights.values()))
        yield changed


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shards", (2, 4, 8, 16))
def test_adding_or_removing_a_host_moves_no_other_host_without_cap(seed: int, shards: int) -> None:
    """Rendezvous placement itself is strictly stable (each host's shard is its own)."""
    weights = synthetic_cluster(seed)
    before = plan_hosts(weights, shards, max_imbalance=NO_CAP)
    for changed in single_host_changes(weights, seed, 10):
        assert moved(before, plan_hosts(changed, shards, max_imbalance=NO_CAP)) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_adding_or_removing_a_host_moves_no_other_host_when_no_shard_is_capped(seed: int) -> None:
    """The correction applies only when needed: under the cap, placement is pure HRW."""
    weights = synthetic_cluster(seed)
    assert plan_hosts(weights, 2) == plan_hosts(weights, 2, max_imbalance=NO_CAP)
    before = plan_hosts(weights, 2)
    for changed in single_host_changes(weights, seed, 20):
        assert moved(before, plan_hosts(changed, 2)) == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shards", (3, 4, 5, 8, 12, 16))
def test_adding_or_removing_a_host_with_the_cap_moves_at_most_1_percent(
    seed: int, shards: int
) -> None:
    """The documented trade-off: strict 1.05 balance costs a few collateral moves.

    A host at the margin of a shard at the cap can flip when the mean moves, so the
    literal "no other host moves" cannot hold together with a hard 1.05 cap. Measured
    here: on average about one other host per event, at most 1 % of the hosts.
    """
    weights = synthetic_cluster(seed)
    before = plan_hosts(weights, shards)
    events = single_host_changes(weights, seed, 20)
    collateral = [len(moved(before, plan_hosts(changed, shards))) for changed in events]
    assert max(collateral) <= 0.01 * len(weights)
    assert sum(collateral) / len(collateral) <= 0.0025 * len(weights)


# -- guarantee 4: rack mode ------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shards", (2, 3, 4, 5, 8))
def test_rack_mode_keeps_racks_whole_and_balances_by_weight(seed: int, shards: int) -> None:
    weights = synthetic_cluster(seed)
    racks = racks_of(weights)
    assignment = plan_hosts(weights, shards, racks=racks)
    shards_of_rack: dict[str, set[int]] = {}
    for host, shard in assignment.items():
        shards_of_rack.setdefault(racks[host], set()).add(shard)
    assert all(len(s) == 1 for s in shards_of_rack.values())
    assert imbalance(shard_loads(assignment, weights, shards)) <= 1.05


def test_rack_mode_hosts_without_rack_are_their_own_unit() -> None:
    weights = {"a1": 10, "a2": 10, "solo1": 5, "solo2": 5}
    racks = {"a1": "ra", "a2": "ra", "solo1": "", "solo2": ""}
    assignment = plan_hosts(weights, 2, racks=racks)
    assert assignment["a1"] == assignment["a2"]


# -- guarantee 5: pins -----------------------------------------------------------------------


def test_pins_are_honoured_and_balance_still_holds() -> None:
    weights = synthetic_cluster(2)
    pins = {host: 3 for host in sorted(weights)[:40]}
    assignment = plan_hosts(weights, 4, pins)
    assert all(assignment[h] == 3 for h in pins)
    assert imbalance(shard_loads(assignment, weights, 4)) <= 1.05


def test_pin_in_rack_mode_takes_the_whole_rack() -> None:
    weights = synthetic_cluster(2)
    racks = racks_of(weights)
    host = sorted(weights)[0]
    assignment = plan_hosts(weights, 4, {host: 2}, racks)
    assert {assignment[h] for h in weights if racks[h] == racks[host]} == {2}


@pytest.mark.parametrize(
    ("pins", "message"),
    [
        ({"r001-x": 0}, "pinned host 'r001-x' is not in the plan"),
        ({"a": 4}, "a is pinned to shard 4, but shards are 0..3"),
        ({"a": -1}, "a is pinned to shard -1, but shards are 0..3"),
    ],
)
def test_bad_pins_are_errors(pins: dict[str, int], message: str) -> None:
    with pytest.raises(ShardingError) as err:
        plan_hosts({"a": 1, "b": 1}, 4, pins)
    assert str(err.value) == message


def test_conflicting_pins_in_one_rack_are_an_error() -> None:
    with pytest.raises(ShardingError, match="a2 is pinned to shard 1 but a1 in the same rack"):
        plan_hosts({"a1": 1, "a2": 1}, 2, {"a1": 0, "a2": 1}, {"a1": "r", "a2": "r"})


# -- speed -------------------------------------------------------------------------------------


def test_plan_for_10000_hosts_is_well_under_a_second() -> None:
    weights = synthetic_cluster(5, 10_000)
    # CPU time of this thread: another process on a loaded machine does not count.
    start = time.thread_time()
    plan_hosts(weights, 16)
    assert time.thread_time() - start < 1.0
