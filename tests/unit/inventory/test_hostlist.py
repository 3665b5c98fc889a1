"""Slurm hostlist expansion and compression."""

from __future__ import annotations

import random

import pytest

from gpufleet.hostlist import HostlistError, compress, expand, last_number


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("gpu001", ["gpu001"]),
        ("gpu[001-003,010]", ["gpu001", "gpu002", "gpu003", "gpu010"]),
        ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
        ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
        ("r[1-2]-gpu[01-02]", ["r1-gpu01", "r1-gpu02", "r2-gpu01", "r2-gpu02"]),
        ("login1,login2", ["login1", "login2"]),
        ("a[1-2],b[3],c", ["a1", "a2", "b3", "c"]),
        ("gpu[1-2]x", ["gpu1x", "gpu2x"]),
        (" mon[01-02] ", ["mon01", "mon02"]),
        ("n[7]", ["n7"]),
        ("h.example.org", ["h.example.org"]),
    ],
)
def test_expand(expression: str, expected: list[str]) -> None:
    assert expand(expression) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "empty hostlist"),
        ("gpu[", "unclosed '[' in 'gpu['"),
        ("gpu[1-2]]", "unmatched ']' at position 8 in 'gpu[1-2]]'"),
        ("gpu[[1]]", "nested '[' at position 4 in 'gpu[[1]]'"),
        ("gpu[3-1]", "reversed range '3-1' in 'gpu[3-1]'"),
        ("gpu[]", "empty range '[]' in 'gpu[]'"),
        ("gpu[1,,2]", "empty item in range '[1,,2]' of 'gpu[1,,2]'"),
        ("gpu[a-b]", "invalid range 'a-b' in 'gpu[a-b]'"),
        ("gpu[1-]", "invalid range '1-' in 'gpu[1-]'"),
        ("gp u1", "invalid character ' ' in 'gp u1'"),
        ("gpu1,,gpu2", "empty host name in 'gpu1,,gpu2'"),
        ("gpu[0-99999999]", "'gpu[0-99999999]' expands to more than 1,000,000 names"),
    ],
)
def test_expand_errors(expression: str, message: str) -> None:
    with pytest.raises(HostlistError) as err:
        expand(expression)
    assert str(err.value) == message


def test_expand_rejects_non_strings() -> None:
    with pytest.raises(HostlistError, match="expected a hostlist string, got int"):
        expand(12)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["gpu001", "gpu002", "gpu003", "gpu010"], "gpu[001-003,010]"),
        (["cpu8", "cpu9", "cpu10"], "cpu[8-10]"),
        (["login1"], "login1"),
        (["x", "gpu1", "gpu2"], "x,gpu[1-2]"),
        (["r1-gpu01", "r1-gpu02", "r2-gpu01"], "r1-gpu[01-02],r2-gpu01"),
    ],
)
def test_compress(names: list[str], expected: str) -> None:
    assert compress(names) == expected


def test_compress_round_trips_random_sets() -> None:
    rnd = random.Random(7)
    for _ in range(200):
        names = {
            f"{rnd.choice(['gpu', 'n', 'r1-c'])}{rnd.randint(0, 300):0{rnd.choice([1, 3])}d}"
            for _ in range(rnd.randint(1, 40))
        }
        assert set(expand(compress(sorted(names)))) == names


def test_last_number() -> None:
    assert last_number("gpu007") == 7
    assert last_number("r2-gpu16") == 16
    assert last_number("login") is None
