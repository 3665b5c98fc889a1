#!/usr/bin/env python3
"""The demo's test bed hosts, read from `ansible-inventory --list` on stdin.

testbed_hosts.py platforms   JSON for `testbed.py up --platforms` (name, address, and
                             the node list's demo_testbed suite and podman_args)
testbed_hosts.py names       one host name a line
testbed_hosts.py address G   the address of group G's first host
"""

from __future__ import annotations

import json
import sys
from typing import Any


def plain(value: Any) -> Any:
    """ansible-core 2.19 writes unsafe strings as {"__ansible_unsafe": s} in JSON."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def platforms(hostvars: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for name in sorted(hostvars):
        host = plain(hostvars[name])
        testbed = host.get("demo_testbed") or {}
        platform = {"name": name, "address": host["ansible_host"]}
        platform.update({key: testbed[key] for key in ("suite", "podman_args") if key in testbed})
        found.append(platform)
    return found


def main(argv: list[str]) -> int:
    command = argv[1:2]
    if command not in (["platforms"], ["names"], ["address"]) or len(argv) != 2 + (
        command == ["address"]
    ):
        print(__doc__, file=sys.stderr)
        return 2
    inventory = json.load(sys.stdin)
    hosts = platforms(inventory["_meta"]["hostvars"])
    if not hosts:
        print("demo: no hosts in the inventory", file=sys.stderr)
        return 1
    if argv[1] == "address":
        members = inventory.get(argv[2], {}).get("hosts", [])
        if not members:
            print(f"demo: no hosts in group {argv[2]}", file=sys.stderr)
            return 1
        print(next(host["address"] for host in hosts if host["name"] == members[0]))
    elif argv[1] == "names":
        print("\n".join(host["name"] for host in hosts))
    else:
        print(json.dumps(hosts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
