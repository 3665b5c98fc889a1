"""Issue 26, findings 11-14: configuration is parsed strictly.

Per class, seeded and bounded: duplicate keys at any depth, YAML 1.1 coercions of
identifiers, case/format aliases of one host, constructed options whose work is bounded,
and slurm.conf files Slurm itself accepts.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleParserError
from ansible.inventory.data import InventoryData
from ansible.parsing.dataloader import DataLoader
from inventory_helpers import minimal_node_list, write_node_list

from gpufleet import slurmconf, strictyaml
from gpufleet.deadline import DeadlineExceeded, deadline
from gpufleet.nodelist import NodeListError, construct_problem, load_node_list
from gpufleet.shardlock import LockError, format_lock, parse_lock

SEED = 26


def one_line_error(path: Path) -> str:
    with pytest.raises(NodeListError) as caught:
        load_node_list(str(path))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    return message


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


# -- finding 11: duplicate keys ---------------------------------------------------------------


def test_second_nodes_key_is_refused_naming_file_line_and_key(tmp_path: Path) -> None:
    text = dump(minimal_node_list()) + "nodes:\n  - hosts: login01\n"
    message = one_line_error(write_node_list(tmp_path, text))
    assert "duplicate key 'nodes' (first at line 3" in message


def test_plan_exits_nonzero_on_a_duplicate_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpufleet.cli import main

    path = write_node_list(tmp_path, dump(minimal_node_list()) + "cluster: other\n")
    assert main(["plan", str(path)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "duplicate key 'cluster'" in err


def _with_duplicate(rnd: random.Random, data: Any, depth: int = 0) -> tuple[Any, bool]:
    """A copy of ``data`` as YAML text parts with one mapping's key written twice."""
    mappings: list[dict[str, Any]] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            mappings.append(value)
            for child in value.values():
                walk(child)
        elif isinstance(value, list):
            for child in value:
                walk(child)

    walk(data)
    target = rnd.choice([m for m in mappings if m])
    key = rnd.choice(list(target))
    target[f"__DUP__{key}"] = target[key]
    return data, True


@pytest.mark.parametrize("case", range(40))
def test_duplicate_keys_at_any_depth_are_refused(case: int) -> None:
    rnd = random.Random(SEED * 1000 + case)
    data, _ = _with_duplicate(rnd, minimal_node_list())
    text = dump(data)
    text = __import__("re").sub(r"__DUP__", "", text)
    flow = rnd.random() < 0.3
    if flow:  # the same document in flow style: {a: 1, a: 2} on one line
        text = text.replace("\n", "\n")
    with pytest.raises(strictyaml.YamlProblem) as caught:
        strictyaml.load(text)
    assert caught.value.where.startswith("line ") and "duplicate key" in caught.value.problem


def test_duplicate_key_in_a_flow_mapping() -> None:
    with pytest.raises(strictyaml.YamlProblem, match="duplicate key 'count'"):
        strictyaml.load("gpu: {vendor: nvidia, count: 8, count: 4}\n")


def test_merge_keys_are_not_duplicates() -> None:
    assert strictyaml.load("a: &A {x: 1}\nb:\n  <<: *A\n  x: 2\n") == {
        "a": {"x": 1},
        "b": {"x": 2},
    }


def test_host_listed_twice_in_the_shard_lock_is_refused() -> None:
    text = "version: 1\ncluster: c\nshards: 2\nhosts:\n  gpu01: 0\n  gpu02: 1\n  gpu01: 1\n"
    with pytest.raises(LockError, match="line 7: invalid YAML: duplicate key 'gpu01'"):
        parse_lock(text, "lock")


def test_case_aliases_in_the_shard_lock_are_refused() -> None:
    text = "version: 1\ncluster: c\nshards: 2\nhosts:\n  gpu01: 0\n  GPU01: 1\n"
    with pytest.raises(LockError, match="'GPU01' and host 'gpu01' differ only in case"):
        parse_lock(text, "lock")


# -- finding 13: YAML 1.1 coercions of identifiers --------------------------------------------

# Every YAML 1.1 implicit type PyYAML's safe_load applies that changes or retypes the text.
COERCIBLE = [
    "010", "0o17", "0x1F", "0b101", "+5", "1_000", "10:30", "1:20:30", "-0", "00",
    "yes", "no", "on", "off", "y", "n", "Yes", "OFF",
    "1_0.5", "10:30.5", "2024-01-01", "2024-01-01 10:00:00", "=",
]  # fmt: skip


@pytest.mark.parametrize("text", COERCIBLE)
def test_coercible_scalars_stay_the_text_written(text: str) -> None:
    assert strictyaml.load(f"rack: {text}\n") == {"rack": text}


