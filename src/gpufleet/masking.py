"""A refused configuration explained without its secrets.

A task that writes a file holding credentials runs under no_log, which hides a checker's
refusal as well; the task after it explains the refusal with every secret value masked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

MASK = "********"
# Shorter values (a port, "yes") would mask common words and say little.
SHORTEST = 4


def secret_strings(values: object) -> list[str]:
    """Every string value (not a key, not a name:) in values, as written and JSON-escaped,
    longest first, so that a value inside another is masked after it."""
    found: set[str] = set()

    def walk(value: object, key: object = None) -> None:
        if isinstance(value, Mapping):
            for inner_key, inner in value.items():
                walk(inner, inner_key)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, str) and key != "name":
            found.update((value, json.dumps(value)[1:-1]))

    walk(values)
    return sorted((s for s in found if len(s) >= SHORTEST), key=lambda s: (-len(s), s))


def masked_refusal(result: Mapping[str, object], secrets: object) -> str:
    """What a registered task result says (msg, stderr, stdout), secrets masked."""
    said = " ".join(str(result[key]) for key in ("msg", "stderr", "stdout") if result.get(key))
    for value in secret_strings(secrets):
        said = said.replace(value, MASK)
    return said.strip()
