"""Numbers from outside (Prometheus answers, stored summaries) as gpufleet prints them.

One rule for every report: NaN and +/-Inf are no figure. They become ``None``, which a
text report prints as ``-`` and JSON as ``null``; every JSON document gpufleet prints goes
through :func:`strict_dumps` (``allow_nan=False``: never ``NaN`` or ``Infinity``, which
are not JSON). Standard library only, Python 3.9: the epilog's zipapp carries it.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> float | None:
    """``value`` if it is a finite number, else None (NaN, +/-Inf, None, a bool, not a
    number, or an integer beyond a float's range, on which math.isfinite would raise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def in_range(value: float | None, low: float, high: float) -> float | None:
    """``value`` if finite and within [low, high], else None."""
    number = finite(value)
    return number if number is not None and low <= number <= high else None


def finite_tree(value: Any) -> Any:
    """``value`` with every non-finite float (in dicts, lists and tuples) made None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_tree(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_tree(item) for item in value]
    return value


def strict_dumps(value: Any, **options: Any) -> str:
    """Strict JSON of ``value``: NaN and +/-Inf as null, never ``NaN``/``Infinity``."""
    return json.dumps(finite_tree(value), allow_nan=False, **options)
