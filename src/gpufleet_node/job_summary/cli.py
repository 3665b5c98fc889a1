"""``EpilogSlurmctld`` program: store a finished job's summary in its AdminComment.

slurmctld runs it as SlurmUser once per finished job, with SLURM_JOB_ID in its
environment (docs/jobstats.md has the slurm.conf line). It asks every Prometheus
instance of the configuration (the standalone one, or each shard: a job's nodes may be
spread over several) for the job's figures, then runs
``scontrol update job=<id> AdminComment=GF1:...``. A job without GPU series (a CPU job)
gets no summary. Exit status: 0 stored or nothing to store, 1 when Prometheus, scontrol
or the configuration failed (slurmctld logs it), 2 for invalid arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import syslog
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet_node.job_summary import gather
from gpufleet_node.job_summary.prom import PromClient, PromError, one_line
from gpufleet_node.job_summary.summary import JOB_ID, MAX_TEXT, Summary, SummaryError, encode

# slurm.conf names the program without arguments: the role writes the configuration here.
CONFIG = "/etc/gpufleet/job-summary/config.json"
MAX_CONFIG = 1024 * 1024
SCONTROL_TIMEOUT_S = 30


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
    scontrol: str = "scontrol"


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
        scontrol=_string(document, "scontrol", "scontrol") or "scontrol",
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
    for key in ("timeout", "lookback_s"):
        value = document.get(key, getattr(config, key))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{path}: {key} must be a positive number")
        setattr(config, key, type(getattr(config, key))(value))
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


def summarize(config: Config, job_id: str, now: float) -> tuple[Summary, list[str]]:
    """The job's summary over every instance, and the instances that did not answer."""
    secret = read_password(config)

    def make(url: str) -> PromClient:
        return PromClient(url, config.timeout, config.ca_file or None, config.username, secret)

    down: list[str] = []
    names: list[str] = []  # of the instances in ``down``
    found: list[tuple[PromClient, Summary]] = []
    for name, urls in config.instances:
        client, why = gather.first_answer(urls, make, name)
        if client is None:
            down.append(why)
            names.append(name)
            continue
        try:
            part = gather.find(client, job_id, config.lookback_s, now)
        except PromError as err:
            down.append(f"{name}: {err}")
            names.append(name)
            continue
        if part.nodes:
            found.append((client, part))
    whole = gather.merge(job_id, [part for _, part in found])
    for client, part in found:
        gather.figures(client, part, whole.start, whole.end)
    whole = gather.merge(job_id, [part for _, part in found])
    # Stored all the same: the reader lists what is missing, as for a live shard down.
    whole.down = [name[:MAX_TEXT] for name in names]
    return whole, down


def store(config: Config, job_id: str, text: str) -> None:
    argv = [config.scontrol, "update", f"job={job_id}", f"AdminComment={text}"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ConfigError(f"{config.scontrol}: {one_line(str(err))}") from err
    if done.returncode != 0:
        said = one_line(done.stderr or done.stdout or "")
        raise ConfigError(f"scontrol update job={job_id} failed ({done.returncode}): {said}")


def say(line: str) -> None:
    """stderr, and syslog: slurmctld keeps no output of its epilog."""
    print(f"gpufleet-job-summary: {line}", file=sys.stderr)
    syslog.openlog("gpufleet-job-summary", 0, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_WARNING, line)


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
        job_id = args.job_id if args.job_id is not None else os.environ.get("SLURM_JOB_ID", "")
        if not JOB_ID.fullmatch(job_id):
            say(f"{job_id[:40]!r} is not a job id")
            return 2
        summary, down = summarize(config, job_id, time.time())
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
        if args.print:
            print(text)
        else:
            store(config, job_id, text)
        return 1 if down else 0
    except (ConfigError, SummaryError, PromError) as err:
        say(str(err))
        return 1
