"""The node list's custom labels on gpufleet's rules: gpufleet.rule_labels' filters."""

from __future__ import annotations

import os
import sys

try:
    from gpufleet import rule_labels
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
    from gpufleet import rule_labels


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpufleet_rule_labels": rule_labels.with_node_labels,
            "gpufleet_rule_label_problems": rule_labels.name_problems,
        }
