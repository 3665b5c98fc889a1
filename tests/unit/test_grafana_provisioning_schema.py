"""The rendered Grafana configuration against Grafana's documented schemas.

The grafana scenario's stand-in reads neither grafana.ini's meaning nor the provisioning
files' (it records that they were read, and refuses an unknown orgId), so what the files
mean is checked here: the keys and types of datasources and dashboard providers, the rule
that an organisation has at most one default datasource, and grafana.ini's sections,
keys and values.
"""

from __future__ import annotations

import configparser
import re
from typing import Any

import pytest
import yaml
from config_schema import schema_problems
from render_role import render
from test_grafana_role import MAIN_ORG, OTHER_ORG, SECRETS, grafana_ini

# Subset of "Provision Grafana", https://grafana.com/docs/grafana/v13.0/administration/
# provisioning/ (grafana_version 13.0.4): the data source and dashboard provider fields.
DATASOURCES_SCHEMA: dict[str, Any] = {
    "apiVersion": (1,),
    "prune": "bool",
    "deleteDatasources": [{"name": "string", "orgId": "int"}],
    "datasources": [
        {
            "name": "string",
            "type": "string",
            "access": ("proxy", "direct"),
            "orgId": "int",
            "uid": "string",
            "url": "string",
            "user": "string",
            "database": "string",
            "basicAuth": "bool",
            "basicAuthUser": "string",
            "withCredentials": "bool",
            "isDefault": "bool",
            "jsonData": "mapping",
            "secureJsonData": "mapping",
            "version": "int",
            "editable": "bool",
        }
    ],
}
DASHBOARDS_SCHEMA: dict[str, Any] = {
    "apiVersion": (1,),
    "providers": [
        {
            "name": "string",
            "orgId": "int",
            "folder": "string",
            "folderUid": "string",
            "type": ("file",),
            "disableDeletion": "bool",
            "updateIntervalSeconds": "int",
            "allowUiUpdates": "bool",
            "options": {"path": "string", "foldersFromFilesStructure": "bool"},
        }
    ],
}


def datasource_problems(doc: dict) -> list[str]:
    problems = schema_problems(doc, DATASOURCES_SCHEMA)
    # "Only one data source per organization can be marked as default" (same page).
    for org in {ds.get("orgId", 1) for ds in doc["datasources"]}:
        defaults = [
            ds for ds in doc["datasources"] if ds.get("orgId", 1) == org and ds.get("isDefault")
        ]
        if len(defaults) > 1:
            problems.append(f"orgId {org}: {len(defaults)} default datasources")
    return problems


def rendered(template: str, target: dict, **overrides: Any) -> dict:
    values = {**SECRETS, "__grafana_target": target, **overrides}
    return yaml.safe_load(render("grafana", template, "mon03", values))


@pytest.mark.parametrize("target", [MAIN_ORG, OTHER_ORG], ids=["main", "other-org"])
def test_provisioning_files_match_the_documented_schema(target):
    extra = [{"name": "site", "type": "loki", "url": "http://logs:3100", "orgId": target["org_id"]}]
    doc = rendered("datasources.yml.j2", {**target, "datasources_extra": extra})
    assert datasource_problems(doc) == []
    assert schema_problems(rendered("dashboards.yml.j2", target), DASHBOARDS_SCHEMA) == []


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"name": "x", "type": "loki", "isDefault": True}, "2 default datasources"),
        ({"name": "x", "type": "loki", "jsonData": "maxLines: 5"}, "is not a mapping"),
        ({"name": "x", "type": "loki", "default": True}, ".default: not a documented key"),
        ({"name": "x", "type": "loki", "access": "server"}, "'server' is not one of"),
    ],
    ids=["two-defaults", "json-data", "unknown-key", "access"],
)
def test_datasource_check_finds_what_grafana_refuses(extra, problem):
    doc = rendered("datasources.yml.j2", {**MAIN_ORG, "datasources_extra": [extra]})
    assert any(problem in p for p in datasource_problems(doc)), datasource_problems(doc)


