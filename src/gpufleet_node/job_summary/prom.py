"""The one Prometheus HTTP API client: instant and range queries (stdlib, Python 3.9).

The slurmctld epilog (this package, shipped in a zipapp that carries no controller code)
and ``gpufleet jobstats`` / ``gpufleet report idle`` (the controller's
``gpufleet.jobstats``) both ask Prometheus through it.

- Each query is one POST through :func:`gpufleet_node.httpclient.fetch`: ``timeout``
  seconds for the whole exchange, a bounded body, no redirects (the Authorization header
  stays with the host it was meant for), no proxy.
- The answer is read strictly: a body that is not the API's JSON, a result of another
  type than asked, a label value that is not a string, a sample value that is not the
  API's string of a number is an error, never a partial answer.
- Values come back as Prometheus gives them, NaN and +/-Inf included: the callers take
  them through :mod:`gpufleet_node.numbers` (non-finite is no figure), and
  ``gpufleet report idle`` counts the ones it leaves out.
- Errors are :class:`PromError` with one line, the URL first; a URL with a user or
  password in it is refused (it would be printed in every message).
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# One way to ask over HTTP (one deadline, a size bound) for every gpufleet client.
from gpufleet_node.httpclient import Answer, FetchError, fetch, one_line

__all__ = ["PromClient", "PromError", "Sample", "Series", "api_error"]


class PromError(Exception):
    """A query that gave no usable answer; the message is one line."""


class Sample(NamedTuple):
    """One element of an instant vector (a scalar is one without labels)."""

    labels: dict[str, str]
    value: float


class Series(NamedTuple):
    """One series of a range query: its labels and its (time, value) points."""

    labels: dict[str, str]
    values: list[tuple[float, float]]


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
    timeout: float = 30.0  # seconds per query, the whole exchange
    ca_file: str | None = None
    ca_data: str | None = None  # PEM, e.g. the inventory's prometheus_tls_ca
    username: str | None = None  # None or "": no basic auth
    password: str | None = field(default=None, repr=False)
    stats: list[dict[str, Any]] = field(default_factory=list)  # per-query stats, if asked
    want_stats: bool = False

    def __post_init__(self) -> None:
        if "@" in self.url:
            # It would be printed in every message: the login goes apart from the URL.
            raise PromError(
                "a Prometheus URL carries no user or password"
                " (give the login apart: --user, or the epilog's username)"
            )
        try:
            parsed = urllib.parse.urlsplit(self.url)
        except ValueError:  # an unclosed IPv6 bracket
            parsed = urllib.parse.SplitResult("", "", "", "", "")
        if (
            parsed.scheme not in ("http", "https")
            or not parsed.netloc
            or parsed.query
            or parsed.fragment
        ):
            raise PromError(f"{self.url[:200]!r} is not an http(s):// URL")
        self.url = self.url.rstrip("/")

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https://"):
            return None
        try:
            return ssl.create_default_context(
                cafile=self.ca_file or None, cadata=self.ca_data or None
            )
        except (OSError, ssl.SSLError) as err:
            where = f"CA file {self.ca_file}" if self.ca_file else "the inventory's CA"
            raise PromError(f"{where}: {one_line(str(err))}") from err

    def _get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        """The API's ``data`` for a POSTed query, within ``timeout`` seconds in all."""
        if self.want_stats:
            params = {**params, "stats": "all"}
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if self.username:
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
        """An instant query (at ``at``, else Prometheus' now): a vector, or a scalar as one
        sample without labels."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        kind, result = data.get("resultType"), data.get("result")
        if kind == "scalar":
            return [Sample({}, _point(self.url, result)[1])]
        if kind != "vector" or not isinstance(result, list):
            raise PromError(f"{self.url}: expected a vector, got {_shown(kind)}")
        return [_sample(self.url, item) for item in result]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        """A range query over [start, end] every ``step`` seconds: a matrix."""
        data = self._get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        kind, result = data.get("resultType"), data.get("result")
        if kind != "matrix" or not isinstance(result, list):
            raise PromError(f"{self.url}: expected a matrix, got {_shown(kind)}")
        return [_series(self.url, item) for item in result]


def _data(url: str, body: bytes, stats: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A success answer's ``data`` object; PromError for anything else."""
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
    data: dict[str, Any] = answer["data"]
    if stats is not None and isinstance(data.get("stats"), dict):
        stats.append(data["stats"])
    return data


def _shown(value: Any) -> str:
    """A peer's scalar for a message; a container only by its type (no deep repr)."""
    if isinstance(value, (str, int, float)) or value is None:
        return one_line(str(value), 40)
    return type(value).__name__


def _labels(url: str, labels: Any) -> dict[str, str]:
    # Label values are strings in the API; anything else is not a Prometheus answer.
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise PromError(f"{url}: malformed labels in the answer")
    return {str(k): v for k, v in labels.items()}


def _point(url: str, pair: Any) -> tuple[float, float]:
    """(time, value) of the API's ``[<unix time>, "<value>"]``; the value may be "NaN",
    "+Inf" or "-Inf"."""
    if not isinstance(pair, list) or len(pair) != 2:
        raise PromError(f"{url}: malformed sample {_shown(pair)}")
    at, value = pair
    try:
        if isinstance(at, bool) or not isinstance(at, (int, float)):
            raise TypeError("time")
        when = float(at)
    except (TypeError, OverflowError) as err:
        raise PromError(f"{url}: malformed sample time {_shown(at)}") from err
    try:
        if not isinstance(value, str):
            raise TypeError("value")
        return when, float(value)
    except (TypeError, ValueError) as err:
        raise PromError(f"{url}: malformed sample value {_shown(value)!r}") from err


def _sample(url: str, item: Any) -> Sample:
    if not isinstance(item, dict):
        raise PromError(f"{url}: malformed vector sample")
    return Sample(_labels(url, item.get("metric")), _point(url, item.get("value"))[1])


def _series(url: str, item: Any) -> Series:
    if not isinstance(item, dict) or not isinstance(item.get("values"), list):
        raise PromError(f"{url}: malformed range result")
    return Series(_labels(url, item.get("metric")), [_point(url, p) for p in item["values"]])
