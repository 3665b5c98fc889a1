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

With a shard lock (the previous plan), :func:`place_sticky` keeps every locked unit where
it is and places only what changed, which makes adding and removing units strictly
stable; see docs/inventory.md, section "Sharding".
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

DEFAULT_MAX_IMBALANCE = 1.05
DEFAULT_REBALANCE_MARGIN = 0.05
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


def checked_pins(
    pins: Mapping[str, int] | None, units: Mapping[str, int], shards: int
) -> dict[str, int]:
    """``pins`` as a dict, once ``shards`` and every pin are known to be valid."""
    if shards < 1:
        raise ShardingError(f"shards must be >= 1, got {shards}")
    pins = dict(pins or {})
    for unit, shard in pins.items():
        if unit not in units:
            raise ShardingError(f"pinned unit {unit!r} is not in the plan")
        if not 0 <= shard < shards:
            raise ShardingError(
                f"{unit} is pinned to shard {shard}, but shards are 0..{shards - 1}"
            )
    return pins


class ScoreCache(dict[str, list[int]]):
    """Unit -> rendezvous scores, computed on first use (a sticky plan ranks few units)."""

    def __init__(self, shards: int) -> None:
        super().__init__()
        self.shards = shards

    def __missing__(self, unit: str) -> list[int]:
        scores = self[unit] = shard_scores(unit, self.shards)
        return scores


class Packing:
    """A placement being built: unit -> shard and the weight per shard, changed together."""

    def __init__(
        self, weights: Mapping[str, int], shards: int, scores: Mapping[str, list[int]]
    ) -> None:
        self.weights = weights
        self.scores = scores
        self.loads = [0] * shards
        self.assignment: dict[str, int] = {}

    def put(self, unit: str, shard: int) -> None:
        self.assignment[unit] = shard
        self.loads[shard] += self.weights[unit]

    def move(self, unit: str, target: int) -> None:
        self.loads[self.assignment[unit]] -= self.weights[unit]
        self.put(unit, target)

    def placement(self) -> Placement:
        return Placement(
            assignment={u: self.assignment[u] for u in self.weights}, loads=tuple(self.loads)
        )

    def fill_largest_first(self, units: Iterable[str], cap: float) -> None:
        """Place ``units`` largest first, each on its best-ranked shard with room under
        ``cap``, else on the lightest shard."""
        weights, loads = self.weights, self.loads
        for unit in sorted(units, key=lambda u: (-weights[u], u)):
            weight = weights[unit]
            preferred = ranking(self.scores[unit])
            fitting = [shard for shard in preferred if loads[shard] + weight <= cap]
            self.put(unit, fitting[0] if fitting else min(preferred, key=loads.__getitem__))

    def relieve_overloaded(
        self, cap: float, pinned: Collection[str] = (), preferred: Sequence[int] = ()
    ) -> None:
        """Move the least attached unpinned units out of shards above ``cap``.

        Each evicted unit goes to the first ``preferred`` shard, else its best-ranked other
        shard, that stays under ``cap``.
        """
        loads, scores = self.loads, self.scores
        overloaded = [shard for shard in range(len(loads)) if loads[shard] > cap]
        if not overloaded:
            return
        members: dict[int, list[str]] = {shard: [] for shard in overloaded}
        for unit, shard in self.assignment.items():
            if shard in members and unit not in pinned:
                members[shard].append(unit)
        for shard in sorted(overloaded, key=lambda s: (-loads[s], s)):
            candidates = sorted(members[shard], key=lambda unit: (scores[unit][shard], unit))
            for unit in candidates:
                if loads[shard] <= cap:
                    break
                weight = self.weights[unit]
                for target in (*preferred, *ranking(scores[unit])):
                    if target != shard and loads[target] + weight <= cap:
                        self.move(unit, target)
                        break

    def migrate_to_new_shards(self, first_new: int, target: float, pinned: Collection[str]) -> None:
        """Move units whose top shard is new (index >= ``first_new``) there, up to ``target``.

        Only such units move (as in pure rendezvous hashing). They are taken from the
        heaviest old shard first, most attached first, which also levels the old shards.
        """
        loads, weights = self.loads, self.weights
        queues: dict[int, list[tuple[int, str, int]]] = {}
        for unit, shard in self.assignment.items():
            if unit in pinned:
                continue
            unit_scores = self.scores[unit]
            top = max(range(len(unit_scores)), key=unit_scores.__getitem__)
            if top >= first_new and shard < first_new:
                queues.setdefault(shard, []).append((-unit_scores[top], unit, top))
        for queue in queues.values():
            queue.sort(reverse=True)  # most attached last: pop() takes it
        while queues:
            for source in list(queues):
                queue = queues[source]
                # New shards only fill up: a unit that does not fit now never will.
                while queue and loads[queue[-1][2]] + weights[queue[-1][1]] > target:
                    queue.pop()
                if not queue or loads[source] <= target:
                    del queues[source]
            if not queues:
                break
            source = max(queues, key=lambda shard: (loads[shard], -shard))
            _, unit, top = queues[source].pop()
            self.move(unit, top)


def place(
    weights: Mapping[str, int],
    shards: int,
    pins: Mapping[str, int] | None = None,
    max_imbalance: float = DEFAULT_MAX_IMBALANCE,
) -> Placement:
    """Place every unit on a shard. Deterministic for the same input, in any order."""
    pins = checked_pins(pins, weights, shards)
    # Only unpinned units are scored: relieve_overloaded() never moves a pinned one.
    scores: dict[str, list[int]] = {}
    packing = Packing(weights, shards, scores)
    for unit in weights:
        if unit in pins:
            packing.put(unit, pins[unit])
        else:
            unit_scores = scores[unit] = shard_scores(unit, shards)
            packing.put(unit, max(range(shards), key=unit_scores.__getitem__))
    if shards > 1:
        packing.relieve_overloaded(max_imbalance * sum(packing.loads) / shards, pins)
    return packing.placement()


