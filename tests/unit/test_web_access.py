"""TLS and basic auth on Prometheus and Alertmanager, and every client gpufleet configures.

The servers render the exporter-toolkit web configuration (roles/_common/tasks/web_config.yml,
its checks in roles/_common/tasks/preflight.yml: test_common_web_config.py); the global
tier's federation, Prometheus' self-scrape, alert delivery, Grafana's datasources and
Loki's ruler take scheme, CA and login from the same variables of the servers' hosts.
Checked here with a real CA and certificate, promtool's own checkers and bcrypt.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest
import yaml
from ansible.plugins.loader import filter_loader
from render_role import ROOT, evaluate, example_inventory, render, render_web_config

filter_loader.add_directory(str(ROOT / "plugins" / "filter"))
sys.path.insert(0, str(ROOT / "plugins" / "filter"))

from gpufleet_filters import gpufleet_web_ca, gpufleet_web_client  # noqa: E402
from test_common_web_config import accepted  # noqa: E402

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(not PROMTOOL, reason="promtool not installed")
GLOBAL = {"name": "global", "mode": "global", "shard": None, "replica": 0}
PASSWORD = "pa$$word-for-gpufleet"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, str]:
    """A CA and a server certificate for the monitoring hosts' addresses."""
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            *ec,
            "-keyout",
            d / "ca.key",
            "-out",
            d / "ca.crt",
            "-subj",
            "/CN=test CA",
            "-days",
            "2",
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            "openssl",
            "req",
            *ec,
            "-keyout",
            d / "tls.key",
            "-out",
            d / "tls.csr",
            "-subj",
            "/CN=mon",
        ],
        check=True,
        capture_output=True,
    )
    (d / "san.ext").write_text("subjectAltName=IP:10.1.9.1,IP:10.1.9.2,IP:10.1.9.3\n")
    subprocess.run(
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            d / "tls.csr",
            "-CA",
            d / "ca.crt",
            "-CAkey",
            d / "ca.key",
            "-CAcreateserial",
            "-out",
            d / "tls.crt",
            "-days",
            "2",
            "-extfile",
            d / "san.ext",
        ],
        check=True,
        capture_output=True,
    )
    return {name: (d / name).read_text() for name in ("ca.crt", "tls.crt", "tls.key")}


def secured(pki: dict, service: str, **changes) -> dict:
    return {
        f"{service}_tls_cert": pki["tls.crt"],
        f"{service}_tls_key": pki["tls.key"],
        f"{service}_tls_ca": pki["ca.crt"],
        f"{service}_basic_auth_users": {"gpufleet": PASSWORD, "admin": "another-secret"},
        **changes,
    }


def inventory_with(pki: dict, prometheus: bool = True, alertmanager: bool = True):
    """The example inventory with TLS and login on every Prometheus and/or Alertmanager host."""
    groups, hostvars = example_inventory()
    hostvars = {name: dict(values) for name, values in hostvars.items()}
    for name in groups["prometheus"] + groups["prometheus_global"] if prometheus else []:
        hostvars[name].update(secured(pki, "prometheus"))
    for name in groups["alertmanager"] if alertmanager else []:
        hostvars[name].update(secured(pki, "alertmanager"))
    return groups, hostvars


# The client settings ------------------------------------------------------------------


def test_without_tls_or_users_clients_use_plain_http():
    client = gpufleet_web_client(["a", "b"], {"a": {}, "b": {}}, "prometheus")
    assert client == {"scheme": "http", "ca": "", "username": "", "password": ""}
    assert gpufleet_web_ca(["a"], {"a": {}}, "prometheus") == ""


def test_tls_and_users_give_https_the_ca_and_gpufleets_login(pki):
    hosts = {"a": secured(pki, "alertmanager"), "b": secured(pki, "alertmanager")}
    client = gpufleet_web_client(["b", "a"], hosts, "alertmanager")
    assert client == {
        "scheme": "https",
        "ca": pki["ca.crt"],
        "username": "gpufleet",
        "password": PASSWORD,
    }
    assert gpufleet_web_ca(["a", "b"], hosts, "alertmanager") == pki["ca.crt"]


def test_a_self_signed_certificate_is_its_own_ca(pki):
    hosts = {"a": secured(pki, "prometheus", prometheus_tls_ca="")}
    assert gpufleet_web_client(["a"], hosts, "prometheus")["ca"] == pki["tls.crt"]


def test_users_without_gpufleet_are_refused_with_the_fix():
    hosts = {"a": {"prometheus_basic_auth_users": {"admin": "x"}}}
    with pytest.raises(ValueError, match="prometheus_basic_auth_users has no user 'gpufleet'"):
        gpufleet_web_client(["a"], hosts, "prometheus")


