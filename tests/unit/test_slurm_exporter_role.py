"""roles/slurm_exporter: the web config it renders is one the exporter accepts.

The template is rendered with Ansible's Templar and gpufleet's filters (bcrypt hashing
as for node_exporter), then checked by the exporter's own --check-web-config, the same
command the role runs as `validate:`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest
import yaml
from ansible.plugins.loader import filter_loader
from render_role import (
    ROLES,
    ROOT,
    evaluate,
    example_inventory,
    render,
    render_web_config,
    template_value,
    web_config_values,
)

from gpufleet_node.job_summary import cli as job_summary_cli

filter_loader.add_directory(str(ROOT / "plugins" / "filter"))

ROLE = "slurm_exporter"
HOST = "slurmctl01"
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def web_config(overrides: dict) -> dict:
    """The web configuration as the role writes it: roles/_common/tasks/web_config.yml,
    which the role includes with no vars, reading the role's own variables."""
    configure = yaml.safe_load((ROLES / ROLE / "tasks" / "configure.yml").read_text())
    (task,) = [
        t
        for t in configure
        if t.get("ansible.builtin.include_role", {}).get("tasks_from") == "web_config"
    ]
    assert task["ansible.builtin.include_role"]["name"] == "_common" and "vars" not in task
    piece = web_config_values(ROLE, HOST, overrides)
    assert piece["__common_web_file"] == "/etc/gpufleet/slurm-exporter/web-config.json"
    assert piece["__common_web"]["validate"].endswith("--check-web-config %s")
    return json.loads(render_web_config(ROLE, HOST, overrides))


