"""Helpers for testinfra tests that act on the test bed itself (restart, probe)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTBED = Path(__file__).resolve().parents[2] / "testbed" / "testbed.py"


def host_address(host) -> str:
    return host.backend.get_variables()["ansible_host"]


def network() -> str:
    return f"gpufleet-{os.environ['MOLECULE_SCENARIO_NAME']}"


def restart_host(host) -> None:
    """Stop and start the host's container: systemd shuts down and boots again."""
    name = host.backend.get_variables()["inventory_hostname"]
    subprocess.run(
        [sys.executable, str(TESTBED), "restart", f"{name}={host_address(host)}"],
        check=True,
        timeout=180,
    )


def probe_from_network(host, url: str, *curl_args: str) -> str:
    """Fetch url from a throwaway host on the scenario's network (not the controller)."""
    result = subprocess.run(
        [
            sys.executable,
            str(TESTBED),
            "probe",
            "--network",
            network(),
            "--",
            "curl",
            "-fsS",
            "--max-time",
            "10",
            *curl_args,
            url,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout
