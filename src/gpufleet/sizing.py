"""What a host costs a Prometheus shard, and what one shard may hold.

The figures are measured (docs/prometheus.md, "How big can a shard be"):
``bench/shard_scale_bench.py`` replays node_exporter and the GPU collector as recorded on
a test-bed GPU node (``bench/payloads/``) to a shard running gpufleet's own rules, and
tests/unit/test_sizing.py keeps these constants equal to that recording and to the rule
files. Change them together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gpufleet import strictyaml

# The exporter registry (roles/_exporters): which group runs each exporter and what one
# host running it sends (its `series`). The roles read the same file; gpufleet runs
# from its checkout, as the inventory plugin and the roles do.
EXPORTERS_FILE = Path(__file__).resolve().parents[2] / "roles/_exporters/defaults/main.yml"

# gpufleet's GPU collector over nvidia-smi writes through node_exporter's textfile
# collector, so it has no registry entry of its own: its series per GPU (health and XID
# series included). The exporters' own figures are in the registry.
SMI_SERIES_PER_GPU = 58
# Prometheus' own series per target (up, scrape_duration_seconds, scrape_samples_scraped,
# scrape_samples_post_metric_relabeling, scrape_series_added).
SERIES_PER_TARGET = 5
# What gpufleet's rules record on the shard: the node: series of every node, the node:
# GPU rollups of a GPU node, and the dense gpu: series of each GPU (sparse ones, such as
# active clock-event reasons and XID rates, exist only while something happens).
RECORDED_SERIES_PER_NODE = 10
RECORDED_SERIES_PER_GPU_NODE = 11
RECORDED_SERIES_PER_GPU = 10
# The Slurm exporter's per-job series land on the shard of the job's node: with every
# GPU allocated, its GPU-index series, the job's recorded per-GPU utilization and the
# (job, node) series.
SLURM_SERIES_PER_GPU = 3

DEFAULT_CPUS = 64

# The per-shard budget (docs/prometheus.md, "How big can a shard be"): RSS per head series
# that the budget assumes, by Prometheus major line, and the stated server: half of a
# 64 GiB host for the head, the rest for queries, compaction, WAL replay and the page
# cache. Each figure is the highest RSS per head series bench/shard_scale_bench.py
# measured on that line (250 to 1,000 nodes, minutes of data), plus 15 % for a full
# 2-hour head that the benchmark does not build, rounded up to 100 bytes: Prometheus
# 3.5.3 at most 3,103 bytes (2026-12-07), 2.42 at most 4,996 (2026-12-07, same machine
# and hour; 4,343 on 2026-11-25, when 5,000 bytes was the budget). The role installs 3.x
# (prometheus_version), so 3.x sizes the defaults; a site whose servers run 2.x
# (prometheus_install_method: package on Debian 12 or 13) sets the node list's
# monitoring.max_series_per_shard to PROMETHEUS_2_MAX_SERIES_PER_SHARD.
BYTES_PER_HEAD_SERIES_BY_MAJOR = {3: 3_600, 2: 5_800}
DEFAULT_PROMETHEUS_MAJOR = 3
BYTES_PER_HEAD_SERIES = BYTES_PER_HEAD_SERIES_BY_MAJOR[DEFAULT_PROMETHEUS_MAJOR]
REFERENCE_SERVER_BYTES = 64 * 2**30
HEAD_SHARE_OF_MEMORY = 0.5
BUDGET_ROUNDING = 100_000


def max_series_per_shard(major: int = DEFAULT_PROMETHEUS_MAJOR) -> int:
    """The series budget of the reference server under Prometheus ``major``."""
    head = REFERENCE_SERVER_BYTES * HEAD_SHARE_OF_MEMORY
    per_series = BYTES_PER_HEAD_SERIES_BY_MAJOR[major]
    return int(head / per_series) // BUDGET_ROUNDING * BUDGET_ROUNDING


DEFAULT_MAX_SERIES_PER_SHARD = max_series_per_shard()
PROMETHEUS_2_MAX_SERIES_PER_SHARD = max_series_per_shard(2)
BUDGET_WARNING_RATIO = 0.8  # the PrometheusSeriesNearBudget alert's threshold
# Rule evaluation grows with the GPUs a shard holds (the per-GPU rules). At 8,000 GPUs
# (1,000 8-GPU nodes) the benchmark measured all groups at 5.1 s per 15 s cycle and the
# slowest at 1.95 s on its 2-core machine with 2.42, none missed with 3.5.3 either: the
# largest shard it ran, the default limit for both lines (monitoring.max_gpus_per_shard;
# gpufleet plan warns past it). Measure bigger servers with bench/shard_scale_bench.py
# and raise it.
DEFAULT_MAX_GPUS_PER_SHARD = 8_000


# The groups the inventory plugin puts a host in by its kind (src/gpufleet/inventory.py).
KIND_GROUPS = ("gpu_nodes", "cpu_nodes", "compute_nodes", "servers")


def kind_groups(role: str, gpu_count: int) -> list[str]:
    """``servers``, or ``compute_nodes`` and ``gpu_nodes`` or ``cpu_nodes``."""
    if role == "server":
        return ["servers"]
    return ["compute_nodes", "gpu_nodes" if gpu_count else "cpu_nodes"]


@dataclass(frozen=True)
class HostShape:
    """What sizes a host's series: its CPUs, its GPUs and their collector (a plain word),
    and its role (node or server)."""

    cpus: int
    gpu_count: int
    collector: str
    role: str = "node"


def host_groups(host: HostShape) -> set[str]:
    """The inventory groups, of those a registry exporter may name, a host is in: all,
    its kind's, and gpu_collector_<collector> for a GPU host (collectors are plain words,
    so the group is named as inventory.group_name would). The monitoring groups and
    slurm_controller come from the node list's monitoring section, not from a host's
    kind: an exporter there is not counted per host."""
    groups = {"all", *kind_groups(host.role, host.gpu_count)}
    if host.gpu_count:
        groups.add(f"gpu_collector_{host.collector}")
    return groups


SERIES_TERMS = ("host", "per_cpu", "per_gpu")


class RegistryError(ValueError):
    """One line for a registry file gpufleet cannot use: file, key path, what is wrong."""

    def __init__(self, file: str, key_path: str, message: str) -> None:
        self.file = file
        self.key_path = key_path
        self.message = message
        where = f"{file}: {key_path}" if key_path else file
        super().__init__(strictyaml.one_line(f"{where}: {message}"))


def checked_registry(data: Any, file: str) -> dict[str, dict[str, Any]]:
    """``exporters_registry`` of a loaded registry file, with what sizing reads of each
    entry checked (``group``, ``sharded``, ``series``)."""
    registry = data.get("exporters_registry") if isinstance(data, dict) else None
    if not isinstance(registry, dict):
        raise RegistryError(file, "exporters_registry", "must be a mapping of scrape jobs")
    for name, entry in registry.items():
        where = f"exporters_registry.{name}"
        if not isinstance(entry, dict):
            raise RegistryError(file, where, "must be a mapping")
        if not isinstance(entry.get("group"), str):
            raise RegistryError(file, f"{where}.group", "must be a group name")
        if not isinstance(entry.get("sharded", False), bool):
            raise RegistryError(file, f"{where}.sharded", "must be true or false")
        series = entry.get("series") or {}
        if not isinstance(series, dict):
            raise RegistryError(file, f"{where}.series", "must be a mapping")
        for term, count in series.items():
            if term not in SERIES_TERMS:
                raise RegistryError(
                    file,
                    f"{where}.series.{term}",
                    f"unknown term; one of {', '.join(SERIES_TERMS)}",
                )
            # bool is an int to Python; a count is a plain non-negative integer
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise RegistryError(
                    file, f"{where}.series.{term}", f"must be a non-negative integer, got {count!r}"
                )
    return registry


def registry_field(job: str, entry: Mapping[str, Any], key: str) -> Any:
    """A key every registry entry has (exporters_registry.<job>.<key>), by name when missing:
    the roles' filters (gpufleet.scrape_targets, gpufleet.firewall) read the entries."""
    if key not in entry:
        raise ValueError(f"exporters_registry.{job} has no {key}")
    return entry[key]


