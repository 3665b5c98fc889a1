"""``EpilogSlurmctld`` program: store a finished job's summary in its AdminComment.

slurmctld runs it as SlurmUser once per finished job, with SLURM_JOB_ID in its
environment (docs/jobstats.md has the slurm.conf line). It asks every Prometheus
instance of the configuration (the standalone one, or each shard: a job's nodes may be
spread over several) for the job's figures, then runs
``sacctmgr -i update job where jobid=<id> set AdminComment=GF1:...`` (<id>: the array task
or het component itself, see :func:`accounting_target`). It is slurmdbd's record that
changes: slurmctld refuses ``scontrol update`` of a job that has finished (24.11: "Job has
already finished"), as Princeton's jobstats epilog also found. A job without GPU series (a
CPU job) gets no summary. Exit status: 0 stored or nothing to store, 1 when Prometheus,
sacctmgr or the configuration failed (slurmctld logs it), 2 for invalid arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import math
import os
import signal
import sys
import syslog
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import IO, Any, Callable, TypeVar

from gpufleet_node.commands import run_command
from gpufleet_node.httpclient import one_line
from gpufleet_node.job_summary import gather
from gpufleet_node.job_summary.prom import PromClient, PromError
from gpufleet_node.job_summary.summary import (
    JOB_ID,
    MAX_TEXT,
    Summary,
    SummaryError,
    canonical_job_id,
    encode,
)

# slurm.conf names the program without arguments: the role writes the configuration here.
CONFIG = "/etc/gpufleet/job-summary/config.json"
MAX_CONFIG = 1024 * 1024
SACCTMGR_TIMEOUT_S = 30
# slurmdbd may not hold the job's record yet when the epilog starts: a few tries.
SACCTMGR_TRIES = 3
SACCTMGR_MAX_OUTPUT = 64 * 1024  # its answer is a line or two; more is not sacctmgr's
SACCTMGR_RETRY_S = 2.0
# Margin on SLURM_JOB_START_TIME when it bounds the lookback (series start a scrape late).
START_MARGIN_S = 600
T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message is one line."""


@dataclass
class Config:
    """What the role writes (config.json): where the job's series are, how to log in."""

    instances: list[tuple[str, list[str]]] = field(default_factory=list)  # (name, URLs)
    ca_file: str = ""
    username: str = ""
    password_file: str = ""
    timeout: float = 20.0
    lookback_s: int = 30 * 86400
    sacctmgr: str = "sacctmgr"  # an absolute path: slurmctld gives its epilog no PATH
    slurm_conf: str = ""  # SLURM_CONF for sacctmgr (nor that): "" is Slurm's default
    # slurmctld keeps the job completing until its epilog exits: the whole run is bounded.
    deadline_s: float = 60.0
    # Epilogs running at once on this host (a burst of job ends), each holding a slot file
    # of run_dir; "" runs without the cap. One that gets no slot in slot_wait_s skips.
    run_dir: str = ""
    slots: int = 4
    slot_wait_s: float = 5.0


def _string(document: dict[str, Any], key: str, default: str = "") -> str:
    value = document.get(key, default)
    if not isinstance(value, str) or len(value) > 4096 or not value.isprintable():
        raise ConfigError(f"{key} must be a printable string")
    return value


def load_config(path: str) -> Config:
    try:
        with open(path, "rb") as handle:
            document = json.loads(handle.read(MAX_CONFIG + 1)[:MAX_CONFIG])
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror or err}") from err
    except ValueError as err:
        raise ConfigError(f"{path}: not JSON") from err
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: not a JSON object")
    instances = document.get("prometheus")
    if not isinstance(instances, list) or not instances:
        raise ConfigError(f"{path}: prometheus must list at least one instance")
    config = Config(
        ca_file=_string(document, "ca_file"),
        username=_string(document, "username"),
        password_file=_string(document, "password_file"),
        sacctmgr=_string(document, "sacctmgr", "sacctmgr") or "sacctmgr",
        run_dir=_string(document, "run_dir"),
        slurm_conf=_string(document, "slurm_conf"),
    )
    for item in instances:
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: a prometheus entry is not an object")
        urls = item.get("urls")
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
            raise ConfigError(f"{path}: each prometheus entry needs a list of urls")
        for url in urls:
            try:
                PromClient(url)
            except PromError as err:
                raise ConfigError(f"{path}: {err}") from err
        config.instances.append((_string(item, "name", urls[0]), list(urls)))
    for key in ("timeout", "lookback_s", "deadline_s", "slots", "slot_wait_s"):
        value = document.get(key, getattr(config, key))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value < 1e9:
            raise ConfigError(f"{path}: {key} must be a positive number")
        value = type(getattr(config, key))(value)  # int keys: 0.5 slots is none
        if not value > 0:
            raise ConfigError(f"{path}: {key} must be a positive number")
        setattr(config, key, value)
    return config


