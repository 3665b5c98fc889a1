"""A minimal Prometheus instant-query client (stdlib, Python 3.9).

The controller's ``gpufleet.jobstats.promapi`` does the same for ``gpufleet jobstats``;
this one ships to the Slurm controller inside the zipapp, which carries no controller
code. Errors are :class:`PromError` with one line.
"""

from __future__ import annotations

import base64
import json
import math
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

MAX_BODY = 8 * 1024 * 1024
CHUNK = 64 * 1024

Sample = tuple[dict[str, str], float]


class PromError(Exception):
    """A query that gave no usable answer; the message is one line."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: urllib would resend the basic-auth header to its target."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return "".join(ch if ch.isprintable() else "?" for ch in flat)[:limit]


@dataclass
class PromClient:
    url: str
    timeout: float = 20.0
    ca_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc or "@" in parsed.netloc:
            raise PromError(f"{self.url[:200]!r} is not an http(s):// URL without credentials")
        self.url = self.url.rstrip("/")

    def _opener(self) -> urllib.request.OpenerDirector:
        handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
        if self.url.startswith("https://"):
            try:
                context = ssl.create_default_context(cafile=self.ca_file or None)
            except (OSError, ssl.SSLError) as err:
                raise PromError(f"CA file {self.ca_file}: {one_line(str(err))}") from err
            handlers.append(urllib.request.HTTPSHandler(context=context))
        return urllib.request.build_opener(*handlers)

    def query(self, expr: str, at: float) -> list[Sample]:
        """An instant query's vector as (labels, value) pairs."""
        request = urllib.request.Request(
            f"{self.url}/api/v1/query",
            data=urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"}).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        if self.username:
            token = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        deadline = time.monotonic() + self.timeout
        try:
            with self._opener().open(request, timeout=self.timeout) as response:
                body = _read_until(response, deadline)
        except urllib.error.HTTPError as err:
            raise PromError(f"{self.url}: HTTP {err.code} {one_line(str(err.reason), 80)}") from err
        except urllib.error.URLError as err:
            raise PromError(f"{self.url}: cannot connect: {one_line(str(err.reason))}") from err
        except OSError as err:  # timeouts included
            raise PromError(f"{self.url}: {one_line(str(err))}") from err
        return _vector(self.url, body)


def _read_until(response: Any, deadline: float) -> bytes:
    parts: list[bytes] = []
    size = 0
    while size <= MAX_BODY:
        if time.monotonic() > deadline:
            raise TimeoutError("the answer took longer than the timeout")
        # read1: what has come, not a full chunk, so a server that drips a byte at a time
        # meets the deadline here (each recv is bounded by the socket timeout).
        part = response.read1(min(CHUNK, MAX_BODY + 1 - size))
        if not part:
            break
        parts.append(part)
        size += len(part)
    if size > MAX_BODY:
        raise OSError(f"answer larger than {MAX_BODY} bytes")
    return b"".join(parts)


def _vector(url: str, body: bytes) -> list[Sample]:
    try:
        answer = json.loads(body)
        if answer.get("status") != "success":
            raise PromError(f"{url}: {one_line(str(answer.get('error')))}")
        data = answer["data"]
        if data["resultType"] != "vector":
            raise PromError(f"{url}: expected a vector")
        samples = []
        for item in data["result"]:
            labels = item["metric"]
            if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
                raise TypeError("labels")
            value = float(item["value"][1])
            if math.isfinite(value):
                samples.append(({str(k): v for k, v in labels.items()}, value))
        return samples
    except PromError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        raise PromError(f"{url}: answer is not the Prometheus API's JSON") from err
