"""The collector: runs the Slurm commands in a background thread, keeps a snapshot."""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from gpufleet_node.commands import CommandResult, Runner, StreamRunner, run_command
from gpufleet_node.exposition import Family, render
from gpufleet_node.slurm_exporter.metrics import CommandStatus, build_families
from gpufleet_node.slurm_exporter.model import (
    COMMANDS,
    DEFAULT_MAX_GPU_INDEX_SERIES,
    DEFAULT_MAX_JOB_SERIES,
    JOB_FALLBACK_ERRORS,
    JOB_JSON_COMMAND,
    JOB_MAX_OUTPUT,
    JOB_SOURCES,
    JSON_MIN_VERSION,
    MAX_JOB_REQUERIES,
    JobList,
)
from gpufleet_node.slurm_exporter.parsers import PARSERS
from gpufleet_node.slurm_exporter.parsers.jobs import JsonJobReader, TextJobReader
from gpufleet_node.slurm_exporter.shards import (
    CLUSTER_PART,
    NodeMap,
    Parts,
    Selection,
    UnknownShard,
    assemble,
    node_map_families,
    split_families,
)

LOG = logging.getLogger("gpufleet_slurm_exporter")


def slurm_version_tuple(version: object) -> tuple[int, int] | None:
    """``24.11.5`` -> (24, 11); None when unknown."""
    m = re.match(r"([0-9]{1,4})\.([0-9]{1,2})", version) if isinstance(version, str) else None
    return (int(m.group(1)), int(m.group(2))) if m else None


_FEED_CHUNK = 65536


def streamed(runner: Runner, max_output: int) -> StreamRunner:
    """A StreamRunner over a Runner that returns the whole output (tests, a site's wrapper):
    its output is fed in chunks, and more than ``max_output`` bytes is an output_limit."""

    def run(argv: list[str], timeout: float, sink: Callable[[bytes], None]) -> CommandResult:
        res = runner(argv, timeout)
        data = res.stdout.encode()
        if res.error is None and len(data) > max_output:
            return CommandResult("", res.duration, "output_limit", res.stderr, res.returncode)
        for i in range(0, len(data), _FEED_CHUNK):
            sink(data[i : i + _FEED_CHUNK])
        return res

    return run


