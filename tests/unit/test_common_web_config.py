"""roles/_common/tasks/web_config.yml: the web configuration of a role that serves HTTP.

A role declares _<role>_web in its vars/main.yml ({dir, group, format, validate}) and
includes the shared task file, with no vars, from its configure step; the piece reads
the role's own <role>_tls_cert, _tls_key, _tls_client_ca and _basic_auth_users, which
the shared preflight (roles/_common/tasks/preflight.yml) checks before anything is
written. Ansible finds a role that declares one without the other, or a setting the
piece does not know, only on a live run; this finds them for every role.
"""

from __future__ import annotations

import json

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import filter_loader
from render_role import (
    ROLES,
    ROOT,
    TRUSTED_FILES,
    evaluate,
    render_web_config,
    role_variables,
    template_value,
    web_config_values,
)
from role_tasks import common_includes, load
from role_tasks import declared as declared_settings

filter_loader.add_directory(str(ROOT / "plugins" / "filter"))

COMMON = ROLES / "_common" / "tasks"
HOST = "mon01"
CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN EC PRIVATE KEY-----\nMHcC\n-----END EC PRIVATE KEY-----\n"
SETTINGS = {"dir", "group", "format", "validate"}


def includes(role: str) -> list[tuple[str, dict]]:
    return common_includes(role, "web_config")


def declared() -> dict[str, dict]:
    return declared_settings("web")


DECLARED = declared()
INCLUDING = sorted(p.name for p in ROLES.iterdir() if includes(p.name))


def test_the_roles_that_serve_http_are_found():
    assert {"node_exporter", "prometheus", "slurm_exporter"} <= set(DECLARED)
    assert sorted(DECLARED) == INCLUDING, "a role declares _<role>_web it never writes, or not"


@pytest.mark.parametrize("role", sorted(DECLARED))
def test_the_include_passes_nothing_and_runs_in_the_configure_step(role: str):
    ((_, task),) = includes(role)
    # ansible-lint's var-naming refuses vars passed to a role named _common: the piece
    # reads the role's own, by convention.
    assert "vars" not in task
    assert task["ansible.builtin.include_role"]["apply"] == {"tags": [role, f"{role}_configure"]}


@pytest.mark.parametrize("role", sorted(DECLARED))
def test_the_role_has_what_the_piece_reads(role: str):
    web = DECLARED[role]
    assert "dir" in web and set(web) <= SETTINGS, sorted(set(web) - SETTINGS)
    assert web.get("format", "yaml") in ("yaml", "json")
    variables = role_variables(role)
    for name in ("tls_cert", "tls_key", "basic_auth_users"):
        assert f"{role}_{name}" in variables
    if "group" not in web:
        assert f"{role}_system_group" in variables
    values = web_config_values(role, HOST)
    assert values["__common_web_tls_client_ca"] == variables.get(f"{role}_tls_client_ca", "")
    suffix = "json" if web.get("format") == "json" else "yml"
    assert values["__common_web_file"] == f"{values['__common_web']['dir']}/web-config.{suffix}"
    # Where the role's unit looks for it, when the role names the file.
    if f"_{role}_web_config" in variables:
        named = template_value(role, variables[f"_{role}_web_config"], HOST)
        assert values["__common_web_file"] == named


@pytest.mark.parametrize("role", sorted(DECLARED))
def test_the_file_names_the_tls_files_the_piece_installs(role: str):
    values = {f"{role}_tls_cert": CERT, f"{role}_tls_key": KEY, f"{role}_tls_client_ca": CERT}
    text = render_web_config(role, HOST, values)
    directory = web_config_values(role, HOST)["__common_web"]["dir"]
    doc = json.loads(text) if DECLARED[role].get("format") == "json" else yaml.safe_load(text)
    tls = doc["tls_server_config"]
    assert (tls["cert_file"], tls["key_file"], tls["client_ca_file"]) == (
        f"{directory}/tls.crt",
        f"{directory}/tls.key",
        f"{directory}/client-ca.crt",
    )
    (block,) = load(COMMON / "web_config.yml")
    installed = {
        t["ansible.builtin.copy"]["dest"] for t in block["block"] if "ansible.builtin.copy" in t
    }
    assert installed == {
        "{{ __common_web.dir }}/tls.crt",
        "{{ __common_web.dir }}/tls.key",
        "{{ __common_web.dir }}/client-ca.crt",
    }


# --------------------------------------------------------------- the preflight check

PREFLIGHT = COMMON / "preflight.yml"
CHECK = "Check the TLS and basic auth settings"


def check() -> dict:
    loaded = DataLoader().load_from_file(str(PREFLIGHT), **TRUSTED_FILES)
    (task,) = [t for t in loaded if t["name"] == CHECK]
    return task


def context(role: str, values: dict) -> dict:
    return {**check()["vars"], "ansible_parent_role_names": [role], **values}


def accepted(role: str, **values) -> bool:
    """Whether the assert passes; like Ansible, it stops at the first false condition."""
    overrides = context(role, {f"{role}_{k}": v for k, v in values.items()})
    for condition in check()["ansible.builtin.assert"]["that"]:
        if evaluate(role, condition, HOST, overrides) is not True:
            return False
    return True


@pytest.mark.parametrize("role", sorted(DECLARED))
@pytest.mark.parametrize(
    ("values", "ok"),
    [
        ({}, True),
        ({"tls_cert": CERT, "tls_key": KEY}, True),
        ({"tls_cert": CERT, "tls_key": KEY, "tls_client_ca": CERT}, True),
        ({"tls_cert": CERT}, False),
        ({"tls_key": KEY}, False),
        ({"tls_cert": "not pem", "tls_key": KEY}, False),
        ({"tls_cert": CERT, "tls_key": "not pem"}, False),
        ({"tls_client_ca": CERT}, False),
        ({"tls_cert": CERT, "tls_key": KEY, "tls_client_ca": "not pem"}, False),
        ({"basic_auth_users": {"a:b": "x"}}, False),
        ({"basic_auth_users": {"a\nb": "x"}}, False),
        ({"basic_auth_users": {"a": ""}}, False),
        ({"basic_auth_users": {"a": 1}}, False),
        ({"basic_auth_users": ["a"]}, False),
        ({"basic_auth_users": {"a": "secret", "gpufleet": "other"}}, True),
    ],
)
def test_preflight_checks_tls_and_basic_auth(role: str, values: dict, ok: bool):
    assert accepted(role, **values) is ok


@pytest.mark.parametrize("role", sorted(DECLARED))
def test_the_refusal_names_the_role_variables(role: str):
    message = template_value(
        role, check()["ansible.builtin.assert"]["fail_msg"], HOST, context(role, {})
    )
    for name in ("tls_cert", "tls_key", "tls_client_ca", "basic_auth_users"):
        assert f"{role}_{name}" in message


def test_the_check_runs_only_for_a_role_that_serves_http():
    when = check()["when"]
    for role in sorted(DECLARED):
        assert evaluate(role, when, HOST, context(role, {})) is True
    others = {"gpu_collector", "grafana", "loki"}
    for role in sorted(others):
        assert evaluate(role, when, HOST, context(role, {})) is False


def test_the_roles_leave_the_check_to_the_shared_preflight():
    # One copy: each role's preflight includes the shared one (test_unit_bounds.py),
    # and the piece itself asserts nothing.
    for role in sorted(DECLARED):
        own = (ROLES / role / "tasks" / "preflight.yml").read_text()
        assert f"{role}_tls_key" not in own, role
    assert "ansible.builtin.assert" not in (COMMON / "web_config.yml").read_text()
