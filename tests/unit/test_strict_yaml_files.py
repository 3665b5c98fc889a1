"""Issue 26: every YAML file gpufleet reads goes through its strict loader.

Besides the node list and the shard lock (tests/unit/inventory/test_strict_config.py): the
exporter registry (``gpufleet.sizing``) and the roles' argument specs (``gpufleet.roledocs``).
Both are files Ansible reads too, so besides duplicate keys, a value that Ansible's YAML 1.1
types differently from gpufleet's reading is an error naming the file and the key.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet import roledocs, sizing, strictyaml
from gpufleet.cli import main as gpufleet_main
from gpufleet.nodelist import NodeListError, parse_node_list

GOOD_ENTRY = "  node:\n    group: all\n    sharded: true\n    series: {host: 460, per_cpu: 13}\n"


def registry_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "main.yml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(sizing.RegistryError) as caught:
        sizing.read_registry(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    return message


# -- the shared rule ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "typed"),
    [
        ("a: yes\n", "a", "True"),
        ("a: {b: [1, 010]}\n", "a.b[1]", "8"),
        ("a: 10:30\n", "a", "630"),
        ("a: 1_000\n", "a", "1000"),
        ("a: 0x1F\n", "a", "31"),
        ("a: 2024-01-01\n", "a", "datetime.date(2024, 1, 1)"),
        ("a: {on: 1}\n", "a.on", "True"),
        ("x: &anchor [off]\ny: *anchor\n", "x[0]", "False"),
    ],
)
def test_a_value_ansible_would_type_differently_is_refused(text: str, key: str, typed: str) -> None:
    with pytest.raises(strictyaml.YamlProblem) as caught:
        strictyaml.load_as_ansible_reads_it(text)
    assert str(caught.value).startswith(f"{key}: ") and f"is {typed} to YAML 1.1" in str(
        caught.value
    )


def test_keys_that_yaml_1_1_makes_one_are_refused() -> None:
    with pytest.raises(
        strictyaml.YamlProblem, match=r"^010: '010' is the same key as one before it"
    ):
        strictyaml.load_as_ansible_reads_it("8: b\n010: a\n")


@pytest.mark.parametrize(
    "text", ["a: 'yes'\nb: \"010\"\n", "a: true\nb: 8\nc: 8.5\nd: -.inf\ne: ~\n", "a: !vault x\n"]
)
def test_values_both_readings_agree_on_load(text: str) -> None:
    assert strictyaml.load_as_ansible_reads_it(text) == strictyaml.load(text)


def test_nan_agrees_with_itself() -> None:
    value = strictyaml.load_as_ansible_reads_it("a: .nan\n")["a"]
    assert value != value


def test_aliases_are_compared_once_not_per_use() -> None:
    # 20 levels of 10 uses each: 10**20 leaves if walked as a tree.
    lines = ["l0: &l0 [x, y]"]
    lines += [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 10)}]" for n in range(1, 20)]
    assert len(strictyaml.load_as_ansible_reads_it("\n".join(lines) + "\n")) == 20


# -- the exporter registry (gpufleet.sizing) ----------------------------------------------


def test_the_shipped_registry_reads_the_same_both_ways() -> None:
    assert sizing.exporters()["node"]["series"] == {"host": 460, "per_cpu": 13}


def test_duplicate_exporter_is_refused_naming_file_line_and_key(tmp_path: Path) -> None:
    message = registry_error(tmp_path, f"exporters_registry:\n{GOOD_ENTRY}{GOOD_ENTRY}")
    assert ": line 6: invalid YAML: duplicate key 'node' (first at line 2" in message


@pytest.mark.parametrize(
    ("entry", "key", "problem"),
    [
        ("series: {host: 1_000}", "series.host", "'1_000' is 1000 to YAML 1.1"),
        ("sharded: yes", "sharded", "'yes' is True to YAML 1.1"),
        ("sharded: 'yes'", "sharded", "must be true or false"),
        ("series: {host: -1}", "series.host", "must be a non-negative integer, got -1"),
        ("series: {host: true}", "series.host", "must be a non-negative integer, got True"),
        ("series: {hosts: 3}", "series.hosts", "unknown term"),
        ("series: [1]", "series", "must be a mapping"),
    ],
)
def test_registry_values_are_refused_in_one_line(
    tmp_path: Path, entry: str, key: str, problem: str
) -> None:
    text = f"exporters_registry:\n  node:\n    group: all\n    {entry}\n"
    message = registry_error(tmp_path, text)
    assert f"exporters_registry.node.{key}: " in message and problem in message, message


def test_a_registry_that_is_no_mapping_is_refused(tmp_path: Path) -> None:
    assert "exporters_registry: must be a mapping" in registry_error(tmp_path, "- node\n")


def test_a_bad_registry_reaches_plan_as_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = tmp_path / "main.yml"
    registry.write_text("exporters_registry:\n  node: {group: all, sharded: on}\n")
    monkeypatch.setattr(sizing, "EXPORTERS_FILE", registry)
    node_list = tmp_path / "nodes.gpufleet.yml"
    node_list.write_text("plugin: gpufleet\ncluster: c\nnodes:\n  - hosts: gpu01\n")
    with pytest.raises(NodeListError, match=r"exporters_registry\.node\.sharded: 'on' is True"):
        parse_node_list({"plugin": "gpufleet", "cluster": "c", "nodes": [{"hosts": "gpu01"}]}, "x")
    assert gpufleet_main(["plan", str(node_list)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{registry}: exporters_registry.node.sharded" in err


# -- argument specs (gpufleet.roledocs) ----------------------------------------------------


def write_spec(root: Path, text: str) -> Path:
    spec = root / "roles" / "demo" / "meta" / "argument_specs.yml"
    spec.parent.mkdir(parents=True)
    spec.write_text(text, encoding="utf-8")
    return spec


SPEC_HEAD = "argument_specs:\n  main:\n    short_description: Demo.\n    options:\n"


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (
            "      demo_mode: {type: str, default: 0644}\n",
            "argument_specs.main.options.demo_mode.default: '0644' is 420 to YAML 1.1",
        ),
        (
            "      demo_on: {type: bool, default: yes}\n",
            "argument_specs.main.options.demo_on.default: 'yes' is True to YAML 1.1",
        ),
        (
            "      demo_a: {type: int}\n      demo_a: {type: str}\n",
            "line 6: invalid YAML: duplicate key 'demo_a' (first at line 5",
        ),
    ],
)
def test_a_spec_either_reading_disagrees_on_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: str, problem: str
) -> None:
    spec = write_spec(tmp_path, SPEC_HEAD + options)
    assert roledocs.main(["--root", str(tmp_path), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"{roledocs.COMMAND}: {spec}: {problem}")


@pytest.mark.parametrize(
    ("text", "key"),
    [("argument_specs: [main]\n", "argument_specs"), ("argument_specs: {main: 1}\n", "main")],
)
def test_a_spec_of_the_wrong_shape_is_one_line(tmp_path: Path, text: str, key: str) -> None:
    spec = write_spec(tmp_path, text)
    with pytest.raises(roledocs.SpecError, match=rf"^{spec}: (argument_specs\.)?{key}: must be"):
        roledocs.load_specs(tmp_path)
