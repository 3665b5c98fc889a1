"""Fixtures for the gpufleet inventory tests; helpers live in inventory_helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.plugins.loader import init_plugin_loader, inventory_loader
from ansible.utils.collection_loader import AnsibleCollectionConfig
from inventory_helpers import REPO_ROOT, close_warm_servers, minimal_node_list, write_node_list


@pytest.fixture(scope="session", autouse=True)
def _warm_ansible_inventory_ends_with_the_session():
    """run_ansible_inventory's servers end with the tests (their runs' CPU time is then
    counted as this process's children's, like that of the processes they replace)."""
    yield
    close_warm_servers()


@pytest.fixture()
def node_list_path(tmp_path: Path) -> Path:
    return write_node_list(tmp_path, minimal_node_list())


@pytest.fixture(scope="session")
def loader_ready() -> None:
    """Ansible's plugin loader, set up once per session (a second setup warns)."""
    if not AnsibleCollectionConfig.collection_finder:
        init_plugin_loader()
    inventory_loader.add_directory(str(REPO_ROOT / "plugins" / "inventory"))


@pytest.fixture()
def plugin(loader_ready: None):
    """The gpufleet inventory plugin, loaded the way Ansible loads it."""
    module = inventory_loader.get("gpufleet")
    assert module is not None, "plugins/inventory/gpufleet.py was not found by the loader"
    return module
