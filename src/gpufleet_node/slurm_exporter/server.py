"""The HTTP server: bounded connections, TLS, basic auth, /metrics from the snapshot."""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import select
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any, TypeVar, cast

from gpufleet_node import __version__
from gpufleet_node.exposition import Family, render
from gpufleet_node.slurm_exporter.collect import Collector
from gpufleet_node.slurm_exporter.shards import Selection, UnknownShard, parse_selection
from gpufleet_node.webconfig import Authenticator, WebConfig

_T = TypeVar("_T")
LOG = logging.getLogger("gpufleet_slurm_exporter")


INDEX_HTML = b"""<html><head><title>gpufleet Slurm exporter</title></head>
<body><h1>gpufleet Slurm exporter</h1><p><a href="/metrics">Metrics</a></p></body></html>
"""
# The HTTP server: a connection gets --web-read-timeout seconds in all for its TLS handshake,
# request line and headers, then --web-write-timeout for the whole response. At most
# --web-max-connections are open, --web-max-connections-per-address from one address; when
# a limit is reached, a new connection replaces the oldest one still waiting for its request,
# else the slowest answer, so neither idle clients nor slow readers lock a scrape out.
WEB_MAX_CONNECTIONS = 64
WEB_MAX_CONNECTIONS_PER_ADDRESS = 8
WEB_READ_TIMEOUT = 5.0
WEB_WRITE_TIMEOUT = 10.0  # Prometheus' default scrape timeout: a later answer is not used
# Seconds an answer runs before it may be replaced as the slowest: its first bytes fill the
# socket buffers at once, so its rate means something only after a while.
SLOW_WRITER_GRACE = 1.0
# Why a connection was closed before its answer was complete
# (slurm_exporter_http_connections_dropped_total{reason}).
DROP_REASONS = (
    "read_deadline",  # no complete request within --web-read-timeout
    "write_deadline",  # answer not taken within --web-write-timeout
    "reader_replaced",  # still waiting for its request when a limit was reached
    "slow_writer_replaced",  # the slowest answer when a limit was reached
    "full",  # refused: --web-max-connections open and none replaceable
    "address_limit",  # refused: its address's limit reached and none of its own replaceable
)
MAX_REQUEST_HEAD = 16384  # bytes of request line and headers
_POLL_SLICE = 0.25  # seconds a waiting connection thread sleeps between checks
_EVICTION_WAIT = 2.0  # seconds to wait for evicted connections to close: a loaded host is slow


def _request_head_end(buf: bytes) -> int:
    """Length of a complete request line + headers at the start of ``buf``, else 0."""
    ends = [i + n for i, n in ((buf.find(b"\r\n\r\n"), 4), (buf.find(b"\n\n"), 2)) if i >= 0]
    return min(ends) if ends else 0


