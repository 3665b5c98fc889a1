"""The query limits of a Prometheus instance, sized from its memory bound.

roles/prometheus passes --query.max-concurrency, --query.timeout and --query.max-samples
to every instance it runs (docs/prometheus.md, "Query limits and the query log"). The
sample limit follows the instance's MemoryMax= (the bound the role writes into the
unit's drop-in, or what the site set in prometheus_memory_max):

    max_samples = MemoryMax * 1/4 / 16 bytes / max_concurrency,
                  clamped to [1,000,000, 50,000,000]

A sample a query holds (a timestamp and a float) costs about 16 bytes, so every query
running at once, each at its limit, holds at most a quarter of the bound; the rest is
the head, the WAL and the rule evaluations. The floor keeps a small instance useful (a
rule reading every series of a 2 GiB instance loads fewer); the ceiling is upstream's
default, which no bound raises. An unbounded instance (infinity) gets the ceiling.
With prometheus_memory_max "auto" the bound is at least 8 KiB per series held, so the
limit is at least 8192 / 4 / 16 / concurrency = 128 / concurrency samples per series
held: 6.4 at the default concurrency of 20 (upstream's, which the rule evaluations share).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpufleet.alert_for import MAX_NANOSECONDS, _nanoseconds

SAMPLE_BYTES = 16
# The share of MemoryMax that concurrent queries may hold, as 1/QUERY_SHARE_DIVISOR.
QUERY_SHARE_DIVISOR = 4
MIN_MAX_SAMPLES = 1_000_000
# Upstream's default of --query.max-samples.
MAX_MAX_SAMPLES = 50_000_000
# The flags gpufleet sets itself: prometheus_extra_flags may not repeat them (Prometheus
# refuses a repeated flag at start, after the unit was written).
FLAGS = {
    "--query.max-concurrency": "prometheus_query_max_concurrency",
    "--query.timeout": "prometheus_query_timeout",
    "--query.max-samples": "prometheus_query_max_samples",
}

# systemd's MemoryMax= (gpufleet.preflight.SYSTEMD_SIZE): bytes with a 1024-based suffix,
# a share of the host's memory, or infinity.
_SIZE = re.compile(r"([1-9][0-9]*)([KMGT]?)")
_PERCENT = re.compile(r"([1-9][0-9]?|100)%")
_SUFFIX = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_POSITIVE = re.compile(r"[1-9][0-9]*")


def memory_bytes(memory_max: str, host_memory_bytes: int | None = None) -> int | None:
    """The bytes a systemd MemoryMax= value allows (None: infinity, no bound).

    A share (40%) needs the host's memory; ValueError without it or for a value that is
    no systemd size (the shared preflight refuses those first)."""
    value = str(memory_max).strip()
    if value == "infinity":
        return None
    size = _SIZE.fullmatch(value)
    if size:
        return int(size.group(1)) * _SUFFIX[size.group(2)]
    share = _PERCENT.fullmatch(value)
    if share:
        if not host_memory_bytes or host_memory_bytes <= 0:
            raise ValueError(
                f"MemoryMax={value} is a share of the host's memory, which is unknown "
                "(gather facts, or set prometheus_query_max_samples)"
            )
        return host_memory_bytes * int(share.group(1)) // 100
    raise ValueError(f"MemoryMax={value!r} is no systemd size")


def max_samples(memory: int | None, concurrency: int) -> int:
    """--query.max-samples for an instance bounded to memory bytes (None: unbounded)
    running at most concurrency queries at once (the formula of the module docstring)."""
    if concurrency < 1:
        raise ValueError(f"the query concurrency must be at least 1 (got {concurrency})")
    if memory is None:
        return MAX_MAX_SAMPLES
    samples = memory // QUERY_SHARE_DIVISOR // SAMPLE_BYTES // concurrency
    return max(MIN_MAX_SAMPLES, min(MAX_MAX_SAMPLES, samples))


def sized_max_samples(
    setting: object, memory_max: object, concurrency: object, host_memory_mb: object = 0
) -> int:
    """prometheus_query_max_samples as the unit gets it: a number as set, or "auto" sized
    from the instance's MemoryMax= (host_memory_mb: Ansible's memtotal_mb fact)."""
    if str(setting) != "auto":
        return int(str(setting))
    host = int(str(host_memory_mb or 0)) * 2**20
    return max_samples(memory_bytes(str(memory_max), host or None), int(str(concurrency)))


def setting_problems(concurrency: object, timeout: object, samples: object) -> list[str]:
    """One line per refused query limit setting (prometheus_query_*), in that order."""
    problems = []
    if isinstance(concurrency, bool) or not _POSITIVE.fullmatch(str(concurrency)):
        problems.append(
            f"prometheus_query_max_concurrency must be a positive number of queries "
            f"(got {concurrency!r})"
        )
    nanoseconds = _nanoseconds(timeout) if isinstance(timeout, str) else None
    if not nanoseconds or nanoseconds > MAX_NANOSECONDS:
        problems.append(
            "prometheus_query_timeout must be a positive Prometheus duration such as 30s, "
            f"2m or 1m30s (got {timeout!r})"
        )
    if str(samples) != "auto" and (
        isinstance(samples, bool) or not _POSITIVE.fullmatch(str(samples))
    ):
        problems.append(
            f"prometheus_query_max_samples must be auto or a positive number (got {samples!r})"
        )
    return problems


def flag_conflicts(flags: Sequence[object]) -> list[str]:
    """One line per flag of prometheus_extra_flags that gpufleet already sets."""
    problems = []
    for flag in flags:
        # --flag=value, or --flag value in one item.
        name = re.split(r"[=\s]", str(flag).strip(), maxsplit=1)[0]
        if name in FLAGS:
            problems.append(
                f"prometheus_extra_flags sets {name}, which gpufleet sets from {FLAGS[name]}: "
                "set that variable instead (docs/prometheus.md)"
            )
    return problems


# logrotate's size: bytes, or k, M, G.
_LOG_SIZE = re.compile(r"[1-9][0-9]*[kMG]?")
# A directory logrotate's quoted glob and systemd's ReadWritePaths= take as written.
_LOG_DIR = re.compile(r"/[A-Za-z0-9._/+@:-]*")


def log_problems(log_dir: object, max_size: object, rotate: object) -> list[str]:
    """One line per refused query log setting (prometheus_log_dir, _query_log_*)."""
    problems = []
    directory = str(log_dir)
    if (
        not _LOG_DIR.fullmatch(directory)
        or directory.rstrip("/") == ""
        or "/../" in directory + "/"
    ):
        problems.append(
            "prometheus_log_dir must be an absolute directory of letters, digits and "
            f"._/+@:- other than / (got {log_dir!r})"
        )
    if isinstance(max_size, bool) or not _LOG_SIZE.fullmatch(str(max_size)):
        problems.append(
            "prometheus_query_log_max_size must be a logrotate size such as 50M, 500k or "
            f"1G (got {max_size!r})"
        )
    if isinstance(rotate, bool) or not _POSITIVE.fullmatch(str(rotate)):
        problems.append(
            f"prometheus_query_log_rotate must be a positive number of files (got {rotate!r})"
        )
    return problems
