"""The rendered Grafana provisioning files against Grafana's documented provisioning schema.

The grafana scenario's stand-in loads provisioning only to tell organisations apart, so
what the files mean is checked here: the keys and types of datasources and dashboard
providers, and the rule that an organisation has at most one default datasource.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from config_schema import schema_problems
from render_role import render
from test_grafana_role import MAIN_ORG, OTHER_ORG, SECRETS

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
