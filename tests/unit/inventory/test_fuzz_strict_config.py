"""Seeded property test of strict config parsing, per class rather than per case.

Random node list *texts* (the YAML as an operator writes it, not data dumped by PyYAML)
mix the three ways one file can say two things: a key written twice (block or flow, at
any depth), an identifier YAML 1.1 would retype (``010``, ``yes``, ``10:30``), and one host
written two ways (case, an IPv4-mapped address, a YAML alias reusing a host list), with
some stray characters. Each case must end, within its bound, in a node list whose
identifiers are the text written, or in exactly one ``NodeListError`` line naming the file;
a mutation that always makes the file invalid must give that line. No other exception,
no traceback, no hang.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import yaml
from inventory_helpers import minimal_node_list

from gpufleet.inventory import build_inventory
from gpufleet.nodelist import NodeList, NodeListError, load_node_list

SEED = 2_611
CASES = 250
PER_CASE_SECONDS = 0.5  # CPU seconds of this thread: a loaded machine cannot fail it
TOTAL_SECONDS = 3.0
FILE = "fuzz.gpufleet.yml"

COERCIBLE = ["010", "0x1F", "0o17", "1_000", "10:30", "yes", "off", "On", "2024-01-01", "+5"]
STRAY = "[]{},:&*!|>'\"#%@`-?\t\u2028\x00é"
IDENTIFIER_KEYS = ("cluster", "rack", "model", "vendor", "gpu_collector")

Mutation = Callable[[random.Random, list[str]], bool]


BASE_LINES = tuple(
    yaml.safe_dump(minimal_node_list(), sort_keys=False, default_flow_style=False).splitlines()
)


def scalar_lines(lines: list[str], keys: tuple[str, ...] | None = None) -> list[int]:
    """Indexes of ``key: value`` lines (a scalar value), of ``keys`` if given."""
    found = []
    for index, line in enumerate(lines):
        key, colon, value = line.strip().removeprefix("- ").partition(": ")
        if colon and value and (keys is None or key in keys):
            found.append(index)
    return found


def duplicate_a_key(rnd: random.Random, lines: list[str]) -> bool:
    """Write one scalar key of a block mapping a second time, right below (same mapping)."""
    index = rnd.choice(scalar_lines(lines))
    line = lines[index]
    indent = len(line) - len(line.lstrip())
    body = line.strip()
    if body.startswith("- "):  # the first key of a list item: the next key is indented by 2
        indent, body = indent + 2, body[2:]
    key = body.partition(": ")[0]
    lines.insert(
        index + 1, " " * indent + f"{key}: {rnd.choice(['x', '1', 'true', body[len(key) + 2 :]])}"
    )
    return True


def duplicate_in_flow(rnd: random.Random, lines: list[str]) -> bool:
    """Write the GPU mapping in flow style with one of its keys twice."""
    start = next(i for i, line in enumerate(lines) if line.strip() == "gpu:")
    indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
    key = rnd.choice(["vendor", "model", "count"])
    value = {"vendor": "nvidia", "model": "A100", "count": "4"}[key]
    lines[start : start + 4] = [
        f"{indent}gpu: {{vendor: nvidia, model: H100, count: 8, {key}: {value}}}"
    ]
    return True


def coerce_an_identifier(rnd: random.Random, lines: list[str]) -> bool:
    """An identifier written as a token YAML 1.1 retypes (plain, so the loader decides)."""
    index = rnd.choice(scalar_lines(lines, IDENTIFIER_KEYS))
    head = lines[index].partition(": ")[0]
    lines[index] = f"{head}: {rnd.choice(COERCIBLE)}"
    return False  # it may read as written and then fail its grammar, or pass


def quote_a_coercible(rnd: random.Random, lines: list[str]) -> bool:
    """The same tokens quoted: valid wherever the identifier's grammar allows them."""
    index = rnd.choice(scalar_lines(lines, ("cluster", "rack", "model")))
    head = lines[index].partition(": ")[0]
    token = rnd.choice([t for t in COERCIBLE if ":" not in t and "+" not in t])
    quoted = f"'{token}'" if rnd.random() < 0.5 else f'"{token}"'
    lines[index] = f"{head}: {quoted}"
    return False


