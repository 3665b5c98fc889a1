"""How jobstats reaches the inventory's Prometheus: as the prometheus role's own clients do.

The role's clients (the global tier's federation, Grafana) take scheme, CA and login from
the Prometheus hosts' ``prometheus_tls_cert``, ``prometheus_tls_ca`` and
``prometheus_basic_auth_users`` (:func:`gpufleet.web.web_client`), and the port base from
``prometheus_port_base``. jobstats reads those variables of the same hosts where Ansible
would: the node list's host vars, then the inventory's ``group_vars``/``host_vars`` (vault
decrypted with the vault password file Ansible is configured with, templates rendered).
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.inventory import PROMETHEUS_PORT_BASE, build_inventory
from gpufleet.nodelist import NodeList
from gpufleet.web import web_client
from gpufleet_node.job_summary.prom import PromError

SERVICE = "prometheus"
KEYS = (
    "prometheus_tls_cert",
    "prometheus_tls_ca",
    "prometheus_basic_auth_users",
    "prometheus_port_base",
)


@dataclass(frozen=True)
class Access:
    """Scheme, CA (PEM), login and port base of the inventory's Prometheus hosts."""

    scheme: str = "http"
    ca: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    port_base: dict[str, int] = field(default_factory=dict)  # host name: its port base


def _file_vars(node_list: NodeList, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """KEYS of each host as Ansible sees them (plugin host vars, group_vars, host_vars)."""
    with warnings.catch_warnings():
        # Warnings of Ansible's own imports (cryptography 51 deprecates the DSA support
        # ansible-core's SSH agent imports) are not gpufleet's: its output stays one line.
        warnings.filterwarnings("ignore", module=r"ansible(\.|$)")
        from ansible import constants as C
        from ansible.cli import CLI
        from ansible.inventory.group import Group
        from ansible.inventory.host import Host
        from ansible.parsing.dataloader import DataLoader
        from ansible.plugins.loader import init_plugin_loader
        from ansible.template import Templar
        from ansible.utils.vars import combine_vars
        from ansible.vars.plugins import get_vars_from_path

        if not any(type(f).__name__ == "_AnsibleCollectionFinder" for f in sys.meta_path):
            init_plugin_loader()  # as Ansible's CLIs do; the vars plugins load through it
    loader = DataLoader()
    once: dict[str, bool] = {}
    if "initialize_context" in inspect.signature(CLI.setup_vault_secrets).parameters:
        once["initialize_context"] = False  # 2.19+: a second call (the tests) must not fail
    secrets = CLI.setup_vault_secrets(
        loader,
        vault_ids=C.DEFAULT_VAULT_IDENTITY_LIST,  # and it adds DEFAULT_VAULT_PASSWORD_FILE
        ask_vault_pass=False,
        auto_prompt=False,
        **once,
    )
    loader.set_vault_secrets(secrets)
    plan = build_inventory(node_list)
    base = os.path.dirname(os.path.abspath(node_list.file))
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        host = Host(name)
        groups = [Group("all")] + [Group(g) for g in sorted(plan.groups) if name in plan.groups[g]]
        merged: dict[str, Any] = {}
        # Ansible's order: inventory group_vars, the plugin's host vars, host_vars/ (stage
        # "task": read now, whatever the config's RUN_VARS_PLUGINS says).
        merged = combine_vars(merged, get_vars_from_path(loader, base, groups, "task"))
        merged = combine_vars(merged, plan.host_vars.get(name, {}))
        merged = combine_vars(merged, get_vars_from_path(loader, base, [host], "task"))
        # The magic variables an inventory's templates use most (e.g. a file lookup).
        magic = {
            "inventory_hostname": name,
            "inventory_dir": base,
            "inventory_file": os.path.abspath(node_list.file),
            "group_names": [group.name for group in groups[1:]],
        }
        templar = Templar(loader=loader, variables=combine_vars(merged, magic))
        out[name] = {key: templar.template(merged[key]) for key in KEYS if key in merged}
    return out


def inventory_access(node_list: NodeList, hosts: Iterable[str]) -> Access:
    """The settings for hosts; PromError (naming no secret) when they cannot be read."""
    names = sorted(set(hosts))
    try:
        hostvars = _file_vars(node_list, names)
        client = web_client(names, hostvars, SERVICE)
        port_base = {
            name: int(hostvars[name].get("prometheus_port_base") or PROMETHEUS_PORT_BASE)
            for name in names
        }
    except Exception as err:  # vault, template or value errors: one line, the cause's type
        reason = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
        raise PromError(
            f"{node_list.file}: cannot read the Prometheus hosts' TLS and login settings "
            f"({reason}); give --prometheus with --ca-file/--user instead"
        ) from err
    return Access(
        scheme=client["scheme"],
        ca=client["ca"],
        username=client["username"],
        password=client["password"],
        port_base=port_base,
    )
