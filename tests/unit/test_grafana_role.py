"""The grafana role, offline (Grafana's repository is unreachable from the test hosts).

Renders grafana.ini, the datasources and the dashboard provider with the role's
defaults and the example inventory; evaluates the preflight password rules; checks the
task/handler contract (reload API for provisioning changes, restart only for package and
grafana.ini, API calls guarded for check mode, secrets under no_log), and the per-
organisation provisioning. The molecule scenario `observability` runs the role with
grafana_install_method=none, and `grafana` runs all of it against a stand-in package.
"""

from __future__ import annotations

import configparser
import copy
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from render_role import (
    ROLES,
    TRUSTED_FILES,
    evaluate,
    example_inventory,
    render,
    template_value,
    trust_as_template,
)
from test_dashboards import PROMTOOL, known_metrics, metric_names
from test_unit_bounds import refused, shared_check

ROLE = ROLES / "grafana"
SECRETS = {
    "grafana_admin_password": "c0rrect-horse-battery",
    "grafana_secret_key": "0123456789abcdef0123",
}
# What provisioning.yml passes for the main organisation, and api.yml for another one.
MAIN_ORG = {
    "org_id": 1,
    "name": "Main Org.",
    "file": "gpufleet.yml",
    "dir": "/var/lib/grafana/dashboards/gpufleet",
    "dashboards": [],
    "datasources_extra": [],
}
OTHER_ORG = {
    **MAIN_ORG,
    "org_id": 5,
    "name": "ml-research",
    "file": "gpufleet-org-5.yml",
    "dir": "/var/lib/grafana/dashboards/gpufleet-org-5",
}


def datasources(host: str = "mon03", inventory=None, target=MAIN_ORG, **overrides) -> dict:
    values = {**SECRETS, "__grafana_target": target, **overrides}
    return yaml.safe_load(render("grafana", "datasources.yml.j2", host, values, inventory))


def by_uid(doc: dict) -> dict:
    return {ds["uid"]: ds for ds in doc["datasources"]}


def test_sharded_inventory_gives_global_shards_alertmanager_and_loki():
    doc = datasources()
    assert doc["apiVersion"] == 1 and doc["prune"] is True
    ds = by_uid(doc)
    assert set(ds) == {
        "gpufleet-prometheus",
        "gpufleet-prometheus-shard-0",
        "gpufleet-prometheus-shard-1",
        "gpufleet-alertmanager",
        "gpufleet-loki",
    }
    # mon01 (10.1.9.1) runs global replica 0 and replica 0 of both shards.
    assert ds["gpufleet-prometheus"]["url"] == "http://10.1.9.1:9090"
    assert ds["gpufleet-prometheus"]["isDefault"] is True
    assert ds["gpufleet-prometheus-shard-0"]["url"] == "http://10.1.9.1:9091"
    assert ds["gpufleet-prometheus-shard-1"]["url"] == "http://10.1.9.1:9092"
    assert ds["gpufleet-alertmanager"]["type"] == "alertmanager"
    assert ds["gpufleet-alertmanager"]["jsonData"]["implementation"] == "prometheus"
    assert ds["gpufleet-loki"]["url"] == "http://10.1.9.3:3100"
    assert sum(1 for d in doc["datasources"] if d.get("isDefault")) == 1
    assert all(d["editable"] is False for d in doc["datasources"])


def test_the_alertmanager_datasource_follows_the_alertmanagers_own_port():
    # alertmanager_port in the Alertmanager's host_vars moves Grafana's datasource with it.
    groups, hostvars = example_inventory()
    hostvars = copy.deepcopy(hostvars)
    first = groups["alertmanager"][0]
    address = hostvars[first]["ansible_host"]
    assert by_uid(datasources())["gpufleet-alertmanager"]["url"] == f"http://{address}:9093"
    hostvars[first]["alertmanager_port"] = 9193
    ds = by_uid(datasources(inventory=(groups, hostvars)))
    assert ds["gpufleet-alertmanager"]["url"] == f"http://{address}:9193"