def alias_a_host(rnd: random.Random, lines: list[str]) -> bool:
    """One more server that is a host already defined, written another way."""
    kind = rnd.randrange(4)
    if kind == 0:  # a case alias of a compute node
        name = "".join(c.upper() if rnd.random() < 0.5 else c for c in "gpu002") or "GPU002"
        entry = [f"- hosts: {name if name != 'gpu002' else 'GPU002'}"]
    elif kind == 1:  # a hostlist whose expansion holds a case alias
        entry = [f"- hosts: {rnd.choice(['CPU', 'Cpu', 'cPU'])}[1-3]"]
    elif kind == 2:  # mon01's address, as an IPv4-mapped IPv6 address
        entry = ["- hosts: extra01", "  address: '::ffff:10.0.9.1'"]
    else:  # the same host list again, through a YAML alias
        at = next(i for i, line in enumerate(lines) if line.startswith("- hosts: mon[01-02]"))
        lines[at] = "- hosts: &servers mon[01-02]"
        entry = ["- hosts: *servers"]
    at = next(i for i, line in enumerate(lines) if line.startswith("monitoring:"))
    lines[at:at] = entry
    return True


def stray_characters(rnd: random.Random, lines: list[str]) -> bool:
    index = rnd.randrange(len(lines))
    chars = list(lines[index])
    for _ in range(rnd.randint(1, 3)):
        chars.insert(rnd.randint(0, len(chars)), rnd.choice(STRAY))
    lines[index] = "".join(chars)
    return False


# (mutation, weight): the ones that leave a valid file come often enough that both ends of
# the property are exercised.
MUTATIONS: list[tuple[Mutation, int]] = [
    (duplicate_a_key, 2),
    (duplicate_in_flow, 1),
    (coerce_an_identifier, 3),
    (quote_a_coercible, 4),
    (alias_a_host, 2),
    (stray_characters, 1),
]


def random_document(rnd: random.Random) -> tuple[str, bool]:
    """A node list text and whether some mutation in it always makes it invalid."""
    lines = list(BASE_LINES)
    always_invalid = False
    mutations, weights = zip(*MUTATIONS, strict=True)
    chosen = rnd.choices(mutations, weights, k=rnd.randint(1, 3))
    for mutation in chosen:
        try:
            always_invalid |= mutation(rnd, lines)
        except StopIteration:  # an earlier mutation moved what this one edits
            continue
    return "\n".join(lines) + "\n", always_invalid


def check_read_as_written(text: str, node_list: NodeList) -> None:
    """Every identifier of the result is text the file holds (never 8 for 010); host names
    are expanded from hostlists, so they are only checked to be text, one per host."""
    values = [node_list.cluster]
    for host in node_list.hosts:
        assert isinstance(host.name, str)
        values += [host.rack, host.gpu_model, host.gpu_vendor, *host.partitions]
    for value in values:
        assert isinstance(value, str) and (value == "" or value in text), (value, text)
    names = [host.name.lower() for host in node_list.hosts]
    assert len(names) == len(set(names)), "two hosts that are one host to DNS"


def test_random_node_list_texts_end_in_a_node_list_or_one_line() -> None:
    rnd = random.Random(SEED)
    started = time.thread_time()
    outcomes = {"parsed": 0, "refused": 0}
    for case in range(CASES):
        text, always_invalid = random_document(rnd)
        case_started = time.thread_time()
        try:
            node_list = load_node_list(FILE, read_text=lambda _path, text=text: text)
            build_inventory(node_list)
        except NodeListError as err:
            message = str(err)
            assert "\n" not in message and message.startswith(f"{FILE}: "), (case, message)
            outcomes["refused"] += 1
        else:
            assert not always_invalid, f"case {case} parsed:\n{text}"
            check_read_as_written(text, node_list)
            outcomes["parsed"] += 1
        spent = time.thread_time() - case_started
        assert spent < PER_CASE_SECONDS, f"case {case} took {spent:.2f} s:\n{text}"
    assert time.thread_time() - started < TOTAL_SECONDS
    # Both ends of the property are exercised, not only the refusals.
    assert outcomes["parsed"] >= CASES // 10 and outcomes["refused"] >= CASES // 2, outcomes
