"""What a host costs a Prometheus shard, and what one shard may hold.

The figures are measured (docs/prometheus.md, "How big can a shard be"):
``bench/shard_scale_bench.py`` replays node_exporter and the GPU collector as recorded on
a test-bed GPU node (``bench/payloads/``) to a shard running gpufleet's own rules, and
tests/unit/test_sizing.py keeps these constants equal to that recording and to the rule
files. Change them together.
"""

from __future__ import annotations

# node_exporter as the node_exporter role runs it (default collectors, systemd limited to
# the units that matter, the textfile directory): a fixed part (process, memory, NICs,
# disks, filesystems, a few units) and the series repeated per logical CPU.
NODE_EXPORTER_SERIES = 460
NODE_EXPORTER_SERIES_PER_CPU = 13
# Per GPU, as each collector writes them: smi is gpufleet's collector over nvidia-smi
# (health and XID series included), dcgm is dcgm-exporter with the role's default
# counters (one series per counter and GPU).
COLLECTOR_SERIES_PER_GPU = {"smi": 58, "dcgm": 40}
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

# The per-shard budget: RSS per head series (the benchmark measured 3.7-4.2 KiB with
# Prometheus 2.42 after minutes of data; 5,000 bytes leaves room for a full 2-hour head),
# and the stated server: half of a 64 GiB host for the head, the rest for queries,
# compaction, WAL replay and the page cache.
BYTES_PER_HEAD_SERIES = 5_000
REFERENCE_SERVER_BYTES = 64 * 2**30
HEAD_SHARE_OF_MEMORY = 0.5
BUDGET_ROUNDING = 100_000
DEFAULT_MAX_SERIES_PER_SHARD = (
    int(REFERENCE_SERVER_BYTES * HEAD_SHARE_OF_MEMORY / BYTES_PER_HEAD_SERIES)
    // BUDGET_ROUNDING
    * BUDGET_ROUNDING
)
BUDGET_WARNING_RATIO = 0.8  # the PrometheusSeriesNearBudget alert's threshold
# Rule evaluation grows with the GPUs a shard holds (the per-GPU rules). At 8,000 GPUs
# (1,000 8-GPU nodes) the benchmark measured all groups at 5.1 s per 15 s cycle and the
# slowest at 1.95 s on its 2-core machine: the largest shard it ran, the default limit
# (monitoring.max_gpus_per_shard; gpufleet plan warns past it). Measure bigger servers
# with bench/shard_scale_bench.py and raise it.
DEFAULT_MAX_GPUS_PER_SHARD = 8_000


def exporter_series(cpus: int, gpu_count: int, collector: str) -> int:
    """Series the host's exporters send (node_exporter, the GPU collector or DCGM)."""
    gpu_series = COLLECTOR_SERIES_PER_GPU.get(collector, 0) * gpu_count
    targets = 1 + (collector == "dcgm" and gpu_count > 0)
    return (
        NODE_EXPORTER_SERIES
        + NODE_EXPORTER_SERIES_PER_CPU * cpus
        + gpu_series
        + SERIES_PER_TARGET * targets
    )


def recorded_series(gpu_count: int) -> int:
    """Series the shard's rules record for the host (at full Slurm allocation)."""
    if not gpu_count:
        return RECORDED_SERIES_PER_NODE
    per_gpu = RECORDED_SERIES_PER_GPU + SLURM_SERIES_PER_GPU
    return RECORDED_SERIES_PER_NODE + RECORDED_SERIES_PER_GPU_NODE + per_gpu * gpu_count


def estimate_series(cpus: int, gpu_count: int, collector: str) -> int:
    """Head series one host adds to its shard: what it sends and what rules record."""
    return exporter_series(cpus, gpu_count, collector) + recorded_series(gpu_count)
