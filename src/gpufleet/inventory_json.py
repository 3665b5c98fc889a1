"""Reading `ansible-inventory --list` JSON written by ansible-core 2.19 and later."""

from __future__ import annotations

from typing import Any

_UNSAFE = "__ansible_unsafe"


def plain(value: Any) -> Any:
    """The value with ansible-core's unsafe-string markers ({"__ansible_unsafe": s}) removed."""
    if isinstance(value, dict):
        if set(value) == {_UNSAFE}:
            return value[_UNSAFE]
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
