"""The `for:` duration of gpufleet's shipped alerts per alert name: gpufleet.alert_for's filters."""

from __future__ import annotations

import os
import sys

try:
    from gpufleet import alert_for
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
    from gpufleet import alert_for


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpufleet_alert_for": alert_for.set_durations,
            "gpufleet_alert_for_problems": alert_for.setting_problems,
        }
