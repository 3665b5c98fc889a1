"""The one text-format writer (Prometheus exposition format 0.0.4)."""

from __future__ import annotations

import math
import os
import stat

import pytest

from gpufleet_node import exposition
from gpufleet_node.exposition import Family, Registry, render


def test_special_values_are_spelled_as_the_format_says():
    fam = Family("x", "gauge", "h")
    fam.set(math.nan, k="nan")
    fam.set(math.inf, k="pinf")
    fam.set(-math.inf, k="ninf")
    fam.set(3.0, k="int")
    fam.set(0.25, k="float")
    fam.set(1e20, k="big")
    lines = render([fam]).splitlines()
    assert lines[2:] == [
        'x{k="nan"} NaN',
        'x{k="pinf"} +Inf',
        'x{k="ninf"} -Inf',
        'x{k="int"} 3',
        'x{k="float"} 0.25',
        'x{k="big"} 1e+20',
    ]


def test_label_values_and_help_are_escaped():
    fam = Family("x", "gauge", 'back\\slash\nnew "quote"')
    fam.set(1, v='a\\b\n"c"')
    text = render([fam])
    assert '# HELP x back\\\\slash\\nnew "quote"\n' in text  # help keeps its quotes
    assert 'x{v="a\\\\b\\n\\"c\\""} 1\n' in text
    assert text.count("\n") == 3  # nothing user-set breaks a line


def test_labels_are_sorted_and_samples_add_up():
    reg = Registry()
    reg.family("c", "help", "counter").add(1, b="2", a="1")
    reg.family("c", "ignored", "counter").add(2, a="1", b="2")
    assert render(reg.families.values()) == '# HELP c help\n# TYPE c counter\nc{a="1",b="2"} 3\n'


def test_write_textfile_is_atomic_and_readable(tmp_path):
    path = tmp_path / "gpu.prom"
    path.write_text("old\n")
    exposition.write_textfile(path, "x 1\n")
    assert path.read_text() == "x 1\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.prom"]  # no temp file left


def test_write_textfile_failure_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "gpu.prom"
    path.write_text("old\n")

    def fail(*_args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        exposition.write_textfile(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.prom"]
