"""Pin a repository signing key by its OpenPGP fingerprint: gpufleet.openpgp's filters."""

from __future__ import annotations

import os
import sys

try:
    from gpufleet import openpgp
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
    from gpufleet import openpgp


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpufleet_openpgp_select": openpgp.select_key,
            "gpufleet_openpgp_fingerprints": openpgp.primary_fingerprints,
        }
