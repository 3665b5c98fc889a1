"""The ansible-core range is set in one place, playbooks/vars/ansible_core.yml (which
playbooks/preflight.yml reads); every file that repeats it says the same (issue 27)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import yaml

REPO = Path(__file__).resolve().parents[2]
RANGE = yaml.safe_load((REPO / "playbooks" / "vars" / "ansible_core.yml").read_text())
FLOOR = RANGE["gpufleet_ansible_core_floor"]
TOP = RANGE["gpufleet_ansible_core_top"]
# The oldest controller Python of each ansible-core release gpufleet supports
# (ansible-core's support matrix); pyproject.toml's requires-python is the floor's.
CONTROLLER_PYTHON = {"2.19": "3.11", "2.20": "3.12", "2.21": "3.12", "2.22": "3.12"}


def minor(version: str) -> tuple[int, int]:
    major, minor_ = version.split(".")[:2]
    return int(major), int(minor_)


def test_the_range_is_two_releases_in_order() -> None:
    assert re.fullmatch(r"2\.[0-9]+", FLOOR) and re.fullmatch(r"2\.[0-9]+", TOP)
    assert minor(FLOOR) <= minor(TOP)
    assert FLOOR in CONTROLLER_PYTHON and TOP in CONTROLLER_PYTHON


def test_pyproject_pins_the_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = [d for d in project["dependencies"] if d.startswith("ansible-core")]
    major, top_minor = minor(TOP)
    assert core == [f"ansible-core>={FLOOR},<{major}.{top_minor + 1}"]
    assert project["requires-python"] == f">={CONTROLLER_PYTHON[FLOOR]}"


def test_preflight_reads_the_range_and_names_no_release() -> None:
    text = (REPO / "playbooks" / "preflight.yml").read_text()
    play = yaml.safe_load(text)[0]
    assert play["vars_files"] == ["vars/ansible_core.yml"]
    assert not re.search(r"['\"]2\.[0-9]+['\"]", text), "a release written in preflight.yml"


def test_readme_and_testing_doc_say_the_range() -> None:
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"ansible-core {FLOOR} to {TOP}" in readme
    testing = (REPO / "docs" / "testing.md").read_text()
    rows = [line for line in testing.splitlines() if line.startswith("| controller |")]
    assert len(rows) == 1
    assert f"ansible-core {FLOOR} (the floor" in rows[0]
    assert f"ansible-core {TOP} (the top" in rows[0]


@pytest.mark.parametrize(
    "meta", sorted((REPO / "roles").glob("*/meta/main.yml")), ids=lambda p: p.parts[-3]
)
def test_role_meta_names_the_floor(meta: Path) -> None:
    info = yaml.safe_load(meta.read_text())["galaxy_info"]
    assert info["min_ansible_version"] == FLOOR


def test_the_ansible_core_running_the_tests_is_in_the_range() -> None:
    from ansible.release import __version__

    assert minor(FLOOR) <= minor(__version__) <= minor(TOP), __version__
