"""Sticky placement with a shard lock, on synthetic heterogeneous clusters of 1,000+ hosts.

The lock is the previous plan (host -> shard on N shards); docs/inventory.md section
"Sharding" states what it guarantees. Each test starts from the stateless plan, as
``gpufleet plan --write-lock`` writes it the first time.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest
from inventory_helpers import racks_of, synthetic_cluster

from gpufleet.sharding import imbalance, plan_hosts, shard_loads

SEEDS = range(4)
SHARD_COUNTS = (2, 4, 8, 16)
CAP = 1.05
TRIGGER = 1.10  # max_imbalance + rebalance_margin (defaults)


def moved(old: dict[str, int], new: dict[str, int]) -> list[str]:
    return [host for host in old if host in new and old[host] != new[host]]


def balance(assignment: dict[str, int], weights: dict[str, int], shards: int) -> float:
    return imbalance(shard_loads(assignment, weights, shards))


def sticky(weights: dict[str, int], shards: int, lock: dict[str, int], **kwargs) -> dict[str, int]:
    """The plan with ``lock`` as the previous plan (on as many shards as ``lock`` uses)."""
    return plan_hosts(weights, shards, previous=lock, **kwargs)


def new_rack(weights: dict[str, int], name: str, size: int) -> dict[str, int]:
    """``size`` hosts of the heaviest kind in the cluster (the worst case for balance)."""
    heaviest = max(weights.values())
    return {f"{name}-gpu{index:03d}": heaviest for index in range(1, size + 1)}


# -- the lock of an unchanged node list changes nothing ------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shards", SHARD_COUNTS)
def test_a_fresh_lock_is_a_fixed_point(seed: int, shards: int) -> None:
    weights = synthetic_cluster(seed)
    lock = plan_hosts(weights, shards)
    assert sticky(weights, shards, lock) == lock


def test_sticky_placement_does_not_depend_on_input_order() -> None:
    weights = synthetic_cluster(1)
    lock = plan_hosts(weights, 4)
    grown = {**weights, **new_rack(weights, "x", 64)}
    shuffled = list(grown.items())
    random.Random(3).shuffle(shuffled)
    for shards in (4, 5):
        expected = sticky(grown, shards, lock, previous_shards=4)
        assert sticky(dict(shuffled), shards, lock, previous_shards=4) == expected


def test_a_lock_holds_even_a_plan_the_stateless_planner_would_not_make() -> None:
    """Every locked host keeps its shard as long as no shard is past the hysteresis."""
    weights = synthetic_cluster(0)
    lock = plan_hosts(weights, 4)
    swapped = dict(lock)
    a, b = (next(h for h in sorted(lock) if lock[h] == s) for s in (0, 1))
    swapped[a], swapped[b] = 1, 0
    assert balance(swapped, weights, 4) <= TRIGGER
    assert swapped != lock
    assert sticky(weights, 4, swapped) == swapped


# -- adding nodes moves no other node -------------------------------------------------------


def add_single_node(weights: dict[str, int], step: int) -> dict[str, int]:
    return {**weights, f"new{step:03d}-gpu001": list(weights.values())[step * 37]}


def add_rack_of_64(weights: dict[str, int], step: int) -> dict[str, int]:
    return {**weights, **new_rack(weights, f"x{step}", 64)}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shards", SHARD_COUNTS)
@pytest.mark.parametrize(
    ("add", "steps"), [(add_single_node, 20), (add_rack_of_64, 4)], ids=["single", "racks"]
)
def test_adding_nodes_moves_no_other_node(
    seed: int, shards: int, add: Callable[[dict[str, int], int], dict[str, int]], steps: int
) -> None:
    weights = synthetic_cluster(seed)
    lock = plan_hosts(weights, shards)
    for step in range(steps):  # the lock is rewritten after every change, as in the workflow
        weights = add(weights, step)
        plan = sticky(weights, shards, lock)
        assert moved(lock, plan) == []
        assert balance(plan, weights, shards) <= CAP
        lock = plan


# -- removing nodes: nothing moves until the hysteresis, then a bounded rebalance -----------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shards", SHARD_COUNTS)
def test_removing_a_node_moves_no_other_node(seed: int, shards: int) -> None:
    weights = synthetic_cluster(seed)
    lock = plan_hosts(weights, shards)
    for host in sorted(weights)[::50]:  # about 20 separate removals from the same lock
        smaller = {h: w for h, w in weights.items() if h != host}
        assert moved(lock, sticky(smaller, shards, lock)) == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shards", (4, 8, 16))
def test_draining_one_shard_rebalances_only_past_the_hysteresis(seed: int, shards: int) -> None:
    """Remove shard 0's hosts 2 at a time, rewriting the lock after every step.

    No host moves while the heaviest shard stays within 1.10 x mean; the first step past
    it moves hosts only out of shards above 1.05 x mean, the least attached first, just
    enough to bring them back under it, and only that step moves anything.
    """
    weights = synthetic_cluster(seed)
    lock = plan_hosts(weights, shards)
    victims = sorted(h for h in lock if lock[h] == 0)
    rebalances = 0
    while victims:
        for host in victims[:2]:
            del weights[host]
        victims = victims[2:]
        unlocked_balance = balance({h: lock[h] for h in weights}, weights, shards)
        plan = sticky(weights, shards, lock)
        moves = moved(lock, plan)
        if unlocked_balance <= TRIGGER:
            assert moves == []
        else:
            rebalances += 1
            loads = shard_loads({h: lock[h] for h in weights}, weights, shards)
            cap = CAP * sum(loads) / shards
            sources = {lock[h] for h in moves}
            assert all(loads[s] > cap for s in sources)  # only overloaded shards give
            excess = sum(load - cap for load in loads if load > cap)
            moved_weight = sum(weights[h] for h in moves)
            assert moved_weight <= excess + len(sources) * max(weights.values())
            assert len(moves) <= 0.05 * len(weights)
            assert balance(plan, weights, shards) <= CAP
        lock = plan
    # After a rebalance (<= 1.05), about 4.5 % of the total weight must go before the
    # heaviest shard passes 1.10 again: a few rebalances per drained shard, not one a step.
    assert 1 <= rebalances <= 1 + (1 / shards) / 0.04


def test_rebalance_margin_sets_the_hysteresis() -> None:
    weights = synthetic_cluster(1)
    lock = plan_hosts(weights, 8)
    drained = {h: w for h, w in weights.items() if lock[h] != 0 or hash_free_half(h)}
    before = balance({h: lock[h] for h in drained}, drained, 8)
    assert before > CAP  # over the cap after the removal
    relaxed = sticky(drained, 8, lock, rebalance_margin=before - CAP + 0.01)
    strict = sticky(drained, 8, lock, rebalance_margin=0.0)
    assert moved(lock, relaxed) == []
    assert moved(lock, strict) and balance(strict, drained, 8) <= CAP


def hash_free_half(host: str) -> bool:
    """Keeps about half of a shard's hosts, deterministically."""
    return int(host[-1], 36) % 2 == 0


