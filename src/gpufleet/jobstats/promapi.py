"""A small Prometheus HTTP API client: instant and range queries, stdlib only.

Errors are :class:`PromError` with a one-line message (connection refused, HTTP status,
Prometheus' own error, a body that is not the API's JSON); callers print it, no traceback.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

# One way to ask over HTTP for every gpufleet client (one deadline, a size bound), and
# one reading of Prometheus' error answers, shared with the node package's epilog.
from gpufleet_node.httpclient import FetchError, fetch, one_line
from gpufleet_node.job_summary.prom import api_error


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
    ca_data: str | None = None  # PEM, e.g. the inventory's prometheus_tls_ca
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    stats: list[dict[str, Any]] = field(default_factory=list)  # per-query stats, if asked
    want_stats: bool = False

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PromError(f"{self.url[:200]!r} is not an http(s):// URL")
        if "@" in parsed.netloc:
            # It would be printed in every message: credentials go by --user.
            raise PromError("a Prometheus URL carries no user or password (use --user)")
        self.url = self.url.rstrip("/")

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https://"):
            return None
        try:
            return ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        except (OSError, ssl.SSLError) as err:
            where = f"CA file {self.ca_file}" if self.ca_file else "the inventory's CA"
            raise PromError(f"{where}: {one_line(str(err))}") from err

    def _get(self, path: str, params: dict[str, str]) -> Any:
        """The API's ``data`` for a POSTed query, within ``timeout`` seconds in all."""
        if self.want_stats:
            params = {**params, "stats": "all"}
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if self.username is not None:
            token = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        data = urllib.parse.urlencode(params).encode()
        try:
            answer = fetch(f"{self.url}{path}", self.timeout, data, headers, self._context())
        except FetchError as err:
            raise PromError(f"{self.url}: {err}") from err
        if not answer.ok:
            raise PromError(f"{self.url}: {api_error(answer)}")
        return _data(self.url, answer.body, self.stats if self.want_stats else None)

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """An instant query; a vector (or a scalar, as one sample without labels)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        kind, result = data.get("resultType"), data.get("result")
        if kind == "scalar" and isinstance(result, list) and len(result) == 2:
            return [Sample({}, _number(result[1]))]
        if kind != "vector" or not isinstance(result, list):
            raise PromError(f"{self.url}: expected a vector, got {one_line(str(kind), 40)}")
        return [_sample(item) for item in result]

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


def _data(url: str, body: bytes, stats: list[dict[str, Any]] | None) -> Any:
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError) as err:
        raise PromError(f"{url}: answer is not JSON (not a Prometheus API?)") from err
    if not isinstance(answer, dict) or not isinstance(answer.get("data"), dict):
        if isinstance(answer, dict) and answer.get("status") == "error":
            raise PromError(f"{url}: {one_line(str(answer.get('error')))}")
        raise PromError(f"{url}: answer is not the Prometheus API's JSON")
    if answer.get("status") != "success":
        raise PromError(f"{url}: {one_line(str(answer.get('error')))}")
    data = answer["data"]
    if stats is not None and isinstance(data.get("stats"), dict):
        stats.append(data["stats"])
    return data


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError) as err:
        raise PromError(f"malformed sample value {one_line(str(value), 40)!r}") from err


def _sample(item: Any) -> Sample:
    try:
        labels = item["metric"]
        if not isinstance(labels, dict):
            raise TypeError("labels")
        # Label values are strings in the API; anything else is not a Prometheus answer.
        clean = {str(k): v for k, v in labels.items() if isinstance(v, str)}
        if len(clean) != len(labels):
            raise TypeError("label value")
        return Sample(clean, _number(item["value"][1]))
    except (KeyError, TypeError, IndexError) as err:
        raise PromError("malformed vector sample") from err