def test_each_victoriametrics_host_is_a_datasource_on_its_own_port():
    groups, hostvars = example_inventory()
    assert "gpufleet-victoriametrics" not in by_uid(datasources())
    hostvars = copy.deepcopy(hostvars)
    one = {**groups, "victoriametrics": ["mon02"]}
    address = hostvars["mon02"]["ansible_host"]
    ds = by_uid(datasources(inventory=(one, hostvars)))
    vm = ds["gpufleet-victoriametrics"]
    assert (vm["name"], vm["type"], vm["url"]) == (
        "gpufleet VictoriaMetrics",
        "prometheus",
        f"http://{address}:8428",
    )
    assert vm["isDefault"] is False and ds["gpufleet-prometheus"]["isDefault"] is True
    # Two single-node servers, each with what was written to it; a moved port follows.
    hostvars["mon01"]["victoriametrics_port"] = 8528
    both = {**groups, "victoriametrics": ["mon02", "mon01"]}
    two = by_uid(datasources(inventory=(both, hostvars)))
    assert {uid: d["url"] for uid, d in two.items() if "victoriametrics" in uid} == {
        "gpufleet-victoriametrics-0": f"http://{hostvars['mon01']['ansible_host']}:8528",
        "gpufleet-victoriametrics-1": f"http://{address}:8428",
    }


def test_the_removed_alertmanager_port_setting_is_refused():
    (task,) = [t for t in tasks("preflight.yml") if "removed port setting" in t["name"]]
    condition = task["ansible.builtin.assert"]["that"]
    assert evaluate("grafana", condition, "mon03", SECRETS) is True
    refused = {**SECRETS, "grafana_alertmanager_port": 9193}
    assert evaluate("grafana", condition, "mon03", refused) is False
    message = " ".join(task["ansible.builtin.assert"]["fail_msg"].split())
    assert message.startswith("grafana_alertmanager_port is no longer read: set alertmanager_port")


def test_standalone_inventory_gives_one_prometheus():
    groups, hostvars = example_inventory()
    groups = {**groups, "prometheus": ["mon01"], "prometheus_global": [], "alertmanager": []}
    hostvars = {
        **hostvars,
        "mon01": {
            **hostvars["mon01"],
            "gpufleet_prometheus_instances": [
                {"name": "standalone", "mode": "standalone", "shard": None, "replica": 0}
            ],
        },
    }
    ds = by_uid(datasources(inventory=(groups, hostvars)))
    assert set(ds) == {"gpufleet-prometheus", "gpufleet-loki"}
    assert ds["gpufleet-prometheus"]["url"] == "http://10.1.9.1:9090"


def test_url_overrides_win():
    ds = by_uid(datasources(grafana_prometheus_url="https://prom.example.org"))
    assert ds["gpufleet-prometheus"]["url"] == "https://prom.example.org"


def test_loki_log_lines_link_to_metrics():
    loki = by_uid(datasources())["gpufleet-loki"]
    fields = {f["name"]: f for f in loki["jsonData"]["derivedFields"]}
    assert set(fields) == {"XID", "Slurm job", "Node"}
    # Grafana expands $VAR in provisioning files: a literal $ must be written $$.
    for field in fields.values():
        assert "${" not in field["url"].replace("$${", "")
    xid = fields["XID"]
    assert xid["datasourceUid"] == "gpufleet-prometheus"
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    assert re.search(xid["matcherRegex"], line).group(1) == "79"
    assert re.search(fields["Slurm job"]["matcherRegex"], "launch task StepId=4242.0").group(1)
    assert fields["Node"]["matcherType"] == "label"
    assert fields["Node"]["url"].startswith("/d/gpufleet-node-detail/")


def test_derived_field_queries_are_valid_promql(tmp_path):
    loki = by_uid(datasources())["gpufleet-loki"]
    rules = []
    for field in loki["jsonData"]["derivedFields"]:
        if field.get("datasourceUid") == "gpufleet-prometheus":
            expr = field["url"].replace("$${__value.raw}", "79")
            assert metric_names(expr) <= known_metrics()
            rules.append({"record": f"derived_{len(rules)}", "expr": expr})
    path = tmp_path / "derived.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": rules}]}))
    if not Path(PROMTOOL).exists():
        pytest.skip("promtool not installed")
    subprocess.run([PROMTOOL, "check", "rules", str(path)], check=True, capture_output=True)


def grafana_ini(**overrides) -> configparser.ConfigParser:
    text = render("grafana", "grafana.ini.j2", "mon03", {**SECRETS, **overrides})
    parser = configparser.ConfigParser(interpolation=None, comment_prefixes=(";", "#"))
    parser.read_string(text)
    return parser