class _Conn:
    """One accepted connection: its socket (non-blocking), deadline and phase.

    Every wait is sliced (_POLL_SLICE) so that the deadline and an eviction by the
    accepting thread take effect within a fraction of a second.
    """

    def __init__(self, sock: socket.socket, address: tuple[str, int], deadline: float) -> None:
        self.sock = sock
        self.address = address
        self.accepted = time.monotonic()
        self.deadline = deadline
        self.phase = "read"  # "read": handshake/request head; "write": answering
        self.write_started = self.accepted
        self.sent = 0  # bytes of the answer the kernel has taken
        self.evicted = False
        self.evicted_as = ""  # the drop reason an eviction gives
        self.dropped_as = ""  # set when a deadline (or an eviction seen in wait) ended it
        self.head = b""

    def start_writing(self, timeout: float) -> None:
        self.phase = "write"
        self.write_started = time.monotonic()
        self.deadline = self.write_started + timeout

    def evict(self) -> None:
        """Called by the accepting thread: end this connection as soon as possible."""
        self.evicted_as = "reader_replaced" if self.phase == "read" else "slow_writer_replaced"
        self.evicted = True
        with contextlib.suppress(OSError):  # wakes the connection's thread from its poll
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)

    def wait(self, for_write: bool) -> None:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLOUT if for_write else select.POLLIN)
        while True:
            if self.evicted:
                self.dropped_as = self.evicted_as
                raise TimeoutError("replaced by a newer connection")
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.dropped_as = f"{self.phase}_deadline"
                raise TimeoutError(f"{self.phase} deadline passed")
            if poller.poll(int(min(remaining, _POLL_SLICE) * 1000) + 1):
                return

    def handshake(self, context: ssl.SSLContext) -> None:
        tls = context.wrap_socket(self.sock, server_side=True, do_handshake_on_connect=False)
        self.sock = tls
        while True:
            try:
                tls.do_handshake()
                return
            except ssl.SSLWantReadError:
                self.wait(False)
            except ssl.SSLWantWriteError:
                self.wait(True)

    def _retry(self, blocked_for_write: bool, op: Callable[..., _T], *args: object) -> _T:
        """``op(*args)``, waiting each time the socket (or TLS) is not ready for it."""
        while True:
            try:
                return op(*args)
            except ssl.SSLWantReadError:
                self.wait(False)
            except ssl.SSLWantWriteError:
                self.wait(True)
            except BlockingIOError:
                self.wait(blocked_for_write)

    def recv(self, size: int) -> bytes:
        return self._retry(False, self.sock.recv, size)

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            sent = self._retry(True, self.sock.send, view)
            self.sent += sent
            view = view[sent:]

    def read_head(self) -> bytes | None:
        """The request line and headers, or None if the peer closed or sent too much."""
        buf = b""
        while len(buf) <= MAX_REQUEST_HEAD:
            chunk = self.recv(4096)
            if not chunk:
                return None
            buf += chunk
            end = _request_head_end(buf)
            if end:
                return buf[:end]
        return None


def send_rate(conn: _Conn, now: float) -> float:
    """Bytes per second the kernel has taken of ``conn``'s answer since it began."""
    return conn.sent / max(now - conn.write_started, 1e-6)


def replaceable(conns: Sequence[_Conn], now: float, grace: float) -> _Conn | None:
    """The connection a new one replaces when a limit is reached, or None.

    The oldest still waiting for its request; else the answer going out slowest once it has
    run ``grace`` seconds (a slow reader: the kernel takes nothing while its peer reads
    nothing). A client that reads keeps its slot against any that reads slower.
    """
    live = [c for c in conns if not c.evicted]
    readers = [c for c in live if c.phase == "read"]
    if readers:
        return min(readers, key=lambda c: c.accepted)
    writers = [c for c in live if now - c.write_started >= grace]
    return min(writers, key=lambda c: send_rate(c, now)) if writers else None


def wants_cluster_part(selection: Selection | None) -> bool:
    """Whether a scrape gets the series without a node label (the exporter's own among them)."""
    return selection is None or selection.cluster


class _ConnWriter(io.RawIOBase):
    """``wfile`` of a request: every write goes out within the connection's deadline."""

    def __init__(self, conn: _Conn) -> None:
        super().__init__()
        self._conn = conn

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._conn.sendall(bytes(data))
        return len(data)


