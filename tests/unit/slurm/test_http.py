"""The exporter's HTTP server under idle, slow and vanishing clients, over real sockets.

Reported: sockets had no timeout and every connection got a thread, so 129 idle connections
(open file limit 128) made scrapes fail with EMFILE; an unknown basic-auth user was answered
at once while a known one paid bcrypt; a password over 72 bytes raised in bcrypt >= 5; every
client disconnect logged a traceback.
"""

from __future__ import annotations

import base64
import logging
import resource
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from conftest import EXPORTER, FIXTURES, exp, wait_for, write_fake_slurm
from test_glue import start_exporter
from test_web import answered, client_context, get, hashed, pki, server_tls, write_config

from gpufleet_node.slurm_exporter import cli as cli_module
from gpufleet_node.slurm_exporter import server as server_module

BODY = b"slurm_up 1\n"
__all__ = ["pki"]  # the session's certificates (a fixture of test_web)


class Snapshot:
    def __init__(self, body: bytes = BODY) -> None:
        self.body = body

    def snapshot(self) -> bytes:
        return self.body


@pytest.fixture
def start(tmp_path) -> Iterator:
    """start(doc=None, body=BODY, **server options) -> (server, base URL)."""
    servers = []

    def run(doc: dict | None = None, body: bytes = BODY, **options):
        path = tmp_path / "web-config.json"
        if doc is not None:
            write_config(path, doc)
        web = exp.WebConfig(str(path) if doc is not None else None)
        server = exp.make_server("127.0.0.1:0", Snapshot(body), web, **options)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        scheme = "https" if web.current().tls else "http"
        return server, f"{scheme}://127.0.0.1:{server.server_address[1]}"

    yield run
    for server in servers:
        server.shutdown()
        server.server_close()


def idle(port: int, count: int, timeout: float = 5.0) -> list[socket.socket]:
    """``count`` connections that never send anything."""
    out = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        out.append(s)
    return out


def closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except OSError:  # a timeout (socket.timeout is no TimeoutError on Python 3.9)
        return False


def timed_get(url: str, *args) -> tuple[int, bytes, float]:
    begin = time.monotonic()
    code, body = get(url, *args)
    return code, body, time.monotonic() - begin


# --- idle and slow connections -------------------------------------------------------------


def test_idle_connections_do_not_block_a_scrape(start):
    server, base = start(max_connections=8, read_timeout=1.0)
    port = server.server_address[1]
    conns = idle(port, 40)
    try:
        code, body, took = timed_get(f"{base}/metrics")
        assert answered((code, body)) and took < 2.0
        # Open connections stay bounded, whatever the clients hold open.
        assert server.open_connections() <= 2 * server.max_connections
        # Idle ones are closed at their read deadline.
        assert closed_by_server(conns[-1], within=3.0)
        assert wait_for(lambda: server.open_connections() == 0)
    finally:
        for s in conns:
            s.close()


def test_a_slow_client_is_cut_at_the_read_deadline(start):
    server, base = start(read_timeout=1.0)
    s = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5)
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        begin = time.monotonic()
        cut = False
        # A byte arrives at least every 0.3 s: a timeout restarted on each read never cuts.
        while time.monotonic() - begin < 10:
            try:
                s.sendall(b"X")  # one header byte now and then: never a complete request
            except OSError:
                cut = True
                break
            if closed_by_server(s, within=0.3):
                cut = True
                break
        assert cut and time.monotonic() - begin < 6
        assert answered(get(f"{base}/metrics"))
    finally:
        s.close()


def test_an_oversized_request_head_is_dropped(start):
    server, base = start()
    s = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5)
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (exp.MAX_REQUEST_HEAD + 10))
        assert closed_by_server(s, within=3.0)
    finally:
        s.close()
    assert answered(get(f"{base}/metrics"))


def test_tls_clients_that_never_handshake_do_not_block(start, pki):
    server, base = start({"tls_server_config": server_tls(pki)}, max_connections=2, read_timeout=1)
    conns = idle(server.server_address[1], 10)
    try:
        code, body = get(f"{base}/metrics", context=client_context(pki))
        assert answered((code, body))
        assert closed_by_server(conns[-1], within=3.0)
    finally:
        for s in conns:
            s.close()


