"""How gpufleet's own clients reach a service behind its web configuration.

A service that serves HTTP (Prometheus, Alertmanager) reads the exporter-toolkit web
configuration that roles/_common's web_config piece renders from `<service>_tls_cert`,
`<service>_tls_ca` and `<service>_basic_auth_users`. The clients gpufleet configures (the
global tier's federation, Prometheus sending alerts, Grafana's datasources) take their
scheme, CA and login from the same variables of the servers' hosts, so they can never
disagree with what the servers serve. The logic is gpufleet.web's, which ``gpufleet
jobstats`` shares; these are its filters.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

try:
    from gpufleet import web
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
    from gpufleet import web


gpufleet_web_client = web.web_client
gpufleet_web_ca = web.web_ca


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
            "gpufleet_scrape_clients": web.scrape_clients,
            "gpufleet_scrape_cas": web.scrape_cas,
            "gpufleet_prometheus_client": gpufleet_prometheus_client,
            "gpufleet_grafana_client": gpufleet_grafana_client,
        }
