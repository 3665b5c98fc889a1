"""The shard lock file: format, validation, ``gpufleet plan --write-lock``/``--diff``/``--lock``,
and the plugin reading it (in process and through ``ansible-inventory``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.inventory.data import InventoryData
from ansible.parsing.dataloader import DataLoader
from inventory_helpers import minimal_node_list, run_ansible_inventory, write_node_list

from gpufleet.cli import main
from gpufleet.inventory import plan_shards
from gpufleet.nodelist import NodeListError, load_node_list
from gpufleet.shardlock import format_lock, parse_lock

LOCK = ".shards.lock"
HOSTS = ("cpu1", "cpu2", "gpu001", "gpu002", "gpu003", "gpu004", "mon01", "mon02")


def locked_node_list(directory: Path, **monitoring: Any) -> Path:
    data = minimal_node_list()
    data["monitoring"].update({"shard_lock": LOCK, **monitoring})
    return write_node_list(directory, data)


def write_lock(directory: Path, hosts: dict[str, Any], **fields: Any) -> Path:
    body = {"version": 1, "cluster": "test", "shards": 2, "hosts": hosts, **fields}
    path = directory / LOCK
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def stateless_plan(directory: Path) -> dict[str, int]:
    """The plan of the minimal node list without a lock (written to a subdirectory)."""
    (directory / "stateless").mkdir(exist_ok=True)
    path = write_node_list(directory / "stateless", minimal_node_list())
    return plan_shards(load_node_list(str(path)))


def flipped(plan: dict[str, int]) -> dict[str, int]:
    """A valid lock that differs from the stateless plan everywhere (shards swapped)."""
    return {host: 1 - shard for host, shard in plan.items()}


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- format ------------------------------------------------------------------------------------


def test_format_and_parse_round_trip_with_names_yaml_would_misread() -> None:
    assignment = {"gpu001": 1, "123": 0, "yes": 1, "null": 0, "1e5": 1, "0x1F": 0}
    text = format_lock("hpc-a", 2, assignment)
    assert text.startswith("# gpufleet shard lock")
    lock = parse_lock(text, "x.lock")
    assert (lock.cluster, lock.shards, dict(lock.hosts)) == ("hpc-a", 2, assignment)
    assert list(yaml.safe_load(text)["hosts"]) == sorted(assignment)


def test_empty_hosts_is_a_valid_lock() -> None:
    assert parse_lock("version: 1\ncluster: c\nshards: 3\nhosts:\n", "x").hosts == {}


# -- validation: one line, file: key: problem --------------------------------------------------

HEAD = "version: 1\ncluster: test\n"
BAD_LOCKS = [
    ("yaml", HEAD + "shards: [2\n", "line 4", "invalid YAML: did not find expected ',' or ']'"),
    ("not-mapping", "- a\n- b\n", "", "must be a YAML mapping (a gpufleet shard lock)"),
    ("typo", HEAD + "shards: 2\nhost: {}\n", "host", "unknown key; did you mean 'hosts'?"),
    ("no-shards", HEAD + "hosts: {}\n", "shards", "required"),
    ("version", "version: 2\ncluster: test\nshards: 2\nhosts: {}\n", "version",
     "unsupported lock format 2 (this gpufleet reads 1)"),
    ("shards-0", HEAD + "shards: 0\nhosts: {}\n", "shards", "must be an integer >= 1, got 0"),
    ("hosts-list", HEAD + "shards: 2\nhosts: [gpu001]\n", "hosts",
     "must be a mapping of host name -> shard"),
    ("shard-str", HEAD + "shards: 2\nhosts: {gpu001: x}\n", "hosts.gpu001",
     "shard must be an integer in 0..1, got 'x'"),
    ("shard-range", HEAD + "shards: 2\nhosts: {gpu001: 2}\n", "hosts.gpu001",
     "shard must be an integer in 0..1, got 2"),
    ("shard-neg", HEAD + "shards: 2\nhosts: {gpu001: -1}\n", "hosts.gpu001",
     "shard must be an integer in 0..1, got -1"),
    ("host-int", HEAD + "shards: 2\nhosts: {17: 1}\n", "hosts",
     "host names must be strings, got 17"),
    ("cluster", "version: 1\ncluster: other\nshards: 2\nhosts: {}\n", "cluster",
     "the lock is for cluster 'other', not 'test'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "key_path", "message"), [pytest.param(*case[1:], id=case[0]) for case in BAD_LOCKS]
)
def test_malformed_lock_is_a_one_line_error(
    tmp_path: Path, text: str, key_path: str, message: str
) -> None:
    node_list = locked_node_list(tmp_path)
    (tmp_path / LOCK).write_text(text)
    with pytest.raises(NodeListError) as err:
        load_node_list(str(node_list))
    lock_file = str(tmp_path / LOCK)
    expected = f"{lock_file}: {key_path}: {message}" if key_path else f"{lock_file}: {message}"
    assert str(err.value) == expected
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("monitoring", "key_path", "message"),
    [
        ({"shard_lock": "nodes.shards.lock"}, "monitoring.shard_lock",
         "'nodes.shards.lock' sits next to the node list, where Ansible would read it as an "
         "inventory source; use a hidden name such as '.shards.lock'"),
        ({"shard_lock": ""}, "monitoring.shard_lock", "must be a non-empty string, got ''"),
        ({"rebalance_margin": -0.1}, "monitoring.rebalance_margin",
         "must be a number in 0.0..64.0, got -0.1"),
    ],
)  # fmt: skip
def test_bad_lock_settings_are_errors(
    tmp_path: Path, monitoring: dict[str, Any], key_path: str, message: str
) -> None:
    data = minimal_node_list()
    data["monitoring"].update(monitoring)
    path = write_node_list(tmp_path, data)
    with pytest.raises(NodeListError) as err:
        load_node_list(str(path))
    assert str(err.value) == f"{path}: {key_path}: {message}"


def test_lock_elsewhere_may_have_any_name(tmp_path: Path) -> None:
    data = minimal_node_list()
    data["monitoring"]["shard_lock"] = "../locks/prod.lock"
    node_list = load_node_list(str(write_node_list(tmp_path, data)))
    assert node_list.monitoring.shard_lock == str(tmp_path / "../locks/prod.lock")
    assert node_list.lock is None


# -- the plan with a lock ----------------------------------------------------------------------


def test_missing_lock_file_gives_the_stateless_plan(tmp_path: Path) -> None:
    node_list = load_node_list(str(locked_node_list(tmp_path)))
    assert node_list.lock is None
    assert plan_shards(node_list) == stateless_plan(tmp_path)


def test_the_plan_follows_the_lock(tmp_path: Path) -> None:
    lock = {**flipped(stateless_plan(tmp_path)), "retired01": 1}
    write_lock(tmp_path, lock)
    plan = plan_shards(load_node_list(str(locked_node_list(tmp_path))))
    assert plan == {host: lock[host] for host in HOSTS}


def test_a_lock_from_more_shards_is_handled(tmp_path: Path) -> None:
    write_lock(tmp_path, {"gpu001": 3, "gpu002": 1, "cpu1": 0}, shards=4)
    plan = plan_shards(load_node_list(str(locked_node_list(tmp_path))))
    assert set(plan.values()) <= {0, 1}
    assert (plan["gpu002"], plan["cpu1"]) == (1, 0)


# -- gpufleet plan --write-lock / --lock / --diff ----------------------------------------------


def test_write_lock_round_trip(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    node_list = locked_node_list(tmp_path)
    code, out, _ = run_main(capsys, "plan", str(node_list))
    assert code == 0 and f"lock: {tmp_path / LOCK} missing: stateless plan" in out
    code, out, _ = run_main(capsys, "plan", "--write-lock", str(tmp_path))
    assert code == 0 and f"lock: {tmp_path / LOCK}: 8 hosts, written, 8 entries changed" in out
    lock = parse_lock((tmp_path / LOCK).read_text(), LOCK)
    assert (lock.cluster, lock.shards) == ("test", 2)
    assert dict(lock.hosts) == stateless_plan(tmp_path)
    _, out, _ = run_main(capsys, "plan", str(node_list), "--json")
    report = json.loads(out)
    assert report["assignment"] == lock.hosts
    assert report["lock"] == {"file": str(tmp_path / LOCK), "present": True, "hosts": 8,
                              "outdated": 0}  # fmt: skip
    # more hosts: the locked ones stay, the lock reports what --write-lock would change
    data = yaml.safe_load(node_list.read_text())
    data["nodes"][0]["hosts"] = "gpu[001-006]"
    write_node_list(tmp_path, data)
    _, out, _ = run_main(capsys, "plan", str(node_list))
    assert "8 hosts, 2 entries to update (--write-lock)" in out
    _, out, _ = run_main(capsys, "plan", "--write-lock", str(node_list), "--json")
    rewritten = parse_lock((tmp_path / LOCK).read_text(), LOCK).hosts
    assert json.loads(out)["lock"]["changed"] == 2
    assert {h: rewritten[h] for h in lock.hosts} == lock.hosts
    assert rewritten.keys() == set(lock.hosts) | {"gpu005", "gpu006"}


def test_write_lock_keeps_a_hand_written_lock(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lock = flipped(stateless_plan(tmp_path))
    write_lock(tmp_path, {**lock, "retired01": 0})
    run_main(capsys, "plan", "--write-lock", str(locked_node_list(tmp_path)))
    assert parse_lock((tmp_path / LOCK).read_text(), LOCK).hosts == lock  # retired01 dropped


def test_write_lock_needs_a_lock_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write_node_list(tmp_path, minimal_node_list())
    code, out, err = run_main(capsys, "plan", "--write-lock", str(path))
    assert code == 2 and out == ""
    assert err == (
        f"gpufleet: {path}: monitoring.shard_lock: not set; add e.g. "
        "'shard_lock: .shards.lock' (or give --lock FILE)\n"
    )
    elsewhere = tmp_path / "locks" / "test.lock"
    code, _, _ = run_main(capsys, "plan", "--write-lock", str(path), "--lock", str(elsewhere))
    assert code == 0
    assert dict(parse_lock(elsewhere.read_text(), "x").hosts) == stateless_plan(tmp_path)


def test_write_lock_refuses_a_shard_override(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--write-lock takes the node list's own shards"):
        main(["plan", "--write-lock", str(locked_node_list(tmp_path)), "--shards", "3"])


def test_plan_with_an_explicit_lock(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lock = flipped(stateless_plan(tmp_path))
    lock_file = write_lock(tmp_path, lock)
    path = write_node_list(tmp_path, minimal_node_list())  # no shard_lock key
    _, out, _ = run_main(capsys, "plan", str(path), "--lock", str(lock_file), "--json")
    assert json.loads(out)["assignment"] == lock


def test_diff_starts_both_plans_from_the_old_lock(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    old_dir.mkdir()
    new_dir.mkdir()
    lock = flipped(stateless_plan(tmp_path))
    write_lock(old_dir, lock)
    old = locked_node_list(old_dir)
    data = yaml.safe_load(old.read_text())
    data["nodes"][0]["hosts"] = "gpu[001-006]"
    new = write_node_list(new_dir, data)  # its own lock is missing: OLD's is the one in force
    code, out, _ = run_main(capsys, "plan", "--diff", str(old), str(new), "--json")
    report = json.loads(out)
    assert code == 0 and report["lock"] == str(old_dir / LOCK)
    assert report["moved"] == []
    assert {a["host"] for a in report["added"]} == {"gpu005", "gpu006"}
    _, text, _ = run_main(capsys, "plan", "--diff", str(old), str(new))
    assert text.splitlines()[0] == f"lock: {old_dir / LOCK} (both plans start from it)"
    assert "0 host(s) move" in text
    # the same node lists without the lock: stateless plans on both sides
    plain = write_node_list(tmp_path, minimal_node_list())
    _, out, _ = run_main(capsys, "plan", "--diff", str(plain), str(plain), "--json")
    assert json.loads(out)["lock"] is None
    # --lock FILE instead of OLD's own
    _, out, _ = run_main(
        capsys, "plan", "--diff", str(plain), str(new), "--lock", str(old_dir / LOCK), "--json"
    )
    assert json.loads(out)["moved"] == []


# -- the plugin reads the lock (never writes it) -----------------------------------------------


def test_plugin_in_process_follows_the_lock_and_writes_nothing(plugin, tmp_path: Path) -> None:
    lock = flipped(stateless_plan(tmp_path))
    write_lock(tmp_path, lock)
    path = locked_node_list(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    inventory = InventoryData()
    plugin.parse(inventory, DataLoader(), str(path), cache=False)
    assert {h: inventory.get_host(h).get_vars()["gpufleet_shard"] for h in HOSTS} == lock
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_plugin_without_the_lock_file_writes_none(plugin, tmp_path: Path) -> None:
    path = locked_node_list(tmp_path)
    plugin.parse(InventoryData(), DataLoader(), str(path), cache=False)
    assert not (tmp_path / LOCK).exists()


def test_ansible_inventory_reads_the_lock_from_the_inventory_directory(tmp_path: Path) -> None:
    lock = flipped(stateless_plan(tmp_path))
    inventory_dir = tmp_path / "inventory"
    inventory_dir.mkdir()
    write_lock(inventory_dir, lock)
    locked_node_list(inventory_dir)
    result = run_ansible_inventory("-i", str(inventory_dir), "--list")
    assert result.returncode == 0, result.stderr
    hostvars = json.loads(result.stdout)["_meta"]["hostvars"]
    assert {h: hostvars[h]["gpufleet_shard"] for h in HOSTS} == lock
    (inventory_dir / LOCK).write_text("version: 1\ncluster: test\nshards: 2\nhosts: {gpu001: 7}\n")
    result = run_ansible_inventory("-i", str(inventory_dir), "--list")
    assert result.returncode != 0
    # Compared without whitespace: ansible-core 2.18 wraps warnings at 80 columns.
    want = f"{inventory_dir / LOCK}: hosts.gpu001: shard must be an integer in 0..1, got 7"
    assert "".join(want.split()) in "".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stderr
