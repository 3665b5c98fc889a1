"""Jinja2 filters of a node's removal (playbooks/remove_node.yml): thin glue over
src/gpufleet/lifecycle.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

try:
    from gpufleet import lifecycle
    from gpufleet.shardlock import LockError
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "src")
    )
    from gpufleet import lifecycle
    from gpufleet.shardlock import LockError


def gpufleet_leaving_hosts(spec: object, groups: Mapping[str, Any]) -> dict[str, Any]:
    """{hosts, problem}: the hosts gpufleet_remove_nodes names, or why not (one line)."""
    return dict(lifecycle.leaving_hosts(spec, groups))


def gpufleet_staying(hostnames: Iterable[str], hostvars: Mapping[str, Any]) -> list[str]:
    """hostnames without the hosts marked gpufleet_leaving."""
    return lifecycle.staying(hostnames, hostvars)


def gpufleet_groups_staying(
    groups: Mapping[str, Iterable[str]], hostvars: Mapping[str, Any]
) -> dict[str, list[str]]:
    """Every group without the hosts marked gpufleet_leaving."""
    return lifecycle.groups_staying(groups, hostvars)


def gpufleet_lock_without(text: str, file: str, hosts: Iterable[str]) -> dict[str, str]:
    """{text, problem}: the shard lock's text without hosts, or why it cannot be read."""
    try:
        return {"text": lifecycle.lock_without(str(text), str(file), list(hosts)), "problem": ""}
    except LockError as err:
        return {"text": "", "problem": f"{file}: {err}"}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "gpufleet_leaving_hosts": gpufleet_leaving_hosts,
            "gpufleet_staying": gpufleet_staying,
            "gpufleet_groups_staying": gpufleet_groups_staying,
            "gpufleet_lock_without": gpufleet_lock_without,
        }
