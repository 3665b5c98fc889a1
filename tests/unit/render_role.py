"""Render a role's templates the way Ansible does, without a host.

The role's defaults and vars are loaded as trusted templates (as Ansible loads them),
the inventory comes from tests/golden/example-inventory.json (the example cluster the
inventory plugin produces: 66 hosts, 2 shards x 2 replicas, 3 Alertmanagers, Grafana
and Loki on mon03), and Ansible's own Templar renders with its own filters.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
from pathlib import Path

from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar
from ansible.utils.collection_loader import AnsibleCollectionConfig

try:
    from ansible.template import trust_as_template

    # ansible-core 2.19+ templates only trusted strings, as it loads role files.
    TRUSTED_FILES = {"trusted_as_template": True}
    TEXT_GUARD = ""
except ImportError:  # ansible-core 2.18: every string is a template

    def trust_as_template(value: str) -> str:
        return value

    TRUSTED_FILES = {}
    # 2.18 turns a rendered file that reads as a literal (JSON, a list) into data, as
    # the template module does not: a leading line that is no literal keeps it text.
    TEXT_GUARD = "#gpufleet-render-guard\n"

from gpufleet.inventory_json import plain

# Plugins by their FQCN (lookup('ansible.builtin.vars', ...)) need the collection loader
# that Ansible's CLI installs at start; once per process.
if not AnsibleCollectionConfig.collection_finder:
    init_plugin_loader()

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
GOLDEN = ROOT / "tests" / "golden" / "example-inventory.json"


def example_inventory() -> tuple[dict[str, list[str]], dict[str, dict]]:
    data = json.loads(GOLDEN.read_text())
    hostvars = plain(data["_meta"]["hostvars"])
    groups = {name: group.get("hosts", []) for name, group in data.items() if name != "_meta"}
    groups["all"] = sorted(hostvars)
    for name in ("prometheus", "prometheus_global", "alertmanager", "grafana", "loki"):
        groups.setdefault(name, [])
    return groups, hostvars


def role_variables(role: str) -> dict:
    """The role's defaults and vars over those of its meta dependencies (as Ansible)."""
    return copy.deepcopy(_role_variables(role))


@functools.cache
def _role_variables(role: str) -> dict:
    """role_variables, loaded once per process: the role files do not change during a run,
    and loading them (YAML, trusted as templates) cost most of every render. Shared:
    callers take a copy (templar() merges it into a new dict) and never change it."""
    loader = DataLoader()
    out = {}
    meta = loader.load_from_file(str(ROLES / role / "meta" / "main.yml")) or {}
    for dependency in meta.get("dependencies") or []:
        name = dependency["role"] if isinstance(dependency, dict) else dependency
        out.update(_role_variables(name))
    for part in ("defaults", "vars"):
        path = ROLES / role / part / "main.yml"
        if path.exists():
            out.update(loader.load_from_file(str(path), **TRUSTED_FILES) or {})
    return out


def templar(role: str, host: str, overrides: dict | None = None, inventory=None) -> Templar:
    groups, hostvars = inventory or example_inventory()
    variables = {
        **_role_variables(role),
        **hostvars.get(host, {}),
        "groups": groups,
        "hostvars": hostvars,
        "inventory_hostname": host,
        "ansible_managed": "Ansible managed",
        "role_path": str(ROLES / role),
        "ansible_facts": {"os_family": "Debian", "architecture": "x86_64"},
        "ansible_check_mode": False,
        **(overrides or {}),
    }
    return Templar(loader=DataLoader(), variables=variables)


def render(
    role: str, template: str, host: str, overrides: dict | None = None, inventory=None
) -> str:
    source = (ROLES / role / "templates" / template).read_text()
    text = templar(role, host, overrides, inventory).template(
        trust_as_template(TEXT_GUARD + source)
    )
    return text[len(TEXT_GUARD) :]


def evaluate(role: str, expression: str, host: str, overrides: dict | None = None, inventory=None):
    """The value of a Jinja expression (a `that:` condition) in the role's context."""
    return templar(role, host, overrides, inventory).template(
        trust_as_template("{{ " + expression + " }}")
    )


def template_value(role: str, value: str, host: str, overrides: dict | None = None, inventory=None):
    """A task argument or variable as Ansible templates it: a whole template."""
    return templar(role, host, overrides, inventory).template(trust_as_template(value))


def systemd_verify_problems(unit: Path) -> list[str]:
    """What `systemd-analyze verify` objects to in a unit file (its own lines only)."""
    run = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    return [
        line
        for line in (run.stdout + run.stderr).splitlines()
        if str(unit) in line and re.search(r"Unknown|Failed|Invalid|not valid|ignoring", line)
    ]


# roles/_common/tasks/web_config.yml: a role includes it with no vars, and its outer
# block's variables read the role's own (<role>_tls_cert, _<role>_web, ...).
COMMON_WEB_CONFIG = ROLES / "_common" / "tasks" / "web_config.yml"


def _web_config_context(role: str, overrides: dict | None) -> dict:
    (block,) = DataLoader().load_from_file(str(COMMON_WEB_CONFIG), **TRUSTED_FILES)
    return {**block["vars"], "ansible_parent_role_names": [role], **(overrides or {})}


def web_config_values(role: str, host: str, overrides: dict | None = None, inventory=None) -> dict:
    """The web configuration piece's variables (__common_web, __common_web_file, ...), as
    role's include of it sees them."""
    context = _web_config_context(role, overrides)
    names = [name for name in context if name.startswith("__common_")]
    render = templar(role, host, context, inventory)
    return {name: render.template(trust_as_template("{{ " + name + " }}")) for name in names}


def render_web_config(role: str, host: str, overrides: dict | None = None, inventory=None) -> str:
    """role's web configuration as roles/_common/tasks/web_config.yml writes it: the
    shared template (roles/_common/templates/web-config.yml.j2) in role's context."""
    source = (ROLES / "_common" / "templates" / "web-config.yml.j2").read_text()
    text = templar(role, host, _web_config_context(role, overrides), inventory).template(
        trust_as_template(TEXT_GUARD + source)
    )
    return text[len(TEXT_GUARD) :]


def installed_rule_file(values: dict) -> str:
    """A shipped rule file (values' ``item``, its text ``_text``) as the prometheus role's
    install task writes it, the other values overriding the role's."""
    tasks = DataLoader().load_from_file(str(ROLES / "prometheus" / "tasks" / "instance.yml"))
    install = next(t for t in tasks if t["name"].startswith("Install the rule files"))
    values = dict(values)
    name, text = values.pop("item"), values.pop("_text")
    instance = {"name": "standalone", "mode": "standalone", "shard": None, "replica": 0}
    rules = template_value(
        "prometheus",
        install["vars"]["_rules"],
        "mon01",
        {**values, "_names": [name], "_texts": [text], "_instance": instance},
    )
    (only,) = rules.values()
    return only