@cache
def read_registry(path: Path) -> dict[str, dict[str, Any]]:
    """The registry as the strict loader reads it; the roles read the same file through
    Ansible, so a value their YAML 1.1 would type differently is refused too."""
    try:
        text = path.read_text(encoding="utf-8")
        data = strictyaml.load_as_ansible_reads_it(text)
    except OSError as err:
        raise RegistryError(str(path), "", f"cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise RegistryError(str(path), "", "cannot read: not valid UTF-8") from None
    except strictyaml.YamlProblem as problem:
        raise RegistryError(str(path), problem.where, problem.problem) from None
    return checked_registry(data, str(path))


def exporters() -> dict[str, dict[str, Any]]:
    """The exporter registry, by scrape job name."""
    return read_registry(EXPORTERS_FILE)


def exporter_series(
    host: HostShape, registry: Mapping[str, Mapping[str, Any]] | None = None
) -> int:
    """Series the host's exporters send: every registry exporter a shard scrapes on this
    host (its group), each with Prometheus' own series of its target, and the GPU
    collector's textfile series."""
    groups = host_groups(host)
    total = SMI_SERIES_PER_GPU * host.gpu_count if host.collector == "smi" else 0
    for exporter in (exporters() if registry is None else registry).values():
        if not exporter.get("sharded") or exporter["group"] not in groups:
            continue
        series = exporter.get("series") or {}
        total += (
            int(series.get("host", 0))
            + int(series.get("per_cpu", 0)) * host.cpus
            + int(series.get("per_gpu", 0)) * host.gpu_count
            + SERIES_PER_TARGET
        )
    return total


def recorded_series(gpu_count: int) -> int:
    """Series the shard's rules record for the host (at full Slurm allocation)."""
    if not gpu_count:
        return RECORDED_SERIES_PER_NODE
    per_gpu = RECORDED_SERIES_PER_GPU + SLURM_SERIES_PER_GPU
    return RECORDED_SERIES_PER_NODE + RECORDED_SERIES_PER_GPU_NODE + per_gpu * gpu_count


def estimate_series(
    host: HostShape, registry: Mapping[str, Mapping[str, Any]] | None = None
) -> int:
    """Head series one host adds to its shard: what it sends and what rules record."""
    return exporter_series(host, registry) + recorded_series(host.gpu_count)
