"""Filters that write a role variable into a unit, environment or INI file literally.

Thin glue over gpufleet.render_escape, where the quoting rules of each format are
explained: every value a template writes into such a file goes through one of these.
"""

from __future__ import annotations

import os
import sys

try:
    from gpufleet import render_escape
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
    from gpufleet import render_escape


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpufleet_systemd_arg": render_escape.systemd_arg,
            "gpufleet_systemd_executable": render_escape.systemd_executable,
            "gpufleet_systemd_path": render_escape.systemd_path,
            "gpufleet_systemd_environment": render_escape.systemd_environment,
            "gpufleet_systemd_value": render_escape.systemd_specifiers,
            "gpufleet_env_value": render_escape.env_value,
            "gpufleet_env_words": render_escape.env_words,
            "gpufleet_ini_name": render_escape.ini_name,
            "gpufleet_ini_value": render_escape.ini_value,
            "gpufleet_ini_problems": render_escape.ini_problems,
        }
