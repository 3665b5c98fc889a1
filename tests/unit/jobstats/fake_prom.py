"""A stand-in for the Prometheus HTTP API (what PromClient._get returns), for the tests
that feed ``gpufleet jobstats``, ``gpufleet report idle`` and the epilog chosen answers
without a Prometheus: job 42 on node g1, GPUs 0 and 1, values from ``pick``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet.jobstats.idle import THRESHOLD_SERIES
from gpufleet_node.job_summary.summary import FIGURES

START, END = 1_764_115_200, 1_764_122_400
# (API path, query) -> the answer's data, or None for FakeApi's own answer
Extra = Callable[[str, str], Any]


class FakeApi:
    """Answers the queries jobstats and report idle make, with values from ``pick``."""

    def __init__(self, pick: Callable[[str], str], extra: Extra | None = None) -> None:
        self.pick = pick
        self.extra = extra
        self.queries: list[str] = []

    def vector(self, query: str) -> list[dict[str, Any]]:
        def sample(labels: dict[str, str], kind: str) -> dict[str, Any]:
            return {"metric": labels, "value": [END, self.pick(kind)]}

        node = {"node": "g1", "user": "alice", "account": "phys", "partition": "gpu"}
        if query.startswith("max_over_time(slurm_job_gpus_allocated"):
            return [sample(node, "count")]
        if "timestamp(" in query:
            return [sample({}, "time")]
        if "slurm_job_gpu:gpu_utilization_percent:max" in query and "sum by" not in query:
            return [{"metric": {"node": "g1", "gpu": g}, "value": [END, "1"]} for g in "01"]
        if THRESHOLD_SERIES in query:
            return [sample({}, "threshold")]
        if "last_over_time(" in query or query.startswith("count(max_over_time"):
            return [sample({}, "count")]
        if query.startswith("sum by (user, account)"):
            return [sample({"user": u, "account": "a"}, "hours") for u in ("u1", "u2")]
        if query.startswith("sum by ("):
            key = query[len("sum by (") : query.index(")")]
            return [sample({key: name}, "hours") for name in ("x", "y", "z")]
        for (kind, _), (_, series) in FIGURES.items():
            if series in query:
                labels = {"node": "g1", "gpu": "0"} if kind == "gpu" else {"node": "g1"}
                return [sample(labels, "figure"), sample({**labels, "gpu": "1"}, "figure")]
        return []

    def get(self, path: str, params: dict[str, str]) -> Any:
        query = params["query"]
        self.queries.append(query)
        if self.extra is not None:
            data = self.extra(path, query)
            if data is not None:
                return data
        if path.endswith("query_range"):
            values = [[START, self.pick("count")], [END, self.pick("count")]]
            return {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}
        return {"resultType": "vector", "result": self.vector(query)}
