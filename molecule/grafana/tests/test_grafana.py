"""roles/grafana with install method `repository`, against the Grafana stand-in.

The package comes from a signed apt repository served on the scenario's bridge address
(molecule/testbed/standins/grafana_repo.py); the server is a thin test double of Grafana
(molecule/testbed/standins/grafana.py: the API calls the role makes, the admin password
read only at first start, provisioning refused for an unknown orgId). It records the
sha256 of the provisioning files it read at its last start or reload call, so the tests
see whether a change reached Grafana by a reload or a restart; what the files mean is
checked against Grafana's documentation in tests/unit/test_grafana_provisioning_schema.py.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from testbed_helpers import converge, eventually

testinfra_hosts = ["all"]
EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
DASHBOARDS = Path(__file__).resolve().parents[3] / "roles" / "grafana" / "files" / "dashboards"
ADDRESS = "10.203.16.11"
REPO_URL = "http://10.203.16.1:18095"
ADMIN = ("admin", "molecule-only-Zq47pLm2vR")
ORGS = {"ml-research": {"cluster-overview", "slurm-jobs"}, "ops": None}
TEAMS = {"gpu-admins": "Main Org.", "ml-oncall": "ml-research"}
STATE = "/var/lib/grafana/standin-state.json"
PROVISIONING = "/etc/grafana/provisioning"
DASHBOARDS_DIR = "/var/lib/grafana/dashboards/gpufleet"
ALL_DASHBOARDS = {p.stem for p in DASHBOARDS.glob("*.json")}
DATASOURCE_UIDS = {
    "gpufleet-prometheus",
    "gpufleet-prometheus-shard-0",
    "gpufleet-prometheus-shard-1",
    "gpufleet-alertmanager",
    "gpufleet-loki",
}


def scenario_vars() -> dict:
    return yaml.safe_load((EPHEMERAL / "test-vars.yml").read_text())


def repo() -> dict:
    return json.loads((EPHEMERAL / "repo.json").read_text())


def api(path: str, auth: tuple[str, str] | None = ADMIN, org: int | None = None) -> tuple[int, Any]:
    """Status and JSON body of a GET on Grafana's API, from the controller."""
    request = urllib.request.Request(f"http://{ADDRESS}:3000{path}")
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    if org is not None:
        request.add_header("X-Grafana-Org-Id", str(org))
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def wait_healthy(seconds: int = 30) -> None:
    """Wait (bounded) until Grafana answers /api/health again after a restart."""

    def healthy() -> bool:
        try:
            return api("/api/health", auth=None)[0] == 200
        except OSError:
            return False

    assert eventually(healthy, seconds), f"Grafana did not answer /api/health within {seconds}s"


def org_ids() -> dict[str, int]:
    status, orgs = api("/api/orgs")
    assert status == 200
    return {org["name"]: org["id"] for org in orgs}


def loaded_is_on_disk(host) -> None:
    """What the stand-in last read (start or reload) is what the role wrote since."""
    state = json.loads(host.file(STATE).content_string)
    for kind in ("datasources", "dashboards"):
        names = host.check_output(f"ls {PROVISIONING}/{kind}").split()
        on_disk = {name: host.file(f"{PROVISIONING}/{kind}/{name}").sha256sum for name in names}
        assert state["loaded"][kind] == on_disk, kind


def datasource_urls(host, org: int) -> dict[str, str]:
    name = "gpufleet.yml" if org == 1 else f"gpufleet-org-{org}.yml"
    doc = yaml.safe_load(host.file(f"{PROVISIONING}/datasources/{name}").content_string)
    return {ds["uid"]: ds["url"] for ds in doc["datasources"]}


def calls(host, path_suffix: str) -> int:
    state = json.loads(host.file(STATE).content_string)
    return sum(1 for c in state["calls"] if c["path"].endswith(path_suffix))


def main_pid(host) -> str:
    return host.service("grafana-server").systemd_properties["MainPID"]


