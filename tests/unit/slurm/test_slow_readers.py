"""Slow readers of the exporter's answers, over real sockets (issue 26 finding 1).

Reported: 64 clients that send ``GET /metrics`` with a small receive buffer and never read
held every connection slot for the whole write deadline, so three scrapes in a row got no
answer. Here the body is 8 MiB (far more than loopback buffers hold with a 4 KiB receive
window) and the write deadline is short, so the tests take seconds.
"""

from __future__ import annotations

import socket
import threading
import time
import types
from collections.abc import Iterator

import pytest
from conftest import exp, metric_samples, wait_for

BODY = b"slurm_up 1\n" + b"# padding to make the answer large\n" * (8 * 1024 * 1024 // 34)
WRITE_TIMEOUT = 3.0
SLOW_READERS = 64
SCRAPE_BOUND = 5.0  # seconds for a whole 8 MiB scrape on a loaded two-core machine


class Snapshot:
    def snapshot(self) -> bytes:
        return BODY


@pytest.fixture
def server() -> Iterator:
    srv = exp.make_server(
        "127.0.0.1:0", Snapshot(), None, max_connections=64, write_timeout=WRITE_TIMEOUT
    )
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def slow_reader(port: int, source: str) -> socket.socket:
    """A client that asks for /metrics with a 4 KiB receive buffer and never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: small window
    s.settimeout(5)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    return s


def scrape(port: int, source: str = "127.0.0.1", path: str = "/metrics") -> tuple[bytes, bytes]:
    """(status line, body) of one GET read to its end, as Prometheus reads it."""
    with socket.create_connection(
        ("127.0.0.1", port), timeout=SCRAPE_BOUND, source_address=(source, 0)
    ) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        chunks = []
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0], body


def drops(srv) -> dict[str, float]:
    """slurm_exporter_http_connections_dropped_total by reason, as a scrape reads it."""
    _, body = scrape(srv.server_address[1])
    m = metric_samples(body.decode())
    name = "slurm_exporter_http_connections_dropped_total"
    return {reason: m[f'{name}{{reason="{reason}"}}'] for reason in exp.DROP_REASONS}


def hold_and_scrape(srv, sources: list[str]) -> None:
    """64 slow readers from ``sources`` hold; three scrapes in a row get the whole body."""
    port = srv.server_address[1]
    readers = [slow_reader(port, sources[i % len(sources)]) for i in range(SLOW_READERS)]
    try:
        held = min(SLOW_READERS, len(sources) * srv.max_connections_per_address)
        assert wait_for(lambda: srv.open_connections(phase="write") >= held, timeout=10.0)
        time.sleep(1.2)  # past the grace a new answer gets before it may be replaced
        for _ in range(3):
            begin = time.monotonic()
            status, body = scrape(port, "127.0.0.1")
            took = time.monotonic() - begin
            assert status.endswith(b" 200 OK") and body.startswith(BODY), (status, len(body))
            assert took < SCRAPE_BOUND
        # Whatever was not replaced is cut at the write deadline, while the readers still
        # hold their sockets open and read nothing.
        assert wait_for(lambda: srv.open_connections() == 0, timeout=WRITE_TIMEOUT + 5.0)
    finally:
        for s in readers:
            s.close()


def test_slow_readers_from_one_address_do_not_lock_prometheus_out(server):
    """The finding as reported: every client on one host, Prometheus there too."""
    hold_and_scrape(server, ["127.0.0.1"])
    counted = drops(server)
    assert sum(counted.values()) >= SLOW_READERS  # every slow reader, one way or another
    assert counted["slow_writer_replaced"] >= 1  # the first scrape took a slow one's slot


def test_slow_readers_from_many_addresses_do_not_lock_prometheus_out(server):
    """No address limit applies: the slowest answers make room for the new scrapes."""
    hold_and_scrape(server, [f"127.0.1.{i}" for i in range(1, SLOW_READERS + 1)])
    counted = drops(server)
    assert counted["slow_writer_replaced"] >= 1  # the first scrape took a slow one's slot
    # Every slow reader got a slot (one per address) and lost it to a scrape or at the
    # write deadline; nothing else was dropped.
    assert counted["slow_writer_replaced"] + counted["write_deadline"] == SLOW_READERS
    assert sum(counted.values()) == SLOW_READERS


def test_a_slow_reader_is_cut_at_the_write_deadline(server):
    port = server.server_address[1]
    s = slow_reader(port, "127.0.0.1")
    try:
        begin = time.monotonic()
        assert wait_for(lambda: server.open_connections(phase="write") == 1, timeout=10.0)
        assert wait_for(lambda: server.open_connections() == 0, timeout=WRITE_TIMEOUT + 5.0)
        assert WRITE_TIMEOUT - 0.5 < time.monotonic() - begin < WRITE_TIMEOUT + 5.0
    finally:
        s.close()
    assert drops(server)["write_deadline"] == 1


def test_every_drop_reason_is_exported_from_the_start(server):
    assert drops(server) == dict.fromkeys(exp.DROP_REASONS, 0.0)


def conn(phase: str, accepted: float, write_started: float = 0.0, sent: int = 0):
    """What ``replaceable`` reads of a connection."""
    return types.SimpleNamespace(
        phase=phase, accepted=accepted, write_started=write_started, sent=sent, evicted=False
    )


def test_replaceable_takes_the_oldest_reader_then_the_slowest_answer_past_its_grace():
    now = 100.0
    fast = conn("write", 90.0, 90.0, 80_000_000)  # 8 MB/s
    slow = conn("write", 90.0, 90.0, 200_000)  # a slow reader: 20 kB/s
    young = conn("write", 99.9, 99.9, 0)  # has not had its grace yet
    reader_old, reader_new = conn("read", 95.0), conn("read", 99.0)
    pick = exp.replaceable
    assert pick([fast, slow, young, reader_new, reader_old], now, 1.0) is reader_old
    assert pick([fast, slow, young], now, 1.0) is slow
    assert pick([fast, young], now, 1.0) is fast  # the slowest of those past their grace
    assert pick([young], now, 1.0) is None  # nothing to replace: the new one is refused
    slow.evicted = True
    assert pick([slow, young], now, 1.0) is None  # already on its way out


def test_a_client_that_reads_keeps_its_slot_against_one_that_does_not():
    """Both answers past their grace, the server full: the new scrape replaces the reader
    that reads nothing, not the one reading steadily (if slowly)."""
    srv = exp.make_server("127.0.0.1:0", Snapshot(), None, max_connections=2, write_timeout=30)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    hurry = threading.Event()
    received: list[bytes] = []

    def steady_reader() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            while chunk := s.recv(16384):
                received.append(chunk)
                if not hurry.is_set():
                    time.sleep(0.01)  # about 1.6 MB/s until told to hurry

    reading = threading.Thread(target=steady_reader)
    reading.start()
    stalled = slow_reader(port, "127.0.0.1")
    try:
        assert wait_for(lambda: srv.open_connections(phase="write") == 2, timeout=10.0)
        time.sleep(1.5)  # both past their grace
        status, body = scrape(port)
        assert status.endswith(b" 200 OK") and body.startswith(BODY)
        # Counted when the replaced connection's thread ends, a moment after.
        assert wait_for(lambda: srv.dropped["slow_writer_replaced"] == 1, timeout=10.0), srv.dropped
        assert srv.refused == 0
        hurry.set()
        reading.join(timeout=20)
        whole = b"".join(received).partition(b"\r\n\r\n")[2]
        assert whole.startswith(BODY)  # the steady reader got its whole answer
    finally:
        hurry.set()
        stalled.close()
        reading.join(timeout=20)
        srv.shutdown()
        srv.server_close()
