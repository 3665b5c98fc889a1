"""Every role's meta/argument_specs.yml and defaults/main.yml describe the same variables."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
ROLE_DIRS = sorted(path for path in ROLES.iterdir() if (path / "tasks" / "main.yml").exists())


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("role", ROLE_DIRS, ids=lambda path: path.name)
def test_spec_and_defaults_agree(role: Path) -> None:
    defaults = load(role / "defaults" / "main.yml")
    options = load(role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert sorted(defaults) == sorted(options), "variables in one file but not the other"
    for name, spec in options.items():
        assert "description" in spec, f"{name} has no description"
        assert spec.get("default") == defaults[name], f"{name}: spec default differs"


@pytest.mark.parametrize("role", ROLE_DIRS, ids=lambda path: path.name)
def test_public_variables_carry_the_role_prefix(role: Path) -> None:
    defaults = load(role / "defaults" / "main.yml")
    assert all(name.startswith(f"{role.name}_") for name in defaults)


@pytest.mark.parametrize("role", ROLE_DIRS, ids=lambda path: path.name)
def test_internal_variables_are_underscored(role: Path) -> None:
    internal = role / "vars" / "main.yml"
    if internal.exists():
        assert all(name.startswith(f"_{role.name}_") for name in load(internal))