def key_fingerprints(host, path: str) -> list[str]:
    output = host.check_output(f"gpg --batch --with-colons --show-keys {path}")
    # The first fpr line after each pub line is the primary key's.
    lines = output.splitlines()
    return [
        lines[i + 1].split(":")[9]
        for i, line in enumerate(lines[:-1])
        if line.startswith("pub:") and lines[i + 1].startswith("fpr:")
    ]


def test_service_runs_the_package_from_the_repository(host):
    version = scenario_vars()["grafana_version"]
    assert host.check_output("dpkg-query -W -f '${Status} ${Version}' grafana") == (
        f"install ok installed {version}"
    )
    policy = host.check_output("apt-cache policy grafana")
    assert f"{REPO_URL}/genuine stable/main amd64 Packages" in policy
    service = host.service("grafana-server")
    assert service.is_running and service.is_enabled
    assert host.file("/usr/sbin/grafana").linked_to == "/usr/share/grafana/bin/grafana"
    # The process answering is the packaged one, running as the package's user.
    assert api("/api/health", auth=None) == (
        200,
        {"commit": "standin", "database": "ok", "version": version},
    )
    pid = main_pid(host)
    assert host.check_output(f"ps -o user= -p {pid}") == "grafana"
    assert "/usr/share/grafana/bin/grafana server --config=/etc/grafana/grafana.ini" in (
        host.check_output(f"ps -o args= -p {pid}")
    )


def test_apt_source_and_only_the_pinned_key(host):
    source = host.file("/etc/apt/sources.list.d/grafana.sources").content_string
    for line in (
        f"URIs: {REPO_URL}/genuine",
        "Suites: stable",
        "Components: main",
        "Signed-By: /etc/apt/keyrings/grafana.asc",
    ):
        assert line in source.splitlines()
    pinned = scenario_vars()["grafana_repository_key_fingerprint"]
    assert pinned == repo()["fingerprint"]
    # The served key file holds the signing key and an unrelated one; only the pinned
    # key reaches the host.
    host.check_output(f"curl -fsS -o /tmp/served-gpg.key {REPO_URL}/genuine/gpg.key")
    assert sorted(key_fingerprints(host, "/tmp/served-gpg.key")) == sorted(
        [repo()["fingerprint"], repo()["other_fingerprint"]]
    )
    assert key_fingerprints(host, "/etc/apt/keyrings/grafana.asc") == [pinned]
    assert host.file("/etc/apt/keyrings/grafana.asc").user == "root"


def test_health_and_authentication():
    status, health = api("/api/health", auth=None)
    assert status == 200 and health["database"] == "ok"
    status, user = api("/api/user")
    assert status == 200 and user["login"] == "admin" and user["isGrafanaAdmin"]
    assert api("/api/user", auth=("admin", "wrong-password-123"))[0] == 401
    assert api("/api/user", auth=None)[0] == 401
    assert api("/api/orgs", auth=None)[0] == 401


def test_organisations_and_teams_exist_once():
    status, orgs = api("/api/orgs")
    assert status == 200
    names = [org["name"] for org in orgs]
    assert sorted(names) == sorted(["Main Org.", *ORGS])
    ids = org_ids()
    for team, org_name in TEAMS.items():
        status, found = api(f"/api/teams/search?name={team}", org=ids[org_name])
        assert status == 200 and found["totalCount"] == 1, (team, found)
    # Each team lives only in its own organisation.
    for org_name, org in ids.items():
        status, found = api("/api/teams/search", org=org)
        assert status == 200
        assert {t["name"] for t in found["teams"]} == {t for t, o in TEAMS.items() if o == org_name}


def test_each_organisation_gets_its_own_set_and_grafana_read_it(host):
    for org in [1, *(org_ids()[name] for name in ORGS)]:
        assert set(datasource_urls(host, org)) == DATASOURCE_UIDS, org
    loaded_is_on_disk(host)