def test_a_full_server_refuses_then_replaces_the_slowest_answer(start, monkeypatch):
    """All slots taken by answers pending: a new connection is refused while they are young,
    and replaces the slowest once it has had its grace (issue 26 finding 1)."""
    big = b"x" * (64 * 1024 * 1024)  # far more than the loopback buffers hold
    server, base = start(body=big, max_connections=2, read_timeout=1.0)
    port = server.server_address[1]
    monkeypatch.setattr(server_module, "SLOW_WRITER_GRACE", 3600.0)
    readers = []
    for _ in range(2):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: small window
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")  # then never reads the answer
        readers.append(s)
    try:
        # Both must be answering: a connection still reading its head would be replaced.
        assert wait_for(lambda: server.open_connections(phase="write") == 2)
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        assert closed_by_server(s, within=3.0)  # refused: nobody to replace yet
        s.close()
        assert server.refused == 1 and server.dropped["full"] == 1
        monkeypatch.setattr(server_module, "SLOW_WRITER_GRACE", 0.0)
        assert get(f"{base}/")[0] == 200  # replaces one of the readers that read nothing
        # Counted when the replaced connection's thread ends, a moment after.
        assert wait_for(lambda: server.dropped["slow_writer_replaced"] == 1), server.dropped
        assert server.refused == 1
    finally:
        for s in readers:
            s.close()
    assert wait_for(lambda: server.open_connections() == 0)


def test_open_file_limit_of_the_exporter_process(tmp_path):
    """The reported setup: RLIMIT_NOFILE 128 and more idle connections than that."""
    bin_dir = write_fake_slurm(tmp_path / "bin", FIXTURES / "22.05")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    proc, port = start_exporter(
        [f"--slurm-bin-dir={bin_dir}", "--collect-interval=1", "--web-read-timeout=2"],
        preexec_fn=limit,
    )
    conns: list[socket.socket] = []
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        assert wait_for(lambda: _up(url), timeout=20)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
        conns = idle(port, 200, timeout=15)
        for _ in range(5):
            code, body, took = timed_get(url)
            assert code == 200 and b"slurm_up 1" in body and took < 8
    finally:
        for s in conns:
            s.close()
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert b"Traceback" not in err and b"Too many open files" not in err, err.decode()[-2000:]


def _up(url: str) -> bool:
    try:
        return get(url)[0] == 200
    except OSError:
        return False


# --- clients that go away ------------------------------------------------------------------


def test_a_client_that_disconnects_is_one_debug_line_at_most(start, caplog, capfd):
    big = b"x" * (16 * 1024 * 1024)
    server, base = start(body=big)
    caplog.set_level(logging.DEBUG, logger="gpufleet_slurm_exporter")
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        s.recv(1024)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # RST while the server writes 16 MB
    assert wait_for(lambda: server.open_connections() == 0)
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert all(r.exc_info is None for r in caplog.records)
    assert get(f"{base}/")[0] == 200


def test_tls_handshake_failures_are_quiet(start, pki, capfd, caplog):
    server, base = start({"tls_server_config": server_tls(pki)})
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")  # plain HTTP to the TLS port
        assert closed_by_server(s, within=3.0)
    assert "Traceback" not in capfd.readouterr().err
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert get(f"{base}/", context=client_context(pki))[0] == 200


# --- basic auth ----------------------------------------------------------------------------


def _auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_an_unknown_user_costs_a_bcrypt_check_too(start, monkeypatch):
    real_hash = hashed("s3cret-scrape")
    checked: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed_password: bytes) -> bool:
        checked.append(hashed_password)
        return real(password, hashed_password)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    _, base = start({"basic_auth_users": {"prometheus": real_hash}})
    assert get(f"{base}/metrics", "nobody", "s3cret-scrape")[0] == 401
    assert get(f"{base}/metrics", "prometheus", "wrong")[0] == 401
    assert len(checked) == 2
    dummy, real_checked = checked
    assert real_checked == real_hash.encode()
    assert dummy != real_hash.encode() and dummy[:7] == real_hash.encode()[:7]  # same cost
    # No header, no "user:password" separator: no user name to leak, no check needed.
    assert get(f"{base}/metrics")[0] == 401


