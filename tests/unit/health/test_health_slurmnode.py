"""Slurm's node JSON (gpu_health.slurmnode), every shape from 22.05 to 24.11 and later."""

from __future__ import annotations

import json

import pytest

from gpufleet_node.gpu_health.slurmnode import NodeState, SlurmShapeError, node_state, parse_nodes


def nodes_json(*records: object) -> str:
    return json.dumps({"nodes": list(records), "errors": [], "warnings": []})


def test_slurm_22_05_state_and_flags():
    record = {
        "name": "gpu-a",
        "state": "idle",
        "state_flags": ["DRAIN"],
        "reason": "gpufleet: xid79 gpu3 (fallen off the bus) 2026-11-27T10:02Z",
        "reason_changed_at": 1764237720,
        "partitions": ["gpu", "all"],
    }
    (found,) = parse_nodes(nodes_json(record))
    assert found == NodeState(
        "gpu-a",
        frozenset({"IDLE", "DRAIN"}),
        record["reason"],
        1764237720,
        ("gpu", "all"),
    )
    assert found.drained and found.drained_by_us


def test_slurm_23_02_state_list():
    record = {"name": "gpu-b", "state": ["MIXED", "DRAIN"], "reason": "bad fan"}
    (found,) = parse_nodes(nodes_json(record))
    assert found.flags == {"MIXED", "DRAIN"}
    assert found.drained and not found.drained_by_us
    assert (found.reason_time, found.partitions) == (0, ())


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"set": True, "infinite": False, "number": 1764237720}, 1764237720),
        ({"set": False, "infinite": False, "number": 0}, 0),
        ({"set": False, "infinite": False, "number": 1764237720}, 0),
        ({"set": True, "infinite": True, "number": 0}, 0),
        (0, 0),
        (1764237720, 1764237720),
        (2**70, 2**70),
    ],
)
def test_reason_time_shapes(value, expected):
    record = {"name": "n", "state": ["IDLE"], "reason_changed_at": value}
    assert node_state(record).reason_time == expected


def test_slurm_24_11_answer():
    text = json.dumps(
        {
            "nodes": [
                {
                    "name": "gpu-a",
                    "hostname": "gpu-a",
                    "state": ["IDLE", "DRAIN"],
                    "reason": "gpufleet: xid48 gpu0 (double bit ECC error) 2026-11-27T10:02Z",
                    "reason_changed_at": {"set": True, "infinite": False, "number": 1764237720},
                    "reason_set_by_user": "root",
                    "partitions": ["gpu"],
                    "gres": "gpu:h100:8",
                },
                {
                    "name": "gpu-b",
                    "state": ["ALLOCATED"],
                    "reason": "",
                    "reason_changed_at": {"set": False, "infinite": False, "number": 0},
                    "partitions": ["gpu", "debug"],
                },
            ],
            "last_update": {"set": True, "infinite": False, "number": 1764237720},
            "meta": {"slurm": {"release": "24.11.5"}},
            "errors": [],
            "warnings": [],
        }
    )
    a, b = parse_nodes(text)
    assert a.drained_by_us and a.reason_time == 1764237720
    assert not b.drained and b.partitions == ("gpu", "debug")


def test_flags_are_upper_case_and_drain_is_a_flag_not_a_state_word():
    assert node_state({"name": "n", "state": ["idle", "drain"]}).drained
    assert not node_state({"name": "n", "state": ["DRAINED_NOT"]}).drained
    assert not node_state({"name": "n", "state": "down"}).drained


def test_only_a_reason_that_starts_with_gpufleet_is_ours():
    def mine(reason: str) -> bool:
        return node_state({"name": "n", "state": ["IDLE", "DRAIN"], "reason": reason}).drained_by_us

    assert mine("gpufleet: xid79 gpu0 (x) 2026-11-27T10:02Z")
    assert not mine("bad gpu, see gpufleet: xid79")
    assert not mine("GPUFLEET: xid79")
    assert not mine("")
    # our reason on a node that is not drained: not drained by us
    assert not node_state({"name": "n", "state": ["IDLE"], "reason": "gpufleet: x"}).drained_by_us


@pytest.mark.parametrize(
    ("state", "out"),
    [
        (["IDLE"], False),
        (["ALLOCATED"], False),
        (["MIXED", "COMPLETING"], False),
        (["IDLE", "RESERVED"], False),
        (["IDLE", "DRAIN"], True),
        (["down"], True),
        (["IDLE", "FAIL"], True),
        (["ALLOCATED", "FAILING"], True),
        (["IDLE", "MAINTENANCE"], True),
        (["IDLE", "REBOOT_REQUESTED"], True),
    ],
)
def test_out_of_service(state, out):
    found = node_state({"name": "n", "state": state, "reason": "admin"})
    assert found.out_of_service is out
    assert not found.drained_by_us


def test_out_of_service_in_22_05_state_flags():
    assert node_state({"name": "n", "state": "idle", "state_flags": ["MAINTENANCE"]}).out_of_service


def test_absent_or_null_optional_fields():
    found = node_state({"name": "n", "state": ["IDLE"], "reason": None, "partitions": None})
    assert (found.reason, found.partitions, found.reason_time) == ("", (), 0)
    assert node_state({"name": "n", "partitions": "gpu"}).partitions == ("gpu",)
    assert node_state({"name": "n"}).flags == frozenset()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[]",
        "{}",
        '{"nodes": {}}',
        '{"nodes": null}',
        "[" * 100000 + "]" * 100000,
    ],
)
def test_answers_that_are_not_a_node_list(text):
    with pytest.raises(SlurmShapeError):
        parse_nodes(text)


@pytest.mark.parametrize(
    "record",
    [
        None,
        "gpu-a",
        {},
        {"name": 5},
        {"name": "n", "state": 5},
        {"name": "n", "state": ["IDLE", 5]},
        {"name": "n", "state_flags": {"DRAIN": True}},
        {"name": "n", "reason": 5},
        {"name": "n", "reason": ["x"]},
        {"name": "n", "partitions": [1]},
        {"name": "n", "reason_changed_at": "2026-11-27"},
        {"name": "n", "reason_changed_at": 1.5},
        {"name": "n", "reason_changed_at": True},
        {"name": "n", "reason_changed_at": {"set": True, "number": "1"}},
        {"name": "n", "reason_changed_at": {"set": True, "number": False}},
        {"name": "n", "reason_changed_at": {"set": True}},
    ],
)
def test_records_of_another_shape_are_errors(record):
    with pytest.raises(SlurmShapeError):
        parse_nodes(nodes_json(record))