# -- changing the shard count ---------------------------------------------------------------


def assert_growth_moves_at_most_the_new_share(
    weights: dict[str, int], grown: dict[str, int], shards: int, new_shards: int
) -> None:
    """From the lock of ``weights`` on ``shards``, ``grown`` on ``new_shards`` moves at most
    the new shards' share of the locked hosts (+2 points) and stays balanced."""
    lock = plan_hosts(weights, shards)
    plan = sticky(grown, new_shards, lock, previous_shards=shards)
    assert len(moved(lock, plan)) / len(weights) <= (new_shards - shards) / new_shards + 0.02
    assert balance(plan, grown, new_shards) <= CAP


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shards", range(1, 16))
def test_growing_by_one_shard_moves_at_most_one_share_plus_2pp(seed: int, shards: int) -> None:
    """At 1,000 hosts for every N (the stateless plan needs ~125 hosts per shard)."""
    weights = synthetic_cluster(seed)
    assert_growth_moves_at_most_the_new_share(weights, weights, shards, shards + 1)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shards", (2, 3, 4, 8, 12, 16))
def test_shrinking_by_one_shard_moves_only_the_removed_shards_hosts(seed: int, shards: int) -> None:
    weights = synthetic_cluster(seed)
    lock = plan_hosts(weights, shards)
    plan = sticky(weights, shards - 1, lock, previous_shards=shards)
    assert {lock[h] for h in moved(lock, plan)} == {shards - 1}
    assert all(plan[h] == lock[h] for h in lock if lock[h] < shards - 1)
    assert balance(plan, weights, shards - 1) <= CAP


