"""How gpufleet's own clients reach a service behind its web configuration.

A service that serves HTTP (Prometheus, Alertmanager) reads the exporter-toolkit web
configuration that the `web_config` role renders from `<service>_tls_cert`,
`<service>_tls_ca` and `<service>_basic_auth_users`. The clients gpufleet configures (the
global tier's federation, Prometheus sending alerts, Grafana's datasources) take their
scheme, CA and login from the same variables of the servers' hosts, so they can never
disagree with what the servers serve. gpufleet_web_client is gpufleet.web.web_client,
which ``gpufleet jobstats`` shares.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

try:
    from gpufleet.web import web_client as gpufleet_web_client
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
    from gpufleet.web import web_client as gpufleet_web_client


def gpufleet_web_ca(hostnames: list[str], hostvars: Mapping, service: str) -> str:
    """The PEM that verifies the servers of service on hostnames ("" for plain HTTP).

    The CA half of gpufleet_web_client, reading no password: the task that writes the
    CA file has nothing to hide.
    """
    cas = {}
    for name in sorted(set(hostnames or [])):
        host = hostvars[name]
        cert = str(host.get(f"{service}_tls_cert") or "")
        cas[name] = (str(host.get(f"{service}_tls_ca") or "") or cert) if cert else ""
    if len(set(cas.values())) > 1:
        first, *others = sorted(cas)
        odd = next(name for name in others if cas[name] != cas[first])
        raise ValueError(
            f"{odd}: {service}_tls_cert/_tls_ca give another CA than {first}; every "
            f"{service} host must share one (one scrape job or datasource reaches them all)"
        )
    return next(iter(cas.values()), "")


def gpufleet_prometheus_client(client: Mapping, ca_file: str, server_name: str = "") -> dict:
    """The scheme, tls_config and basic_auth of a Prometheus scrape or alerting entry."""
    settings: dict = {"scheme": client["scheme"]}
    if client["scheme"] == "https":
        settings["tls_config"] = {"ca_file": ca_file}
        if server_name:
            settings["tls_config"]["server_name"] = server_name
    if client["username"]:
        settings["basic_auth"] = {"username": client["username"], "password": client["password"]}
    return settings


def gpufleet_grafana_client(client: Mapping) -> dict:
    """basicAuth, jsonData and secureJsonData of a Grafana datasource for client.

    Grafana expands $VAR in provisioning files: a literal $ in a secret is written $$.
    """
    settings: dict = {}
    json_data: dict = {}
    secure: dict = {}
    if client["scheme"] == "https":
        json_data["tlsAuthWithCACert"] = True
        secure["tlsCACert"] = client["ca"].replace("$", "$$")
    if client["username"]:
        settings["basicAuth"] = True
        settings["basicAuthUser"] = client["username"]
        secure["basicAuthPassword"] = client["password"].replace("$", "$$")
    if json_data:
        settings["jsonData"] = json_data
    if secure:
        settings["secureJsonData"] = secure
    return settings


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpufleet_web_client": gpufleet_web_client,
            "gpufleet_web_ca": gpufleet_web_ca,
            "gpufleet_prometheus_client": gpufleet_prometheus_client,
            "gpufleet_grafana_client": gpufleet_grafana_client,
        }