@pytest.mark.parametrize("case", range(30))
def test_identifiers_are_read_as_written_or_refused(tmp_path: Path, case: int) -> None:
    rnd = random.Random(SEED + case)
    text = rnd.choice([*COERCIBLE, "true", "1.5", "1.0e+3", ".inf", "null", "7"])
    field = rnd.choice(["cluster", "rack", "model", "partition"])
    base = dump(minimal_node_list(cluster="clusterX"))
    base = base.replace("rack: r01", "rack: RACKX").replace("model: H100", "model: MODELX")
    base = base.replace("- gpu\n", "- PARTX\n")
    token = {"cluster": "clusterX", "rack": "RACKX", "model": "MODELX", "partition": "PARTX"}
    path = write_node_list(tmp_path, base.replace(token[field], text, 1))
    try:
        node_list = load_node_list(str(path))
    except NodeListError as err:
        assert "\n" not in str(err) and str(err).startswith(f"{path}: ")
        return
    host = node_list.hosts[0]
    read = {
        "cluster": node_list.cluster,
        "rack": host.rack,
        "model": host.gpu_model,
        "partition": host.partitions[0],
    }[field]
    assert read == text  # never 630 for 10:30, 8 for 010


def test_issue_examples(tmp_path: Path) -> None:
    text = dump(minimal_node_list()).replace("rack: r01", "rack: 010")
    node_list = load_node_list(str(write_node_list(tmp_path, text)))
    assert node_list.hosts[0].rack == "010"
    text = dump(minimal_node_list()).replace("cluster: test", "cluster: 10:30")
    message = one_line_error(write_node_list(tmp_path, text))
    assert "cluster: invalid value '10:30'" in message


def test_lock_round_trips_names_either_yaml_would_type() -> None:
    names = {name: index % 2 for index, name in enumerate(["010", "1e3", "yes", "10:30", "a"])}
    assert parse_lock(format_lock("c", 2, names), "lock").hosts == names


# -- finding 13: case and format aliases of one host ------------------------------------------


def test_case_aliases_are_one_host(tmp_path: Path) -> None:
    data = minimal_node_list()
    data["servers"].append({"hosts": "GPU001", "address": "10.0.8.1"})
    message = one_line_error(write_node_list(tmp_path, dump(data)))
    assert "'GPU001' and host 'gpu001' (nodes[0]) differ only in case" in message


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("fe80::1", "FE80:0:0:0:0:0:0:1"),
        ("2001:db8::1", "2001:0db8:0000::0001"),
        ("10.0.8.1", "::ffff:10.0.8.1"),
        ("mon.example.org", "MON.Example.org"),
    ],
)
def test_one_address_written_two_ways_is_a_duplicate(
    tmp_path: Path, first: str, second: str
) -> None:
    data = minimal_node_list()
    data["servers"] = [{"hosts": "x1", "address": first}, {"hosts": "x2", "address": second}]
    data["monitoring"] = {}
    message = one_line_error(write_node_list(tmp_path, dump(data)))
    assert f"address {second} of x2 duplicates that of x1 (servers[0], written {first})" in message


@pytest.mark.parametrize("case", range(20))
def test_random_case_aliases_are_refused(tmp_path: Path, case: int) -> None:
    rnd = random.Random(SEED * 7 + case)
    name = "".join(rnd.choice("abcxyz") for _ in range(5)) + str(rnd.randrange(100))
    alias = "".join(c.upper() if rnd.random() < 0.5 else c for c in name)
    if alias == name:
        alias = name.upper()
    data = minimal_node_list()
    data["servers"] += [{"hosts": name}, {"hosts": alias}]
    assert "differ only in case" in one_line_error(write_node_list(tmp_path, dump(data)))


# -- finding 12: constructed options are bounded ----------------------------------------------


def test_construct_bound_is_checked_before_any_evaluation() -> None:
    keyed = [{"key": f"k{i}"} for i in range(300)]
    assert construct_problem(10, None, None, keyed) == (
        "keyed_groups",
        "300 compose/groups/keyed_groups expressions, more than 256",
    )
    problem = construct_problem(100_000, {"a": "1"}, {"g": "true"}, [{"key": "x"}] * 20)
    assert problem is not None and "template evaluations, more than 1,000,000" in problem[1]
    assert construct_problem(1000, {"a": "1"}, None, [{"key": "x"}]) is None


def _plugin_parse(plugin: Any, path: Path) -> InventoryData:
    inventory = InventoryData()
    plugin.parse(inventory, DataLoader(), str(path), cache=False)
    return inventory


def test_large_keyed_groups_input_is_refused_fast(plugin: Any, tmp_path: Path) -> None:
    data = minimal_node_list()
    data["nodes"][0]["hosts"] = "gpu[00001-20000]"
    data["nodes"][0]["address"] = "10.{num}.0.1"
    data["nodes"][0].pop("address")
    data["keyed_groups"] = [{"key": f"gpufleet_rack ~ '{i}'", "prefix": "p"} for i in range(60)]
    path = write_node_list(tmp_path, dump(data))
    start = time.monotonic()
    with pytest.raises(AnsibleParserError, match=r"keyed_groups: 60 expressions x 20,00"):
        _plugin_parse(plugin, path)
    assert time.monotonic() - start < 30


