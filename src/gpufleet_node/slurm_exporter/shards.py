"""Per-shard selection (pure) and the node map file."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet_node.exposition import Family, Labels, Registry
from gpufleet_node.hostlist import MAX_HOSTS_PER_SCRAPE
from gpufleet_node.reloaded import ReloadedFile

# ---------------------------------------------------------------------------------------
# Per-shard selection (pure): which series the scrape of one Prometheus shard gets
# ---------------------------------------------------------------------------------------

# A sharded site scrapes /metrics?shard=K (the series of the nodes the node map gives to
# shard K) and exactly one shard adds cluster=1 (every series without a node label, and
# the nodes no shard owns). /metrics without a query serves everything (standalone).
# Shard ids are the inventory plugin's (0, 1, ...); the map is written by the
# slurm_exporter role from the same plan that picks each shard's node targets.
SHARD_ID = re.compile(r"[0-9]{1,6}")
MAX_NODE_MAP_BYTES = 32 * 1024 * 1024
MAX_NODE_MAP_SHARDS = 4096
MAX_NODE_MAP_NODES = MAX_HOSTS_PER_SCRAPE
MAX_NODE_NAME = 255
# Key of the cluster-level part in split_families(): series without a node label, and
# those of nodes the map gives to no shard (so nothing is lost).
CLUSTER_PART = ""


class NodeMapError(ValueError):
    """The node map file is unreadable or not in the expected shape."""


@dataclass(frozen=True)
class NodeMapData:
    """One version of the node map: node -> shard id, and every shard id it names."""

    node_shard: Mapping[str, str] = field(default_factory=dict)
    shards: frozenset[str] = frozenset()


def _valid_node_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_NODE_NAME
        and name.isprintable()
        and not any(c.isspace() for c in name)
    )


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are all different (a shard named twice is an error)."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key[:40]!r} given twice")
        out[key] = value
    return out


def parse_node_map(text: str) -> NodeMapData:
    """``{"shards": {"0": ["gpu001", ...], "1": [...]}}`` -> NodeMapData.

    Bounded: at most MAX_NODE_MAP_SHARDS shard ids (digits) and MAX_NODE_MAP_NODES node
    names of at most MAX_NODE_NAME printable characters; a node in two shards is an error.
    """
    if len(text) > MAX_NODE_MAP_BYTES:
        raise NodeMapError(f"larger than {MAX_NODE_MAP_BYTES} bytes")
    try:
        doc = json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise NodeMapError("not JSON: nested too deeply") from None
    except ValueError as exc:
        raise NodeMapError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"shards"}:
        raise NodeMapError('expected an object with the one key "shards"')
    shards = doc["shards"]
    if not isinstance(shards, dict):
        raise NodeMapError('"shards" must map shard ids to lists of node names')
    if len(shards) > MAX_NODE_MAP_SHARDS:
        raise NodeMapError(f"more than {MAX_NODE_MAP_SHARDS} shards")
    node_shard: dict[str, str] = {}
    total = 0
    for shard, nodes in shards.items():
        if not SHARD_ID.fullmatch(shard):
            raise NodeMapError(f"shard id {shard[:40]!r} is not 1 to 6 digits")
        if not isinstance(nodes, list):
            raise NodeMapError(f"shard {shard}: expected a list of node names")
        total += len(nodes)
        if total > MAX_NODE_MAP_NODES:
            raise NodeMapError(f"more than {MAX_NODE_MAP_NODES} nodes")
        for node in nodes:
            if not _valid_node_name(node):
                raise NodeMapError(f"shard {shard}: invalid node name {str(node)[:40]!r}")
            other = node_shard.setdefault(node, shard)
            if other != shard:
                raise NodeMapError(f"node {node!r} is in shards {other} and {shard}")
    return NodeMapData(node_shard, frozenset(shards))


@dataclass(frozen=True)
class Selection:
    """What one scrape asks for: the nodes of one shard, the cluster-level part, or both."""

    shard: str | None = None
    cluster: bool = False


def parse_selection(query: str) -> Selection | None:
    """A /metrics query string -> Selection, or None (everything) when it is empty.

    Only ``shard=<digits>`` and ``cluster=0|1``, each at most once; anything else is a
    ValueError (answered 400).
    """
    if not query:
        return None
    if len(query) > 256:
        raise ValueError("query too long")
    seen: dict[str, str] = {}
    for part in query.split("&"):
        key, sep, value = part.partition("=")
        if not sep or key not in ("shard", "cluster"):
            raise ValueError("the only parameters are shard=<id> and cluster=0|1")
        if key in seen:
            raise ValueError(f"{key} given twice")
        seen[key] = value
    shard = seen.get("shard")
    if shard is not None and not SHARD_ID.fullmatch(shard):
        raise ValueError("shard must be 1 to 6 digits")
    cluster = seen.get("cluster", "0")
    if cluster not in ("0", "1"):
        raise ValueError("cluster must be 0 or 1")
    if shard is None and cluster == "0":
        raise ValueError("select a shard, the cluster part (cluster=1), or both")
    return Selection(shard=shard, cluster=cluster == "1")


def _node_of(labels: Labels) -> str | None:
    for key, value in labels:
        if key == "node":
            return value
    return None


Parts = dict[str, dict[str, dict[Labels, float]]]  # part -> family name -> samples


def split_families(families: Iterable[Family], node_shard: Mapping[str, str]) -> Parts:
    """Samples by part: a shard id for a node the map places, else CLUSTER_PART. O(samples)."""
    parts: Parts = {}
    for fam in families:
        for labels, value in fam.samples.items():
            node = _node_of(labels)
            part = CLUSTER_PART if node is None else node_shard.get(node, CLUSTER_PART)
            parts.setdefault(part, {}).setdefault(fam.name, {})[labels] = value
    return parts


def assemble(families: Iterable[Family], parts: Parts, selection: Selection) -> list[Family]:
    """The families of one selection, in the order of ``families``; empty ones left out."""
    wanted = []
    if selection.shard is not None:
        wanted.append(parts.get(selection.shard, {}))
    if selection.cluster:
        wanted.append(parts.get(CLUSTER_PART, {}))
    out = []
    for fam in families:
        samples: dict[Labels, float] = {}
        for part in wanted:
            samples.update(part.get(fam.name, {}))
        if samples:
            out.append(Family(fam.name, fam.type, fam.help, samples))
    return out


def select_families(
    families: list[Family], node_shard: Mapping[str, str], selection: Selection
) -> list[Family]:
    """The families one scrape gets (split_families + assemble)."""
    return assemble(families, split_families(families, node_shard), selection)


def node_map_families(data: NodeMapData, families: Iterable[Family]) -> list[Family]:
    """Cluster-level gauges about the node map: its shards, and Slurm nodes it leaves out."""
    reg = Registry()
    reg.gauge("slurm_exporter_node_map_shards", "Shards the node map names", len(data.shards))
    slurm_nodes: set[str] = set()
    for fam in families:
        if fam.name == "slurm_node_status":
            slurm_nodes.update(n for n in map(_node_of, fam.samples) if n is not None)
    reg.gauge(
        "slurm_exporter_unmapped_nodes",
        "Slurm nodes the node map gives to no shard (served with the cluster-level part)",
        len(slurm_nodes - data.node_shard.keys()),
    )
    return list(reg.families.values())


class UnknownShard(LookupError):
    """A scrape asked for a shard the node map does not name (answered 404)."""


class NodeMap(ReloadedFile):
    """The node map file (--node-map-file), reread at each collection when it changed.

    A changed file that does not load keeps the last good map (and is logged); at start
    it is an error.
    """

    what = "node map"
    load_error = NodeMapError

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = Path(path)
        self._data = NodeMapData()
        self._load()

    def _load(self) -> None:
        stamp = self._file_stamp()
        assert self.path is not None  # set in __init__
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_NODE_MAP_BYTES + 1)
            data = parse_node_map(raw.decode("utf-8"))
        except (OSError, UnicodeDecodeError, NodeMapError) as exc:
            raise NodeMapError(f"{self.path}: {exc}") from None
        self._data, self._stamp = data, stamp

    def current(self) -> NodeMapData:
        with self._lock:
            self._reload_if_changed()
            return self._data