@pytest.mark.parametrize(
    "change",
    [
        {"prometheus_tls_cert": "", "prometheus_tls_key": ""},
        {"prometheus_tls_ca": "-----BEGIN CERTIFICATE-----\nother\n"},
        {"prometheus_basic_auth_users": {"gpufleet": "different"}},
    ],
)
def test_hosts_that_disagree_are_refused_by_name(pki, change):
    hosts = {"mon01": secured(pki, "prometheus"), "mon02": secured(pki, "prometheus", **change)}
    with pytest.raises(ValueError, match=r"^mon02: "):
        gpufleet_web_client(["mon01", "mon02"], hosts, "prometheus")


# What the servers serve ---------------------------------------------------------------


def assert_promtool_accepts(what: str, path: Path, *flags: str) -> None:
    check = subprocess.run(
        [PROMTOOL, "check", what, *flags, path], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


def web_config(pki: dict, directory: Path, **values) -> str:
    """Prometheus' web configuration, written into directory."""
    overrides = {
        "_prometheus_web_dir": str(directory),
        "prometheus_tls_cert": pki["tls.crt"],
        "prometheus_tls_key": pki["tls.key"],
        "prometheus_basic_auth_users": {"gpufleet": PASSWORD},
        **values,
    }
    return render_web_config("prometheus", "mon01", overrides)


@needs_promtool
def test_the_web_config_passes_promtool_and_holds_only_bcrypt_hashes(pki, tmp_path):
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_text(pki[name])
    text = web_config(pki, tmp_path)
    assert PASSWORD not in text
    doc = yaml.safe_load(text)
    assert doc["tls_server_config"]["cert_file"] == f"{tmp_path}/tls.crt"
    assert bcrypt.checkpw(PASSWORD.encode(), doc["basic_auth_users"]["gpufleet"].encode())
    (tmp_path / "web-config.yml").write_text(text)
    assert_promtool_accepts("web-config", tmp_path / "web-config.yml")
    assert web_config(pki, tmp_path) == text, "a rerun renders the same hashes"


@needs_promtool
def test_an_empty_web_config_serves_plain_http_and_passes_promtool(tmp_path):
    text = render_web_config("prometheus", "mon01", {"_prometheus_web_dir": str(tmp_path)})
    assert yaml.safe_load(text) is None
    (tmp_path / "web-config.yml").write_text(text)
    assert_promtool_accepts("web-config", tmp_path / "web-config.yml")


def test_a_real_certificate_and_key_pass_the_shared_preflight(pki):
    # roles/_common/tasks/preflight.yml's check (test_common_web_config.py), on real PEM.
    values = {"tls_cert": pki["tls.crt"], "tls_key": pki["tls.key"], "tls_client_ca": pki["ca.crt"]}
    for role in ("prometheus", "alertmanager"):
        assert accepted(role, **values, basic_auth_users={"gpufleet": PASSWORD})
        assert not accepted(role, **{**values, "tls_key": pki["tls.crt"]})


# Prometheus' own clients --------------------------------------------------------------


def global_config(pki: dict, **inventory) -> dict:
    groups, hostvars = inventory_with(pki, **inventory)
    overrides = {
        "_instance": GLOBAL,
        **{k: v for k, v in hostvars["mon01"].items() if k.startswith("prometheus_")},
    }
    return yaml.safe_load(
        render("prometheus", "prometheus.yml.j2", "mon01", overrides, (groups, hostvars))
    )


def test_global_tier_federates_sends_alerts_and_scrapes_itself_over_tls_with_login(pki):
    config = global_config(pki)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    web = "/etc/gpufleet/prometheus/web"
    login = {"username": "gpufleet", "password": PASSWORD}
    for name in ("federate", "prometheus_shards"):
        assert jobs[name]["scheme"] == "https"
        assert jobs[name]["tls_config"] == {"ca_file": f"{web}/shards-ca.crt"}
        assert jobs[name]["basic_auth"] == login
    assert jobs["prometheus"]["tls_config"] == {
        "ca_file": f"{web}/self-ca.crt",
        "server_name": "10.1.9.1",
    }
    assert jobs["prometheus"]["basic_auth"] == login
    assert jobs["alertmanager"]["scheme"] == "https"
    assert jobs["alertmanager"]["tls_config"] == {"ca_file": f"{web}/alertmanager-ca.crt"}
    (alerting,) = config["alerting"]["alertmanagers"]
    assert alerting["scheme"] == "https" and alerting["basic_auth"] == login
    assert alerting["tls_config"] == {"ca_file": f"{web}/alertmanager-ca.crt"}


def test_plain_inventory_keeps_plain_http_and_no_login():
    config = yaml.safe_load(
        render("prometheus", "prometheus.yml.j2", "mon01", {"_instance": GLOBAL})
    )
    for job in config["scrape_configs"]:
        assert job.get("scheme", "http") == "http" and "basic_auth" not in job, job["job_name"]
    assert "basic_auth" not in config["alerting"]["alertmanagers"][0]


@needs_promtool
def test_the_secured_global_config_passes_promtool(pki, tmp_path):
    text = yaml.safe_dump(global_config(pki))
    text = text.replace("/etc/gpufleet/prometheus/web/", f"{tmp_path}/")
    for name in ("self", "shards", "alertmanager"):
        (tmp_path / f"{name}-ca.crt").write_text(pki["ca.crt"])
    (tmp_path / "prometheus.yml").write_text(text)
    assert_promtool_accepts("config", tmp_path / "prometheus.yml", "--syntax-only")


def test_the_unit_serves_the_web_config_and_names_the_tls_state(pki):
    unit = render("prometheus", "prometheus.service.j2", "mon01", {"_instance": GLOBAL})
    assert "--web.config.file=/etc/gpufleet/prometheus/web/web-config.yml" in unit
    assert "TLS off" in unit
    tls = render(
        "prometheus",
        "prometheus.service.j2",
        "mon01",
        {"_instance": GLOBAL, **secured(pki, "prometheus")},
    )
    assert "TLS on" in tls, "switching TLS changes the unit, which restarts the instance"


# Alertmanager: its web config and gossip ----------------------------------------------


def test_gossip_listens_on_the_hosts_address_and_reaches_peers_there(pki):
    unit = render("alertmanager", "alertmanager.service.j2", "mon02", secured(pki, "alertmanager"))
    assert "--cluster.listen-address=10.1.9.2:9094" in unit
    assert "--cluster.advertise-address=10.1.9.2:9094" in unit
    assert "0.0.0.0:9094" not in unit
    assert {"--cluster.peer=10.1.9.1:9094", "--cluster.peer=10.1.9.3:9094"} <= set(unit.split())
    assert "--web.config.file=/etc/gpufleet/alertmanager/web/web-config.yml" in unit
    assert "TLS on" in unit


@pytest.mark.parametrize(
    ("address", "ok"),
    [
        ("10.1.9.2", True),
        ("fd00::2", True),
        ("0.0.0.0", False),
        ("::", False),
        ("mon02.example", False),
    ],
)
def test_gossip_address_must_be_an_ip_address(address, ok):
    tasks = yaml.safe_load((ROOT / "roles/alertmanager/tasks/preflight.yml").read_text())
    (task,) = [t for t in tasks if t["name"] == "Check the gossip address"]
    conditions = task["ansible.builtin.assert"]["that"]
    results = [
        evaluate("alertmanager", c, "mon02", {"alertmanager_cluster_address": address})
        for c in conditions
    ]
    assert all(results) is ok


# Grafana and Loki -----------------------------------------------------------------------


def test_grafana_datasources_carry_the_ca_and_login(pki):
    target = {
        "org_id": 1,
        "name": "Main Org.",
        "file": "gpufleet.yml",
        "dir": "/d",
        "dashboards": [],
        "datasources_extra": [],
    }
    values = {
        "grafana_admin_password": "c0rrect-horse-battery",
        "grafana_secret_key": "0123456789abcdef0123",
        "__grafana_target": target,
    }
    doc = yaml.safe_load(
        render("grafana", "datasources.yml.j2", "mon03", values, inventory_with(pki))
    )
    sources = {ds["uid"]: ds for ds in doc["datasources"]}
    for uid in ("gpufleet-prometheus", "gpufleet-prometheus-shard-0", "gpufleet-alertmanager"):
        ds = sources[uid]
        assert ds["url"].startswith("https://10.1.9."), ds["url"]
        assert ds["basicAuth"] is True and ds["basicAuthUser"] == "gpufleet"
        assert ds["jsonData"]["tlsAuthWithCACert"] is True
        # Grafana expands $VAR in provisioning files: a literal $ is written $$.
        assert ds["secureJsonData"]["basicAuthPassword"] == PASSWORD.replace("$", "$$")
        assert ds["secureJsonData"]["tlsCACert"] == pki["ca.crt"]
    assert sources["gpufleet-prometheus"]["jsonData"]["httpMethod"] == "POST", (
        "merged, not replaced"
    )
    assert "basicAuth" not in sources["gpufleet-loki"]


def test_lokis_ruler_reaches_secured_alertmanagers(pki):
    groups, hostvars = inventory_with(pki, prometheus=False)
    config = yaml.safe_load(render("loki", "loki.yml.j2", "mon03", {}, (groups, hostvars)))
    ruler = config["ruler"]
    assert all(url.startswith("https://") for url in ruler["alertmanager_url"].split(","))
    assert ruler["alertmanager_client"] == {
        "tls_ca_path": "/etc/loki/alertmanager-ca.crt",
        "basic_auth_username": "gpufleet",
        "basic_auth_password": PASSWORD,
    }
