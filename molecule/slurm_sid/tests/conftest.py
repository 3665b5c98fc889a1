import os
import sys
from pathlib import Path

import pytest
import testinfra

HERE = Path(__file__).resolve().parent
# The shared test helpers, and the `slurm` scenario's Slurm helpers (same checks, another
# Slurm release).
sys.path.insert(0, str(HERE.parents[1] / "shared" / "tests"))
sys.path.insert(0, str(HERE.parents[1] / "slurm" / "tests"))

CONTROLLER = "gpufleet-sid-ctl"
GPU_NODE = "gpufleet-sid-gpu1"


def _host(name: str):
    inventory = os.environ["MOLECULE_INVENTORY_FILE"]
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={inventory}")


@pytest.fixture(scope="session")
def ctl():
    return _host(CONTROLLER)


@pytest.fixture(scope="session")
def gpu():
    return _host(GPU_NODE)
