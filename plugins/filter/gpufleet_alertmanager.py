"""Alertmanager's severity routes and their check: gpufleet.alert_routes' filters."""

from __future__ import annotations

import os
import sys

try:
    from gpufleet import alert_routes
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
    from gpufleet import alert_routes


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpufleet_alertmanager_severity_routes": alert_routes.severity_routes,
            "gpufleet_alertmanager_timing_problems": alert_routes.timing_problems,
        }
