"""Per-shard scrapes: /metrics?shard=K[&cluster=1] serves one shard's nodes (node map).

Measured at 10,000 nodes: every Prometheus shard scraped the whole exporter (158 k series,
12 MB per scrape). Now shard K gets the series of the nodes the node map (written by the
slurm_exporter role from the inventory plugin's shard plan) gives it, and the one shard
that asks for cluster=1 also gets the cluster-level series and the nodes no shard owns.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import exp, metric_samples, run_exporter, runner_for, shards
from test_web import get

# The 22.05 capture: nodes gpu02, gpu03 and vm; job 6 runs on gpu02 and vm.
MAP = {"shards": {"0": ["gpu02"], "1": ["gpu03", "gpu99"]}}
NODE_MAP = {"gpu02": "0", "gpu03": "1", "gpu99": "1"}


def families() -> list:
    collector = exp.Collector(runner=runner_for("22.05"))
    collector.collect()
    return collector._families


def keys(fams: list) -> set[tuple[str, tuple]]:
    return {(f.name, labels) for f in fams for labels in f.samples}


def nodes_of(fams: list) -> set[str]:
    return {dict(labels)["node"] for f in fams for labels in f.samples if "node" in dict(labels)}


def select(shard: str | None, cluster: bool) -> list:
    return exp.select_families(families(), NODE_MAP, exp.Selection(shard, cluster))


# --- the node map --------------------------------------------------------------------


def test_a_node_map_parses():
    data = exp.parse_node_map(json.dumps(MAP))
    assert data.node_shard == NODE_MAP
    assert data.shards == {"0", "1"}
    assert exp.parse_node_map('{"shards": {}}').shards == frozenset()


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ("[]", "one key"),
        ('{"shards": {}, "extra": 1}', "one key"),
        ('{"shards": []}', "shard ids"),
        ('{"shards": {"a": []}}', "digits"),
        ('{"shards": {"1234567": []}}', "digits"),
        ('{"shards": {"0": "gpu01"}}', "list"),
        ('{"shards": {"0": [1]}}', "invalid node name"),
        ('{"shards": {"0": [""]}}', "invalid node name"),
        ('{"shards": {"0": ["gpu 01"]}}', "invalid node name"),
        ('{"shards": {"0": ["gpu\\n01"]}}', "invalid node name"),
        ('{"shards": {"0": ["' + "x" * 256 + '"]}}', "invalid node name"),
        ('{"shards": {"0": ["gpu01"], "1": ["gpu01"]}}', "shards 0 and 1"),
        ("{", "not JSON"),
        ('{"shards": {"0": ["gpu01"], "0": ["gpu02"]}}', "given twice"),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
    ],
)
def test_a_bad_node_map_is_refused(doc, why):
    with pytest.raises(exp.NodeMapError, match=why):
        exp.parse_node_map(doc)


def test_the_node_map_is_bounded(monkeypatch):
    monkeypatch.setattr(shards, "MAX_NODE_MAP_NODES", 3)
    with pytest.raises(exp.NodeMapError, match="more than 3 nodes"):
        exp.parse_node_map(json.dumps({"shards": {"0": ["a", "b"], "1": ["c", "d"]}}))
    monkeypatch.setattr(shards, "MAX_NODE_MAP_SHARDS", 1)
    with pytest.raises(exp.NodeMapError, match="more than 1 shards"):
        exp.parse_node_map(json.dumps({"shards": {"0": [], "1": []}}))
    monkeypatch.setattr(shards, "MAX_NODE_MAP_BYTES", 10)
    with pytest.raises(exp.NodeMapError, match="larger than"):
        exp.parse_node_map(json.dumps(MAP))


def test_check_node_map_is_what_the_role_validates_with(tmp_path):
    path = tmp_path / "node-shards.json"
    path.write_text(json.dumps(MAP))
    assert run_exporter("--check-node-map", str(path)).returncode == 0
    path.write_text('{"shards": {"0": ["a"], "1": ["a"]}}')
    result = run_exporter("--check-node-map", str(path))
    assert (
        result.returncode == 2 and "node map" in result.stderr and "shards 0 and 1" in result.stderr
    )
    assert run_exporter("--check-node-map", str(tmp_path / "missing.json")).returncode == 2


# --- the query -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "selection"),
    [
        ("", None),
        ("shard=0", exp.Selection("0", False)),
        ("shard=12&cluster=1", exp.Selection("12", True)),
        ("cluster=1&shard=3", exp.Selection("3", True)),  # Prometheus sorts its params
        ("shard=3&cluster=0", exp.Selection("3", False)),
        ("cluster=1", exp.Selection(None, True)),
    ],
)
def test_a_query_selects(query, selection):
    assert exp.parse_selection(query) == selection


@pytest.mark.parametrize(
    "query",
    [
        "shard",
        "shard=",
        "shard=a",
        "shard=-1",
        "shard=1234567",
        "shard=%30",
        "shard=0&shard=1",
        "shard=0&cluster=yes",
        "cluster=0",
        "node=gpu01",
        "shard=0&x=1",
        "shard=0&" + "cluster=1&" * 100,
    ],
)
def test_a_bad_query_is_refused(query):
    with pytest.raises(ValueError):
        exp.parse_selection(query)


# --- what each shard gets --------------------------------------------------------------


def test_the_parts_are_disjoint_and_together_are_everything():
    everything = keys(families())
    shard0, shard1, cluster = (keys(select(*s)) for s in (("0", False), ("1", False), (None, True)))
    assert shard0 and shard1 and cluster
    assert not (shard0 & shard1) and not (shard0 & cluster) and not (shard1 & cluster)
    assert shard0 | shard1 | cluster == everything
    # The shard that asks for both gets exactly its nodes plus the cluster part.
    assert keys(select("0", True)) == shard0 | cluster


def test_a_shard_gets_only_its_nodes_and_no_cluster_series():
    shard0 = select("0", False)
    assert nodes_of(shard0) == {"gpu02"}
    assert all(any(k == "node" for k, _ in labels) for f in shard0 for labels in f.samples)
    names = {f.name for f in shard0}
    # What the shard's rules and node alerts join with its own GPU and node series.
    assert {"slurm_job_gpus_allocated", "slurm_job_gpu_index_info"} <= names
    assert {"slurm_node_status", "slurm_node_state_reason_info"} & names
    assert not names & {"slurm_up", "slurm_queue_pending", "slurm_exporter_job_series"}
    assert nodes_of(select("1", False)) == {"gpu03"}


def test_a_job_on_two_shards_is_split_by_node():
    def pairs(fams: list) -> set[tuple[str, str]]:
        return {
            (dict(labels)["job_id"], dict(labels)["node"])
            for f in fams
            if f.name == "slurm_job_gpus_allocated"
            for labels in f.samples
        }

    assert ("6", "gpu02") in pairs(select("0", False))
    assert ("6", "vm") in pairs(select(None, True))  # vm: in no shard of the map


def test_the_cluster_part_has_cluster_series_and_unmapped_nodes():
    cluster = select(None, True)
    names = {f.name for f in cluster}
    assert {
        "slurm_up",
        "slurm_info",
        "slurm_queue_pending",
        "slurm_partition_gpus_allocated",
        "slurm_user_gpus_running",
        "slurm_account_gpus_running",
        "slurm_scheduler_threads",
        "slurm_exporter_last_collect_timestamp_seconds",
        "slurm_exporter_command_success",
        "slurm_exporter_job_series_dropped_total",
    } <= names
    assert nodes_of(cluster) == {"vm"}


def test_an_empty_map_serves_every_node_with_the_cluster_part():
    fams = families()
    assert keys(exp.select_families(fams, {}, exp.Selection(None, True))) == keys(fams)
    assert exp.select_families(fams, {}, exp.Selection("0", False)) == []


# --- the collector and the HTTP server ------------------------------------------------------


def map_file(tmp_path: Path, doc: dict = MAP) -> Path:
    path = tmp_path / "node-shards.json"
    path.write_text(json.dumps(doc))
    return path


def test_the_collector_serves_each_shard_its_part(tmp_path):
    collector = exp.Collector(
        runner=runner_for("22.05"), node_map=exp.NodeMap(str(map_file(tmp_path)))
    )
    whole = metric_samples(collector.collect().decode())
    assert whole["slurm_exporter_node_map_shards"] == 2
    assert whole["slurm_exporter_unmapped_nodes"] == 1  # vm
    parts = [
        metric_samples(collector.snapshot_for(exp.Selection(*s)).decode())
        for s in (("0", True), ("1", False))
    ]
    assert parts[0].keys() | parts[1].keys() == whole.keys()
    assert not parts[0].keys() & parts[1].keys()
    assert "slurm_exporter_unmapped_nodes" in parts[0]
    # Cached for this snapshot (two replicas scrape the same part)...
    first = collector.snapshot_for(exp.Selection("1", False))
    assert collector.snapshot_for(exp.Selection("1", False)) is first
    # ...and cut anew from the next one.
    collector.collect()
    assert collector.snapshot_for(exp.Selection("1", False)) is not first
    with pytest.raises(exp.UnknownShard):
        collector.snapshot_for(exp.Selection("2", False))


def test_without_a_node_map_only_the_whole_snapshot_is_served():
    collector = exp.Collector(runner=runner_for("22.05"))
    collector.collect()
    with pytest.raises(exp.UnknownShard, match="no node map"):
        collector.snapshot_for(exp.Selection("0", True))


def test_a_changed_node_map_applies_at_the_next_collection(tmp_path):
    path = map_file(tmp_path)
    collector = exp.Collector(runner=runner_for("22.05"), node_map=exp.NodeMap(str(path)))
    collector.collect()
    path.write_text(json.dumps({"shards": {"0": ["gpu02", "gpu03"], "1": ["vm"]}}))
    collector.collect()
    assert b'node="gpu03"' in collector.snapshot_for(exp.Selection("0", False))
    # A map that does not load keeps the last good one.
    path.write_text('{"shards": {"0": ["vm"], "1": ["vm"]}}')
    collector.collect()
    assert b'node="vm"' in collector.snapshot_for(exp.Selection("1", False))


def test_the_cache_is_bounded(tmp_path, monkeypatch):
    collector = exp.Collector(
        runner=runner_for("22.05"), node_map=exp.NodeMap(str(map_file(tmp_path)))
    )
    collector.collect()
    monkeypatch.setattr(collector, "_snapshot", b"")  # budget: 1 MiB
    monkeypatch.setattr(collector, "_selected_bytes", 1 << 20)
    first = collector.snapshot_for(exp.Selection("0", False))
    assert collector.snapshot_for(exp.Selection("0", False)) == first
    assert exp.Selection("0", False) not in collector._selected


@pytest.fixture
def serve(tmp_path) -> Iterator:
    servers = []

    def run(node_map: bool = True) -> str:
        collector = exp.Collector(
            runner=runner_for("22.05"),
            node_map=exp.NodeMap(str(map_file(tmp_path))) if node_map else None,
        )
        collector.collect()
        server = exp.make_server("127.0.0.1:0", collector, exp.WebConfig(None))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield run
    for server in servers:
        server.shutdown()
        server.server_close()


def test_http_per_shard_scrapes(serve):
    base = serve()
    status, whole = get(f"{base}/metrics")
    assert status == 200 and b'node="gpu03"' in whole and b"slurm_up " in whole
    status, body = get(f"{base}/metrics?shard=1")
    assert status == 200 and b'node="gpu03"' in body
    assert b'node="gpu02"' not in body and b"slurm_up " not in body
    # The server's own counters go with the cluster part: one shard ingests them.
    own = b"\nslurm_exporter_http_connections_dropped_total{"
    assert own in whole and own not in body
    status, body = get(f"{base}/metrics?cluster=1&shard=0")
    assert status == 200 and b'node="gpu02"' in body and b"slurm_up " in body and own in body
    assert b'node="gpu03"' not in body
    status, body = get(f"{base}/metrics?shard=7")
    assert status == 404 and b"no shard 7" in body
    for query in ("shard=x", "node=gpu02", "shard=0&shard=1"):
        status, _ = get(f"{base}/metrics?{query}")
        assert status == 400, query


def test_http_a_shard_scrape_without_a_map_is_an_error(serve):
    base = serve(node_map=False)
    assert get(f"{base}/metrics")[0] == 200
    status, body = get(f"{base}/metrics?shard=0")
    assert status == 404 and b"no node map" in body


def test_the_global_tier_federates_the_cluster_part_by_name():
    """The federation selectors (roles/prometheus/vars/main.yml) name the cluster-level
    families: on the shard every series of the job carries the target's `node` label,
    so only the family name tells them from the per-node and per-job ones."""
    import re

    import yaml

    root = Path(__file__).resolve().parents[3]
    selectors = yaml.safe_load((root / "roles/prometheus/vars/main.yml").read_text())[
        "_prometheus_federate_match"
    ]
    slurm = [s for s in selectors if 'job="slurm"' in s]
    matchers = [re.findall(r'__name__(=~|!~|=)"([^"]+)"', s) for s in slurm]

    def federated(name: str) -> bool:
        def ok(op: str, rx: str) -> bool:
            hit = re.fullmatch(rx, name) is not None
            return hit if op in ("=~", "=") else not hit

        return any(all(ok(op, rx) for op, rx in m) for m in matchers)

    every = {f.name for f in families()}
    cluster_only = {f.name for f in select(None, True)} - {f.name for f in select("0", False)}
    node_families = {f.name for f in select("0", False)}
    assert {n for n in every if federated(n)} == cluster_only | {"slurm_node_state_reason_info"}
    assert not any(federated(n) for n in node_families - {"slurm_node_state_reason_info"})
