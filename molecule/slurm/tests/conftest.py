import os
import sys
from pathlib import Path

import pytest
import testinfra

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "shared" / "tests"))


def _host(name: str):
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={inventory}")


@pytest.fixture(scope="session")
def ctl():
    return _host("gpufleet-slurmctl")


@pytest.fixture(scope="session")
def gpu_nodes():
    return {name: _host(name) for name in ("gpufleet-slurm-gpu1", "gpufleet-slurm-gpu2")}
