"""Vendor tools' value tokens: numbers, booleans, P-states, absent and N/A."""

from __future__ import annotations

import math
import re
from typing import Any

from .model import MAX_FIELD_CHARS

# Tokens nvidia-smi/amd-smi print instead of a value; any "[...]" token counts too.
ABSENT_TOKENS = frozenset({"", "n/a", "na", "not supported", "unknown error", "none reported"})
BOOL_TRUE = frozenset({"enabled", "yes", "active", "on", "true"})
BOOL_FALSE = frozenset({"disabled", "no", "not active", "off", "false"})
MAX_NUMBER_CHARS = 64  # longer text is not a number (and NUMBER_RE is not linear)
NUMBER_RE = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z%/°]*)")
RECOVERY_ACTIONS = {
    "none": 0.0,
    "gpu reset": 1.0,
    "reset": 1.0,
    "node reboot": 2.0,
    "reboot": 2.0,
    "drain p2p": 3.0,
    "drain and reset": 4.0,
}


def is_absent(raw: str | None) -> bool:
    if raw is None:
        return True
    text = raw.strip()
    if text.startswith("[") and text.endswith("]"):
        return True
    return text.lower() in ABSENT_TOKENS


def parse_number(raw: str | None) -> float | None:
    """'69.85 W' / '69.85' / '0x1F' / '81559 MiB' -> float; sentinels -> None."""
    if raw is None or len(raw) > MAX_NUMBER_CHARS or is_absent(raw):
        return None
    text = raw.strip().strip("()")
    if text[:2].lower() == "0x":
        try:
            return float(int(text, 16))
        except ValueError:
            return None
    match = NUMBER_RE.fullmatch(text)
    if not match:
        return None
    value = float(match.group(1))
    return value if math.isfinite(value) else None


def parse_bool(raw: str | None) -> float | None:
    if raw is None or is_absent(raw):
        return None
    text = raw.strip().lower()
    if text in BOOL_TRUE:
        return 1.0
    if text in BOOL_FALSE:
        return 0.0
    return None


def parse_pstate(raw: str | None) -> float | None:
    match = re.fullmatch(r"\s*P(\d{1,2})\s*", raw or "")
    return float(match.group(1)) if match else None


def parse_recovery_action(raw: str | None) -> float | None:
    if raw is None or is_absent(raw):
        return None
    return RECOVERY_ACTIONS.get(raw.strip().lower())


def clean_label(raw: Any) -> str:
    """Info labels: sentinel text becomes empty (= label absent in Prometheus)."""
    text = "" if raw is None else raw if isinstance(raw, str) else str(raw)
    return "" if is_absent(text) else text.strip()[:MAX_FIELD_CHARS]


# What nvidia-smi prints for a value this GPU does not have: not an error. Any
# other value a field's parser rejects (ERR!, [Unknown Error], [GPU is lost],
# [Insufficient Permissions], NaN, garbage) counts in node_gpu_unreadable_fields.
NOT_APPLICABLE = frozenset(
    {
        "",
        "n/a",
        "na",
        "not supported",
        "not available",
        "none reported",
        "function not found",
        "requested functionality has been deprecated",
    }
)


def is_not_applicable(raw: str | None) -> bool:
    if raw is None:
        return True
    text = raw.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1].strip()
    return text.lower() in NOT_APPLICABLE
