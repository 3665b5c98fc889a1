"""What both test files of the exporter_firewall scenario name: its paths, the
firewall's table and unit, curl's timeout exit status."""

from __future__ import annotations

import os
from pathlib import Path

SCENARIO = Path(os.environ["MOLECULE_SCENARIO_DIRECTORY"])
REPO = SCENARIO.parents[1]
MOLECULE_INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
TABLE = "gpufleet_exporters"
FIREWALL_UNIT = "gpufleet-exporter-firewall.service"
# curl: the connection timed out (a dropped packet, not a refused one).
CURL_TIMEOUT_RC = 28
