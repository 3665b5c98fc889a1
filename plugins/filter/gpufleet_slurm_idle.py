"""The idle-GPU threshold and duration of gpufleet-slurm.rules.yml: gpufleet.slurm_idle's filter."""

from __future__ import annotations

import os
import sys

try:
    from gpufleet import slurm_idle
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
    from gpufleet import slurm_idle


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpufleet_slurm_idle_rules": slurm_idle.idle_rules,
        }