def test_provisioning_files_name_existing_organisations(host):
    ids = org_ids()
    expected = {"gpufleet.yml": 1} | {f"gpufleet-org-{ids[name]}.yml": ids[name] for name in ORGS}
    for kind in ("datasources", "dashboards"):
        present = set(host.check_output(f"ls {PROVISIONING}/{kind}").split())
        assert present == set(expected), kind
    for name, org in expected.items():
        sources = yaml.safe_load(host.file(f"{PROVISIONING}/datasources/{name}").content_string)
        assert {ds["orgId"] for ds in sources["datasources"]} == {org}
        assert sum(1 for ds in sources["datasources"] if ds.get("isDefault")) == 1
        providers = yaml.safe_load(host.file(f"{PROVISIONING}/dashboards/{name}").content_string)
        (provider,) = providers["providers"]
        folder = DASHBOARDS_DIR if org == 1 else f"{DASHBOARDS_DIR}-org-{org}"
        assert provider["orgId"] == org and provider["options"]["path"] == folder
        stems = ALL_DASHBOARDS if org == 1 else ORGS[name_of(ids, org)] or ALL_DASHBOARDS
        on_host = {Path(p).stem for p in host.check_output(f"ls {folder}").split()}
        assert on_host == stems
        for stem in stems:
            assert (
                host.file(f"{folder}/{stem}.json").content
                == (DASHBOARDS / f"{stem}.json").read_bytes()
            )


def name_of(ids: dict[str, int], org: int) -> str:
    return next(name for name, i in ids.items() if i == org)


def test_admin_password_changed_out_of_band_is_set_back(host):
    rogue = "rogue-password-0451"
    host.check_output(
        f"printf %s {rogue} | runuser -u grafana -- /usr/sbin/grafana cli --homepath "
        "/usr/share/grafana --config /etc/grafana/grafana.ini "
        "admin reset-admin-password --password-from-stdin"
    )
    assert api("/api/user")[0] == 401
    # grafana.ini still holds the inventory's password, but Grafana reads it only when it
    # creates its database: a restart does not bring it back.
    host.check_output("systemctl restart grafana-server")
    wait_healthy()
    assert api("/api/user")[0] == 401
    result = converge()
    assert result.returncode == 0, result.stdout[-3000:]
    assert ADMIN[1] not in result.stdout and rogue not in result.stdout
    assert api("/api/user")[0] == 200
    assert api("/api/user", auth=("admin", rogue))[0] == 401


def test_provisioning_change_reloads_without_restart(host):
    pid = main_pid(host)
    before = (calls(host, "/datasources/reload"), calls(host, "/dashboards/reload"))
    result = converge("grafana_loki_url=http://loki.gf.invalid:3100")
    assert result.returncode == 0, result.stdout[-3000:]
    assert main_pid(host) == pid
    after = (calls(host, "/datasources/reload"), calls(host, "/dashboards/reload"))
    assert after[0] > before[0], "datasources were not reloaded through the API"
    # Only the datasources changed.
    assert after[1] == before[1]
    for org in [1, *(org_ids()[name] for name in ORGS)]:
        assert datasource_urls(host, org)["gpufleet-loki"] == "http://loki.gf.invalid:3100", org
    loaded_is_on_disk(host)


def test_removed_organisation_loses_its_provisioning(host):
    ids = org_ids()
    gone, kept = ids["ml-research"], ids["ops"]
    pid = main_pid(host)
    result = converge('{"grafana_organizations": [{"name": "ops"}]}')
    assert result.returncode == 0, result.stdout[-3000:]
    for kind in ("datasources", "dashboards"):
        assert not host.file(f"{PROVISIONING}/{kind}/gpufleet-org-{gone}.yml").exists
        assert host.file(f"{PROVISIONING}/{kind}/gpufleet-org-{kept}.yml").exists
    assert not host.file(f"{DASHBOARDS_DIR}-org-{gone}").exists
    assert host.file(f"{DASHBOARDS_DIR}-org-{kept}").is_directory
    # The organisation itself (and its team) stays; what gpufleet provisioned in it is
    # gone after a reload, without a restart.
    assert "ml-research" in org_ids()
    loaded_is_on_disk(host)
    assert main_pid(host) == pid