def test_grafana_ini_defaults():
    ini = grafana_ini()
    assert ini["auth.anonymous"]["enabled"] == "false"
    assert ini["users"]["allow_sign_up"] == "false"
    assert ini["security"]["admin_password"] == SECRETS["grafana_admin_password"]
    assert ini["security"]["secret_key"] == SECRETS["grafana_secret_key"]
    assert ini["analytics"]["reporting_enabled"] == "false"
    assert ini["server"]["http_port"] == "3000"
    assert ini["server"]["root_url"] == "http://mon03:3000/"
    assert ini["paths"]["provisioning"] == "/etc/grafana/provisioning"


def test_grafana_ini_merges_the_nested_variable():
    ini = grafana_ini(
        grafana_ini={
            "server": {"domain": "grafana.example.org"},
            "auth.anonymous": {"enabled": True},
        },
        grafana_admin_password="has#hash;semicolon!",
    )
    assert ini["server"]["domain"] == "grafana.example.org"
    assert ini["server"]["http_port"] == "3000"
    assert ini["auth.anonymous"]["enabled"] == "true"
    # Grafana cuts values at # or ; unless they are wrapped in triple quotes.
    assert ini["security"]["admin_password"] == '"""has#hash;semicolon!"""'


PASSWORD_RULES = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())[0][
    "ansible.builtin.assert"
]["that"]


def password_accepted(password) -> bool:
    return all(
        evaluate("grafana", rule, "mon03", {**SECRETS, "grafana_admin_password": password})
        for rule in PASSWORD_RULES
    )


@pytest.mark.parametrize(
    "password",
    [
        "",
        "admin",
        "Admin",
        "grafana",
        "deepops",
        "DeepOps",
        "password",
        "changeme",
        "short-1",
        "admin123",
    ],
)
def test_preflight_refuses_weak_or_default_passwords(password):
    assert not password_accepted(password)


def test_preflight_accepts_a_real_password():
    assert password_accepted("c0rrect-horse-battery")


def control_check_refuses(**values) -> list[str]:
    """The shared control-character check (roles/_common), on grafana's variables."""
    return refused("grafana", **{**SECRETS, **values})


def test_a_password_with_a_newline_would_add_lines_to_grafana_ini_and_is_refused():
    injected = "c0rrect-horse-battery\n[auth.proxy]\nenabled = true\nheader_name = X-User"
    # What preflight prevents: the password's next lines would become settings of their
    # own (here: whoever sends an X-User header is logged in as that user). The
    # template's gpufleet_ini_value refuses it too, without printing the value.
    with pytest.raises(Exception, match="holds a control character") as refused:
        grafana_ini(grafana_admin_password=injected)
    assert "horse" not in str(refused.value)
    assert control_check_refuses(grafana_admin_password=injected) == ["grafana_admin_password"]
    for bad in ("x\ry", "x\x00y", "x\x1by"):
        assert control_check_refuses(grafana_secret_key=bad * 8) == ["grafana_secret_key"]
    assert control_check_refuses(grafana_ini={"smtp": {"password": "a\nb"}}) == ["grafana_ini"]
    # Everything printable passes, backslashes and the quoting characters included.
    assert control_check_refuses(grafana_admin_password='p@ss\\n"w;o#rd`$') == []
    task = shared_check("Check that no value of a line-based file holds a control character")
    message = template_value(
        "grafana",
        trust_as_template(task["ansible.builtin.assert"]["fail_msg"]),
        "mon03",
        {"__common_control": ["grafana_admin_password"]},
    )
    assert message.startswith("grafana_admin_password must not contain control characters")
    assert "\n" not in message and "no_log" not in task


def test_preflight_refuses_a_missing_secret_key():
    rules = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())[1][
        "ansible.builtin.assert"
    ]["that"]
    for key, ok in (("", False), ("SW2YcwTIb9zpOOhoPsMm", False), ("x" * 24, True)):
        values = {**SECRETS, "grafana_secret_key": key}
        assert all(evaluate("grafana", r, "mon03", values) for r in rules) is ok


def provider(target: dict) -> dict:
    doc = yaml.safe_load(
        render("grafana", "dashboards.yml.j2", "mon03", {**SECRETS, "__grafana_target": target})
    )
    (only,) = doc["providers"]
    return only


def test_dashboard_provider():
    main = provider(MAIN_ORG)
    assert main["folder"] == "gpufleet" and main["type"] == "file" and main["orgId"] == 1
    assert main["options"]["path"] == "/var/lib/grafana/dashboards/gpufleet"
    assert main["disableDeletion"] is True and main["allowUiUpdates"] is False