def make_handler(
    collector: Collector, web: WebConfig, auth: Authenticator
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"gpufleet_slurm_exporter/{__version__}"

        def setup(self) -> None:
            # ``request`` is the _Conn whose request head the server has already read.
            conn: _Conn = self.request
            self.connection = conn.sock
            self.rfile = io.BytesIO(conn.head)
            self.wfile = _ConnWriter(conn)  # type: ignore[assignment]

        def do_GET(self) -> None:
            if not auth.allowed(self.headers.get_all("Authorization"), web.current().users):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="gpufleet"')
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", "13")
                self.end_headers()
                self.wfile.write(b"Unauthorized\n")
                return
            path, _, query = self.path.partition("?")
            if path == "/metrics":
                try:
                    selection = parse_selection(query)
                    body = (
                        collector.snapshot()
                        if selection is None
                        else collector.snapshot_for(selection)
                    )
                except ValueError as exc:
                    self._send(400, "text/plain; charset=utf-8", f"{exc}\n".encode())
                    return
                except UnknownShard as exc:
                    self._send(404, "text/plain; charset=utf-8", f"{exc}\n".encode())
                    return
                # Counted now, not at the last collection: appended, the body is not copied.
                server = cast(ExporterServer, self.server)
                own = server.http_metrics() if wants_cluster_part(selection) else b""
                self._send(200, "text/plain; version=0.0.4; charset=utf-8", body, own)
            elif path == "/":
                self._send(200, "text/html; charset=utf-8", INDEX_HTML)
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def _send(self, code: int, ctype: str, body: bytes, tail: bytes = b"") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body) + len(tail)))
            self.end_headers()
            self.wfile.write(body)
            if tail:
                self.wfile.write(tail)

        def log_message(self, format: str, *args: object) -> None:
            LOG.debug("%s " + format, self.address_string(), *args)

    return Handler