def test_slow_expression_hits_the_deadline(
    plugin: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setattr(sys.modules[type(plugin).__module__], "CONSTRUCT_DEADLINE_S", 1.0)
    data = minimal_node_list()
    data["compose"] = {"big": "range(10**9) | select('gt', 10**10) | list"}
    path = write_node_list(tmp_path, dump(data))
    start = time.monotonic()
    with pytest.raises(AnsibleParserError, match="templating took longer than 1 s"):
        _plugin_parse(plugin, path)
    assert time.monotonic() - start < 20


def test_keyed_groups_adding_too_many_groups_is_refused(
    plugin: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setattr(sys.modules[type(plugin).__module__], "MAX_CONSTRUCTED_GROUPS", 50)
    data = minimal_node_list()
    data["keyed_groups"] = [
        {
            "key": "range(40) | map('string') | map('regex_replace', '^', inventory_hostname)"
            " | list",
            "prefix": "k",
        }
    ]
    data["compose"] = {"x": "1"}
    path = write_node_list(tmp_path, dump(data))
    with pytest.raises(AnsibleParserError, match="keyed_groups: adds more than 50 groups"):
        _plugin_parse(plugin, path)


def test_deadline_is_not_swallowed_by_except_exception() -> None:
    with pytest.raises(DeadlineExceeded), deadline(0.2):
        try:
            while True:
                time.sleep(0.01)
        except Exception:  # what strict: false does around a template
            pytest.fail("swallowed")


def test_plugin_keeps_vault_and_unsafe_vars_from_ansible(plugin: Any, tmp_path: Path) -> None:
    text = dump(minimal_node_list()).replace(
        "  cpus: 64\n", "  cpus: 64\n  vars:\n    raw: !unsafe '{{ nope }}'\n", 1
    )
    text = text.replace("rack: r02", "rack: 010")
    inventory = _plugin_parse(plugin, write_node_list(tmp_path, text))
    host = inventory.get_host("cpu1").get_vars()
    assert host["gpufleet_rack"] == "010"
    assert str(host["raw"]) == "{{ nope }}"


def test_plugin_refuses_duplicate_keys_in_one_line(plugin: Any, tmp_path: Path) -> None:
    path = write_node_list(tmp_path, dump(minimal_node_list()) + "plugin: gpufleet\n")
    with pytest.raises(AnsibleParserError) as caught:
        _plugin_parse(plugin, path)
    assert str(caught.value.message).startswith(f"{path}: line ")
    assert "duplicate key 'plugin'" in str(caught.value.message)


# -- finding 14: slurm.conf read as Slurm reads it --------------------------------------------


def test_partition_default_nodes_are_inherited() -> None:
    conf = slurmconf.parse(
        "NodeName=gpu[01-04] Gres=gpu:a100:4\nNodeName=cpu01\n"
        "PartitionName=DEFAULT Nodes=gpu[01-04] State=UP\n"
        "PartitionName=gpu Default=YES\nPartitionName=all Nodes=ALL\n"
    )
    assert conf.partitions["gpu"] == ("gpu01", "gpu02", "gpu03", "gpu04")
    assert conf.partitions["all"] == ("gpu01", "gpu02", "gpu03", "gpu04", "cpu01")


@pytest.mark.parametrize(
    ("line", "gpu_type", "count"),
    [
        ("NodeName=n1 Gres=gpumem:80G,gpu:a100:4", "a100", 4),
        ("NodeName=n1 Gres=gpumem:80G", None, 0),
        ("NodeName=n1 Gres=mps:100,gpu:2(S:0-1)", None, 2),
        ("NodeName=n1 Gres=gpu", None, 1),
        ("NodeName=n1 Gres=gpu:h100", "h100", 1),
        ("NodeName=n1 Gres=shard:8,gpu:h100:8 Comment=it's", "h100", 8),
        ('NodeName=n1 Feature="a b" Comment="it\'s ok" Gres=gpu:1', None, 1),
    ],
)
def test_valid_slurm_conf_lines_are_read(line: str, gpu_type: str | None, count: int) -> None:
    (node,) = slurmconf.parse(line + "\n").nodes
    assert (node.gpu_type, node.gpu_count) == (gpu_type, count)


@pytest.mark.parametrize("case", range(30))
def test_free_text_values_never_break_a_line(case: int) -> None:
    rnd = random.Random(SEED * 13 + case)
    value = "".join(rnd.choice("ab'`$;\\!()[]{}<>|&*?~") for _ in range(rnd.randrange(1, 12)))
    conf = slurmconf.parse(f"NodeName=n[1-2] Comment={value} CPUs=8\n")
    assert conf.nodes[0].hosts == ("n1", "n2") and conf.nodes[0].cpus == 8