def test_another_organisation_gets_its_own_provider_folder_and_datasources():
    other = provider(OTHER_ORG)
    assert other["orgId"] == 5 and other["name"] == "gpufleet-org-5"
    assert other["options"]["path"] == "/var/lib/grafana/dashboards/gpufleet-org-5"
    main_doc = datasources(grafana_datasources_extra=[{"name": "site", "type": "loki"}])
    doc = datasources(target=OTHER_ORG)
    # The same datasources (same uids, so the same dashboards work), in organisation 5.
    assert [d["uid"] for d in doc["datasources"]] == [d["uid"] for d in main_doc["datasources"]]
    assert {d["orgId"] for d in doc["datasources"]} == {5}
    assert {d["orgId"] for d in main_doc["datasources"]} == {1}
    # Links from log lines to the node dashboard stay inside the organisation.
    node_link = by_uid(doc)["gpufleet-loki"]["jsonData"]["derivedFields"][2]["url"]
    assert node_link.startswith("/d/gpufleet-node-detail/node-detail?orgId=5&")


def organisation_targets(organizations: list[dict], existing: dict[str, int]) -> list[dict]:
    """The targets api.yml works out, from the organisations the API reports."""
    (task,) = [
        t
        for t in tasks("api.yml")
        if t["name"] == "Work out each organisation's datasources and dashboards"
    ]
    files = sorted(str(p) for p in (ROLE / "files" / "dashboards").glob("*.json"))
    values = {
        **SECRETS,
        "grafana_organizations": organizations,
        "__grafana_dashboard_files": files,
        "__grafana_orgs": {
            "status": 200,
            "json": [{"id": i, "name": n} for n, i in existing.items()],
        },
    }
    return template_value(
        "grafana", task["ansible.builtin.set_fact"]["__grafana_org_targets"], "mon03", values
    )


def test_organisation_targets_follow_the_ids_grafana_gave():
    targets = organisation_targets(
        [
            {"name": "ml-research", "dashboards": ["slurm-jobs", "node-detail"]},
            {"name": "ops"},
            {"name": "later"},
        ],
        {"Main Org.": 1, "ops": 7, "ml-research": 4},
    )
    by_name = {t["name"]: t for t in targets}
    # "later" does not exist yet (check mode on a converged host): nothing for it.
    assert set(by_name) == {"ml-research", "ops"}
    assert by_name["ml-research"]["file"] == "gpufleet-org-4.yml"
    assert by_name["ml-research"]["dir"] == "/var/lib/grafana/dashboards/gpufleet-org-4"
    assert sorted(Path(f).name for f in by_name["ml-research"]["dashboards"]) == [
        "node-detail.json",
        "slurm-jobs.json",
    ]
    assert len(by_name["ops"]["dashboards"]) == len(
        list((ROLE / "files" / "dashboards").glob("*.json"))
    )


def test_the_main_organisation_is_never_provisioned_twice():
    assert organisation_targets([{"name": "Main Org."}], {"Main Org.": 1}) == []


def test_preflight_refuses_unknown_dashboards_for_an_organisation():
    (task,) = [
        t
        for t in tasks("preflight.yml")
        if t["name"] == "Check the dashboards each organisation asks for"
    ]
    task_vars = task["vars"]
    for asked, ok in ((["slurm-jobs"], True), (["slurm-jobs", "no-such-board"], False)):
        item = {"name": "ml-research", "dashboards": asked}
        # __grafana_known globs the role's dashboards (lookups need a full Ansible run).
        known = sorted(p.stem for p in (ROLE / "files" / "dashboards").glob("*.json"))
        unknown = template_value(
            "grafana",
            task_vars["__grafana_unknown"],
            "mon03",
            {"item": item, "__grafana_known": known},
        )
        assert (len(unknown) == 0) is ok


def tasks(name: str) -> list[dict]:
    return yaml.safe_load((ROLE / "tasks" / name).read_text())


