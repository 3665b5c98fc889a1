"""Whether slurmctld serves its own OpenMetrics endpoints (Slurm 25.11+), read from
``scontrol show config``: the check gpufleet runs before Prometheus scrapes them.

Slurm's rules (slurm.conf(5) of 26.05, metrics.html): the endpoints exist with
``MetricsType=metrics/openmetrics``. Any ``PrivateData`` turns them off on 25.11; from
26.05 it restricts them to SlurmUser and root, with a JWT per request, unless
``MetricsParameters=ignore_private_data`` (open to all). ``MetricsAuthUsers`` (26.05) names
who may query, again with a JWT. A scrape that Slurm would refuse is a configuration
error, said in one line before anything changes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

FIRST_RELEASE = (25, 11)
# From 26.05 PrivateData restricts the endpoints (JWT) instead of turning them off.
RESTRICTED_RELEASE = (26, 5)
OPENMETRICS = "metrics/openmetrics"
# "Key   = value" lines; the key is one word, the value the rest of the line.
_LINE_RE = re.compile(r"^(?P<key>[A-Za-z][A-Za-z0-9_]*)\s*=\s?(?P<value>.*)$")
_VERSION_RE = re.compile(r"^(?P<major>[0-9]{1,3})\.(?P<minor>[0-9]{1,2})(?:\.[0-9]{1,3})?\b")
# What scontrol prints for a parameter that is not set.
_UNSET = {"", "(null)", "none", "n/a"}
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def parse_show_config(text: str) -> dict[str, str]:
    """The ``Key = value`` lines of ``scontrol show config`` (keys as Slurm spells them)."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(f"scontrol show config printed over {MAX_CONFIG_BYTES} bytes")
    config: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE_RE.match(line.strip())
        if match:
            config.setdefault(match["key"], match["value"].strip())
    return config


def _shown(value: str) -> str:
    """A value as an error line may quote it: printable, at most 80 characters."""
    printable = "".join(c if c.isprintable() else "?" for c in value)
    return printable if len(printable) <= 80 else printable[:77] + "..."


def _setting(config: Mapping[str, str], key: str) -> str:
    """A setting's value, "" when unset; keys are case-insensitive, as in slurm.conf."""
    for name, value in config.items():
        if name.lower() == key.lower():
            return "" if value.strip().lower() in _UNSET else _shown(value.strip())
    return ""


def _release(version: str) -> tuple[int, int] | None:
    match = _VERSION_RE.match(version)
    return (int(match["major"]), int(match["minor"])) if match else None


def native_metrics_problem(config: Mapping[str, str], *, prometheus_has_token: bool) -> str:
    """Why Prometheus cannot scrape this slurmctld's own metrics, or "" when it can."""
    version = _setting(config, "SLURM_VERSION")
    release = _release(version)
    if release is None:
        return f"scontrol show config names no Slurm release (SLURM_VERSION={version or 'missing'})"
    if release < FIRST_RELEASE:
        return (
            f"Slurm {version} serves no metrics endpoints (25.11 and later do): take the "
            "controller out of the slurmctld_metrics group"
        )
    metrics_type = _setting(config, "MetricsType")
    if metrics_type != OPENMETRICS:
        return (
            f"MetricsType is {metrics_type or 'not set'}: slurmctld serves no metrics; set "
            f"MetricsType={OPENMETRICS} in slurm.conf or take the controller out of "
            "the slurmctld_metrics group"
        )
    auth_users = _setting(config, "MetricsAuthUsers")
    parameters = {p.strip().lower() for p in _setting(config, "MetricsParameters").split(",")}
    private_data = _setting(config, "PrivateData")
    if auth_users:
        needs_token = f"MetricsAuthUsers={auth_users} makes each metrics request carry a JWT"
    elif private_data and "ignore_private_data" not in parameters:
        if release < RESTRICTED_RELEASE:
            return (
                f"PrivateData={private_data} turns slurmctld {version}'s metrics endpoints "
                "off: set MetricsParameters=ignore_private_data in slurm.conf, or take the "
                "controller out of the slurmctld_metrics group"
            )
        needs_token = (
            f"PrivateData={private_data} restricts the metrics endpoints to SlurmUser and "
            "root, with a JWT per request (or set MetricsParameters=ignore_private_data)"
        )
    else:
        return ""
    if prometheus_has_token:
        return ""
    return f"{needs_token}: give Prometheus one in prometheus_job_settings.slurmctld"