def read_password(config: Config) -> str | None:
    if not config.username:
        return None
    if not config.password_file:
        raise ConfigError("username is set but password_file is not")
    try:
        with open(config.password_file, encoding="utf-8") as handle:
            return handle.read(4096).strip("\r\n")
    except OSError as err:
        raise ConfigError(f"{config.password_file}: {err.strerror or err}") from err


def in_parallel(calls: Sequence[Callable[[], T]]) -> list[T | Exception]:
    """Each call in a daemon thread, its result or exception in order: one slow instance
    delays no other, and the deadline's alarm (main thread) can end the program while a
    thread still waits on a socket."""
    results: list[T | Exception] = [Exception("not run")] * len(calls)

    def run(k: int, call: Callable[[], T]) -> None:
        try:
            results[k] = call()
        except Exception as err:  # handed to the caller
            results[k] = err

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def lookback(config: Config, env: Mapping[str, str], now: float) -> int:
    """How far back the job's series are looked for: since the job's start where the
    environment gives it (a shorter range is a cheaper query), else the configured days."""
    start = env.get("SLURM_JOB_START_TIME", "")
    if start.isdigit() and 0 < int(start) <= now:
        return max(60, min(config.lookback_s, math.ceil(now - int(start)) + START_MARGIN_S))
    return config.lookback_s


def summarize(
    config: Config, job_id: str, now: float, lookback_s: int | None = None
) -> tuple[Summary, list[str]]:
    """The job's summary over every instance, and the instances that did not answer."""
    secret = read_password(config)
    since = config.lookback_s if lookback_s is None else lookback_s

    def make(url: str) -> PromClient:
        return PromClient(url, config.timeout, config.ca_file or None, config.username, secret)

    def find_on(name: str, urls: list[str]) -> tuple[PromClient, Summary]:
        client, why = gather.first_answer(urls, make, name)
        if client is None:
            raise PromError(why)
        try:
            return client, gather.find(client, job_id, since, now)
        except PromError as err:
            raise PromError(f"{name}: {err}") from err

    calls = [partial(find_on, name, urls) for name, urls in config.instances]
    down: list[str] = []
    names: list[str] = []  # of the instances in ``down``
    found: list[tuple[str, PromClient, Summary]] = []
    for (name, _), result in zip(config.instances, in_parallel(calls)):
        if isinstance(result, PromError):
            down.append(str(result))
            names.append(name)
        elif isinstance(result, Exception):
            raise result
        elif result[1].nodes:
            found.append((name, *result))
    whole = gather.merge(job_id, [part for _, _, part in found])
    done = in_parallel(
        [partial(gather.figures, client, part, whole.start, whole.end) for _, client, part in found]
    )
    kept = []
    for (name, _, part), failed in zip(found, done):
        if isinstance(failed, PromError):
            # A shard failing now loses its nodes, not the whole summary: named in down.
            down.append(f"{name}: {failed}")
            names.append(name)
        elif isinstance(failed, Exception):
            raise failed
        else:
            kept.append(part)
    whole = gather.merge(job_id, kept)
    if found:
        with contextlib.suppress(PromError):  # the reader falls back to the default
            whole.threshold = gather.site_threshold(found[0][1], whole.end)
    # Stored all the same: the reader lists what is missing, as for a live shard down.
    whole.down = [name[:MAX_TEXT] for name in names]
    return whole, down


def accounting_target(job_id: str, env: Mapping[str, str]) -> str:
    """The one job record to change: ``jobid=<array job id>`` would name every task of the
    array, ``jobid=<het leader>`` every component, so an array task is named
    ``<array job id>_<task id>`` and a het component ``<het id>+<offset>`` (the variables
    slurmctld sets for its epilog)."""
    array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    if JOB_ID.fullmatch(array) and JOB_ID.fullmatch(task):
        return f"{array}_{task}"
    het, offset = env.get("SLURM_HET_JOB_ID", ""), env.get("SLURM_HET_JOB_OFFSET", "")
    if JOB_ID.fullmatch(het) and JOB_ID.fullmatch(offset):
        return f"{het}+{offset}"
    return job_id


