"""A small Prometheus HTTP API client: instant and range queries, stdlib only.

Errors are :class:`PromError` with a one-line message (connection refused, HTTP status,
Prometheus' own error, a body that is not the API's JSON); callers print it, no traceback.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

MAX_BODY = 64 * 1024 * 1024  # a response bigger than this is not a report we can print


class PromError(Exception):
    """A query that gave no usable answer; the message is one line."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass
class PromClient:
    url: str
    timeout: float = 30.0
    ca_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    stats: list[dict[str, Any]] = field(default_factory=list)  # per-query stats, if asked
    want_stats: bool = False

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PromError(f"{self.url!r} is not an http(s):// URL")
        self.url = self.url.rstrip("/")

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https://"):
            return None
        try:
            return ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as err:
            raise PromError(f"CA file {self.ca_file}: {err}") from err

    def _get(self, path: str, params: dict[str, str]) -> Any:
        if self.want_stats:
            params = {**params, "stats": "all"}
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=urllib.parse.urlencode(params).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        if self.username is not None:
            token = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout, context=self._context()
            ) as response:
                body = response.read(MAX_BODY + 1)
        except urllib.error.HTTPError as err:
            raise PromError(f"{self.url}: HTTP {err.code} {err.reason}{_api_error(err)}") from err
        except urllib.error.URLError as err:
            raise PromError(f"{self.url}: cannot connect: {err.reason}") from err
        except (OSError, TimeoutError) as err:
            raise PromError(f"{self.url}: {err}") from err
        if len(body) > MAX_BODY:
            raise PromError(f"{self.url}: answer larger than {MAX_BODY} bytes")
        return _data(self.url, body, self.stats if self.want_stats else None)

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """An instant query; a vector (or a scalar, as one sample without labels)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        if data.get("resultType") == "scalar":
            return [Sample({}, _number(data["result"][1]))]
        if data.get("resultType") != "vector":
            raise PromError(f"{self.url}: {expr}: expected a vector, got {data.get('resultType')}")
        return [_sample(item) for item in data["result"]]

    def query_range(
        self, expr: str, start: float, end: float, step: float
    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        data = self._get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        try:
            return [
                (dict(item["metric"]), [(float(t), _number(v)) for t, v in item["values"]])
                for item in data["result"]
            ]
        except (KeyError, TypeError, ValueError) as err:
            raise PromError(f"{self.url}: malformed range result") from err


def _api_error(err: urllib.error.HTTPError) -> str:
    """Prometheus' own error text from an error response, shortened to one line."""
    try:
        text = json.loads(err.read(65536)).get("error", "")
    except (ValueError, AttributeError, OSError):
        return ""
    return f": {' '.join(str(text).split())[:300]}" if text else ""


def _data(url: str, body: bytes, stats: list[dict[str, Any]] | None) -> Any:
    try:
        answer = json.loads(body)
    except ValueError as err:
        raise PromError(f"{url}: answer is not JSON (not a Prometheus API?)") from err
    if not isinstance(answer, dict) or not isinstance(answer.get("data"), dict):
        if isinstance(answer, dict) and answer.get("status") == "error":
            raise PromError(f"{url}: {' '.join(str(answer.get('error')).split())[:300]}")
        raise PromError(f"{url}: answer is not the Prometheus API's JSON")
    if answer.get("status") != "success":
        raise PromError(f"{url}: {' '.join(str(answer.get('error')).split())[:300]}")
    data = answer["data"]
    if stats is not None and isinstance(data.get("stats"), dict):
        stats.append(data["stats"])
    return data


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError) as err:
        raise PromError(f"malformed sample value {str(value)[:40]!r}") from err


def _sample(item: Any) -> Sample:
    try:
        return Sample(dict(item["metric"]), _number(item["value"][1]))
    except (KeyError, TypeError, IndexError) as err:
        raise PromError("malformed vector sample") from err
