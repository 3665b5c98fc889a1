"""Check data against a documented schema written as data (for the config tests).

A schema is a dict (a mapping with exactly these keys), a one-item list (a list of
such items), a tuple (the allowed values) or the name of a scalar kind in SCALARS.
"""

from __future__ import annotations

import re
from typing import Any

# Prometheus durations (model.Duration: limits_config) and Go durations (time.Duration:
# server, compactor), as the reference's <duration> and the flag defaults use them.
PROM_DURATION = re.compile(r"(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?")
GO_DURATION = re.compile(r"(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+")
SCALARS = {
    "bool": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    # Free-form where the documentation leaves the content to the plugin (jsonData).
    "mapping": lambda v: isinstance(v, dict),
    "date": lambda v: re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(v)) is not None,
    "prom_duration": lambda v: isinstance(v, str) and v != "" and bool(PROM_DURATION.fullmatch(v)),
    "go_duration": lambda v: isinstance(v, str) and GO_DURATION.fullmatch(v) is not None,
}


def schema_problems(value: Any, schema: Any, path: str = "") -> list[str]:
    """Where value strays from schema: unknown keys, wrong types, values not allowed."""
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{path}: a mapping is documented, got {value!r}"]
        problems = [f"{path}.{key}: not a documented key" for key in value if key not in schema]
        for key in value.keys() & schema.keys():
            problems += schema_problems(value[key], schema[key], f"{path}.{key}")
        return problems
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: a list is documented, got {value!r}"]
        return [
            p
            for i, item in enumerate(value)
            for p in schema_problems(item, schema[0], f"{path}[{i}]")
        ]
    if isinstance(schema, tuple):
        return [] if value in schema else [f"{path}: {value!r} is not one of {schema}"]
    return [] if SCALARS[schema](value) else [f"{path}: {value!r} is not a {schema}"]