def test_provider_check_finds_a_misplaced_path():
    doc = rendered("dashboards.yml.j2", MAIN_ORG)
    doc["providers"][0]["path"] = doc["providers"][0]["options"].pop("path")
    assert schema_problems(doc, DASHBOARDS_SCHEMA) == [".providers[0].path: not a documented key"]


# grafana.ini: the sections and keys the role writes, as conf/defaults.ini of Grafana
# documents them (every key there is a setting, with its allowed values in the comment
# above it). Kinds: "bool" (true/false), "port", "path" (absolute), "url", "string", or a
# tuple of the allowed values.
INI_SCHEMA: dict[str, dict[str, Any]] = {
    "paths": {"data": "path", "logs": "path", "plugins": "path", "provisioning": "path"},
    "server": {"http_addr": "string", "http_port": "port", "root_url": "url", "domain": "string"},
    "security": {
        "admin_user": "string",
        "admin_password": "string",
        "secret_key": "string",
        "disable_gravatar": "bool",
        # "can be set to "lax", "strict", "none" and "disabled""
        "cookie_samesite": ("lax", "strict", "none", "disabled"),
        "allow_embedding": "bool",
    },
    "users": {
        "allow_sign_up": "bool",
        "allow_org_create": "bool",
        "default_theme": ("dark", "light"),
    },
    "auth.anonymous": {"enabled": "bool", "org_role": ("Viewer", "Editor", "Admin")},
    "analytics": {
        "reporting_enabled": "bool",
        "check_for_updates": "bool",
        "check_for_plugin_updates": "bool",
        "feedback_links_enabled": "bool",
    },
    "news": {"news_feed_enabled": "bool"},
    "dashboards": {"default_home_dashboard_path": "path"},
}
INI_KINDS = {
    "bool": lambda v: v in ("true", "false"),
    "port": lambda v: v.isdigit() and 0 < int(v) < 65536,
    "path": lambda v: v.startswith("/"),
    "url": lambda v: re.fullmatch(r"https?://[^\s/]+(/\S*)?", v) is not None,
    "string": lambda v: True,
}


def ini_problems(ini: configparser.ConfigParser) -> list[str]:
    problems = [f"{key}: a setting outside any section" for key in ini.defaults()]
    for section in ini.sections():
        documented = INI_SCHEMA.get(section)
        if documented is None:
            problems.append(f"[{section}]: not a documented section")
            continue
        for key, value in ini.items(section, raw=True):
            kind = documented.get(key)
            if kind is None:
                problems.append(f"[{section}] {key}: not a documented key")
            elif isinstance(kind, tuple) and value not in kind:
                problems.append(f"[{section}] {key}: {value!r} is not one of {kind}")
            elif isinstance(kind, str) and not INI_KINDS[kind](value):
                problems.append(f"[{section}] {key}: {value!r} is not a {kind}")
    return problems


def test_grafana_ini_matches_the_documented_settings():
    assert ini_problems(grafana_ini()) == []
    themed = grafana_ini(grafana_ini={"users": {"default_theme": "light"}})
    assert ini_problems(themed) == []


@pytest.mark.parametrize(
    ("grafana_ini_value", "problem"),
    [
        ({"security": {"cookie_samesite": "sometimes"}}, "'sometimes' is not one of"),
        ({"server": {"http_prot": 3000}}, "[server] http_prot: not a documented key"),
        ({"auth.anonymous": {"enabled": "yes"}}, "'yes' is not a bool"),
        ({"auth.anonymous": {"org_role": "viewer"}}, "'viewer' is not one of"),
        ({"paths": {"data": "var/lib/grafana"}}, "is not a path"),
    ],
    ids=["samesite", "unknown-key", "bool", "role-case", "relative-path"],
)
def test_ini_check_finds_what_grafana_would_ignore_or_refuse(grafana_ini_value, problem):
    problems = ini_problems(grafana_ini(grafana_ini=grafana_ini_value))
    assert any(problem in p for p in problems), problems
