"""(d) ``ansible-inventory`` end to end: golden output and bad input through the CLI.

Regenerate the golden file after an intended change with
``GPUFLEET_REGEN_GOLDEN=1 PYTHONPATH=src pytest tests/unit/inventory/test_inventory_golden.py``
and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from inventory_bad_inputs import BAD_CASES, BadCase, expected_error, write_case
from inventory_helpers import (
    REPO_ROOT,
    assert_one_error,
    run_ansible_inventory,
    run_ansible_inventory_process,
)

from gpufleet.inventory_json import plain

GOLDEN = REPO_ROOT / "tests" / "golden" / "example-inventory.json"
EXAMPLE = "inventories/example"


def test_example_inventory_matches_golden() -> None:
    result = run_ansible_inventory("-i", EXAMPLE, "--list")
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    actual = json.loads(result.stdout)
    if os.environ.get("GPUFLEET_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(actual, indent=2, sort_keys=True) + "\n")
        pytest.skip(f"regenerated {GOLDEN.relative_to(REPO_ROOT)}")
    assert comparable(actual) == comparable(json.loads(GOLDEN.read_text())), (
        "ansible-inventory output changed; if intended, regenerate with GPUFLEET_REGEN_GOLDEN=1"
    )


def comparable(listing: dict) -> dict:
    """The listing without what differs between ansible-core versions, not gpufleet's:
    2.19's unsafe-string markers and its `_meta.profile`."""
    listing = plain(listing)
    listing["_meta"].pop("profile", None)
    return listing


def test_golden_example_has_the_documented_shape() -> None:
    """Guards the golden file itself against a careless regeneration."""
    golden = json.loads(GOLDEN.read_text())
    hostvars = golden["_meta"]["hostvars"]
    assert len(hostvars) == 66
    for group in ("gpu_nodes", "cpu_nodes", "servers", "prometheus", "prometheus_global",
                  "alertmanager", "grafana", "loki", "slurm_controller",
                  "prometheus_shard_0", "prometheus_shard_1"):  # fmt: skip
        assert group in golden, group
    shard_members = golden["prometheus_shard_0"]["hosts"] + golden["prometheus_shard_1"]["hosts"]
    assert sorted(shard_members) == sorted(hostvars)
    assert 0 in (hostvars["gpu001"]["gpufleet_shard"],)  # pinned in the example


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: c.id)
def test_ansible_inventory_fails_with_the_one_line_error(case: BadCase, tmp_path: Path) -> None:
    """The user sees gpufleet's line once, and nothing from other plugins (ansible.cfg's
    enable_plugins), next to Ansible's fixed closing line."""
    path = write_case(case, tmp_path)
    result = run_ansible_inventory("-i", str(path), "--list")
    assert result.returncode != 0
    expected = expected_error(case, tmp_path, path)
    assert_one_error(result.stderr, str(path), expected)
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout.strip() == ""


def test_the_shared_import_answers_as_the_command_does(tmp_path: Path) -> None:
    """run_ansible_inventory forks an ansible-inventory that has made its import
    (inventory_helpers.py says why); the command run as a process of its own gives the
    same exit status, output and errors."""
    path = write_case(BAD_CASES[0], tmp_path)
    for args in (["-i", EXAMPLE, "--list"], ["-i", str(path), "--list"], ["--version"]):
        shared, own = run_ansible_inventory(*args), run_ansible_inventory_process(list(args))
        assert (shared.returncode, shared.stdout, shared.stderr) == (
            own.returncode,
            own.stdout,
            own.stderr,
        ), args
