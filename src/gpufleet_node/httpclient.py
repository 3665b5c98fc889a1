"""One HTTP exchange with one deadline and a size bound: what every gpufleet client uses.

``fetch`` answers within ``timeout`` seconds of being called, whatever the server does:
the name lookup, connecting, the TLS handshake, the request, the status line and headers
(dripped a byte at a time or not), and the body of any status (a 503's too) all count
against the same deadline. A socket timeout cannot do that (it bounds one read), so the
exchange runs in a daemon thread; at the deadline the caller stops waiting and shuts the
socket down, which ends the thread's read at once. The body is read to ``max_body`` bytes
and no further. Redirects are not followed (a 3xx is a status like any other: following
it would send the Authorization header to another host), and no proxy is used.

Standard library only, Python 3.9: the slurmctld epilog's zipapp carries this module.
Errors are :class:`FetchError` with one line; callers put the URL in front.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_BODY = 8 * 1024 * 1024  # bytes of a response body read; more is an error
CHUNK = 64 * 1024


class FetchError(Exception):
    """No complete answer within the deadline and the size bound; one line."""


@dataclass(frozen=True)
class Answer:
    """A complete response: any status, its whole body (at most ``max_body`` bytes)."""

    status: int
    reason: str
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def one_line(text: str, limit: int = 200) -> str:
    """A peer's text for a one-line message: no control characters, bounded."""
    flat = " ".join(text.split())
    return "".join(ch if ch.isprintable() else "?" for ch in flat)[:limit]


@dataclass
class _Exchange:
    """What the caller and the exchange's thread share."""

    conn: http.client.HTTPConnection | None = None
    answer: Answer | None = None
    error: BaseException | None = None
    connected: bool = False
    expired: threading.Event = field(default_factory=threading.Event)

    def expire(self) -> None:
        """The deadline passed: end the thread's wait on the socket, if it has one."""
        self.expired.set()
        sock = self.conn.sock if self.conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):  # the plain socket's call, TLS or not
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _connection(
    url: str, timeout: float, context: ssl.SSLContext | None
) -> tuple[http.client.HTTPConnection, str]:
    """(an unconnected connection, the request target) for an http(s) URL."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or "@" in parts.netloc:
        raise FetchError("not an http(s):// URL without credentials")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        if parts.scheme == "https":
            context = context or ssl.create_default_context()
            return http.client.HTTPSConnection(
                parts.netloc, timeout=timeout, context=context
            ), target
        return http.client.HTTPConnection(parts.netloc, timeout=timeout), target
    except (http.client.InvalidURL, ValueError) as err:
        raise FetchError(f"bad address: {one_line(str(err))}") from err


def read_body(response: http.client.HTTPResponse, deadline: float, max_body: int) -> bytes:
    """The body, up to ``max_body`` bytes (FetchError past it), before ``deadline``."""
    parts: list[bytes] = []
    size = 0
    while size <= max_body:
        if time.monotonic() > deadline:
            raise TimeoutError("the deadline passed")
        # read1: what has come, so that a dripping server meets the deadline check.
        part = response.read1(min(CHUNK, max_body + 1 - size))
        if not part:
            return b"".join(parts)
        parts.append(part)
        size += len(part)
    raise FetchError(f"answer larger than {max_body} bytes")


def _exchange(
    state: _Exchange,
    conn: http.client.HTTPConnection,
    request: tuple[str, str, bytes | None, Mapping[str, str]],
    deadline: float,
    max_body: int,
) -> None:
    """The exchange's thread: the whole request and response, into ``state``."""
    method, target, data, headers = request
    try:
        conn.connect()
        state.connected = True
        if state.expired.is_set():
            return
        conn.request(method, target, body=data, headers={**headers, "Connection": "close"})
        response = conn.getresponse()
        body = read_body(response, deadline, max_body)
        state.answer = Answer(response.status, one_line(response.reason or "", 80), body)
    except BaseException as err:  # handed to the caller, which describes it
        state.error = err
    finally:
        conn.close()


def describe(err: BaseException, connected: bool, timeout: float) -> str:
    """One line for what ended an exchange."""
    if isinstance(err, FetchError):
        return str(err)
    if isinstance(err, (socket.timeout, TimeoutError)):
        return f"timeout: no complete answer in {timeout:g} s"
    if isinstance(err, http.client.HTTPException):
        return f"not an HTTP answer: {one_line(type(err).__name__ + ' ' + str(err))}"
    if isinstance(err, ssl.SSLError) or not connected:
        return f"cannot connect: {one_line(str(err) or type(err).__name__)}"
    return f"connection lost: {one_line(str(err) or type(err).__name__)}"


def fetch(
    url: str,
    timeout: float,
    data: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    max_body: int = MAX_BODY,
) -> Answer:
    """GET ``url`` (POST when ``data`` is given): its complete answer, of any status,
    within ``timeout`` seconds in all; FetchError (one line) otherwise."""
    deadline = time.monotonic() + timeout
    conn, target = _connection(url, timeout, context)
    state = _Exchange(conn=conn)
    request = ("POST" if data is not None else "GET", target, data, dict(headers or {}))
    worker = threading.Thread(
        target=_exchange, args=(state, conn, request, deadline, max_body), daemon=True
    )
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    if worker.is_alive():
        state.expire()
        raise FetchError(f"timeout: no complete answer in {timeout:g} s")
    if state.error is not None:
        raise FetchError(describe(state.error, state.connected, timeout)) from state.error
    assert state.answer is not None
    return state.answer
