"""Each scrape job reaches its exporters the way they serve, derived from their settings.

An exporter role serves TLS and basic auth from its own <role>_tls_cert, _tls_ca and
_basic_auth_users (roles/_common's web configuration). Prometheus' scrape job of that
exporter takes its scheme, CA file and login from the same variables of the scraped
hosts (gpufleet.web.scrape_clients), so a new exporter needs no prometheus_job_settings,
and the two can never disagree. prometheus_job_settings still overrides (a site's own
login) and still is the way to reach a served_by endpoint (a site's own daemon).
"""

from __future__ import annotations

import copy

import pytest
import yaml
from ansible.plugins.loader import filter_loader
from render_role import ROLES, ROOT, example_inventory, render, template_value

from gpufleet.web import CLIENT_USER, scrape_cas, scrape_clients

filter_loader.add_directory(str(ROOT / "plugins" / "filter"))

REGISTRY = yaml.safe_load((ROLES / "_exporters" / "defaults" / "main.yml").read_text())[
    "exporters_registry"
]
# Not a real PEM: the scrape side only copies it into the CA file.
CA = "-----BEGIN CERTIFICATE-----\nMIIBexample\n-----END CERTIFICATE-----\n"
SHARD = {"name": "shard-0", "mode": "shard", "shard": 0, "replica": 0}


def secured_inventory(role: str, group: str, **extra: object):
    """The example cluster with every host of group serving role with TLS and a login."""
    groups, hostvars = example_inventory()
    hostvars = copy.deepcopy(hostvars)
    for host in groups.get(group, []) if group != "all" else groups["all"]:
        hostvars[host].update(
            {
                f"{role}_tls_cert": f"per-host certificate of {host}",
                f"{role}_tls_ca": CA,
                f"{role}_basic_auth_users": {CLIENT_USER: "s3cret", "ops": "other"},
                **extra,
            }
        )
    return groups, hostvars


def scrape_job(name: str, inventory, overrides: dict | None = None) -> dict:
    groups, _ = inventory
    host = groups["prometheus"][0]
    rendered = render(
        "prometheus",
        "prometheus.yml.j2",
        host,
        {"_instance": SHARD, **(overrides or {})},
        inventory,
    )
    (job,) = [j for j in yaml.safe_load(rendered)["scrape_configs"] if j["job_name"] == name]
    return job


def prometheus_var(name: str, inventory) -> object:
    """A variable of the prometheus role on the first Prometheus host of inventory."""
    host = inventory[0]["prometheus"][0]
    return template_value("prometheus", "{{ " + name + " }}", host, {"_instance": SHARD}, inventory)


def test_plain_exporters_are_scraped_over_http_without_login():
    groups, hostvars = example_inventory()
    clients = scrape_clients(REGISTRY, groups, hostvars)
    # Every job a gpufleet role runs; a served_by endpoint is the site's own daemon.
    assert set(clients) == {job for job, entry in REGISTRY.items() if entry.get("role")}
    assert all(
        c == {"scheme": "http", "ca": "", "username": "", "password": ""} for c in clients.values()
    )
    assert set(scrape_cas(REGISTRY, groups, hostvars).values()) == {""}


@pytest.mark.parametrize(("job", "role"), [("node", "node_exporter"), ("ipmi", "ipmi_exporter")])
def test_a_secured_exporter_is_scraped_with_its_ca_and_gpufleets_login(job, role):
    inventory = secured_inventory(role, REGISTRY[job]["group"])
    groups, hostvars = inventory
    client = scrape_clients(REGISTRY, groups, hostvars)[job]
    assert client == {"scheme": "https", "ca": CA, "username": CLIENT_USER, "password": "s3cret"}
    rendered = scrape_job(job, inventory)
    assert rendered["scheme"] == "https"
    assert rendered["tls_config"]["ca_file"].endswith(f"/prometheus/web/{job}-ca.crt")
    assert rendered["basic_auth"] == {"username": CLIENT_USER, "password": "s3cret"}
    # The other jobs are untouched.
    other = "slurm" if job != "slurm" else "node"
    assert scrape_job(other, inventory).get("scheme", "http") == "http"


def test_the_ca_file_the_job_names_is_the_one_the_role_writes():
    cas = prometheus_var("_prometheus_client_cas", secured_inventory("node_exporter", "all"))
    # roles/prometheus/tasks/web.yml writes <key>-ca.crt for every non-empty value.
    assert cas["node"] == CA
    assert cas["ipmi"] == "" and cas["self"] == ""


def test_the_site_still_overrides_the_derived_login():
    inventory = secured_inventory("node_exporter", "all")
    mine = {"basic_auth": {"username": "prometheus", "password": "theirs"}}
    job = scrape_job("node", inventory, {"prometheus_job_settings": {"node": mine}})
    assert job["basic_auth"] == mine["basic_auth"] and job["scheme"] == "https"


def test_exporters_that_disagree_are_refused_naming_the_host():
    groups, hostvars = secured_inventory("node_exporter", "all")
    odd = sorted(groups["all"])[3]
    hostvars[odd]["node_exporter_basic_auth_users"] = {CLIENT_USER: "another"}
    with pytest.raises(ValueError, match=f"^{odd}: node_exporter_tls_cert"):
        scrape_clients(REGISTRY, groups, hostvars)


def test_a_login_without_gpufleets_user_is_refused_with_the_fix():
    groups, hostvars = secured_inventory("ipmi_exporter", "ipmi_exporter")
    for host in groups["ipmi_exporter"]:
        hostvars[host]["ipmi_exporter_basic_auth_users"] = {"prometheus": "x"}
    if not groups["ipmi_exporter"]:
        pytest.skip("the example inventory has no IPMI hosts")
    with pytest.raises(ValueError, match="ipmi_exporter_basic_auth_users has no user 'gpufleet'"):
        scrape_clients(REGISTRY, groups, hostvars)


def test_a_refused_configuration_masks_the_derived_logins():
    logins = prometheus_var("_prometheus_logins", secured_inventory("node_exporter", "all"))
    assert "s3cret" in logins
    tasks = yaml.safe_load((ROLES / "prometheus" / "tasks" / "instance.yml").read_text())
    (explain,) = [t for t in tasks if t["name"].startswith("Explain a refused configuration")]
    assert "_prometheus_logins" in explain["ansible.builtin.fail"]["msg"]


def test_a_leaving_exporter_counts_no_more():
    # remove_node.yml marks a node gpufleet_leaving and runs the prometheus role: the job
    # is then already what it will be once the node is gone from the inventory, so the
    # converge after that changes nothing.
    groups, hostvars = secured_inventory("ipmi_exporter", "ipmi_exporter")
    if not groups["ipmi_exporter"]:
        pytest.skip("the example inventory has no IPMI hosts")
    for host in groups["ipmi_exporter"]:
        hostvars[host]["gpufleet_leaving"] = True
    assert scrape_clients(REGISTRY, groups, hostvars)["ipmi"]["scheme"] == "http"
    assert scrape_cas(REGISTRY, groups, hostvars)["ipmi"] == ""