@pytest.mark.parametrize("seed", SEEDS)
def test_growing_by_several_shards_at_once(seed: int) -> None:
    weights = synthetic_cluster(seed)
    assert_growth_moves_at_most_the_new_share(weights, weights, 4, 8)


def test_shard_count_change_and_new_hosts_together() -> None:
    weights = synthetic_cluster(2)
    grown = {**weights, **new_rack(weights, "x", 64)}
    assert_growth_moves_at_most_the_new_share(weights, grown, 4, 5)


# -- pins, stale and partial locks, rack mode ------------------------------------------------


def test_pins_win_over_the_lock_and_are_never_rebalanced() -> None:
    weights = synthetic_cluster(3)
    lock = plan_hosts(weights, 4)
    pinned = sorted(h for h in lock if lock[h] == 0)[:30]
    pins = dict.fromkeys(pinned, 2)
    plan = sticky(weights, 4, lock, pins=pins)
    assert all(plan[h] == 2 for h in pinned)
    assert set(moved(lock, plan)) <= set(pinned) | {h for h in lock if lock[h] == 2}
    grown = sticky(weights, 5, lock, pins=pins, previous_shards=4)
    assert all(grown[h] == 2 for h in pinned)


def test_unknown_hosts_in_the_lock_are_ignored() -> None:
    weights = synthetic_cluster(0)
    lock = {**plan_hosts(weights, 4), "gone001": 3, "gone002": 0}
    plan = sticky(weights, 4, lock)
    assert plan.keys() == weights.keys()
    assert moved(lock, plan) == []


def test_lock_entries_for_removed_shards_are_replaced() -> None:
    weights = synthetic_cluster(0)
    lock = plan_hosts(weights, 6)
    plan = sticky(weights, 4, lock, previous_shards=6)
    assert set(plan.values()) == {0, 1, 2, 3}
    assert all(plan[h] == lock[h] for h in lock if lock[h] < 4)
    assert balance(plan, weights, 4) <= CAP


@pytest.mark.parametrize("seed", SEEDS)
def test_rack_mode_with_a_lock_keeps_racks_whole_and_adding_a_rack_moves_nothing(
    seed: int,
) -> None:
    weights = synthetic_cluster(seed)
    racks = racks_of(weights)
    lock = plan_hosts(weights, 4, racks=racks)
    assert sticky(weights, 4, lock, racks=racks) == lock
    extra = new_rack(weights, "r999", 16)
    grown = {**weights, **extra}
    plan = sticky(grown, 4, lock, racks={**racks, **dict.fromkeys(extra, "r999")})
    assert moved(lock, plan) == []
    assert len({plan[h] for h in extra}) == 1


def test_rack_mode_lock_of_split_rack_goes_to_the_majority_shard() -> None:
    weights = {"a1": 10, "a2": 10, "a3": 10, "b1": 30}
    racks = {"a1": "ra", "a2": "ra", "a3": "ra", "b1": "rb"}
    plan = sticky(weights, 2, {"a1": 1, "a2": 1, "a3": 0, "b1": 0}, racks=racks)
    assert plan == {"a1": 1, "a2": 1, "a3": 1, "b1": 0}


# -- speed --------------------------------------------------------------------------------------


def test_sticky_plan_for_10000_hosts_is_well_under_a_second() -> None:
    weights = synthetic_cluster(5, 10_000)
    lock = plan_hosts(weights, 16)
    grown = {**weights, **new_rack(weights, "x", 64)}
    for shards in (16, 17):
        # CPU time of this thread: another process on a loaded machine does not count.
        start = time.thread_time()
        sticky(grown, shards, lock, previous_shards=16)
        assert time.thread_time() - start < 1.0
