"""How gpufleet's own clients reach a service behind its web configuration.

A service that serves HTTP (Prometheus, Alertmanager) reads the exporter-toolkit web
configuration that roles/_common's web_config piece renders from `<service>_tls_cert`,
`<service>_tls_ca` and `<service>_basic_auth_users`. The clients gpufleet configures (the
global tier's federation, Prometheus sending alerts, Grafana's datasources, through the
filter gpufleet_web_client) and ``gpufleet jobstats`` take their scheme, CA and login from
the same variables of the servers' hosts, so they can never disagree with what the servers
serve. :func:`prometheus_client` and :func:`grafana_client` (filters
gpufleet_prometheus_client and gpufleet_grafana_client) write a web_client the way a
Prometheus scrape or alerting entry and a Grafana datasource want it. The web configuration
itself holds the users' passwords as :func:`bcrypt_hash` makes them (filter
gpufleet_bcrypt), with a salt derived per host and user so a rerun renders the same file.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import bcrypt

from gpufleet.lifecycle import staying

# The basic auth user gpufleet's own clients log in as (the users a site adds for its
# people stay theirs).
CLIENT_USER = "gpufleet"

# bcrypt's own base64 alphabet (not the standard one).
_BCRYPT_ALPHABET = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_STD_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def bcrypt_salt(seed: str, rounds: int = 10) -> bytes:
    """A bcrypt salt derived from seed, so a rerun renders the same hash (idempotence).

    The seed is host and user specific; the salt still differs between hosts and users.
    """
    digest = hashlib.sha256(seed.encode()).digest()[:16]
    encoded = base64.b64encode(digest).decode().rstrip("=")
    translated = encoded.translate(str.maketrans(_STD_ALPHABET, _BCRYPT_ALPHABET))
    # 16 bytes make 22 characters; bcrypt ignores the low bits of the last one.
    return f"$2b${rounds:02d}${translated[:22]}".encode()


def bcrypt_hash(password: str, seed: str, rounds: int = 10) -> str:
    """Hash password with bcrypt, as the Prometheus exporter-toolkit web config expects."""
    if not password:
        raise ValueError("gpufleet_bcrypt: refusing to hash an empty password")
    return bcrypt.hashpw(str(password).encode(), bcrypt_salt(seed, rounds)).decode()


def _settings(host: Mapping[str, Any], service: str) -> tuple[str, str, str]:
    """(scheme, CA, gpufleet's password or "") of one host of service."""
    cert = str(host.get(f"{service}_tls_cert") or "")
    ca = str(host.get(f"{service}_tls_ca") or "") or cert
    users = host.get(f"{service}_basic_auth_users") or {}
    if not isinstance(users, Mapping):
        raise ValueError(f"{service}_basic_auth_users must be a mapping of user to password")
    password = str(users.get(CLIENT_USER) or "")
    if users and not password:
        raise ValueError(
            f"{service}_basic_auth_users has no user {CLIENT_USER!r}: gpufleet's own clients "
            f"(federation, alert delivery, Grafana) log in as {CLIENT_USER!r}; add it"
        )
    return ("https" if cert else "http", ca if cert else "", password)


def web_client(
    hostnames: Iterable[str], hostvars: Mapping[str, Any], service: str
) -> dict[str, str]:
    """{"scheme", "ca", "username", "password"} for clients of service on hostnames.

    One scrape job or datasource reaches every host of a service with one setting, so
    the hosts must agree: a host whose scheme, CA or gpufleet password differs from the
    others' is refused, naming it. "ca" is the PEM that verifies the servers (their
    `<service>_tls_ca`, or the certificate itself when it is self-signed and no CA is
    given); "username" and "password" are empty when the servers ask for no login.
    """
    names = sorted(set(hostnames or []))
    if not names:
        return {"scheme": "http", "ca": "", "username": "", "password": ""}
    first = _settings(hostvars[names[0]], service)
    for name in names[1:]:
        if _settings(hostvars[name], service) != first:
            raise ValueError(
                f"{name}: {service}_tls_cert/_tls_ca/_basic_auth_users give another scheme, CA or "
                f"{CLIENT_USER!r} password than {names[0]}; every {service} host must share them "
                "(one scrape job or datasource reaches them all)"
            )
    scheme, ca, password = first
    return {
        "scheme": scheme,
        "ca": ca,
        "username": CLIENT_USER if password else "",
        "password": password,
    }


def web_ca(hostnames: Iterable[str], hostvars: Mapping[str, Any], service: str) -> str:
    """The PEM that verifies the servers of service on hostnames ("" for plain HTTP).

    The CA half of web_client, reading no password: the task that writes the CA file
    has nothing to hide.
    """
    cas: dict[str, str] = {}
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


def _scraped(
    registry: Mapping[str, Mapping[str, Any]],
    groups: Mapping[str, Iterable[str]],
    hostvars: Mapping[str, Any],
) -> dict[str, tuple[list[str], str]]:
    """job -> (its hosts, the role whose <role>_tls_* and _basic_auth_users they serve
    with), for the registry's jobs that a gpufleet role runs (a served_by endpoint is a
    site's own daemon: prometheus_job_settings says how to reach it). A leaving host
    (remove_node.yml) counts no more, as its targets: the job is what it will be once the
    host is gone from the inventory."""
    return {
        job: (sorted(staying(groups.get(str(entry["group"]), []), hostvars)), str(entry["role"]))
        for job, entry in registry.items()
        if entry.get("role")
    }


def scrape_clients(
    registry: Mapping[str, Mapping[str, Any]],
    groups: Mapping[str, Iterable[str]],
    hostvars: Mapping[str, Any],
) -> dict[str, dict[str, str]]:
    """job -> web_client of its hosts: a new exporter's scrape gets its TLS and login
    from the exporter's own settings, with no prometheus_job_settings to write."""
    return {
        job: web_client(hosts, hostvars, role)
        for job, (hosts, role) in _scraped(registry, groups, hostvars).items()
    }


def scrape_cas(
    registry: Mapping[str, Mapping[str, Any]],
    groups: Mapping[str, Iterable[str]],
    hostvars: Mapping[str, Any],
) -> dict[str, str]:
    """job -> the PEM that verifies its hosts ("" for plain HTTP): scrape_clients' CAs."""
    return {
        job: web_ca(hosts, hostvars, role)
        for job, (hosts, role) in _scraped(registry, groups, hostvars).items()
    }


def prometheus_client(
    client: Mapping[str, str], ca_file: str, server_name: str = ""
) -> dict[str, Any]:
    """The scheme, tls_config and basic_auth of a Prometheus scrape or alerting entry.

    client is a :func:`web_client`; ca_file is where the client's host keeps its "ca"
    (filter gpufleet_prometheus_client).
    """
    settings: dict[str, Any] = {"scheme": client["scheme"]}
    if client["scheme"] == "https":
        tls_config = {"ca_file": ca_file}
        if server_name:
            tls_config["server_name"] = server_name
        settings["tls_config"] = tls_config
    if client["username"]:
        settings["basic_auth"] = {"username": client["username"], "password": client["password"]}
    return settings


def grafana_client(client: Mapping[str, str]) -> dict[str, Any]:
    """basicAuth, jsonData and secureJsonData of a Grafana datasource for client.

    client is a :func:`web_client` (filter gpufleet_grafana_client). Grafana expands $VAR
    in provisioning files: a literal $ in a secret is written $$.
    """
    settings: dict[str, Any] = {}
    json_data: dict[str, Any] = {}
    secure: dict[str, str] = {}
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
