"""A node leaves the cluster: which hosts leave, who stays, and the shard lock without them.

Pure: no Ansible imports, no I/O. ``playbooks/remove_node.yml`` calls these through the
filters of plugins/filter/gpufleet_filters.py:

- :func:`leaving_hosts` reads the admin's ``gpufleet_remove_nodes`` (a Slurm hostlist
  such as ``gpu[007-008]``, or a list of them) against the inventory, and refuses, in one
  line, a name the inventory does not have or a monitoring server;
- the playbook marks each leaving host ``gpufleet_leaving: true`` (a host variable, set
  for the run); :func:`staying` and :func:`groups_staying` leave such hosts out, and so do
  the file_sd targets (:mod:`gpufleet.scrape_targets`) and the firewall sources
  (:mod:`gpufleet.firewall`): the roles, rerun on the remaining hosts, render what they
  will render once the node list no longer has the node;
- :func:`lock_without` is the shard lock's text without the leaving hosts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from gpufleet import hostlist
from gpufleet.shardlock import format_lock, parse_lock

# The host variable that marks a host as leaving (set by remove_node.yml only).
LEAVING = "gpufleet_leaving"

# Hosts of these groups serve the monitoring itself: removing one is a change of the
# monitoring tier (node list, prometheus_hosts, ...), not a node leaving.
SERVER_GROUPS = (
    "prometheus",
    "prometheus_global",
    "alertmanager",
    "grafana",
    "loki",
    "victoriametrics",
)

# At most this many names in one removal (a whole cluster's worth is not a removal).
MAX_LEAVING = 10_000

VARIABLE = "gpufleet_remove_nodes"


class Leaving(TypedDict):
    """What :func:`leaving_hosts` found: the hosts, or the one-line problem."""

    hosts: list[str]
    problem: str


def is_leaving(host: Mapping[str, Any] | None) -> bool:
    """Whether a host's variables mark it as leaving (``gpufleet_leaving`` true)."""
    if host is None:
        return False
    value = host.get(LEAVING)
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "on")
    return value is True


def staying(hostnames: Iterable[str], hostvars: Mapping[str, Any]) -> list[str]:
    """hostnames without the leaving ones, in their order."""
    return [name for name in hostnames if not is_leaving(hostvars.get(name))]


def groups_staying(
    groups: Mapping[str, Iterable[str]], hostvars: Mapping[str, Any]
) -> dict[str, list[str]]:
    """Every group without its leaving hosts (a group may end up empty, and stays)."""
    leaving = {name for name in hostvars if is_leaving(hostvars.get(name))}
    return {
        str(group): [str(name) for name in hosts or [] if name not in leaving]
        for group, hosts in groups.items()
    }


def _names(spec: object) -> list[str]:
    """The names of a hostlist expression, or of a list of them; HostlistError if bad."""
    if isinstance(spec, str):
        expressions = [spec]
    elif isinstance(spec, (list, tuple)):
        expressions = list(spec)
    else:
        raise hostlist.HostlistError(
            f"expected a hostlist such as 'gpu[007-008]', or a list of them, "
            f"got {type(spec).__name__}"
        )
    names: list[str] = []
    for expression in expressions:
        if not isinstance(expression, str):
            raise hostlist.HostlistError(
                f"expected host names, got {type(expression).__name__} {expression!r}"
            )
        text = expression.strip()
        if not text:
            continue
        names += hostlist.expand(text, MAX_LEAVING - len(names))
    return list(dict.fromkeys(names))


def leaving_hosts(spec: object, groups: Mapping[str, Iterable[str]]) -> Leaving:
    """The inventory hosts ``spec`` names, or why it is refused (one line).

    ``spec`` is ``gpufleet_remove_nodes``: a Slurm hostlist (``gpu[007-008],cpu001``) or a
    list of them. Refused: no name at all, a malformed hostlist, a name the inventory
    does not have (``groups['all']``), and a host of a monitoring server group
    (:data:`SERVER_GROUPS`), which this removal does not reconfigure.
    """
    if spec is None or spec == "" or spec == []:
        return {
            "hosts": [],
            "problem": f"name the leaving nodes: -e {VARIABLE}='gpu[007-008]' (a Slurm hostlist)",
        }
    try:
        names = _names(spec)
    except hostlist.HostlistError as err:
        return {"hosts": [], "problem": f"{VARIABLE}: {err}"}
    if not names:
        return {"hosts": [], "problem": f"{VARIABLE} names no host"}
    known = set(groups.get("all") or [])
    unknown = [name for name in names if name not in known]
    if unknown:
        shown = hostlist.compress(unknown)
        return {
            "hosts": [],
            "problem": f"{VARIABLE}: not in the inventory: {shown} "
            f"({len(unknown)} of {len(names)} names); nothing was changed",
        }
    for group in SERVER_GROUPS:
        servers = [name for name in names if name in set(groups.get(group) or [])]
        if servers:
            return {
                "hosts": [],
                "problem": f"{VARIABLE}: {hostlist.compress(servers)} is a monitoring server "
                f"(group {group}): change the node list's monitoring hosts and rerun site.yml "
                "instead; remove_node.yml removes nodes only. Nothing was changed",
            }
    return {"hosts": names, "problem": ""}


def lock_without(text: str, file: str, hosts: Iterable[str]) -> str:
    """The shard lock ``text`` without ``hosts``; ``text`` itself when it has none of them.

    Raises :class:`gpufleet.shardlock.LockError` for a malformed lock (the caller names
    the file). The rest of the plan is kept as it is: the remaining hosts stay on their
    shards, as ``gpufleet plan --write-lock`` writes it once the node list no longer has
    the hosts.
    """
    lock = parse_lock(text, file)
    gone = set(hosts)
    if not gone & set(lock.hosts):
        return text
    kept = {name: shard for name, shard in lock.hosts.items() if name not in gone}
    return format_lock(lock.cluster, lock.shards, kept)
