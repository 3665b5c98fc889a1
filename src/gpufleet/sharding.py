"""Shard placement: weighted rendezvous hashing with a bounded-load correction.

Pure functions, no I/O. The unit of placement is a *unit* (a host, or a whole rack in
``rack`` mode) with an integer weight (its expected series).

1. Every unit ranks the shards by a rendezvous (HRW) score that depends only on the
   unit's name and the shard index, and goes to its top shard. On its own this is
   perfectly stable: adding or removing a unit moves no other unit, and going from N to
   N+1 shards moves exactly the units whose new top shard is N (about 1/(N+1)).
2. Only if a shard then carries more than ``max_imbalance`` x the mean weight, the
   correction evicts its least attached units (lowest score for that shard) to their
   next-ranked shard with room, until it fits. Shards under the cap are never touched,
   so the correction only moves units out of overloaded shards.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DEFAULT_MAX_IMBALANCE = 1.05
_MASK64 = (1 << 64) - 1


class ShardingError(ValueError):
    """An impossible sharding request (bad pin, conflicting pins)."""


def unit_hash(name: str) -> int:
    """A stable 64-bit hash of a unit name (not Python's salted ``hash``)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


def mix64(value: int) -> int:
    """splitmix64 finaliser: a cheap, well-mixed 64-bit permutation."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def shard_scores(name: str, shards: int) -> list[int]:
    """Rendezvous score of ``name`` for each shard; shard k's score never depends on N."""
    base = unit_hash(name)
    return [mix64(base ^ mix64(shard + 1)) for shard in range(shards)]


def ranking(scores: list[int]) -> list[int]:
    """Shards from most to least preferred (ties cannot happen in practice; index breaks them)."""
    return sorted(range(len(scores)), key=lambda shard: (-scores[shard], shard))


@dataclass(frozen=True)
class Placement:
    """Result of :func:`place`: unit -> shard, and the weight per shard."""

    assignment: dict[str, int]
    loads: tuple[int, ...]

    @property
    def imbalance(self) -> float:
        """Heaviest shard / mean shard weight (1.0 is perfect)."""
        total = sum(self.loads)
        return max(self.loads) * len(self.loads) / total if total else 1.0


def validate_pins(pins: Mapping[str, int], units: Mapping[str, int], shards: int) -> None:
    for unit, shard in pins.items():
        if unit not in units:
            raise ShardingError(f"pinned unit {unit!r} is not in the plan")
        if not 0 <= shard < shards:
            raise ShardingError(
                f"{unit} is pinned to shard {shard}, but shards are 0..{shards - 1}"
            )


def place(
    weights: Mapping[str, int],
    shards: int,
    pins: Mapping[str, int] | None = None,
    max_imbalance: float = DEFAULT_MAX_IMBALANCE,
) -> Placement:
    """Place every unit on a shard. Deterministic for the same input, in any order."""
    if shards < 1:
        raise ShardingError(f"shards must be >= 1, got {shards}")
    pins = dict(pins or {})
    validate_pins(pins, weights, shards)
    loads = [0] * shards
    assignment: dict[str, int] = {}
    scores: dict[str, list[int]] = {}
    for unit, weight in weights.items():
        if unit in pins:
            shard = pins[unit]
        else:
            unit_scores = shard_scores(unit, shards)
            scores[unit] = unit_scores
            shard = max(range(shards), key=unit_scores.__getitem__)
        assignment[unit] = shard
        loads[shard] += weight
    if shards > 1:
        cap = max_imbalance * sum(loads) / shards
        relieve_overloaded(assignment, loads, weights, scores, cap)
    return Placement(assignment=assignment, loads=tuple(loads))


def relieve_overloaded(
    assignment: dict[str, int],
    loads: list[int],
    weights: Mapping[str, int],
    scores: Mapping[str, list[int]],
    cap: float,
) -> None:
    """Move the least attached movable units out of shards above ``cap`` (in place)."""
    overloaded = [shard for shard in range(len(loads)) if loads[shard] > cap]
    if not overloaded:
        return
    members: dict[int, list[str]] = {shard: [] for shard in overloaded}
    for unit, shard in assignment.items():
        if shard in members and unit in scores:  # pinned units have no scores: never moved
            members[shard].append(unit)
    for shard in sorted(overloaded, key=lambda s: (-loads[s], s)):
        candidates = sorted(members[shard], key=lambda unit: (scores[unit][shard], unit))
        for unit in candidates:
            if loads[shard] <= cap:
                break
            weight = weights[unit]
            for target in ranking(scores[unit])[1:]:
                if loads[target] + weight <= cap:
                    assignment[unit] = target
                    loads[shard] -= weight
                    loads[target] += weight
                    break


def place_largest_first(
    weights: Mapping[str, int],
    shards: int,
    pins: Mapping[str, int] | None = None,
    max_imbalance: float = DEFAULT_MAX_IMBALANCE,
) -> Placement:
    """Few, big units (racks): largest first, each to its best-ranked shard with room.

    With a handful of units per shard, evicting units after the fact rarely finds a fit;
    placing the largest units first (as the LPT heuristic does) balances far better, and
    the rendezvous ranking still decides between shards that have room, so a unit keeps
    its shard as long as it fits there.
    """
    if shards < 1:
        raise ShardingError(f"shards must be >= 1, got {shards}")
    pins = dict(pins or {})
    validate_pins(pins, weights, shards)
    cap = max_imbalance * sum(weights.values()) / shards
    loads = [0] * shards
    assignment: dict[str, int] = {}
    for unit, shard in pins.items():
        assignment[unit] = shard
        loads[shard] += weights[unit]
    for unit in sorted((u for u in weights if u not in pins), key=lambda u: (-weights[u], u)):
        weight = weights[unit]
        preferred = ranking(shard_scores(unit, shards))
        fitting = [shard for shard in preferred if loads[shard] + weight <= cap]
        shard = fitting[0] if fitting else min(preferred, key=loads.__getitem__)
        assignment[unit] = shard
        loads[shard] += weight
    return Placement(assignment={u: assignment[u] for u in weights}, loads=tuple(loads))


def group_units(unit_of: Mapping[str, str], weights: Mapping[str, int]) -> dict[str, int]:
    """Sum host weights per unit (e.g. per rack)."""
    totals: dict[str, int] = {}
    for host, weight in weights.items():
        unit = unit_of[host]
        totals[unit] = totals.get(unit, 0) + weight
    return totals


def unit_pins(unit_of: Mapping[str, str], host_pins: Mapping[str, int]) -> dict[str, int]:
    """Lift host pins to their unit; two hosts of one unit pinned apart is an error."""
    pins: dict[str, int] = {}
    pinned_by: dict[str, str] = {}
    for host, shard in host_pins.items():
        unit = unit_of[host]
        if unit in pins and pins[unit] != shard:
            raise ShardingError(
                f"{host} is pinned to shard {shard} but {pinned_by[unit]} in the same rack "
                f"is pinned to shard {pins[unit]}"
            )
        pins[unit] = shard
        pinned_by[unit] = host
    return pins


def plan_hosts(
    weights: Mapping[str, int],
    shards: int,
    pins: Mapping[str, int] | None = None,
    racks: Mapping[str, str] | None = None,
    max_imbalance: float = DEFAULT_MAX_IMBALANCE,
) -> dict[str, int]:
    """Host -> shard. With ``racks`` (host -> rack, '' for none), whole racks move together.

    Hosts without a rack stay individual units. Unit names are prefixed so that a rack
    and a host with the same name cannot collide.
    """
    pins = dict(pins or {})
    for host in pins:
        if host not in weights:
            raise ShardingError(f"pinned host {host!r} is not in the plan")
    if racks is None:
        return place(weights, shards, pins, max_imbalance).assignment
    unit_of = {
        host: f"rack:{racks[host]}" if racks.get(host) else f"host:{host}" for host in weights
    }
    placement = place_largest_first(
        group_units(unit_of, weights), shards, unit_pins(unit_of, pins), max_imbalance
    )
    return {host: placement.assignment[unit_of[host]] for host in weights}


def shard_loads(
    assignment: Mapping[str, int], weights: Mapping[str, int], shards: int
) -> list[int]:
    loads = [0] * shards
    for host, shard in assignment.items():
        loads[shard] += weights[host]
    return loads


def imbalance(loads: Iterable[int]) -> float:
    """Heaviest shard / mean shard weight."""
    values = list(loads)
    total = sum(values)
    return max(values) * len(values) / total if total else 1.0


@dataclass(frozen=True)
class Move:
    host: str
    old_shard: int | None  # None: the host is new
    new_shard: int | None  # None: the host was removed


def diff_assignments(old: Mapping[str, int], new: Mapping[str, int]) -> list[Move]:
    """Hosts whose shard changes, plus added (old None) and removed (new None) hosts."""
    moves = [
        Move(host, old.get(host), new.get(host))
        for host in (*old, *(h for h in new if h not in old))
        if old.get(host) != new.get(host)
    ]
    return moves
