"""A file reread when it changes, keeping the last good version."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

LOG = logging.getLogger(__name__)


# (name, mtime_ns, size, inode) of each file; None for a file that cannot be read
Stamp = tuple[tuple[str, Optional[int], Optional[int], Optional[int]], ...]


class ReloadedFile:
    """A file reread when it (or a file it names) changes, by ``current()``.

    A change that does not load keeps the last good version and is logged once.
    """

    path: Path | None
    what = "file"  # for the log
    load_error: type[Exception] = ValueError

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stamp: Stamp | None = None

    @staticmethod
    def _stamp_of(names: Iterable[str]) -> Stamp:
        stamps: list[tuple[str, int | None, int | None, int | None]] = []
        for name in names:
            try:
                st = os.stat(name)
                stamps.append((name, st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                stamps.append((name, None, None, None))
        return tuple(stamps)

    def _file_stamp(self) -> Stamp:
        return self._stamp_of([str(self.path)])

    def _load(self) -> None:
        raise NotImplementedError

    def _reload_if_changed(self) -> None:
        """Reload after a change; the caller holds ``self._lock``."""
        if self._file_stamp() != self._stamp:
            try:
                self._load()
                LOG.info("%s %s reloaded", self.what, self.path)
            except self.load_error as exc:
                self._stamp = self._file_stamp()  # log once per change, not per use
                LOG.error("keeping the previous %s: %s", self.what, exc)