def check(
    doc: dict, tmp_path: Path, option: str = "--check-web-config"
) -> subprocess.CompletedProcess:
    """``doc`` written to a file and checked by the exporter, as the role's ``validate:``."""
    path = tmp_path / "checked.json"
    path.write_text(json.dumps(doc))
    return subprocess.run(
        [sys.executable, "-m", "gpufleet_node.slurm_exporter", option, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_default_is_plain_http_without_auth(tmp_path):
    doc = web_config({})
    assert doc == {"basic_auth_users": {}}
    assert check(doc, tmp_path).returncode == 0


def test_basic_auth_users_are_bcrypt_hashed_and_stable(tmp_path):
    users = {"prometheus": "scrape-secret-1", "vmagent": "scrape-secret-2"}
    doc = web_config({"slurm_exporter_basic_auth_users": users})
    hashes = doc["basic_auth_users"]
    assert set(hashes) == set(users)
    for user, password in users.items():
        assert password not in json.dumps(doc)
        assert bcrypt.checkpw(password.encode(), hashes[user].encode())
    # The same inventory renders the same file: a rerun changes nothing.
    assert web_config({"slurm_exporter_basic_auth_users": users}) == doc
    assert check(doc, tmp_path).returncode == 0


@pytest.mark.parametrize("client_ca", ["", PEM])
def test_tls_names_the_files_the_role_installs(client_ca):
    doc = web_config(
        {
            "slurm_exporter_tls_cert": PEM,
            "slurm_exporter_tls_key": "key",
            "slurm_exporter_tls_client_ca": client_ca,
        }
    )
    tls = doc["tls_server_config"]
    base = "/etc/gpufleet/slurm-exporter"
    assert tls["cert_file"] == f"{base}/tls.crt" and tls["key_file"] == f"{base}/tls.key"
    assert tls["min_version"] == "TLS12"
    if client_ca:
        assert tls["client_ca_file"] == f"{base}/client-ca.crt"
        assert tls["client_auth_type"] == "RequireAndVerifyClientCert"
    else:
        assert "client_ca_file" not in tls and "client_auth_type" not in tls


def test_the_check_refuses_a_certificate_it_cannot_load(tmp_path):
    doc = web_config({"slurm_exporter_tls_cert": PEM, "slurm_exporter_tls_key": "key"})
    result = check(doc, tmp_path)
    assert result.returncode == 2
    assert "TLS certificate or key" in result.stderr


def test_the_unit_always_names_the_web_config():
    unit = render(ROLE, "gpufleet-slurm-exporter.service.j2", HOST)
    assert "--web-config-file /etc/gpufleet/slurm-exporter/web-config.json" in unit


@pytest.mark.parametrize(("gpus", "job_series", "index_series"), [
    (None, 5000, 40000),  # no gpufleet inventory
    (304, 5000, 40000),  # the example cluster
    (10_000 * 8, 80_000, 80_000),  # 10,000 8-GPU nodes: every (job, node) pair fits
])  # fmt: skip
def test_job_series_caps_follow_the_clusters_gpus(gpus, job_series, index_series):
    overrides = {} if gpus is None else {"gpufleet_cluster_gpus": gpus}
    unit = render(ROLE, "gpufleet-slurm-exporter.service.j2", HOST, overrides).split()
    assert unit[unit.index("--max-job-series") + 1] == str(job_series)
    assert unit[unit.index("--max-gpu-index-series") + 1] == str(index_series)


# --- the node map: which Prometheus shard scrapes which node ------------------------------

TASKS = ROOT / "roles" / ROLE / "tasks" / "configure.yml"


def node_map_task() -> dict:
    tasks = yaml.safe_load(TASKS.read_text())
    (task,) = [t for t in tasks if "node map" in t["name"]]
    return task["ansible.builtin.copy"]


def node_map(inventory=None) -> dict:
    content = template_value(ROLE, node_map_task()["content"], HOST, inventory=inventory)
    return json.loads(content)


def test_the_node_map_is_the_inventory_plugins_shard_plan(tmp_path):
    groups, hostvars = example_inventory()
    doc = node_map()
    assert set(doc["shards"]) == {"0", "1"}
    for shard, hosts in doc["shards"].items():
        assert hosts == sorted(groups[f"prometheus_shard_{shard}"])
        assert all(hostvars[h]["gpufleet_shard"] == int(shard) for h in hosts)
    assert sorted(h for hosts in doc["shards"].values() for h in hosts) == sorted(hostvars)
    # What the role validates the file with accepts it.
    result = check(doc, tmp_path, "--check-node-map")
    assert result.returncode == 0, result.stderr
    task = node_map_task()
    assert task["dest"] == "{{ _slurm_exporter_node_map }}"
    assert "--check-node-map %s" in task["validate"]


def test_a_hostile_host_name_never_reaches_the_exporter_unchecked(tmp_path):
    groups, hostvars = example_inventory()
    groups = {**groups, "prometheus_shard_1": [*groups["prometheus_shard_1"], 'x" ,"y\nz']}
    doc = node_map((groups, hostvars))
    assert 'x" ,"y\nz' in doc["shards"]["1"]  # JSON-quoted, one name
    result = check(doc, tmp_path, "--check-node-map")
    assert result.returncode == 2 and "invalid node name" in result.stderr


def test_the_unit_names_the_node_map():
    unit = render(ROLE, "gpufleet-slurm-exporter.service.j2", HOST)
    assert "--node-map-file /etc/gpufleet/slurm-exporter/node-shards.json" in unit


def test_a_configure_run_installs_the_exporter_it_validates_with(tmp_path):
    # Right after an upgrade, --tags slurm_exporter_configure must check the new web
    # config and node map with the new exporter, not the last release's (or none).
    configure = yaml.safe_load((ROOT / "roles" / ROLE / "tasks" / "configure.yml").read_text())
    validating = {
        task["name"]: (task.get("ansible.builtin.template") or task["ansible.builtin.copy"])[
            "validate"
        ]
        for task in configure
        if "validate" in str(task)
    }
    # The web configuration (roles/_common/tasks/web_config.yml) validates with the
    # role's _slurm_exporter_web.
    internal = yaml.safe_load((ROOT / "roles" / ROLE / "vars" / "main.yml").read_text())
    validating["web configuration"] = internal["_slurm_exporter_web"]["validate"]
    assert len(validating) == 2
    for name, validate in validating.items():
        assert "{{ _slurm_exporter_script }}" in validate, name
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- name: List\n  hosts: all\n  gather_facts: false\n  roles: [slurm_exporter]\n"
    )
    listed = subprocess.run(
        [
            str(Path(sys.executable).with_name("ansible-playbook")),
            *("-i", "localhost,", "--list-tasks", "--tags", "slurm_exporter_configure"),
            str(playbook),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles")},
        check=True,
    ).stdout
    # "role : name" for a task, the bare name for an include_role (roles/_common's
    # web_config.yml and zipapp.yml, whose tasks carry the step's tags).
    names = [line.split(" : ", 1)[-1].split("\t")[0].strip() for line in listed.splitlines()]
    install = names.index("Build and install the exporter and job summary zipapps")
    assert install < names.index("Write the web configuration (TLS and basic auth)")
    assert install < names.index("Write the node map (which Prometheus shard scrapes which node)")
    install_yml = yaml.safe_load((ROOT / "roles" / ROLE / "tasks" / "install.yml").read_text())
    (include,) = [t for t in install_yml if "ansible.builtin.include_role" in t]
    assert "slurm_exporter_configure" in include["ansible.builtin.include_role"]["apply"]["tags"]


# --- job summaries: the EpilogSlurmctld program's configuration ---------------------------

SUMMARY_TASKS = ROOT / "roles" / ROLE / "tasks" / "job_summary.yml"


def summary_task(name: str) -> dict:
    tasks = yaml.safe_load(SUMMARY_TASKS.read_text())
    (task,) = [t for t in tasks if t["name"] == name]
    return task


SACCTMGR = {"__slurm_exporter_sacctmgr": {"rc": 0, "stdout": "/opt/slurm/bin/sacctmgr"}}


def summary_config(overrides: dict | None = None) -> dict:
    task = summary_task("Write the job summary configuration")
    values = {**task.get("vars", {}), **SACCTMGR, **(overrides or {})}
    content = template_value(ROLE, task["ansible.builtin.copy"]["content"], HOST, values)
    return json.loads(content)


def test_the_job_summary_configuration_bounds_the_epilog(tmp_path):
    doc = summary_config()
    assert (doc["deadline_s"], doc["slots"]) == (60, 4)
    run_dir = summary_task("Create the directory of the epilogs' slot files")
    assert run_dir["ansible.builtin.file"]["mode"] == "0770"
    assert doc["run_dir"] == template_value(ROLE, run_dir["ansible.builtin.file"]["path"], HOST)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    config = job_summary_cli.load_config(str(path))  # what the role's validate: runs
    assert (config.deadline_s, config.slots, config.run_dir) == (60, 4, doc["run_dir"])


def test_the_epilog_gets_sacctmgrs_path_and_slurm_conf():
    """slurmctld gives its epilog no PATH and no SLURM_CONF."""
    doc = summary_config({"slurm_exporter_slurm_conf": "/etc/slurm/site.conf"})
    assert (doc["sacctmgr"], doc["slurm_conf"]) == (
        "/opt/slurm/bin/sacctmgr",
        "/etc/slurm/site.conf",
    )
    look = summary_task("Look for sacctmgr")
    assert look["register"] == "__slurm_exporter_sacctmgr"
    assert "startswith('/')" in look["failed_when"]
    argv = [template_value(ROLE, a, HOST, {"slurm_exporter_slurm_bin_dir": "/opt/slurm/bin"})
            for a in look["ansible.builtin.command"]["argv"]]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0  # no /opt/slurm/bin/sacctmgr here: the task fails


def test_job_summaries_are_opt_in():
    """Off even where the inventory has prometheus hosts: the epilog rewrites every job's
    AdminComment, and preflight fails on a controller without SlurmUser's group."""
    groups, _ = example_inventory()
    assert groups["prometheus"]
    assert evaluate(ROLE, "slurm_exporter_job_summary | bool", HOST) is False
    specs = yaml.safe_load((ROOT / "roles" / ROLE / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert options["slurm_exporter_job_summary"]["default"] is False


def test_the_job_summary_program_is_installed_only_where_summaries_are_on():
    """The zipapps (roles/_common/tasks/zipapp.yml): the exporter always, the job summary
    program by slurm_exporter_job_summary. Both are built whatever the switch: run_once
    takes the first host's view, and a host that turns summaries on while the first host
    of the play does not would get no zipapp to copy (tests/unit/test_common_zipapp.py)."""
    zipapp = yaml.safe_load((ROLES / "_common" / "tasks" / "zipapp.yml").read_text())
    copies = [t for t in zipapp[0]["block"] if "ansible.builtin.copy" in t]
    assert {t["when"] for t in copies} == {"item.wanted | default(true) | bool"}
    zipapps = evaluate(ROLE, f"_{ROLE}_zipapps", HOST)
    assert [(z["app"], z["restart"]) for z in zipapps] == [
        ("slurm_exporter", True),
        ("job_summary", False),
    ]
    assert [z["dest"] for z in zipapps] == [
        "/usr/local/lib/gpufleet/gpufleet-slurm-exporter.pyz",
        "/usr/local/lib/gpufleet/gpufleet-job-summary.pyz",
    ]

    def installed(overrides: dict) -> list[str]:
        return [
            z["app"]
            for z in evaluate(ROLE, f"_{ROLE}_zipapps", HOST, overrides)
            if evaluate(ROLE, copies[0]["when"], HOST, {**overrides, "item": z}) is True
        ]

    assert installed({}) == ["slurm_exporter"]
    assert installed({"slurm_exporter_job_summary": True}) == ["slurm_exporter", "job_summary"]
    assert installed({"slurm_exporter_job_summary": "false"}) == ["slurm_exporter"]
