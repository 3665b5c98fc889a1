"""Seeded fuzz test of the node list parser: hostlists, address templates and the shard,
replica and imbalance numbers, valid, mutated and hostile.

Every case must end, within a time bound, either in a valid plan (checked against the
limits) or in one clean ``NodeListError`` line naming the file; anything else (a
traceback, MemoryError, RecursionError, a hang) fails and prints the case to reproduce.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import pytest

from gpufleet import hostlist, limits
from gpufleet.inventory import build_inventory
from gpufleet.nodelist import NodeListError, parse_node_list

SEED = 20_240_611
CASES = 400
# CPU seconds of this thread (time.thread_time), so that a loaded machine cannot fail the
# bounds; the old failures took 60 s+ a case.
PER_CASE_SECONDS = 5.0
TOTAL_SECONDS = 120.0
FILE = "fuzz.gpufleet.yml"

GARBAGE = "[],-0123456789abgpu \t\n{}%:!.\\\u2028\x00é"
BIG = [10**6, 10**7, 10**12, 10**30, 10**100]


def mutate(rnd: random.Random, text: str) -> str:
    """Insert, delete or replace one to three characters."""
    chars = list(text)
    for _ in range(rnd.randint(1, 3)):
        position = rnd.randint(0, len(chars))
        action = rnd.choice(["insert", "delete", "replace"])
        if action == "insert" or not chars:
            chars.insert(position, rnd.choice(GARBAGE))
        elif action == "delete":
            del chars[min(position, len(chars) - 1)]
        else:
            chars[min(position, len(chars) - 1)] = rnd.choice(GARBAGE)
    return "".join(chars)


def valid_hostlist(rnd: random.Random, prefix: str) -> str:
    width = rnd.choice([1, 2, 3, 4])
    low = rnd.randint(0, 50)
    high = low + rnd.randint(0, 60)
    body = f"{low:0{width}d}-{high:0{width}d}"
    if rnd.random() < 0.3:
        body += f",{high + 2:0{width}d}"
    return f"{prefix}[{body}]" + (f"-x[1-{rnd.randint(1, 3)}]" if rnd.random() < 0.2 else "")


def random_hostlist(rnd: random.Random, prefix: str) -> Any:
    kind = rnd.randrange(10)
    if kind <= 2:
        return valid_hostlist(rnd, prefix)
    if kind == 3:
        return f"{prefix}[0-{rnd.choice(BIG)}]"
    if kind == 4:
        return prefix + "".join(f"[1-{rnd.choice([10, 100, 1000])}]" for _ in range(3))
    if kind == 5:
        return f"{prefix}[{'9' * rnd.choice([17, 19, 400, 5000])}]"
    if kind == 6:
        return "".join(rnd.choice(GARBAGE) for _ in range(rnd.randint(0, 30)))
    if kind == 7:
        return mutate(rnd, valid_hostlist(rnd, prefix))
    if kind == 8:
        return "a" * rnd.randint(200, 300) + "[1-3]"
    return rnd.choice(
        [
            7,
            None,
            [],
            [valid_hostlist(rnd, prefix), f"{prefix}z[0-{rnd.choice(BIG)}]"],
            {"a": 1},
            f"{valid_hostlist(rnd, prefix)},{valid_hostlist(rnd, prefix + 'q')}",
        ]
    )


def random_address(rnd: random.Random) -> Any:
    kind = rnd.randrange(8)
    if kind <= 1:
        return rnd.choice(
            ["10.{a}.{b}.{{num}}", "bmc-{{num:0{w}d}}", "{{name}}.mgmt.example.org"]
        ).format(a=rnd.randint(0, 255), b=rnd.randint(0, 255), w=rnd.randint(1, 9))
    if kind == 2:
        return rnd.choice(
            [
                "{name!r:>999999999}",
                "{num:>999999999}",
                "{num:0999999999d}",
                "{num:,}",
                "{name:{num}}",
                "{0}",
                "{}",
                "{name.__class__.__mro__}",
                "{name[0]}",
                "{num!s}",
                "10.0.0.{num",
                "10.0.0.num}",
                "{{num}}",
                "%(name)s",
            ]
        )
    if kind == 3:
        return "".join(rnd.choice("{}namu:!r0-9d.>,") for _ in range(rnd.randint(1, 20)))
    if kind == 4:
        return mutate(rnd, "10.1.{num}.{num:03d}")
    if kind == 5:
        return "{name}." * rnd.randint(1, 60) + "org"
    if kind == 6:
        return rnd.choice([5, None, [], 1.5, True, "", "x" * 300])
    return "10.9.9.9"  # a literal: fine for one host, an error for several


def random_number(rnd: random.Random, valid: list[Any]) -> Any:
    if rnd.random() < 0.5:
        return rnd.choice(valid)
    return rnd.choice(
        [
            0,
            -1,
            rnd.randint(-10, 100),
            10 ** rnd.randint(3, 40),
            float("nan"),
            float("inf"),
            float("-inf"),
            0.5,
            1e308,
            65.0,
            True,
            None,
            "2",
            "",
            [2],
        ]
    )


def valid_address(rnd: random.Random, index: int) -> str:
    return rnd.choice(
        [f"10.{index}.{rnd.randint(0, 255)}.{{num}}", f"bmc{index}-{{num:0{rnd.randint(1, 9)}d}}"]
    )


def random_node_list(rnd: random.Random) -> dict[str, Any]:
    """One aspect hostile (hostlists, addresses or numbers), all of them, or none."""
    focus = rnd.choice(["none", "hosts", "address", "numbers", "all"])
    hostile = {aspect: focus in (aspect, "all") for aspect in ("hosts", "address", "numbers")}
    nodes = []
    for index in range(rnd.randint(1, 3)):
        prefix = f"n{index}x"
        hosts = random_hostlist(rnd, prefix) if hostile["hosts"] else valid_hostlist(rnd, prefix)
        entry: dict[str, Any] = {"hosts": hosts}
        if rnd.random() < 0.7:
            entry["address"] = (
                random_address(rnd) if hostile["address"] else valid_address(rnd, index)
            )
        nodes.append(entry)
    monitoring: dict[str, Any] = {}
    for key, valid in [
        ("shards", [1, 2, 3]),
        ("replicas", [1, 2, 8]),
        ("max_imbalance", [1.0, 1.05, 2, 64.0]),
        ("rebalance_margin", [0, 0.05, 1.0]),
    ]:
        if rnd.random() < 0.6:
            monitoring[key] = random_number(rnd, valid) if hostile["numbers"] else valid[0]
    if rnd.random() < 0.3:
        pinned = random_hostlist(rnd, "n0x") if hostile["hosts"] else "mon1"
        pinned = pinned if isinstance(pinned, str | int) or pinned is None else str(pinned)
        monitoring["pin"] = {pinned: random_number(rnd, [0]) if hostile["numbers"] else 0}
    return {
        "plugin": "gpufleet",
        "cluster": "fuzz",
        "nodes": nodes,
        "servers": [{"hosts": "mon[1-2]", "address": "10.200.0.{num}"}],
        "monitoring": monitoring,
    }


def check_plan(data: dict[str, Any]) -> str:
    """'ok' or 'error', after checking the outcome; raises on anything unclean."""
    try:
        node_list = parse_node_list(data, FILE)
        plan = build_inventory(node_list)
    except NodeListError as err:
        text = str(err)
        assert text.startswith(f"{FILE}: "), text
        assert len(text.splitlines()) == 1, text
        assert len(text) < 1000, text
        return "error"
    monitoring = node_list.monitoring
    assert 1 <= len(node_list.hosts) <= limits.MAX_HOSTS
    assert 1 <= monitoring.shards <= min(limits.MAX_SHARDS, len(node_list.hosts))
    assert 1 <= monitoring.replicas <= limits.MAX_REPLICAS
    assert math.isfinite(monitoring.max_imbalance) and math.isfinite(monitoring.rebalance_margin)
    assert len({host.name for host in node_list.hosts}) == len(node_list.hosts)
    for host, variables in plan.host_vars.items():
        assert 0 <= variables["gpufleet_shard"] < monitoring.shards, host
        assert 0 < len(variables["ansible_host"]) <= 253, host
    return "ok"


def test_fuzzed_node_lists_end_in_a_plan_or_one_clean_line() -> None:
    rnd = random.Random(SEED)
    outcomes = {"ok": 0, "error": 0}
    started = time.thread_time()
    for case in range(CASES):
        data = random_node_list(rnd)
        case_started = time.thread_time()
        try:
            outcome = check_plan(data)
        except Exception as err:
            pytest.fail(f"case {case} (seed {SEED}): {type(err).__name__}: {err}\n{data!r:.2000}")
        elapsed = time.thread_time() - case_started
        assert elapsed < PER_CASE_SECONDS, f"case {case} took {elapsed:.1f} s: {data!r:.2000}"
        outcomes[outcome] += 1
    assert time.thread_time() - started < TOTAL_SECONDS
    # Not degenerate: both outcomes are well represented.
    assert outcomes["ok"] >= CASES // 10 and outcomes["error"] >= CASES // 4, outcomes


def test_fuzzed_hostlists_expand_within_the_budget_or_fail_cleanly() -> None:
    rnd = random.Random(SEED + 1)
    for case in range(CASES):
        budget = hostlist.Budget(hosts=5_000, names=20_000)
        expressions = [random_hostlist(rnd, "h") for _ in range(rnd.randint(1, 4))]
        started = time.thread_time()
        for expression in expressions:
            if not isinstance(expression, str):
                continue
            try:
                names = budget.expand(expression, defines=rnd.random() < 0.5)
            except hostlist.HostlistError as err:
                assert len(str(err).splitlines()) == 1 and len(str(err)) < 500, str(err)
                continue
            except Exception as err:
                pytest.fail(f"case {case}: {type(err).__name__}: {err}: {expression!r:.500}")
            assert all(len(name) <= limits.MAX_NAME_LENGTH for name in names)
        assert budget.names_left >= 0 and budget.hosts_left >= 0
        assert time.thread_time() - started < PER_CASE_SECONDS, f"case {case}: {expressions!r:.500}"