def test_provisioning_changes_reload_and_ini_or_package_changes_restart():
    handlers = {h["listen"]: h for h in yaml.safe_load((ROLE / "handlers/main.yml").read_text())}
    assert handlers["reload grafana dashboards"]["ansible.builtin.uri"]["url"].endswith(
        "/api/admin/provisioning/dashboards/reload"
    )
    assert handlers["reload grafana datasources"]["ansible.builtin.uri"]["url"].endswith(
        "/api/admin/provisioning/datasources/reload"
    )
    for handler in handlers.values():
        if "ansible.builtin.uri" in handler:
            assert handler["no_log"] is True
            assert "not ansible_check_mode" in handler["when"]
    for task in tasks("provision_org.yml"):
        assert task.get("notify", "reload").startswith("reload"), task["name"]
    (ini,) = [t for t in tasks("configure.yml") if "grafana.ini" in t["name"]]
    assert ini["notify"] == "restart grafana" and ini["no_log"] is True
    # The package method installs through roles/_common/tasks/upstream_release.yml, which
    # notifies what _grafana_release names.
    release = yaml.safe_load((ROLE / "vars/main.yml").read_text())["_grafana_release"]

    def notifies(task: dict) -> str | None:
        include = task.get("ansible.builtin.include_role") or {}
        if include.get("tasks_from") == "upstream_release":
            return release["notify"]
        return task.get("notify")

    for name in ("install_repository.yml", "install_package.yml"):
        notified = {notifies(t) for t in tasks(name)} - {None}
        assert notified == {"restart grafana"}


def test_api_tasks_are_guarded_and_secret():
    for task in tasks("api.yml"):
        uri = task.get("ansible.builtin.uri", {})
        # Writes and commands wait for a real run; reads also answer in check mode.
        if (
            uri.get("method", "GET") != "GET"
            or "ansible.builtin.command" in task
            or "include_tasks" in str(task)
        ):
            if "provision_org.yml" not in str(task):
                assert "not ansible_check_mode" in task["when"], task["name"]
        elif uri:
            assert (
                "not ansible_check_mode" in task.get("when", "") or task["check_mode"] is False
            ), task["name"]
        if "url_password" in str(task) or "stdin" in str(task):
            assert task["no_log"] is True, task["name"]
    for name in ("api_org.yml", "api_team.yml"):
        for task in tasks(name):
            assert task["no_log"] is True


def test_none_method_skips_install_service_and_api():
    main = {t["name"]: t for t in tasks("main.yml")}
    for name in ("Install", "Run", "Organisations, teams and the admin password (API)"):
        assert main[name]["when"] == "grafana_install_method != 'none'"
    assert (
        "when" not in main["Configure"]
        and "when" not in main["Provision datasources and dashboards"]
    )


@pytest.mark.parametrize(
    ("fingerprint", "ok"),
    [
        ("B53AE77BADB630A683046005963FA27710458545", True),
        ("b53a e77b adb6 30a6 8304  6005 963f a277 1045 8545", True),
        ("963FA27710458545", False),
        ("", False),
    ],
)
def test_preflight_wants_a_whole_fingerprint_for_the_repository(fingerprint, ok):
    (task,) = [
        t for t in tasks("preflight.yml") if t["name"] == "Check the install method's inputs"
    ]
    values = {**SECRETS, "grafana_repository_key_fingerprint": fingerprint}
    assert evaluate("grafana", task["ansible.builtin.assert"]["that"], "mon03", values) is ok


@pytest.mark.parametrize(
    ("machine", "arch"), [("x86_64", "amd64"), ("aarch64", "arm64"), ("armv7l", "armhf")]
)
def test_the_apt_source_names_the_hosts_architecture(machine, arch):
    # The architecture comes from the one map of roles/_common/tasks/repository_key.yml,
    # with the names _grafana_repository_key gives (Debian spells 32-bit ARM armhf).
    tasks = yaml.safe_load((ROLES / "grafana/tasks/install_repository.yml").read_text())
    (include,) = [t for t in tasks if "ansible.builtin.include_role" in t]
    piece = include["ansible.builtin.include_role"]
    assert (piece["name"], piece["tasks_from"]) == ("_common", "repository_key")
    (block,) = DataLoader().load_from_file(
        str(ROLES / "_common/tasks/repository_key.yml"), **TRUSTED_FILES
    )
    facts = {"os_family": "Debian", "architecture": machine}
    resolved = evaluate(
        "grafana",
        "__common_key_arch",
        "mon03",
        {**block["vars"], "ansible_parent_role_names": ["grafana"], "ansible_facts": facts},
    )
    assert resolved == arch
    source = render(
        "grafana",
        "grafana.sources.j2",
        "mon03",
        {"ansible_facts": facts, "upstream_release_repository_arch": resolved},
    )
    # Byte for byte what converged hosts have (no change, no cache refresh on upgrade).
    lines = [line for line in source.splitlines() if line and not line.startswith("#")]
    assert lines == [
        "Types: deb",
        "URIs: https://apt.grafana.com",
        "Suites: stable",
        "Components: main",
        f"Architectures: {arch}",
        "Signed-By: /etc/apt/keyrings/grafana.asc",
    ]
