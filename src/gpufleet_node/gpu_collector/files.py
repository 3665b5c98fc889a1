"""Every file the collector reads: regular files only, opened without blocking, bounded.

A FIFO, a device or a directory where a state file, the previous output, an XID log
file or a /proc entry is expected must never hang or crash the collector: open() of a
FIFO blocks until a writer appears, so files are opened with O_NONBLOCK and read only
when fstat() says they are regular files (procfs files are). /dev/kmsg is read on its
own (xid.read_xid_kmsg), also without blocking.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


class NotRegularFile(OSError):
    """The path exists but is not a regular file (FIFO, socket, device, directory)."""


def open_regular(path: str) -> BinaryIO:
    """A binary reader of ``path``; NotRegularFile (an OSError) for anything but a file."""
    fd = os.open(path, OPEN_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{path} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


CHUNK = 65536


def read_regular(path: str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of a regular file; None if absent, unreadable or not one.

    Read in chunks: a /proc/sys file answers a read() of more than the kernel will
    allocate at once (4 MiB, say) with ENOMEM, which made /proc/sys/kernel/random/boot_id
    unreadable here, and with it every check of "the same boot"."""
    parts: list[bytes] = []
    left = limit
    try:
        with open_regular(path) as handle:
            while left > 0:
                part = handle.read(min(CHUNK, left))
                if not part:
                    break
                parts.append(part)
                left -= len(part)
    except OSError:
        return None
    return b"".join(parts)


def read_text(path: str, limit: int) -> str | None:
    data = read_regular(path, limit)
    return None if data is None else data.decode("utf-8", "replace")
