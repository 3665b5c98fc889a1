"""Limits on what gpufleet accepts, so that any input costs bounded time and memory.

docs/inventory.md ("Limits") documents every value here; change both together
(tests/unit/inventory/test_limits_doc.py fails while they differ).
"""

from __future__ import annotations

import errno
import os
import stat

# Files: the node list, its slurm.conf (with all its Include files together), a shard lock.
MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_INCLUDE_DEPTH = 8  # slurm.conf Include nesting
MAX_INCLUDE_FILES = 64  # slurm.conf files in all, the top one included

# Hostlists, per node list: hosts it defines (nodes, servers and slurm.conf together), and
# names that all its hostlist expressions expand to (host lists under monitoring and slurm,
# pins, slurm.conf NodeAddr= and PartitionName Nodes= included).
MAX_HOSTS = 100_000
MAX_NAMES = 1_000_000
MAX_NAME_LENGTH = 253  # a DNS name; also bounds every expanded name
MAX_NUMBER_DIGITS = 18  # a number in a hostlist bracket or a slurm.conf integer

# Per host.
MAX_CPUS = 65_536
MAX_GPUS = 1_024
MAX_EXPECTED_SERIES = 100_000_000
MAX_TOKEN_LENGTH = 128  # cluster, rack, partition and GPU model names
MAX_ADDRESS_PATTERN_LENGTH = 253  # an address, or a pattern with {name}/{num}
MAX_NUM_WIDTH = 9  # {num:0Nd}
MAX_VALUE_NODES = 10_000  # an entry's vars (YAML aliases count once per use)
MAX_VALUE_DEPTH = 32

# Monitoring. The heaviest shard is at most `shards` x the mean, so a max_imbalance of
# MAX_SHARDS or more never moves a host: larger values would mean nothing more.
MAX_SHARDS = 64
MAX_REPLICAS = 8
MAX_IMBALANCE = float(MAX_SHARDS)
MAX_REBALANCE_MARGIN = float(MAX_SHARDS)

_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


def size_text(size: int) -> str:
    return f"{size // (1024 * 1024)} MiB" if size % (1024 * 1024) == 0 else f"{size:,} bytes"


def not_regular(mode: int) -> OSError:
    return OSError(errno.EINVAL, f"not a regular file ({file_kind(mode)})")


def too_large(limit: int) -> OSError:
    return OSError(errno.EFBIG, f"larger than {size_text(limit)} (the limit)")


def read_file_text(path: str, limit: int = MAX_FILE_BYTES) -> str:
    """A regular file's UTF-8 text, at most ``limit`` bytes; OSError (with a one-line
    ``strerror``) otherwise. Opening never blocks (a FIFO), and a symlink to a device
    (``/dev/zero``) is refused before a byte is read."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    descriptor = os.open(path, flags)
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise not_regular(info.st_mode)
        if info.st_size > limit:
            raise too_large(limit)
        chunks: list[bytes] = []
        left = limit + 1  # the file may have grown since fstat
        while left > 0:
            chunk = os.read(descriptor, min(left, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise too_large(limit)
    finally:
        os.close(descriptor)
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise OSError(errno.EILSEQ, f"line {line}: not valid UTF-8") from None


# The constructed options of a node list (compose, groups, keyed_groups): Ansible templates
# each expression once per host, so their work is bounded three ways, each failing the
# source with one line: the expressions written, expressions x hosts, and wall time (a
# single expression can be slow: `range(10**8) | list`). Groups they may add are bounded.
MAX_CONSTRUCT_EXPRESSIONS = 256
MAX_CONSTRUCT_EVALUATIONS = 1_000_000
MAX_CONSTRUCTED_GROUPS = 10_000
CONSTRUCT_DEADLINE_S = 30.0
