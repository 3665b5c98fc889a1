"""Prometheus' query limits sized from its memory bound: gpufleet.query_limits' filters."""

from __future__ import annotations

import os
import sys

try:
    from gpufleet import query_limits
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
    from gpufleet import query_limits


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpufleet_query_max_samples": query_limits.sized_max_samples,
            "gpufleet_query_limit_problems": query_limits.setting_problems,
            "gpufleet_query_flag_conflicts": query_limits.flag_conflicts,
            "gpufleet_query_log_problems": query_limits.log_problems,
        }