def test_grafana_ini_change_restarts(host):
    pid = main_pid(host)
    result = converge('{"grafana_ini": {"users": {"default_theme": "light"}}}')
    assert result.returncode == 0, result.stdout[-3000:]
    assert main_pid(host) != pid
    assert "default_theme = light" in host.file("/etc/grafana/grafana.ini").content_string
    assert api("/api/user")[0] == 200


def test_key_with_another_fingerprint_fails_and_changes_nothing(host, tmp_path):
    watched = [
        "/etc/apt/keyrings/grafana.asc",
        "/etc/apt/sources.list.d/grafana.sources",
        "/etc/grafana/grafana.ini",
    ]
    before = {path: host.file(path).sha256sum for path in watched}
    pid = main_pid(host)
    result = converge(
        f"grafana_apt_repository_url={REPO_URL}/other", f"grafana_download_dir={tmp_path}"
    )
    assert result.returncode != 0
    output = " ".join((result.stdout + result.stderr).split())
    pinned = scenario_vars()["grafana_repository_key_fingerprint"]
    assert f"holds no key with fingerprint {pinned}" in output
    assert repo()["other_fingerprint"] in output
    assert "nothing was changed on the hosts" in output.lower()
    assert {path: host.file(path).sha256sum for path in watched} == before
    assert main_pid(host) == pid
    assert not list(tmp_path.glob(f"*.{pinned}.asc")), "no key file verified for the pin"


def test_package_method_installs_only_the_verified_deb(host, tmp_path):
    """grafana_install_method: package, as an air-gapped site runs it: the .deb from the
    site's mirror (here the test repository's pool) is checked against its sha256 on the
    controller, copied to the host and installed there."""
    built = repo()
    url = f"{REPO_URL}/genuine/{built['deb']}"
    cached = f"/var/cache/gpufleet/{Path(built['deb']).name}"
    package = ["grafana_install_method=package", f"grafana_package_url={url}"]
    pid = main_pid(host)
    ini = host.file("/etc/grafana/grafana.ini").sha256sum

    result = converge(
        *package, f"grafana_package_sha256={'0' * 64}", f"grafana_download_dir={tmp_path / 'bad'}"
    )
    assert result.returncode != 0
    output = " ".join((result.stdout + result.stderr).split())
    assert "could not be fetched and verified" in output
    assert "checksum" in output.lower() and "nothing was installed" in output
    assert not host.file(cached).exists
    assert host.file("/etc/grafana/grafana.ini").sha256sum == ini
    assert main_pid(host) == pid

    result = converge(
        *package,
        f"grafana_package_sha256={built['deb_sha256']}",
        f"grafana_download_dir={tmp_path / 'good'}",
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert host.file(cached).sha256sum == built["deb_sha256"]
    # The controller caches it under its checksum (roles/_common/tasks/upstream_release.yml).
    assert (tmp_path / "good" / "grafana" / built["deb_sha256"] / Path(built["deb"]).name).exists()
    assert host.check_output("dpkg-query -W -f '${Version}' grafana") == built["version"]
    wait_healthy()
    assert api("/api/user")[0] == 200


def test_rerun_restores_the_converged_state(host):
    result = converge()
    assert result.returncode == 0, result.stdout[-3000:]
    test_organisations_and_teams_exist_once()
    test_each_organisation_gets_its_own_set_and_grafana_read_it(host)
    test_provisioning_files_name_existing_organisations(host)
    assert datasource_urls(host, 1)["gpufleet-loki"] == f"http://{ADDRESS}:3100"