class Collector:
    """Runs the Slurm commands concurrently and keeps the latest exposition snapshot."""

    def __init__(
        self,
        command_timeout: float = 10.0,
        max_job_series: int = DEFAULT_MAX_JOB_SERIES,
        max_stale: float = 300.0,
        bin_dir: str | None = None,
        runner: Runner | None = None,
        commands: Mapping[str, list[str]] | None = None,
        job_source: str = "auto",
        max_gpu_index_series: int = DEFAULT_MAX_GPU_INDEX_SERIES,
        node_map: NodeMap | None = None,
        job_max_output: int = JOB_MAX_OUTPUT,
    ) -> None:
        if job_source not in JOB_SOURCES:
            raise ValueError(f"job source must be one of {JOB_SOURCES}")
        self.command_timeout = command_timeout
        self.max_job_series = max_job_series
        self.max_gpu_index_series = max_gpu_index_series
        self.max_stale = max_stale
        self.job_source = job_source
        self.commands = dict(commands or COMMANDS)
        json_command = list(JOB_JSON_COMMAND)
        if bin_dir:
            self.commands = {
                k: [os.path.join(bin_dir, v[0]), *v[1:]] for k, v in self.commands.items()
            }
            json_command[0] = os.path.join(bin_dir, json_command[0])
        self.job_commands = {"text": self.commands.get("scontrol_jobs", []), "json": json_command}
        # auto: set once `scontrol --json` failed where the text form worked (no data_parser
        # plugin, an unknown schema): the text form is used from then on.
        self.json_failed = False
        env = dict(os.environ)
        env["SLURM_TIME_FORMAT"] = "standard"
        self._env = env
        self.runner: Runner = runner or (lambda argv, t: run_command(argv, t, self._env))
        # Job records are parsed as they arrive, never held whole (a 27,000-job table is
        # 264 MiB of JSON): the output bound is then on time, not memory.
        self.job_runner: StreamRunner = (
            streamed(runner, job_max_output)
            if runner is not None
            else lambda argv, t, sink: run_command(
                argv, t, self._env, max_output=job_max_output, sink=sink
            )
        )
        self.status: dict[str, CommandStatus] = {k: CommandStatus() for k in self.commands}
        self.dropped_total = 0
        self.index_dropped_total = 0
        self.last_collect: float | None = None
        self.collect_duration = 0.0
        self._lock = threading.Lock()
        self.node_map = node_map
        families = build_families(
            self.status, time.time(), max_stale, max_job_series, 0, None, 0.0
        )[0]
        self._snapshot = b""
        # What per-shard scrapes are cut from (None: no node map, only the whole snapshot),
        # and their bodies, rendered on first request, for this snapshot only.
        self._families: list[Family] = families
        self._parts: Parts | None = None
        self._shards: frozenset[str] = frozenset()
        self._generation = 0
        self._selected: dict[Selection, bytes] = {}
        self._selected_bytes = 0
        self._publish(families)

    def job_source_now(self) -> str:
        """The job source of the next collection: json or text."""
        if self.job_source != "auto":
            return self.job_source
        if self.json_failed:
            return "text"
        st = self.status.get("sinfo_version")
        version = slurm_version_tuple(st.result if st is not None else None)
        return "json" if version is not None and version >= JSON_MIN_VERSION else "text"

    def _attempt(
        self, name: str, argv: list[str], parser: str
    ) -> tuple[CommandResult, object, int]:
        """Run and parse one command: (result with its error, parsed value, bad lines)."""
        try:
            res = self.runner(argv, self.command_timeout)
        except Exception:  # the runner must never take the exporter down
            LOG.exception("running %s failed", name)
            res = CommandResult("", 0.0, "exec_error")
        if res.error is not None:
            return res, None, 0
        try:
            result, bad = PARSERS[parser](res.stdout)
        except Exception:
            LOG.exception("parsing %s output failed", name)
            return CommandResult("", res.duration, "parse"), None, 0
        unusable = (
            result.unusable
            if isinstance(result, JobList)
            else bool(bad) and isinstance(result, list) and not result  # no usable line
        )
        if unusable or (result is None and name == "sinfo_version"):
            return CommandResult("", res.duration, "parse"), result, bad
        return res, result, bad

    def _attempt_jobs(self, source: str) -> tuple[CommandResult, JobList | None, int]:
        """Run and parse the job records of ``source`` as they arrive."""
        reader = JsonJobReader() if source == "json" else TextJobReader()
        try:
            res = self.job_runner(self.job_commands[source], self.command_timeout, reader.feed)
        except Exception:  # the runner must never take the exporter down
            LOG.exception("reading the %s job records failed", source)
            res = CommandResult("", 0.0, "exec_error")
        if res.error is not None:
            return res, None, 0
        try:
            result, bad = reader.finish()
            if isinstance(reader, TextJobReader):
                self._requery(reader)
        except Exception:
            LOG.exception("parsing the %s job records failed", source)
            return CommandResult("", res.duration, "parse"), None, 0
        if result.unusable:
            return CommandResult("", res.duration, "parse"), result, bad
        return res, result, bad

    def _requery(self, reader: TextJobReader) -> None:
        """Ask scontrol for each job id that has several records, that job alone: its real
        record starts that output, so text in another job cannot take its place."""
        doubtful = [i for i, recs in reader.result.unresolved.items() if len(recs) > 1]
        # One command timeout for all of them: forged records must not stretch the cycle.
        deadline = time.monotonic() + self.command_timeout
        for job_id in doubtful[:MAX_JOB_REQUERIES]:
            left = deadline - time.monotonic()
            if left <= 0:
                LOG.warning("scontrol show job: no time left for %d job ids", len(doubtful))
                break
            argv = [*self.job_commands["text"], job_id]
            try:
                res = self.runner(argv, left)
            except Exception:
                LOG.warning("scontrol show job %s failed; its records stay unresolved", job_id)
                continue
            if res.error is None:
                reader.adopt(job_id, res.stdout)

    def _run_jobs(self) -> tuple[CommandResult, JobList | None, int]:
        """The job records of this collection, from the job source now in use.

        auto falls back to the text form when the JSON form fails in a way the text form
        may not (no data_parser plugin, unknown schema, more output than the bound), and
        stays with it; the JSON failure is counted as that command's error.
        """
        source = self.job_source_now()
        res, result, bad = self._attempt_jobs(source)
        if res.error in JOB_FALLBACK_ERRORS and source == "json" and self.job_source == "auto":
            text = self._attempt_jobs("text")
            if text[0].error is None:
                st = self.status["scontrol_jobs"]
                st.errors[res.error] = st.errors.get(res.error, 0) + 1
                LOG.warning(
                    "scontrol --json failed (%s), the text form worked: using it from now on",
                    res.error,
                )
                self.json_failed = True
                return text
        return res, result, bad

    def _run_one(self, name: str) -> None:
        st = self.status[name]
        result: object
        if name == "scontrol_jobs":
            res, result, bad = self._run_jobs()
        else:
            res, result, bad = self._attempt(name, self.commands[name], name)
        st.duration = res.duration
        st.parse_errors += bad
        if res.error is None:
            st.success = True
            st.last_success = time.time()
            st.result = result
        else:
            st.success = False
            st.errors[res.error] = st.errors.get(res.error, 0) + 1

    def collect(self) -> bytes:
        """One collection cycle; returns (and stores) the new snapshot. Never raises."""
        start = time.monotonic()
        names = list(self.commands)
        version = self.status.get("sinfo_version")
        if self.job_source == "auto" and version is not None and version.result is None:
            # The job source depends on the Slurm version: learn it first, once.
            self._run_one("sinfo_version")
            names.remove("sinfo_version")
        with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            list(pool.map(self._run_one, names))
        self.collect_duration = time.monotonic() - start
        self.last_collect = time.time()
        try:
            families, dropped, index_dropped = build_families(
                self.status,
                self.last_collect,
                self.max_stale,
                self.max_job_series,
                self.dropped_total,
                self.last_collect,
                self.collect_duration,
                self.max_gpu_index_series,
                self.index_dropped_total,
            )
            self.dropped_total += dropped
            self.index_dropped_total += index_dropped
            return self._publish(families)
        except Exception:
            LOG.exception("building metrics failed")
            body = b"# building metrics failed\nslurm_up 0\n"
            failed = Family("slurm_up", "gauge", "Slurm exporter failure", {(): 0.0})
            with self._lock:
                self._snapshot = body
                self._families, self._parts = [failed], {CLUSTER_PART: {"slurm_up": {(): 0.0}}}
                self._generation += 1
                self._selected, self._selected_bytes = {}, 0
            return body

    def _publish(self, families: list[Family]) -> bytes:
        """Store one snapshot: the whole body, and its parts by shard when a map is set."""
        parts: Parts | None = None
        shards: frozenset[str] = frozenset()
        if self.node_map is not None:
            data = self.node_map.current()
            families = families + node_map_families(data, families)
            parts = split_families(families, data.node_shard)
            shards = data.shards
        body = render(families).encode()
        with self._lock:
            self._snapshot = body
            self._families, self._parts, self._shards = families, parts, shards
            self._generation += 1
            self._selected, self._selected_bytes = {}, 0
        return body

    def snapshot(self) -> bytes:
        with self._lock:
            return self._snapshot

    def snapshot_for(self, selection: Selection) -> bytes:
        """The part of the latest snapshot one scrape asks for (parse_selection).

        UnknownShard when no node map is set or it does not name the shard. Bodies are
        kept for the rest of the snapshot (an HA pair asks twice) within a byte budget of
        twice the whole snapshot; beyond it they are rendered per request.
        """
        with self._lock:
            body = self._selected.get(selection)
            if body is not None:
                return body
            families, parts, shards = self._families, self._parts, self._shards
            generation, budget = self._generation, 2 * len(self._snapshot) + (1 << 20)
        if parts is None:
            raise UnknownShard("no node map is set (--node-map-file)")
        if selection.shard is not None and selection.shard not in shards:
            raise UnknownShard(f"the node map names no shard {selection.shard}")
        body = render(assemble(families, parts, selection)).encode()
        with self._lock:
            if self._generation == generation and self._selected_bytes + len(body) <= budget:
                self._selected[selection] = body
                self._selected_bytes += len(body)
        return body

    def loop(self, interval: float, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            self.collect()
            stop.wait(max(1.0, interval - (time.monotonic() - started)))
