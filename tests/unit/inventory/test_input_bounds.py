"""Bounded input: every limit in docs/inventory.md ("Limits") is a one-line error reached in
bounded time; never a traceback, a hang or a MemoryError. Also slurm.conf ``Include``, the
files gpufleet reads (FIFOs, devices), ``gpufleet plan | head`` and which plugins try a
node list."""

from __future__ import annotations

import configparser
import importlib.util
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleParserError
from ansible.inventory.data import InventoryData
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import inventory_loader
from inventory_helpers import (
    REPO_ROOT,
    SRC,
    assert_one_error,
    minimal_node_list,
    run_ansible_inventory,
    write_node_list,
)

from gpufleet import hostlist, limits, nodelist, slurmconf
from gpufleet.cli import EXIT_BROKEN_PIPE, main
from gpufleet.inventory import build_inventory
from gpufleet.nodelist import (
    AddressTemplate,
    NodeListError,
    load_node_list,
    parse_node_list,
)

EXAMPLE = REPO_ROOT / "inventories" / "example"


def within(seconds: float, function: Callable[[], Any]) -> Any:
    """``function()``'s result or exception, failing the test if it uses more than
    ``seconds`` of CPU. CPU time, not wall time: the bound tells a fast refusal from a
    blow-up (the old failures ran 60 s+) however loaded the machine is. A daemon thread
    with a generous wall limit, so that a hang cannot hold the test run."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        started = time.thread_time()
        try:
            outcome["value"] = function()
        except BaseException as err:
            outcome["error"] = err
        outcome["seconds"] = time.thread_time() - started

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    wall = min(max(10 * seconds, 30), 120)  # a hang fails within two minutes
    thread.join(wall)
    assert not thread.is_alive(), f"still running after {wall} s"
    assert outcome["seconds"] < seconds, f"took {outcome['seconds']:.1f} s of CPU"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def load_error(path: Path, seconds: float = 5) -> str:
    with pytest.raises(NodeListError) as err:
        within(seconds, lambda: load_node_list(str(path)))
    text = str(err.value)
    assert len(text.splitlines()) == 1, text
    return text


def node_list_text(tmp_path: Path, text: str) -> Path:
    return write_node_list(tmp_path, text)


HEAD = "plugin: gpufleet\ncluster: c\nnodes:\n  - hosts: 'gpu[001-004]'\n"


# -- 10, 15: address templates ----------------------------------------------------------------


# The documented forms render as test_nodelist.py's test_render_address checks.


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("{name!r:>999999999}", "placeholder {name!r:>999999999} is not supported"),
        ("{num:>999999999}", "placeholder {num:>999999999} is not supported"),
        ("{num:0999999999d}", "placeholder {num:0999999999d} is not supported"),
        ("{num:010d}", "placeholder {num:010d} is not supported"),
        ("{name:{num}}", "unclosed '{' at position 0"),
        ("{name.__class__}", "placeholder {name.__class__} is not supported"),
        ("{name[0]}", "placeholder {name[0]} is not supported"),
        ("{0}", "unknown placeholder {0} (use {name} or {num})"),
        ("{}", "unknown placeholder {} (use {name} or {num})"),
        ("10.0.0.{num", "unclosed '{' at position 7"),
        ("10.0.0.num}", "unmatched '}' at position 10"),
        ("{{num}}", "unclosed '{' at position 0"),
        ("x" * 254, "longer than 253 characters"),
    ],
)
def test_address_template_refuses_everything_else(pattern: str, problem: str) -> None:
    with pytest.raises(ValueError) as err:
        within(2, lambda: AddressTemplate.parse(pattern))
    assert problem in str(err.value)


def test_format_spec_that_used_to_exhaust_memory_is_a_fast_one_line_error(tmp_path: Path) -> None:
    path = node_list_text(tmp_path, HEAD + "    address: '{name!r:>999999999}'\n")
    assert load_error(path, seconds=2) == (
        f"{path}: nodes[0].address: pattern '{{name!r:>999999999}}': placeholder "
        "{name!r:>999999999} is not supported (use {name}, {num} or {num:0Nd} with N in 1..9)"
    )


def test_unclosed_brace_names_file_and_key(tmp_path: Path) -> None:
    path = node_list_text(tmp_path, HEAD + "    address: '10.0.0.{num'\n")
    assert load_error(path) == (
        f"{path}: nodes[0].address: pattern '10.0.0.{{num': unclosed '{{' at position 7 "
        "(use {name}, {num} or {num:0Nd} with N in 1..9)"
    )


def test_rendered_addresses_are_bounded(tmp_path: Path) -> None:
    name = "n" * 60 + "[1-2]"
    path = node_list_text(
        tmp_path,
        f"plugin: gpufleet\ncluster: c\nnodes:\n  - hosts: '{name}'\n"
        "    address: '{name}.{name}.{name}.{name}.{name}'\n",
    )
    assert "is longer than 253 characters (for host nnn" in load_error(path)


# -- 11: shards, replicas, max_imbalance, per-host numbers ------------------------------------


@pytest.mark.parametrize("shards", [100_000, 10**12, 10**100])
def test_huge_shard_counts_fail_fast(tmp_path: Path, shards: int) -> None:
    path = node_list_text(tmp_path, HEAD + f"monitoring: {{shards: {shards}}}\n")
    assert "monitoring.shards: must be at most 64, got " in load_error(path, seconds=2)


def test_more_shards_than_hosts(tmp_path: Path) -> None:
    path = node_list_text(tmp_path, HEAD + "monitoring: {shards: 5}\n")
    assert load_error(path).endswith(
        "monitoring.shards: 5 shards, but the node list has 4 host(s) (one at least per shard)"
    )


IMBALANCE = "monitoring.max_imbalance: must be a number in 1.0..64.0, got"
MARGIN = "monitoring.rebalance_margin: must be a number in 0.0..64.0, got"


@pytest.mark.parametrize(
    ("monitoring", "message"),
    [
        ("{replicas: 1000000000000}", "monitoring.replicas: must be at most 8, got 1000000000000"),
        ("{max_imbalance: .nan}", f"{IMBALANCE} nan"),
        ("{max_imbalance: .inf}", f"{IMBALANCE} inf"),
        ("{max_imbalance: 1.0e+400}", f"{IMBALANCE} inf"),
        ("{max_imbalance: 65}", f"{IMBALANCE} 65"),
        ("{max_imbalance: 0.5}", f"{IMBALANCE} 0.5"),
        ("{rebalance_margin: -.inf}", f"{MARGIN} -inf"),
        ("{rebalance_margin: .nan}", f"{MARGIN} nan"),
    ],
)
def test_monitoring_numbers_are_bounded(tmp_path: Path, monitoring: str, message: str) -> None:
    path = node_list_text(tmp_path, HEAD + f"monitoring: {monitoring}\n")
    assert load_error(path) == f"{path}: {message}"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("cpus: 65537", "nodes[0].cpus: must be at most 65,536, got 65537"),
        ("cpus: 1" + "0" * 40,
         "nodes[0].cpus: must be at most 65,536, got an integer of 41 digits"),
        ("expected_series: 100000001",
         "nodes[0].expected_series: must be at most 100,000,000, got 100000001"),
        ("gpu: {vendor: nvidia, model: H100, count: 1025}",
         "nodes[0].gpu.count: must be at most 1,024, got 1025"),
        ("rack: " + "r" * 129, "nodes[0].rack: longer than 128 characters: "),
    ],
)  # fmt: skip
def test_per_host_numbers_and_names_are_bounded(tmp_path: Path, entry: str, message: str) -> None:
    path = node_list_text(tmp_path, HEAD + f"    {entry}\n")
    assert load_error(path).startswith(f"{path}: {message}")


def test_integer_too_long_for_python_is_a_yaml_error(tmp_path: Path) -> None:
    path = node_list_text(tmp_path, HEAD + "    cpus: 1" + "0" * 5000 + "\n")
    assert load_error(path).startswith(f"{path}: invalid YAML: Exceeds the limit")


def test_cli_shards_override_is_bounded(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_node_list(tmp_path, minimal_node_list())
    for shards, message in [
        ("100000", "--shards: must be at most 64, got 100000"),
        ("9", "--shards: 9 shards, but the node list has 8 host(s) (one at least per shard)"),
    ]:
        code = within(5, lambda shards=shards: main(["plan", str(path), "--shards", shards]))
        _, err = capsys.readouterr()
        assert (code, err) == (2, f"gpufleet: {path}: {message}\n")


def test_lock_with_a_huge_shard_count_is_refused(tmp_path: Path) -> None:
    data = minimal_node_list()
    data["monitoring"]["shard_lock"] = ".shards.lock"
    path = write_node_list(tmp_path, data)
    (tmp_path / ".shards.lock").write_text(
        "version: 1\ncluster: test\nshards: 1000000000000\nhosts: {gpu001: 999999999999}\n"
    )
    assert load_error(path) == (
        f"{tmp_path}/.shards.lock: shards: must be at most 64, got 1000000000000"
    )


# -- 12: one host limit per node list ---------------------------------------------------------


def test_budget_is_shared_by_all_expressions() -> None:
    budget = hostlist.Budget(hosts=10, names=25)
    assert len(budget.expand("a[1-6]", defines=True)) == 6
    with pytest.raises(hostlist.HostlistError, match="would define more than 10 hosts"):
        budget.expand("b[1-6]", defines=True)
    assert len(budget.expand("c[1-15]")) == 15  # references: only the name limit
    with pytest.raises(hostlist.HostlistError, match="expand to more than 25 names"):
        budget.expand("d[1-5]")


def test_host_limit_is_per_node_list_not_per_expression(tmp_path: Path) -> None:
    text = "plugin: gpufleet\ncluster: c\nnodes:\n  - hosts: ['a[1-60000]', 'b[1-60000]']\n"
    path = node_list_text(tmp_path, text)
    assert load_error(path, seconds=5) == (
        f"{path}: nodes[0].hosts: 'b[1-60000]': the node list would define more than "
        "100,000 hosts (the limit for nodes, servers and slurm.conf together)"
    )


def test_two_million_host_expressions_fail_before_expanding(tmp_path: Path) -> None:
    text = "plugin: gpufleet\ncluster: c\nnodes:\n  - hosts: 'a[1-1000000]'\n" + (
        "  - hosts: 'b[1-1000000]'\n"
    )
    path = node_list_text(tmp_path, text)
    assert "nodes[0].hosts: 'a[1-1000000]': the node list would define more than 100,000" in (
        load_error(path, seconds=2)
    )


def test_slurm_conf_hosts_count_against_the_same_limit(tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text("NodeName=s[1-60000]\n")
    text = (
        "plugin: gpufleet\ncluster: c\nnodes:\n  - hosts: 'a[1-60000]'\nslurm: {conf: slurm.conf}\n"
    )
    path = node_list_text(tmp_path, text)
    assert load_error(path, seconds=5) == (
        f"{tmp_path}/slurm.conf: line 1: NodeName=s[1-60000]: 's[1-60000]': the node list "
        "would define more than 100,000 hosts (the limit for nodes, servers and slurm.conf "
        "together)"
    )


def test_references_count_against_the_name_limit(tmp_path: Path) -> None:
    groups = ", ".join(["'x[1-400000]'"] * 3)
    path = node_list_text(tmp_path, HEAD + f"monitoring: {{loki_hosts: [{groups}]}}\n")
    assert load_error(path, seconds=60).endswith(
        "monitoring.loki_hosts: 'x[1-400000]': the node list's hostlists would expand to more "
        "than 1,000,000 names (the limit for all its hostlists together)"
    )


def test_exactly_the_host_limit_is_accepted(tmp_path: Path) -> None:
    half = limits.MAX_HOSTS // 2
    text = f"plugin: gpufleet\ncluster: c\nnodes:\n  - hosts: ['a[1-{half}]', 'b[1-{half}]']\n"
    node_list = within(30, lambda: load_node_list(str(node_list_text(tmp_path, text))))
    assert len(node_list.hosts) == limits.MAX_HOSTS


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("x[1234567890123456789]", "number with more than 18 digits in 'x[1234567890123456789]'"),
        ("a" * 250 + "[1000-1001]", "names longer than 253 characters in 'aaaa"),
        ("a[1-1000][1-1000][1-1000]", "expands to more than 1,000,000 names"),
    ],
)
def test_hostlist_numbers_and_name_lengths_are_bounded(expression: str, message: str) -> None:
    with pytest.raises(hostlist.HostlistError) as err:
        within(2, lambda: hostlist.expand(expression))
    assert message in str(err.value)


# -- 13: slurm.conf Include -------------------------------------------------------------------


def write_files(directory: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)


def slurm_node_list(tmp_path: Path, files: dict[str, str]) -> Path:
    write_files(tmp_path, files)
    text = "plugin: gpufleet\ncluster: c\nnodes: []\nslurm: {conf: etc/slurm.conf}\n"
    return node_list_text(tmp_path, text)


def test_include_is_followed_relative_to_the_including_file(tmp_path: Path) -> None:
    path = slurm_node_list(
        tmp_path,
        {
            "etc/slurm.conf": "ClusterName=HPC-A\nNodeName=DEFAULT CPUs=32\n"
            "include conf.d/gpu.conf\nNodeName=cpu[1-2]\n"
            "PartitionName=gpu Nodes=gpu[1-2],amd1\nPartitionName=all Nodes=ALL\n",
            # relative to etc/conf.d/, the directory of the file holding the Include
            "etc/conf.d/gpu.conf": "NodeName=gpu[1-2] Gres=gpu:h100:8\nInclude amd/%c.conf\n",
            "etc/conf.d/amd/hpc-a.conf": "NodeName=amd1 CPUs=128 Gres=gpu:mi300x:8\n",
        },
    )
    node_list = load_node_list(str(path))
    hosts = {host.name: host for host in node_list.hosts}
    assert list(hosts) == ["gpu1", "gpu2", "amd1", "cpu1", "cpu2"]
    assert (hosts["gpu1"].cpus, hosts["gpu1"].gpu_model, hosts["gpu1"].partitions) == (
        32, "h100", ("gpu", "all"),
    )  # fmt: skip
    assert (hosts["amd1"].cpus, hosts["amd1"].gpu_vendor) == (128, "amd")
    assert hosts["cpu1"].partitions == ("all",)


def test_include_of_the_example_shape_still_loads_without_includes() -> None:
    parsed = slurmconf.parse("NodeName=n[1-2]\n")
    assert parsed.files == ("",) and [n.hosts for n in parsed.nodes] == [("n1", "n2")]


@pytest.mark.parametrize(
    ("files", "error"),
    [
        (
            {"etc/slurm.conf": "Include a.conf\n", "etc/a.conf": "Include ../etc/slurm.conf\n"},
            "{dir}/etc/a.conf: line 1: Include '../etc/slurm.conf': includes itself (a cycle)",
        ),
        (
            {"etc/slurm.conf": "Include a.conf b.conf\n"},
            "{dir}/etc/slurm.conf: line 1: Include 'a.conf': one file name only",
        ),
        (
            {"etc/slurm.conf": "Include %c.conf\n"},
            "{dir}/etc/slurm.conf: line 1: Include '%c.conf': %c needs a ClusterName= above",
        ),
        (
            {"etc/slurm.conf": "Include conf.d\n", "etc/conf.d/x": ""},
            "{dir}/etc/slurm.conf: line 1: Include 'conf.d': cannot read {dir}/etc/conf.d: "
            "not a regular file (a directory)",
        ),
        (
            {
                "etc/slurm.conf": "Include i1.conf\n",
                **{f"etc/i{n}.conf": f"Include i{n + 1}.conf\n" for n in range(1, 9)},
                "etc/i9.conf": "NodeName=n1\n",
            },
            "{dir}/etc/i8.conf: line 1: Include 'i9.conf': nested more than 8 deep",
        ),
        (
            {
                "etc/slurm.conf": "".join(f"Include i{n}.conf\n" for n in range(70)),
                **{f"etc/i{n}.conf": f"NodeName=n{n}\n" for n in range(70)},
            },
            "{dir}/etc/slurm.conf: line 64: Include 'i63.conf': more than 64 slurm.conf files "
            "in all",
        ),
    ],
)
def test_include_problems_are_one_line_errors(
    tmp_path: Path, files: dict[str, str], error: str
) -> None:
    path = slurm_node_list(tmp_path, files)
    assert load_error(path) == error.replace("{dir}", str(tmp_path))


def test_include_total_size_is_bounded(tmp_path: Path) -> None:
    comment = "#" * (3 * 1024 * 1024) + "\n"
    path = slurm_node_list(
        tmp_path,
        {
            "etc/slurm.conf": "Include a.conf\nInclude b.conf\nInclude c.conf\n",
            "etc/a.conf": comment,
            "etc/b.conf": comment,
            "etc/c.conf": comment,
        },
    )
    assert load_error(path) == (
        f"{tmp_path}/etc/c.conf: slurm.conf and its Include files exceed 8,388,608 bytes together"
    )


# -- 14: the files gpufleet reads -------------------------------------------------------------


def lock_node_list(tmp_path: Path) -> Path:
    data = minimal_node_list()
    data["monitoring"]["shard_lock"] = ".shards.lock"
    return write_node_list(tmp_path, data)


def test_lock_fifo_does_not_hang(tmp_path: Path) -> None:
    path = lock_node_list(tmp_path)
    os.mkfifo(tmp_path / ".shards.lock")
    assert load_error(path, seconds=5) == (
        f"{tmp_path}/.shards.lock: cannot read: not a regular file (a FIFO)"
    )


def test_lock_linked_to_dev_zero_is_refused_before_reading(tmp_path: Path) -> None:
    path = lock_node_list(tmp_path)
    (tmp_path / ".shards.lock").symlink_to("/dev/zero")
    assert load_error(path, seconds=5) == (
        f"{tmp_path}/.shards.lock: cannot read: not a regular file (a character device)"
    )


def test_lock_larger_than_the_limit_is_refused(tmp_path: Path) -> None:
    path = lock_node_list(tmp_path)
    with open(tmp_path / ".shards.lock", "wb") as handle:
        handle.truncate(limits.MAX_FILE_BYTES + 1)  # sparse: costs no disk
    assert load_error(path) == (
        f"{tmp_path}/.shards.lock: cannot read: larger than 8 MiB (the limit)"
    )


def test_lock_that_is_not_utf8(tmp_path: Path) -> None:
    path = lock_node_list(tmp_path)
    (tmp_path / ".shards.lock").write_bytes(b"version: 1\ncluster: \xff\n")
    assert load_error(path) == f"{tmp_path}/.shards.lock: cannot read: line 2: not valid UTF-8"


def test_slurm_conf_fifo_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "slurm.conf")
    text = "plugin: gpufleet\ncluster: c\nnodes: []\nslurm: {conf: slurm.conf}\n"
    path = node_list_text(tmp_path, text)
    assert load_error(path) == (
        f"{path}: slurm.conf: cannot read {tmp_path}/slurm.conf: not a regular file (a FIFO)"
    )


def test_node_list_fifo_does_not_hang_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "nodes.gpufleet.yml"
    os.mkfifo(path)
    code = within(5, lambda: main(["plan", str(tmp_path)]))
    _, err = capsys.readouterr()
    assert (code, err) == (2, f"gpufleet: {path}: cannot read: not a regular file (a FIFO)\n")


def test_node_list_fifo_does_not_hang_the_plugin(plugin, tmp_path: Path) -> None:
    path = tmp_path / "nodes.gpufleet.yml"
    os.mkfifo(path)
    with pytest.raises(AnsibleParserError) as err:
        within(5, lambda: plugin.parse(InventoryData(), DataLoader(), str(path), cache=False))
    assert err.value.message == f"{path}: cannot read: not a regular file (a FIFO)"


def test_node_list_not_utf8_is_one_line_in_the_plugin(plugin, tmp_path: Path) -> None:
    # Checked before Ansible's loader, which would escape it with a deprecation warning.
    path = tmp_path / "nodes.gpufleet.yml"
    path.write_bytes(b"plugin: gpufleet\ncluster: c\n# \xff\nnodes: []\n")
    with pytest.raises(AnsibleParserError) as err:
        within(5, lambda: plugin.parse(InventoryData(), DataLoader(), str(path), cache=False))
    assert err.value.message == f"{path}: cannot read: line 3: not valid UTF-8"


# -- messages stay on one line; YAML that costs too much ---------------------------------------


def test_control_characters_in_keys_are_escaped(tmp_path: Path) -> None:
    path = node_list_text(tmp_path, HEAD + '    labels: {"a\\nb\\u2028c": x}\n')
    assert load_error(path) == (
        f"{path}: nodes[0].labels.'a\\nb\\u2028c': invalid Prometheus label name "
        "(must match [a-zA-Z_][a-zA-Z0-9_]*)"
    )


def test_alias_bomb_in_vars_is_refused() -> None:
    bomb: Any = ["x"] * 10
    for _ in range(8):
        bomb = [bomb] * 10  # what YAML aliases build: 10**9 strings if expanded
    data = {"plugin": "gpufleet", "cluster": "c", "nodes": [{"hosts": "g1", "vars": {"b": bomb}}]}
    with pytest.raises(NodeListError) as err:
        within(2, lambda: parse_node_list(data, "t.gpufleet.yml"))
    assert str(err.value) == (
        "t.gpufleet.yml: nodes[0].vars: too large: more than 10,000 values "
        "(a YAML alias counts each use)"
    )


def test_deeply_nested_yaml_is_one_line_in_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = node_list_text(tmp_path, HEAD + "    vars: {x: " + "[" * 5000 + "]" * 5000 + "}\n")
    code = within(10, lambda: main(["plan", str(path)]))
    _, err = capsys.readouterr()
    assert code == 2 and len(err.splitlines()) == 1 and "invalid YAML" in err, err


def test_empty_node_list(tmp_path: Path) -> None:
    path = node_list_text(tmp_path, "# nothing yet\n")
    assert load_error(path) == f"{path}: is empty (expected a YAML mapping with plugin: gpufleet)"


# -- `gpufleet plan | head -1` ----------------------------------------------------------------


def test_plan_into_a_closed_pipe_exits_quietly() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "plan", str(EXAMPLE), "--json"],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the first write, as `head` may be
    err = process.stderr.read()
    assert process.wait(timeout=60) == EXIT_BROKEN_PIPE == 141
    assert err == b""


def test_plan_piped_into_head_prints_no_traceback() -> None:
    result = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m gpufleet plan {EXAMPLE} --json | head -1"],
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "{\n", "")


# -- 16: only gpufleet tries a node list, and says it once ------------------------------------


def test_ansible_cfg_enables_no_plugin_that_claims_node_lists() -> None:
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "ansible.cfg")
    enabled = [name.strip() for name in config["inventory"]["enable_plugins"].split(",")]
    assert enabled[0] == "gpufleet"
    assert not {"yaml", "ini", "auto", "toml", "script"} & set(enabled), enabled


def test_only_gpufleet_claims_node_lists(loader_ready: None, tmp_path: Path) -> None:
    files = {
        "nodes.gpufleet.yml": "plugin: gpufleet\n",
        "prod.gpufleet.yaml": "plugin: gpufleet\n",
        "hosts.yml": "all: {hosts: {a: {}}}\n",
        "hosts.ini": "[all]\na\n",
        "xgpufleet.yml": "all: {hosts: {a: {}}}\n",
    }
    write_files(tmp_path, files)
    claims = {
        name: sorted(
            plugin_name
            for plugin_name in ("gpufleet", "static_yaml", "static_ini")
            if inventory_loader.get(plugin_name).verify_file(str(tmp_path / name))
        )
        for name in files
    }
    assert claims == {
        "nodes.gpufleet.yml": ["gpufleet"],
        "prod.gpufleet.yaml": ["gpufleet"],
        "hosts.yml": ["static_ini", "static_yaml"],
        "hosts.ini": ["static_ini"],
        "xgpufleet.yml": ["static_ini", "static_yaml"],
    }


def test_wrapper_plugins_know_the_node_list_suffixes() -> None:
    for name in ("static_yaml", "static_ini"):
        path = REPO_ROOT / "plugins" / "inventory" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"gpufleet_test_{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.NODE_LIST_SUFFIXES == nodelist.NODE_LIST_SUFFIXES, name


def test_ansible_inventory_on_a_directory_prints_one_line(tmp_path: Path) -> None:
    inventory = tmp_path / "inv"
    write_files(inventory, {"group_vars/all/x.yml": "x: 1\n"})
    data = minimal_node_list()
    data["nodes"][0]["address"] = "10.0.0.{num"
    path = write_node_list(inventory, data)
    result = run_ansible_inventory("-i", str(inventory), "--list")
    assert result.returncode != 0
    assert_one_error(
        result.stderr,
        str(path),
        f"{path}: nodes[0].address: pattern '10.0.0.{{num': unclosed '{{' at position 7 "
        "(use {name}, {num} or {num:0Nd} with N in 1..9)",
    )


def test_ansible_inventory_invalid_yaml_is_one_line(tmp_path: Path) -> None:
    path = node_list_text(tmp_path, "plugin: gpufleet\ncluster: [c\n")
    result = run_ansible_inventory("-i", str(path), "--list")
    assert_one_error(
        result.stderr, str(path), f"{path}: line 3: invalid YAML: did not find expected ',' or ']'"
    )


def test_static_inventories_still_parse(tmp_path: Path) -> None:
    write_files(
        tmp_path,
        {"hosts.yml": "all:\n  hosts:\n    yaml1: {}\n", "hosts.ini": "[web]\nini1\n"},
    )
    for name, host in [("hosts.yml", "yaml1"), ("hosts.ini", "ini1")]:
        result = run_ansible_inventory("-i", str(tmp_path / name), "--list")
        assert result.returncode == 0, result.stderr
        assert host in result.stdout, name
        assert "WARNING" not in result.stderr, result.stderr


def test_build_of_a_valid_node_list_is_unchanged(tmp_path: Path) -> None:
    """The bounds do not reject the example or the minimal node list."""
    plan = build_inventory(load_node_list(str(write_node_list(tmp_path, minimal_node_list()))))
    assert len(plan.host_vars) == 8
    assert len(load_node_list(str(EXAMPLE / "nodes.gpufleet.yml")).hosts) == 66


def test_bad_constructed_option_is_one_line(plugin, tmp_path: Path) -> None:
    path = write_node_list(tmp_path, minimal_node_list(keyed_groups=5))
    with pytest.raises(AnsibleParserError) as err:
        plugin.parse(InventoryData(), DataLoader(), str(path), cache=False)
    message = err.value.message
    # 2.19 words it "keyed_groups: ...", 2.18 "Invalid type for ... setting: keyed_groups".
    assert message.startswith(f"{path}: ") and "keyed_groups" in message, message
    assert "5" in message and "\n" not in message, message
    assert len(message.splitlines()) == 1
