"""The test bed's Grafana stand-in (molecule/testbed/standins/grafana.py) reads basic
auth as Grafana does: Grafana's basic client calls Go's ``Request.BasicAuth``, which
matches the scheme ``Basic `` with ``ascii.EqualFold``, so the stand-in must not refuse a
spelling Grafana accepts (nor accept one it refuses)."""

from __future__ import annotations

import base64
import importlib.util
import random
from pathlib import Path
from types import ModuleType

import pytest

STANDIN = Path(__file__).resolve().parents[2] / "molecule/testbed/standins/grafana.py"


def load_standin() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grafana_standin", STANDIN)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


grafana = load_standin()
TOKEN = base64.b64encode(b"admin:s3cret:with:colons").decode()
NOT_UTF8 = base64.b64encode(b"\xff:x").decode()


@pytest.mark.parametrize("scheme", ["Basic", "basic", "BASIC", "bAsIc"])
def test_the_scheme_matches_in_any_ascii_case(scheme: str) -> None:
    assert grafana.basic_credentials(f"{scheme} {TOKEN}") == ("admin", "s3cret:with:colons")


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Basic",
        f"Bearer {TOKEN}",
        f"Basic  {TOKEN}",  # Go takes exactly "Basic " and base64 from there
        f"Basic\t{TOKEN}",
        f"ba\u017fic {TOKEN}",  # casefolds to "basic ", but is not ASCII
        f"Basic {TOKEN[:-1]}",  # padding missing
        f"Basic {TOKEN}!",
        f"Basic {base64.b64encode(b'no-colon').decode()}",
        f"Basic {NOT_UTF8}",
    ],
)
def test_anything_else_is_no_credentials(header: str) -> None:
    assert grafana.basic_credentials(header) is None


def test_property_only_the_ascii_spellings_of_basic_give_credentials() -> None:
    rnd = random.Random(26)
    lookalikes = "\u017f\u212a\u0131\t-xS"  # long s, Kelvin sign, dotless i, ...
    for _ in range(2000):
        scheme = "".join(
            rnd.choice((char.lower(), char.upper()))
            if rnd.random() < 0.9
            else rnd.choice(lookalikes)
            for char in "basic "
        )
        got = grafana.basic_credentials(scheme + TOKEN)
        # Go's ascii.EqualFold, character by character: the ASCII letter in either case.
        wanted = all(
            got_char in (c.lower(), c.upper()) for got_char, c in zip(scheme, "basic ", strict=True)
        )
        assert (got is not None) == wanted, repr(scheme)
        assert got in (None, ("admin", "s3cret:with:colons"))
