"""The Authorization header as RFC 7235/7617 write it: the scheme is case-insensitive.

Issue 26 finding 4: ``authorization: basic ...`` was refused. The class: the header is
parsed by its grammar (scheme token, 1*SP, token68), not by one spelling of it. Checked
on the parser (a seeded property test over spellings) and on the wire (the exporter's
own server, raw requests, so no client library normalises the header first).
"""

from __future__ import annotations

import base64
import random
import socket
import threading
from collections.abc import Iterator

import bcrypt
import pytest

from gpufleet_node.slurm_exporter.server import make_server
from gpufleet_node.webconfig import Authenticator, WebConfig, basic_credentials

TOKEN = base64.b64encode(b"prometheus:s3cret").decode()
NO_COLON = base64.b64encode(b"no-colon").decode()
NOT_UTF8 = base64.b64encode(b"user:\xff").decode()


@pytest.mark.parametrize(
    "header",
    [
        f"Basic {TOKEN}",
        f"basic {TOKEN}",
        f"BASIC {TOKEN}",
        f"bAsIc {TOKEN}",
        f"Basic   {TOKEN}",
        f"  Basic {TOKEN}\t",
    ],
)
def test_every_spelling_of_the_scheme_is_basic(header: str) -> None:
    assert basic_credentials(header) == ("prometheus", "s3cret")


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Basic",
        f"Basic{TOKEN}",
        f"Basicx {TOKEN}",
        f"Bearer {TOKEN}",
        f"ba\u017fic {TOKEN}",  # LATIN SMALL LETTER LONG S: "s" only under Unicode folding
        f"Basic {TOKEN} extra",
        "Basic !!!!",
        f"Basic {NO_COLON}",
        f"Basic {NOT_UTF8}",  # not UTF-8
        [f"Basic {TOKEN}", f"Basic {TOKEN}"],  # two headers: ambiguous
        [],
    ],
)
def test_what_is_not_one_basic_credential_is_refused(header: object) -> None:
    assert basic_credentials(header) is None  # type: ignore[arg-type]


def test_property_scheme_case_and_spacing_do_not_matter() -> None:
    """Seeded: any ASCII case of "basic", any run of spaces (and tabs around), any user and
    password without a colon in the user; a scheme that is not "basic" never logs in."""
    rng = random.Random(26_4)
    for _ in range(500):
        scheme = "".join(rng.choice((c.lower(), c.upper())) for c in "basic")
        user = "".join(rng.choice("abcXYZ09_-.é") for _ in range(rng.randint(0, 8)))
        password = "".join(rng.choice("ab:c d\té€") for _ in range(rng.randint(0, 12)))
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        header = " " * rng.randint(0, 2) + scheme + " " * rng.randint(1, 3) + token
        assert basic_credentials(header + "\t" * rng.randint(0, 1)) == (user, password)
        other = "".join(rng.choice("abcisxyz") for _ in range(rng.randint(1, 6)))
        if other.lower() != "basic":
            assert basic_credentials(f"{other} {token}") is None


def test_the_authenticator_takes_a_lowercase_scheme() -> None:
    users = {"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()}
    auth = Authenticator()
    assert auth.allowed(f"basic {TOKEN}", users)
    assert auth.allowed([f"BASIC {TOKEN}"], users)
    assert not auth.allowed([f"basic {TOKEN}", f"basic {TOKEN}"], users)


class Snapshot:
    def snapshot(self) -> bytes:
        return b"slurm_up 1\n"


@pytest.fixture
def exporter(tmp_path) -> Iterator[int]:
    path = tmp_path / "web-config.json"
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    path.write_text(f'{{"basic_auth_users": {{"prometheus": "{hashed}"}}}}')
    server = make_server("127.0.0.1:0", Snapshot(), WebConfig(str(path)))  # type: ignore[arg-type]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def raw_get(port: int, *auth_lines: str) -> bytes:
    """The status line of a GET /metrics with these header lines, sent as written."""
    head = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    head += "".join(f"{line}\r\n" for line in auth_lines) + "\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode())
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


@pytest.mark.parametrize(
    ("lines", "status"),
    [
        ((f"Authorization: Basic {TOKEN}",), b"200"),
        ((f"authorization: basic {TOKEN}",), b"200"),  # finding 4
        ((f"AUTHORIZATION: BASIC  {TOKEN}",), b"200"),
        ((f"Authorization: Basic {TOKEN}", f"Authorization: Basic {TOKEN}"), b"401"),
        ((f"Authorization: Bearer {TOKEN}",), b"401"),
        ((), b"401"),
    ],
)
def test_the_exporter_reads_the_header_by_its_grammar(
    exporter: int, lines: tuple[str, ...], status: bytes
) -> None:
    assert raw_get(exporter, *lines).split(b" ")[1] == status