def store(config: Config, job_id: str, text: str) -> None:
    argv = [config.sacctmgr, "-i", "update", "job", "where", f"jobid={job_id}", "set"]
    argv.append(f"AdminComment={text}")
    env = dict(os.environ)
    if config.slurm_conf:
        env["SLURM_CONF"] = config.slurm_conf
    for attempt in range(SACCTMGR_TRIES):
        done = run_command(argv, SACCTMGR_TIMEOUT_S, env=env, max_output=SACCTMGR_MAX_OUTPUT)
        said = one_line(done.stderr or done.stdout or "")
        if done.error == "timeout":
            raise ConfigError(f"{config.sacctmgr}: no answer in {SACCTMGR_TIMEOUT_S} s")
        if done.error in ("not_found", "exec_error", "output_limit"):
            raise ConfigError(f"{config.sacctmgr}: {said or done.error.replace('_', ' ')}")
        if done.error is not None:
            raise ConfigError(f"sacctmgr update job {job_id} failed ({done.returncode}): {said}")
        if "nothing modified" not in done.stdout.lower():
            return
        if attempt + 1 < SACCTMGR_TRIES:
            time.sleep(SACCTMGR_RETRY_S)
    raise ConfigError(f"sacctmgr update job {job_id}: slurmdbd has no record of it ({said})")


class NoSlot(Exception):
    """Every slot is taken: too many epilogs at once on this host."""


def take_slot(config: Config) -> IO[bytes] | None:
    """An flock on one of run_dir's slot files, held until the program exits (None: no
    cap configured). Raises NoSlot after slot_wait_s, ConfigError if run_dir is unusable."""
    if not config.run_dir:
        return None
    waited_until = time.monotonic() + config.slot_wait_s
    while True:
        for k in range(config.slots):
            path = os.path.join(config.run_dir, f"slot-{k}")
            try:
                handle = open(path, "ab")  # noqa: SIM115 - held until exit
            except OSError as err:
                raise ConfigError(f"{path}: {err.strerror or err}") from err
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return handle
            except OSError as err:
                handle.close()
                if err.errno not in (errno.EAGAIN, errno.EACCES):
                    raise ConfigError(f"{path}: {err.strerror or err}") from err
        if time.monotonic() >= waited_until:
            raise NoSlot(f"{config.slots} job summaries already running on this host")
        time.sleep(0.2)


class DeadlineExceeded(Exception):
    """The program ran past deadline_s."""


def _on_alarm(signum: int, frame: object) -> None:
    raise DeadlineExceeded()


def say(line: str) -> None:
    """stderr, and syslog: slurmctld keeps no output of its epilog."""
    print(f"gpufleet-job-summary: {line}", file=sys.stderr)
    syslog.openlog("gpufleet-job-summary", 0, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_WARNING, line)


def bounded(config: Config, job_id: str, target: str, print_only: bool) -> int:
    """run() within deadline_s (an alarm) and a host-wide slot: never a job held in CG
    for long, nor a burst of job ends running hundreds of these at once."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(max(1, math.ceil(config.deadline_s)))
    slot = None
    try:
        slot = take_slot(config)
        return run(config, job_id, target, print_only)
    except DeadlineExceeded:
        say(f"job {job_id}: not done in {config.deadline_s:g}s (deadline_s), nothing stored")
        return 1
    except NoSlot as err:
        say(f"job {job_id}: {err}, nothing stored")
        return 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        if slot is not None:
            slot.close()


def run(config: Config, job_id: str, target: str, print_only: bool) -> int:
    now = time.time()
    summary, down = summarize(config, job_id, now, lookback(config, os.environ, now))
    for line in down:
        say(f"job {job_id}: {line}")
    if not summary.nodes:
        if down:
            return 1
        print(
            f"gpufleet-job-summary: job {job_id}: no GPU series, nothing stored",
            file=sys.stderr,
        )
        return 0
    text = encode(summary)
    if print_only:
        print(text)
    else:
        store(config, target, text)
    return 1 if down else 0


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpufleet-job-summary", description=__doc__)
    p.add_argument("--config", default=CONFIG, help=f"configuration (default {CONFIG})")
    p.add_argument("--job-id", default=None, help="default: $SLURM_JOB_ID (slurmctld sets it)")
    p.add_argument("--print", action="store_true", help="print the summary, store nothing")
    p.add_argument("--check-config", action="store_true", help="only check --config")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        config = load_config(args.config)
        if args.check_config:
            return 0
        given = args.job_id if args.job_id is not None else os.environ.get("SLURM_JOB_ID", "")
        try:
            job_id = canonical_job_id(given)  # "0042" is job 42, as Slurm reads it
        except ValueError as err:
            say(str(err))
            return 2
        # The series carry the job's own id; sacctmgr must name this task/component only.
        target = job_id if args.job_id is not None else accounting_target(job_id, os.environ)
        return bounded(config, job_id, target, args.print)
    except (ConfigError, SummaryError, PromError) as err:
        say(str(err))
        return 1
