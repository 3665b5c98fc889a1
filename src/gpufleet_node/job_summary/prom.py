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
import urllib.parse
from dataclasses import dataclass, field

# One way to ask over HTTP (one deadline, a size bound) for every gpufleet client.
from gpufleet_node.httpclient import Answer, FetchError, fetch, one_line

Sample = tuple[dict[str, str], float]

__all__ = ["PromClient", "PromError", "Sample", "api_error", "one_line"]


class PromError(Exception):
    """A query that gave no usable answer; the message is one line."""


def api_error(answer: Answer) -> str:
    """A failed answer as one line: its status, and Prometheus' own error text if any
    (Prometheus answers 400, 422 and 503 with a JSON body that says why)."""
    line = f"HTTP {answer.status} {answer.reason}".rstrip()
    try:
        text = json.loads(answer.body).get("error", "")
    except (ValueError, AttributeError, RecursionError):
        return line
    return f"{line}: {one_line(str(text))}" if text else line


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

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https://"):
            return None
        try:
            return ssl.create_default_context(cafile=self.ca_file or None)
        except (OSError, ssl.SSLError) as err:
            raise PromError(f"CA file {self.ca_file}: {one_line(str(err))}") from err

    def query(self, expr: str, at: float) -> list[Sample]:
        """An instant query's vector as (labels, value) pairs."""
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if self.username:
            token = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        data = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"}).encode()
        try:
            answer = fetch(f"{self.url}/api/v1/query", self.timeout, data, headers, self._context())
        except FetchError as err:
            raise PromError(f"{self.url}: {err}") from err
        if not answer.ok:
            raise PromError(f"{self.url}: {api_error(answer)}")
        return _vector(self.url, answer.body)


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
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as err:
        raise PromError(f"{url}: answer is not the Prometheus API's JSON") from err