def parse_listen_address(addr: str) -> tuple[str, int]:
    """``:9341`` -> ("", 9341); ``127.0.0.1:9341``; ``[::1]:9341``."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"bad listen address {addr!r} (want host:port)")
    return host.strip("[]"), int(port)


def _fd_limit() -> int | None:
    try:
        import resource
    except ImportError:
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft > 0 else None


class ExporterServer(socketserver.TCPServer):
    """The HTTP server: one thread per connection, a bounded number of connections.

    The accepting thread only registers a connection; its thread does the TLS handshake and
    reads the request head within ``read_timeout`` seconds in all (a client that sends
    nothing, or a byte now and then, is dropped), then answers within ``write_timeout`` in
    all (a client that reads nothing, or a little now and then, is dropped). When
    ``max_connections`` are open, or ``max_connections_per_address`` from the new one's
    address, it replaces one of them (``replaceable``); if none is, the new one is closed.
    """

    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        web: WebConfig,
        max_connections: int = WEB_MAX_CONNECTIONS,
        read_timeout: float = WEB_READ_TIMEOUT,
        write_timeout: float = WEB_WRITE_TIMEOUT,
        max_connections_per_address: int = WEB_MAX_CONNECTIONS_PER_ADDRESS,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.web = web
        limit = _fd_limit()
        if limit is not None and 2 * max_connections + 32 > limit:
            clamped = max(1, (limit - 32) // 2)
            LOG.warning(
                "--web-max-connections %d lowered to %d: the open file limit is %d",
                max_connections,
                clamped,
                limit,
            )
            max_connections = clamped
        self.max_connections = max(1, max_connections)
        self.max_connections_per_address = max(1, max_connections_per_address)
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self._conns: set[_Conn] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, handler)

    def open_connections(self, phase: str | None = None) -> int:
        """Open connections, or only those in ``phase`` ("read" or "write")."""
        with self._conns_lock:
            return sum(1 for c in self._conns if phase is None or c.phase == phase)

    @property
    def refused(self) -> int:
        """New connections closed at once: nothing was replaceable."""
        with self._conns_lock:
            return self.dropped["full"] + self.dropped["address_limit"]

    def http_metrics(self) -> bytes:
        """The server's own counters, in exposition format."""
        family = Family(
            "slurm_exporter_http_connections_dropped_total",
            "counter",
            "HTTP connections closed before their answer was complete, by reason",
        )
        with self._conns_lock:
            for reason, count in self.dropped.items():
                family.set(count, reason=reason)
        return render([family]).encode()

    def _evict_oldest_reader(self) -> bool:
        readers = [c for c in self._conns if not c.evicted and c.phase == "read"]
        if not readers:
            return False
        min(readers, key=lambda c: c.accepted).evict()
        return True

    def _make_room(self, conn: _Conn) -> str:
        """Under the lock: "" when ``conn`` may be admitted (replacing one if need be), else
        the drop reason it is refused with."""
        live = [c for c in self._conns if not c.evicted]
        same_address = [c for c in live if c.address[0] == conn.address[0]]
        if len(same_address) >= self.max_connections_per_address:
            pool, refusal = same_address, "address_limit"
        elif len(live) >= self.max_connections:
            pool, refusal = live, "full"
        else:
            return ""
        victim = replaceable(pool, time.monotonic(), SLOW_WRITER_GRACE)
        if victim is None:
            return refusal
        victim.evict()
        return ""

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # free a descriptor, do not spin
                with self._conns_lock:
                    self._evict_oldest_reader()
                time.sleep(_POLL_SLICE)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        # Evicted connections end within milliseconds; open descriptors stay below twice
        # the limit. Should a burst reach that, wait a moment for them instead of refusing.
        give_up = time.monotonic() + _EVICTION_WAIT
        while True:
            with self._conns_lock:
                if len(self._conns) < 2 * self.max_connections or time.monotonic() > give_up:
                    break
            time.sleep(0.01)
        conn = _Conn(request, client_address, time.monotonic() + self.read_timeout)
        with self._conns_lock:
            refusal = "full" if len(self._conns) >= 2 * self.max_connections else ""
            refusal = refusal or self._make_room(conn)
            if refusal:
                self.dropped[refusal] += 1
            else:
                self._conns.add(conn)
        if refusal:
            LOG.debug("refused a connection from %s: %s", client_address[0], refusal)
            self.shutdown_request(request)
            return
        try:
            threading.Thread(target=self._serve, args=(conn,), name="http", daemon=True).start()
        except RuntimeError as exc:  # no thread to be had: drop this connection
            LOG.warning("cannot serve %s: %s", client_address[0], exc)
            with self._conns_lock:
                self._conns.discard(conn)
            self.shutdown_request(request)

    def _serve(self, conn: _Conn) -> None:
        try:
            conn.sock.setblocking(False)
            context = self.web.current().tls
            if context is not None:
                conn.handshake(context)
            head = conn.read_head()
            if head is None:
                return
            conn.head = head
            conn.start_writing(self.write_timeout)
            # typeshed wants the handler's own server type; any TCPServer subclass serves.
            self.RequestHandlerClass(conn, conn.address, self)  # type: ignore[arg-type]
        except (OSError, ValueError) as exc:  # timeouts, resets, broken pipes, TLS errors
            LOG.debug("connection from %s ended: %s", conn.address[0], exc or type(exc).__name__)
        except Exception as exc:
            LOG.error("request from %s failed: %r", conn.address[0], exc)
        finally:
            with self._conns_lock:
                self._conns.discard(conn)
                # An evicted connection mostly ends on its shut-down socket, not in wait().
                reason = conn.dropped_as or (conn.evicted_as if conn.evicted else "")
                if reason:
                    self.dropped[reason] += 1
            with contextlib.suppress(OSError):
                conn.sock.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        LOG.debug("connection from %s failed: %r", client_address[0], exc)


def make_server(
    addr: str,
    collector: Collector,
    web: WebConfig | None = None,
    max_connections: int = WEB_MAX_CONNECTIONS,
    read_timeout: float = WEB_READ_TIMEOUT,
    write_timeout: float = WEB_WRITE_TIMEOUT,
    max_connections_per_address: int = WEB_MAX_CONNECTIONS_PER_ADDRESS,
) -> ExporterServer:
    host, port = parse_listen_address(addr)
    web = web or WebConfig(None)
    return ExporterServer(
        (host, port),
        make_handler(collector, web, Authenticator()),
        web,
        max_connections=max_connections,
        read_timeout=read_timeout,
        write_timeout=write_timeout,
        max_connections_per_address=max_connections_per_address,
    )
