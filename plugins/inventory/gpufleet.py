"""Ansible inventory plugin ``gpufleet``: a thin adapter over the ``gpufleet`` package."""

from __future__ import annotations

import os
import re
import sys

from ansible.errors import AnsibleError, AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Constructable

try:
    from gpufleet.deadline import DeadlineExceeded, deadline
    from gpufleet.inventory import build_inventory
    from gpufleet.limits import (
        CONSTRUCT_DEADLINE_S,
        MAX_CONSTRUCTED_GROUPS,
        read_file_text,
    )
    from gpufleet.nodelist import (
        NODE_LIST_SUFFIXES,
        NodeListError,
        YamlProblem,
        construct_problem,
        load_yaml,
        node_list_load_error,
        parse_node_list,
        with_ansible_vars,
    )
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
    from gpufleet.deadline import DeadlineExceeded, deadline
    from gpufleet.inventory import build_inventory
    from gpufleet.limits import (
        CONSTRUCT_DEADLINE_S,
        MAX_CONSTRUCTED_GROUPS,
        read_file_text,
    )
    from gpufleet.nodelist import (
        NODE_LIST_SUFFIXES,
        NodeListError,
        YamlProblem,
        construct_problem,
        load_yaml,
        node_list_load_error,
        parse_node_list,
        with_ansible_vars,
    )

DOCUMENTATION = r"""
    name: gpufleet
    short_description: GPU cluster node list to hosts, groups and Prometheus shards
    description:
        - Reads a C(*.gpufleet.yml) node list of compute C(nodes) and C(servers) written as Slurm
          hostlist expressions, optionally the C(NodeName=) lines of a C(slurm.conf).
        - Produces one host per node with C(ansible_host), C(gpufleet_*) variables (shard, rack,
          partitions, GPU vendor/model/count, collector, expected series, target labels),
          groups per role, vendor, model, collector, rack, partition and Prometheus shard, and the
          monitoring groups C(prometheus), C(prometheus_global), C(alertmanager), C(grafana),
          C(loki), C(slurm_controller).
        - Shards come from weighted rendezvous hashing with a bounded-load correction, so the
          heaviest shard carries at most C(max_imbalance) times the mean expected series.
        - Any invalid input fails the whole source with one line (file, key, problem).
        - Only files named C(*.gpufleet.yml) or C(*.gpufleet.yaml) are claimed.
        - The contract is documented in docs/inventory.md.
    options:
        plugin:
            description: Token that marks the file as a gpufleet node list.
            required: true
            choices: ['gpufleet']
        cluster:
            description:
                - Required. Cluster name; the C(cluster) label on every series.
                - gpufleet validates this and the keys below itself, so that errors name the
                  entry and key (for example C(nodes[2].gpu.count)).
            type: raw
        nodes:
            description:
                - Compute node entries. Keys C(hosts) (hostlist, required), C(address) (may use
                  C({name}) and C({num})), C(rack), C(partition), C(gpu) (C(vendor), C(model),
                  C(count)), C(gpu_collector) (C(smi) or C(dcgm)), C(cpus), C(expected_series),
                  C(labels), C(vars).
                - Required, a list of mappings.
            type: raw
        servers:
            description:
                - Non-compute hosts (login, monitoring, Slurm controller), entries like
                  C(nodes) without C(gpu) and C(gpu_collector).
            type: raw
        monitoring:
            description:
                - C(shards), C(replicas), C(sharding) (C(balanced) or C(rack)), C(max_imbalance),
                  C(pin), and the host lists C(prometheus_hosts), C(global_hosts),
                  C(alertmanager_hosts), C(grafana_hosts), C(loki_hosts).
                - C(shard_lock) (a hidden file next to the node list, written by
                  C(gpufleet plan --write-lock)) keeps hosts on their shard across node list
                  changes; C(rebalance_margin) is how far past C(max_imbalance) a locked plan
                  may drift before hosts move.
            type: raw
        slurm:
            description:
                - C(controller_hosts), C(conf) (a slurm.conf path relative to this file) and
                  C(node_defaults).
            type: raw
    extends_documentation_fragment:
        - constructed
"""

EXAMPLES = r"""
# inventories/prod/nodes.gpufleet.yml
plugin: gpufleet
cluster: hpc-a
nodes:
  - hosts: "gpu[001-064]"
    address: "10.1.0.{num}"
    rack: r01
    partition: [gpu, debug]
    gpu: {vendor: nvidia, model: H100, count: 8}
    gpu_collector: dcgm
    cpus: 224
servers:
  - hosts: "mon[01-02]"
    address: "10.1.9.{num}"
monitoring:
  shards: 2
  replicas: 2
  prometheus_hosts: "mon[01-02]"
  global_hosts: "mon[01-02]"
  alertmanager_hosts: "mon[01-02]"
  grafana_hosts: mon01
  loki_hosts: mon02
# constructed options work as in core plugins
keyed_groups:
  - key: gpufleet_gpu_model
    prefix: model
compose:
  node_exporter_port: 9100
"""

# The strings of a plugin's own config file are trusted templates (compose, groups,
# keyed_groups need it), as _read_config_data marks them.
_LOAD_OPTIONS = {"trusted_as_template": True}


