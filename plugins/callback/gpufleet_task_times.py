"""Wall seconds per task, appended as one JSON line per playbook run.

scripts/test enables it in every molecule scenario (.config/molecule/config.yml) and sums
the lines into its time table: the tasks that cost a scenario most. Enabled by
`callbacks_enabled = gpufleet_task_times` with `callback_plugins` naming this folder; it
writes only when GPUFLEET_TASK_TIMES names a file, and prints nothing.
"""

from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: gpufleet_task_times
type: aggregate
short_description: Wall seconds per task, as JSON lines, for scripts/test's time table
description:
  - Appends one JSON line per playbook run to the file named by GPUFLEET_TASK_TIMES.
requirements:
  - enable in callbacks_enabled
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet_task_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._path = os.environ.get("GPUFLEET_TASK_TIMES", "")
        self._playbook = ""
        self._times: dict[str, float] = {}
        self._task = ""
        self._since = 0.0

    def _close_task(self) -> None:
        if self._task:
            elapsed = time.monotonic() - self._since
            self._times[self._task] = self._times.get(self._task, 0.0) + elapsed
        self._task = ""

    def _open_task(self, task) -> None:
        self._close_task()
        self._task = task.get_name()
        self._since = time.monotonic()

    def v2_playbook_on_start(self, playbook) -> None:
        self._playbook = os.path.basename(playbook._file_name)

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self._open_task(task)

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self._open_task(task)

    def v2_playbook_on_stats(self, stats) -> None:
        self._close_task()
        if not self._path:
            return
        line = {
            "playbook": self._playbook,
            "tasks": {k: round(v, 2) for k, v in self._times.items()},
        }
        with open(self._path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
