"""The node package runs on EL 9's system python3 (3.9): its syntax must parse there."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "src" / "gpufleet_node"
MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_package_has_its_modules():
    names = {p.relative_to(PACKAGE).as_posix() for p in MODULES}
    assert {"exposition.py", "commands.py", "hostlist.py", "webconfig.py", "build.py"} <= names
    assert "slurm_exporter/cli.py" in names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_module_parses_as_python_3_9(path: Path):
    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 9))


def test_feature_version_rejects_newer_syntax():
    # The check above means something: 3.10's match statement is refused.
    with pytest.raises(SyntaxError):
        ast.parse("match x:\n    case 1:\n        pass\n", feature_version=(3, 9))