def test_unknown_and_known_users_take_about_as_long(start):
    """bcrypt cost 10 (what the role uses): ~50 ms a check; an unknown user must not be quick."""
    known = bcrypt.hashpw(b"s3cret-scrape", bcrypt.gensalt(rounds=10)).decode()
    _, base = start({"basic_auth_users": {"prometheus": known}})
    url = f"{base}/metrics"
    get(url, "nobody", "x")  # the dummy hash is made on first use

    # Interleaved, so that a change of the machine's load hits both alike.
    times: dict[str, list[float]] = {"prometheus": [], "nobody": []}
    for _ in range(7):
        for user in times:
            times[user].append(timed_get(url, user, "wrong-password")[2])
    t_known, t_unknown = (statistics.median(times[user]) for user in ("prometheus", "nobody"))
    assert t_unknown > 0.5 * t_known, (t_known, t_unknown)


def test_a_password_over_72_bytes_is_a_failed_login(start, capfd, caplog):
    user_hash = hashed("s3cret-scrape")
    _, base = start({"basic_auth_users": {"prometheus": user_hash}})
    for user in ("prometheus", "nobody"):
        assert get(f"{base}/metrics", user, "p" * 73)[0] == 401
        assert get(f"{base}/metrics", user, "é" * 40)[0] == 401  # 80 bytes, 40 characters
    assert answered(get(f"{base}/metrics", "prometheus", "s3cret-scrape"))
    assert "Traceback" not in capfd.readouterr().err
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_authenticator_never_raises_on_odd_input():
    auth = exp.Authenticator()
    users = {"u": hashed("pw"), "v": "$2b$04$notavalidhashatall"}
    for header in (
        None,
        "",
        "Bearer x",
        "Basic !!!",
        "Basic " + base64.b64encode(b"\xff\xfe:x").decode(),
        _auth("u", "a\x00b"),
        _auth("v", "pw"),
        _auth("u", "x" * 1000),
        _auth("", ""),
        "Basic " + base64.b64encode(b"nocolon").decode(),
    ):
        assert auth.allowed(header, users) is False
    assert auth.allowed(_auth("u", "pw"), users) is True


def test_tls_and_auth_survive_many_idle_clients(start, pki):
    doc = {"tls_server_config": server_tls(pki), "basic_auth_users": {"p": hashed("pw")}}
    server, base = start(doc, max_connections=4, read_timeout=1.0)
    conns = idle(server.server_address[1], 12)
    try:
        ctx = client_context(pki)
        assert answered(get(f"{base}/metrics", "p", "pw", ctx))
        assert get(f"{base}/metrics", "p", "nope", ctx)[0] == 401
    finally:
        for s in conns:
            s.close()


def test_server_options_come_from_the_command_line():
    parser_help = subprocess.run(
        [sys.executable, str(EXPORTER), "--help"], capture_output=True, text=True, timeout=30
    ).stdout
    for flag in (
        "--web-max-connections",
        "--web-read-timeout",
        "--web-write-timeout",
        "--web-max-connections-per-address",
        "--max-gpu-index-series",
        "--job-source",
    ):
        assert flag in parser_help


def test_the_write_deadline_and_address_limit_reach_the_server(monkeypatch):
    seen: dict = {}

    def make_server(addr, collector, web, **options):
        seen.update(options)
        raise ValueError("stop before serving")

    monkeypatch.setattr(cli_module, "make_server", make_server)
    argv = ["--web-write-timeout=3", "--web-max-connections-per-address=2"]
    assert cli_module.main([*argv, "--listen-address=127.0.0.1:0"]) == 2
    assert seen["write_timeout"] == 3.0 and seen["max_connections_per_address"] == 2


def test_ssl_module_is_not_required_for_plain_http(start):
    # The plain path never touches ssl objects (a sanity check of the non-TLS branch).
    _, base = start()
    assert base.startswith("http://") and get(f"{base}/")[0] == 200
    assert isinstance(ssl.PROTOCOL_TLS_SERVER, int)
    assert Path(EXPORTER).exists()
