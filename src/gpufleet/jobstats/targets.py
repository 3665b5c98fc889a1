"""Which Prometheus to ask: one URL, or the instances the inventory places.

The inventory (the node list ``gpufleet plan`` reads) gives every Prometheus instance
through :func:`gpufleet.inventory.prometheus_instances` (docs/inventory.md): a standalone
Prometheus, or shards 0..N-1 plus a global tier, each with its replicas. Ports are the
prometheus role's (:func:`gpufleet.inventory.prometheus_port`) from each host's
``prometheus_port_base``; scheme and port bases come from :mod:`gpufleet.jobstats.access`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from gpufleet.inventory import PROMETHEUS_PORT_BASE, prometheus_instances, prometheus_port
from gpufleet.jobstats.access import Access
from gpufleet.nodelist import NodeList
from gpufleet_node.job_summary.prom import PromClient, PromError

T = TypeVar("T")


@dataclass(frozen=True)
class Instance:
    """One Prometheus (standalone, a shard, or the global tier) and its replicas' URLs."""

    name: str  # "standalone", "shard-3", "global", or the URL given
    urls: tuple[str, ...]


@dataclass(frozen=True)
class Topology:
    """Where the data lives: per-GPU series on ``data`` instances, rollups on ``rollups``."""

    data: tuple[Instance, ...]  # the standalone, or every shard
    rollups: Instance | None  # the global tier, or the standalone; None: same as data[0]
    sharded: bool = False
    notes: list[str] = field(default_factory=list)
    access: Access | None = None  # the inventory's TLS and login; None: flags only


def single(url: str) -> Topology:
    instance = Instance(url, (url,))
    return Topology(data=(instance,), rollups=instance)


def prometheus_hosts(node_list: NodeList) -> list[str]:
    """The hosts that run a Prometheus instance (standalone, shard or global)."""
    return [name for name, insts in prometheus_instances(node_list.monitoring).items() if insts]


def from_inventory(
    node_list: NodeList, scheme: str = "http", port_base: Mapping[str, int] | None = None
) -> Topology:
    """The Prometheus instances of the node list, replicas in the role's order.

    ``port_base``: each host's ``prometheus_port_base`` (default: the node list's host var,
    else the role's default).
    """
    hosts = {host.name: host for host in node_list.hosts}
    urls: dict[str, list[str]] = {}
    for host_name, instances in prometheus_instances(node_list.monitoring).items():
        host = hosts.get(host_name)
        if host is None:
            continue
        if port_base and host_name in port_base:
            base = port_base[host_name]
        else:
            base = int(host.vars.get("prometheus_port_base", PROMETHEUS_PORT_BASE))
        for inst in instances:
            port = prometheus_port(inst, base)
            address = f"[{host.address}]" if ":" in host.address else host.address
            urls.setdefault(inst["name"], []).append(f"{scheme}://{address}:{port}")
    if not urls:
        raise PromError(f"{node_list.file}: monitoring.prometheus_hosts is empty")
    if "standalone" in urls:
        standalone = Instance("standalone", tuple(urls["standalone"]))
        return Topology(data=(standalone,), rollups=standalone)
    shards = tuple(
        Instance(f"shard-{k}", tuple(urls.get(f"shard-{k}", ())))
        for k in range(node_list.monitoring.shards)
    )
    glob = Instance("global", tuple(urls["global"])) if "global" in urls else None
    return Topology(data=shards, rollups=glob, sharded=True)


def ask(
    instance: Instance, make_client: Callable[[str], PromClient], work: Callable[[PromClient], T]
) -> T:
    """``work`` on the first replica that answers; PromError naming the instance if none."""
    errors = []
    for url in instance.urls:
        try:
            return work(make_client(url))
        except PromError as err:
            errors.append(str(err))
    raise no_answer(instance, errors)


def ask_best(
    instance: Instance,
    make_client: Callable[[str], PromClient],
    work: Callable[[PromClient], T],
    score: Callable[[T], float],
) -> T:
    """``work`` on every replica; the answer ``score`` rates highest, the first of equals.

    HA replicas scrape the same targets but need not hold the same data: one restarted on
    an empty TSDB answers too, with less.
    """
    answers: list[T] = []
    errors = []
    for url in instance.urls:
        try:
            answers.append(work(make_client(url)))
        except PromError as err:
            errors.append(str(err))
    if answers:
        return max(answers, key=score)
    raise no_answer(instance, errors)


def no_answer(instance: Instance, errors: list[str]) -> PromError:
    if not errors:
        return PromError(f"{instance.name}: no replica in the inventory")
    if instance.urls == (instance.name,):  # one URL given: its error says it all
        return PromError(errors[0])
    return PromError(f"{instance.name}: no replica answers: {'; '.join(errors)}")
