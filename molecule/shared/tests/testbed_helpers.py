"""Helpers for testinfra tests that act on the test bed itself (restart, probe)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

TESTBED = Path(__file__).resolve().parents[2] / "testbed" / "testbed.py"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


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


def converge(
    *extra_vars: str,
    inventories: Sequence[str] = (),
    tags: str | None = None,
    limit: str | None = None,
    timeout: int = 600,
) -> subprocess.CompletedProcess:
    """Rerun the scenario's converge playbook, as an admin's rerun would.

    extra_vars are `-e` values; inventories are added after molecule's; tags and limit
    narrow the run, which keeps reruns of one role short. Output comes back uncoloured.
    """
    scenario = Path(os.environ["MOLECULE_SCENARIO_DIRECTORY"])
    args = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"]]
    for inventory in inventories:
        args += ["-i", inventory]
    if tags:
        args += ["--tags", tags]
    if limit:
        args += ["--limit", limit]
    args.append(str(scenario / "converge.yml"))
    for extra in extra_vars:
        args += ["-e", extra]
    # Molecule exports ANSIBLE_FORCE_COLOR, which beats ANSIBLE_NOCOLOR.
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    result.stdout, result.stderr = ANSI.sub("", result.stdout), ANSI.sub("", result.stderr)
    return result


def eventually(check: Callable[[], Any], timeout: float = 30, interval: float = 1) -> Any:
    """check()'s first truthy result within timeout (a bounded poll); its last one else."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(interval)
