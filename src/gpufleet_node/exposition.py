"""Prometheus text exposition format 0.0.4: metric families and one writer."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

Labels = tuple[tuple[str, str], ...]


@dataclass
class Family:
    name: str
    type: str
    help: str
    samples: dict[Labels, float] = field(default_factory=dict)

    def set(self, value: float, **labels: str) -> None:
        self.samples[tuple(sorted(labels.items()))] = float(value)

    def add(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.samples[key] = self.samples.get(key, 0.0) + float(value)


class Registry:
    """Ordered collection of families, created on first use."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}

    def family(self, name: str, help_text: str, mtype: str = "gauge") -> Family:
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = Family(name, mtype, help_text)
        return fam

    def gauge(self, name: str, help_text: str, value: float, **labels: str) -> None:
        self.family(name, help_text).set(value, **labels)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def render(families: Iterable[Family]) -> str:
    """Prometheus text exposition format 0.0.4."""
    out: list[str] = []
    for fam in families:
        out.append(f"# HELP {fam.name} {_escape_help(fam.help)}")
        out.append(f"# TYPE {fam.name} {fam.type}")
        for labels, value in fam.samples.items():
            if labels:
                body = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
                out.append(f"{fam.name}{{{body}}} {_format_value(value)}")
            else:
                out.append(f"{fam.name} {_format_value(value)}")
    return "\n".join(out) + "\n"


def write_textfile(path: Path, text: str, mode: int = 0o644, durable: bool = True) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same directory, rename), as
    node_exporter's textfile collector needs: it never reads a partial file. The temp name
    does not end in .prom, so the collector's *.prom glob ignores it.

    ``durable`` also fsyncs the file and its directory, for state that must survive a crash;
    a textfile rewritten every cycle, whose next cycle comes seconds after a reboot, skips it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        with contextlib.suppress(OSError):
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