def place_largest_first(
    weights: Mapping[str, int], shards: int, pins: Mapping[str, int], max_imbalance: float
) -> Placement:
    """Few, big units (racks): largest first, each to its best-ranked shard with room.

    With a handful of units per shard, evicting units after the fact rarely finds a fit;
    placing the largest units first (as the LPT heuristic does) balances far better, and
    the rendezvous ranking still decides between shards that have room, so a unit keeps
    its shard as long as it fits there.
    """
    pins = checked_pins(pins, weights, shards)
    packing = Packing(weights, shards, ScoreCache(shards))
    for unit, shard in pins.items():
        packing.put(unit, shard)
    unpinned = [unit for unit in weights if unit not in pins]
    packing.fill_largest_first(unpinned, max_imbalance * sum(weights.values()) / shards)
    return packing.placement()


def place_sticky(
    weights: Mapping[str, int],
    shards: int,
    previous: Mapping[str, int],
    previous_shards: int,
    pins: Mapping[str, int] | None = None,
    max_imbalance: float = DEFAULT_MAX_IMBALANCE,
    rebalance_margin: float = DEFAULT_REBALANCE_MARGIN,
) -> Placement:
    """Place units starting from a ``previous`` plan (the shard lock) on ``previous_shards``.

    1. Pinned units go to their pin; every other unit of ``previous`` keeps its shard if
       that shard still exists.
    2. More shards than before: only units whose rendezvous top shard (among ``shards``)
       is a new one move there (the HRW property), from the heaviest old shard first
       while it is above the mean weight, and while the new shard stays at or under it.
    3. New units, and units of removed shards, largest first: the best-ranked shard with
       room under the cap, else the lightest shard.
    4. Rebalance only after a shard count change, or when the heaviest shard exceeds
       ``max_imbalance + rebalance_margin`` x mean (hysteresis: removals drift the
       balance without moving anyone until then); then shards above the cap hand over
       their least attached units, to a new shard first, until they fit.
    """
    pins = checked_pins(pins, weights, shards)
    mean = sum(weights.values()) / shards
    cap = max_imbalance * mean
    packing = Packing(weights, shards, ScoreCache(shards))
    unplaced: list[str] = []
    for unit in weights:
        shard = pins.get(unit, previous.get(unit))
        if shard is None or not 0 <= shard < shards:
            unplaced.append(unit)
        else:
            packing.put(unit, shard)
    if shards > previous_shards:
        packing.migrate_to_new_shards(previous_shards, mean, pins)
    packing.fill_largest_first(unplaced, cap)
    trigger = (max_imbalance + rebalance_margin) * mean
    if shards > 1 and (shards != previous_shards or max(packing.loads) > trigger):
        new_shards = range(previous_shards, shards)  # empty unless shards were added
        packing.relieve_overloaded(cap, pins, new_shards)
    return packing.placement()


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


def unit_previous(
    unit_of: Mapping[str, str], weights: Mapping[str, int], previous: Mapping[str, int]
) -> dict[str, int]:
    """A unit's previous shard: where most of its locked weight was (lowest shard on ties)."""
    votes: dict[str, dict[int, int]] = {}
    for host, shard in previous.items():
        if host in unit_of:
            unit_votes = votes.setdefault(unit_of[host], {})
            unit_votes[shard] = unit_votes.get(shard, 0) + weights[host]
    return {
        unit: min(unit_votes, key=lambda shard: (-unit_votes[shard], shard))
        for unit, unit_votes in votes.items()
    }


def plan_hosts(
    weights: Mapping[str, int],
    shards: int,
    pins: Mapping[str, int] | None = None,
    racks: Mapping[str, str] | None = None,
    max_imbalance: float = DEFAULT_MAX_IMBALANCE,
    previous: Mapping[str, int] | None = None,
    previous_shards: int | None = None,
    rebalance_margin: float = DEFAULT_REBALANCE_MARGIN,
) -> dict[str, int]:
    """Host -> shard. With ``racks`` (host -> rack, '' for none), whole racks move together.

    Hosts without a rack stay individual units. Unit names are prefixed so that a rack
    and a host with the same name cannot collide. With ``previous`` (the shard lock:
    host -> shard on ``previous_shards`` shards, default ``shards``), the plan is sticky
    (:func:`place_sticky`); hosts of ``previous`` that are not in ``weights`` are ignored.
    """
    pins = dict(pins or {})
    for host in pins:
        if host not in weights:
            raise ShardingError(f"pinned host {host!r} is not in the plan")
    sticky_shards = shards if previous_shards is None else previous_shards
    if racks is None:
        if previous is None:
            return place(weights, shards, pins, max_imbalance).assignment
        locked = {host: shard for host, shard in previous.items() if host in weights}
        return place_sticky(
            weights, shards, locked, sticky_shards, pins, max_imbalance, rebalance_margin
        ).assignment
    unit_of = {
        host: f"rack:{racks[host]}" if racks.get(host) else f"host:{host}" for host in weights
    }
    unit_weights = group_units(unit_of, weights)
    pins_of_units = unit_pins(unit_of, pins)
    if previous is None:
        placement = place_largest_first(unit_weights, shards, pins_of_units, max_imbalance)
    else:
        placement = place_sticky(
            unit_weights,
            shards,
            unit_previous(unit_of, weights, previous),
            sticky_shards,
            pins_of_units,
            max_imbalance,
            rebalance_margin,
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