class NodeListParserError(AnsibleParserError):
    """A node list problem, already one line naming file, key path and problem.

    It carries no source context: ansible-core 2.19 would print the message a second time
    under an "Origin:" block, where the message already names the file and key.
    """

    @property
    def _formatted_source_context(self):
        return None


_OPTION_ERROR_RE = re.compile(r"^Config '(?P<key>\w+)' .*? has an invalid value: (?P<problem>.*)$")


def option_error(path, err):
    """Ansible's error for a constructed option (``keyed_groups: 5``) as a NodeListError."""
    first_line = (str(getattr(err, "message", err)).strip().splitlines() or ["invalid"])[0]
    match = _OPTION_ERROR_RE.match(first_line)
    if match:
        return NodeListError(path, match.group("key"), match.group("problem"))
    return NodeListError(path, "", first_line)


class InventoryModule(BaseInventoryPlugin, Constructable):
    NAME = "gpufleet"

    def verify_file(self, path):
        return str(path).endswith(NODE_LIST_SUFFIXES) and super().verify_file(path)

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._source = path
        try:
            config, data = self._load_node_list(path)
            plan = build_inventory(parse_node_list(data, path))
        except NodeListError as err:
            # from None: a chained cause would be printed as a second copy of the message
            raise NodeListParserError(str(err)) from None
        # What _read_config_data does after loading: the constructed options (compose, ...),
        # type-checked by Ansible; a bad one is a one-line error like any other.
        try:
            self.set_options(direct=config, var_options=self._vars)
        except AnsibleError as err:
            raise NodeListParserError(str(option_error(path, err))) from None
        self._populate(plan)

    def _load_node_list(self, path):
        """The node list twice: as Ansible's loader reads it (vault, trust: for the
        constructed options and each entry's vars), and as gpufleet's strict loader reads
        the same text (decrypted by Ansible; duplicate keys refused, identifiers kept as
        written), which is what gpufleet validates. The file must be a regular file of
        bounded size (never a FIFO or a device) and UTF-8, checked first: Ansible's
        loader would escape what is not UTF-8, with a deprecation warning."""
        try:
            read_file_text(path)
        except OSError as err:
            raise NodeListError(path, "", f"cannot read: {err.strerror or err}") from None
        try:
            # str(): the plain text of Ansible's tagged str, which PyYAML's C reader refuses
            strict = load_yaml(str(self.loader.get_text_file_contents(path)))
        except YamlProblem as problem:
            raise NodeListError(path, problem.where, problem.problem) from None
        except Exception as err:  # any loader failure becomes one line
            raise node_list_load_error(path, err) from None
        try:
            config = self.loader.load_from_file(path, cache="none", **_LOAD_OPTIONS)
        except Exception as err:  # any loader failure becomes one line
            raise node_list_load_error(path, err) from None
        return config, with_ansible_vars(strict, config)

    def _populate(self, plan):
        inventory = self.inventory
        for group in plan.groups:
            inventory.add_group(group)
        for group, variables in plan.group_vars.items():
            for name, value in variables.items():
                inventory.set_variable(group, name, value)
        for host, variables in plan.host_vars.items():
            inventory.add_host(host)
            for name, value in variables.items():
                inventory.set_variable(host, name, value)
        for group, hosts in plan.groups.items():
            for host in hosts:
                inventory.add_child(group, host)
        self._construct(plan.host_vars)

    def _construct(self, host_vars):
        compose = self.get_option("compose")
        groups = self.get_option("groups")
        keyed_groups = self.get_option("keyed_groups")
        if not (compose or groups or keyed_groups):
            return  # nothing to template: skip 3 calls per host on big clusters
        problem = construct_problem(len(host_vars), compose, groups, keyed_groups)
        if problem:
            raise NodeListParserError(str(NodeListError(self._source, *problem)))
        strict = self.get_option("strict")
        group_limit = len(self.inventory.groups) + MAX_CONSTRUCTED_GROUPS
        try:
            with deadline(CONSTRUCT_DEADLINE_S) as limit:
                for host, variables in host_vars.items():
                    # compose first, so that groups and keyed_groups can use the composed vars
                    self._set_composite_vars(compose, variables, host, strict=strict)
                    merged = self.inventory.get_host(host).get_vars()
                    self._add_host_to_composed_groups(groups, merged, host, strict=strict)
                    self._add_host_to_keyed_groups(keyed_groups, merged, host, strict=strict)
                    if len(self.inventory.groups) > group_limit:
                        raise NodeListParserError(
                            str(
                                NodeListError(
                                    self._source,
                                    "keyed_groups",
                                    f"adds more than {MAX_CONSTRUCTED_GROUPS:,} groups "
                                    f"(at host {host})",
                                )
                            )
                        )
                    limit.check()
        except DeadlineExceeded:
            raise NodeListParserError(
                str(
                    NodeListError(
                        self._source,
                        "compose/groups/keyed_groups",
                        f"templating took longer than {CONSTRUCT_DEADLINE_S:g} s for "
                        f"{len(host_vars):,} hosts; simplify the expressions",
                    )
                )
            ) from None
