"""Helpers for the observability scenario's tests: reruns, processes, HTTP probes.

Loki and Alloy on the test host are the stand-ins (molecule/testbed/standins/), built
and served by prepare.yml; standins.json in the ephemeral directory says what was built.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import testbed_helpers

EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
MIRROR = "http://127.0.0.1:18094"
LOKI_BINARY = "/usr/local/bin/loki"
ALLOY_BINARY = "/usr/bin/alloy"
ALLOY_ADDRESS = "127.0.0.1:12345"
# What the stand-ins' validate entry points refuse (molecule/testbed/standins/).
REFUSE_MARKER = "gpufleet_standin_refuse"


def built() -> dict[str, Any]:
    """What prepare.yml built: {"loki": {version, sha256, binary_sha256, ...}, "alloy": ...}."""
    return json.loads((EPHEMERAL / "standins.json").read_text())


def converge(*extra_vars: str, tags: str | None = None) -> subprocess.CompletedProcess:
    """Rerun converge.yml; tags limits it to a role's tasks (`loki`, `alloy`), the roles'
    own tags, which keep these reruns short; the last test reruns everything."""
    return testbed_helpers.converge(*extra_vars, tags=tags, timeout=900)


def output(result: subprocess.CompletedProcess) -> str:
    """stdout and stderr with whitespace folded (the YAML callback wraps long lines)."""
    return " ".join((result.stdout + result.stderr).split())


def recap(result: subprocess.CompletedProcess, host) -> dict[str, int]:
    """The PLAY RECAP counters of host in a playbook run."""
    name = host.backend.get_variables()["inventory_hostname"]
    match = re.search(
        rf"{re.escape(name)}\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)",
        result.stdout,
    )
    assert match, f"no recap for {name} in:\n{result.stdout[-3000:]}"
    return dict(
        zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups()), strict=True)
    )


def main_pid(host, unit: str) -> int:
    return int(host.service(unit).systemd_properties["MainPID"])


def process(host, pid: int) -> dict[str, Any]:
    """argv, real uid and gid, and supplementary group ids of a process on the host."""
    assert pid > 0, "the service has no main process"
    status = host.file(f"/proc/{pid}/status").content_string
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    argv = host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/cmdline").splitlines()
    return {
        "argv": argv,
        "uid": int(fields["Uid"].split()[0]),
        "gid": int(fields["Gid"].split()[0]),
        "groups": {int(g) for g in fields["Groups"].split()},
    }


def fetch(url: str, method: str = "GET", timeout: float = 5) -> tuple[int, str]:
    """Status and body of a request from the controller; status 0 when nothing answers."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


def fetch_on_host(host, url: str) -> tuple[int, str]:
    """Status and body of a GET made on the host itself (for loopback-only listeners)."""
    result = host.run(f"curl -sS --max-time 5 -w '\\n%{{http_code}}' {url}")
    body, _, code = result.stdout.rpartition("\n")
    return int(code or 0), body


def metrics(body: str) -> dict[str, str]:
    """Prometheus text exposition as {series: value}."""
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = value
    return out


def alloy_metrics(host, address: str = ALLOY_ADDRESS) -> dict[str, str]:
    status, body = fetch_on_host(host, f"http://{address}/metrics")
    assert status == 200, f"Alloy's /metrics on {address} answered {status}"
    return metrics(body)


def alloy_config_hash(series: dict[str, str]) -> str:
    (name,) = [s for s in series if s.startswith("alloy_config_hash{")]
    return re.search(r'sha256="([0-9a-f]*)"', name).group(1)
