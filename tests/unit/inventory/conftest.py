"""Fixtures for the gpufleet inventory tests; helpers live in inventory_helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from inventory_helpers import minimal_node_list, write_node_list


@pytest.fixture()
def node_list_path(tmp_path: Path) -> Path:
    return write_node_list(tmp_path, minimal_node_list())
