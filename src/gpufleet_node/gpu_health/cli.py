"""gpufleet-gpu-health: acts on the GPU collector's health verdict through Slurm.

    gpufleet-gpu-health [check]     Slurm's HealthCheckProgram: drain, resume or nothing
    gpufleet-gpu-health status      one line per check that is not ok, and the Slurm state
    gpufleet-gpu-health validate    the config only (the role's validate step)
    gpufleet-gpu-health clear [--gpu N]
                                    after a GPU reset or repair: XIDs seen so far no longer
                                    count (a reboot clears them by itself)

Settings come from one JSON file the gpu_collector role writes (``--config``). Every
action is logged to the journal (identifier gpufleet-gpu-health) and counted in
``node_gpu_health_*`` series in node_exporter's textfile directory. See docs/health.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import syslog
import time
from pathlib import Path
from typing import Any, NamedTuple

from ..commands import run_command
from ..exposition import Registry, render, write_textfile
from ..gpu_collector.state import (
    boot_id,
    load_json_value,
    load_xid_baseline,
    load_xid_state,
    xid_baseline_document,
    xid_state_problem,
)
from ..numbers import finite
from .decide import (
    MODES,
    Intent,
    Limits,
    Verdict,
    intent,
    over_valve,
    parse_verdict,
    recent,
    valve_problem,
)
from .slurmnode import NodeState, SlurmShapeError, parse_nodes

DEFAULT_CONFIG = "/etc/gpufleet/gpu-health.json"
MAX_FILE_BYTES = 1 << 20  # the verdict, the state, the config: a few KiB each
MAX_SCONTROL_BYTES = 64 << 20  # every node of a large cluster as JSON
ACTIONS = ("drain", "resume", "blocked", "undone")
OUTPUT = "gpufleet_gpu_health.prom"


class Config(NamedTuple):
    mode: str
    node: str
    verdict: str
    xid_state: str
    xid_baseline: str
    max_age: float
    limits: Limits
    resume_after: int
    max_resumes_per_day: int
    state_dir: str
    textfile_dir: str
    scontrol: str
    timeout: float
    chain: str


class ConfigError(ValueError):
    pass


def _number(data: dict[str, Any], key: str, low: float, high: float) -> float:
    value = finite(data.get(key))
    if value is None:
        raise ConfigError(f"{key}: a number is needed")
    if not low <= value <= high:
        raise ConfigError(f"{key}: {value:g} is outside {low:g}..{high:g}")
    return value


def _count(data: dict[str, Any], key: str, low: int, high: int) -> int:
    value = data.get(key)
    if type(value) is not int:
        raise ConfigError(f"{key}: a whole number is needed")
    if not low <= value <= high:
        raise ConfigError(f"{key}: {str(value)[:20]} is outside {low}..{high}")
    return value


def _text(data: dict[str, Any], key: str, absolute: bool = True, empty: bool = False) -> str:
    value = data.get(key, "")
    if not isinstance(value, str) or (not value and not empty):
        raise ConfigError(f"{key}: text is needed")
    if value and any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ConfigError(f"{key}: holds a control character")
    if value and absolute and not value.startswith("/"):
        raise ConfigError(f"{key}: an absolute path is needed")
    return value


def parse_config(text: str) -> Config:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ConfigError(f"not JSON ({err})") from err
    if not isinstance(data, dict):
        raise ConfigError("not a JSON object")
    mode = data.get("mode")
    if mode not in MODES:
        raise ConfigError(f"mode: one of {', '.join(MODES)}, not {mode!r}")
    return Config(
        mode=mode,
        node=_text(data, "node", absolute=False),
        verdict=_text(data, "verdict"),
        xid_state=_text(data, "xid_state"),
        xid_baseline=_text(data, "xid_baseline"),
        max_age=_number(data, "max_age_seconds", 1, 86400),
        limits=Limits(
            _number(data, "max_drained_share_partition", 0, 1),
            _number(data, "max_drained_share_cluster", 0, 1),
        ),
        resume_after=_count(data, "resume_after_runs", 1, 100),
        max_resumes_per_day=_count(data, "max_resumes_per_day", 0, 100),
        state_dir=_text(data, "state_dir"),
        textfile_dir=_text(data, "textfile_dir"),
        scontrol=_text(data, "scontrol"),
        timeout=_number(data, "timeout_seconds", 1, 300),
        chain=_text(data, "chain", empty=True),
    )


def read_small(path: str) -> str | None:
    """A file's text, at most MAX_FILE_BYTES; None when absent or unreadable."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_FILE_BYTES:
        return None
    return data.decode("utf-8", "replace")


def log(message: str, priority: int = syslog.LOG_INFO) -> None:
    """To the journal (through syslog) and to stderr for a person at a terminal."""
    syslog.openlog("gpufleet-gpu-health", 0, syslog.LOG_DAEMON)
    syslog.syslog(priority, message)
    print(f"gpufleet-gpu-health: {message}", file=sys.stderr)


class Slurm:
    """scontrol, bounded; every failure is a SlurmError naming the command."""

    def __init__(self, scontrol: str, timeout: float) -> None:
        self.scontrol, self.timeout = scontrol, timeout

    def run(self, *args: str, max_output: int = MAX_SCONTROL_BYTES) -> str:
        result = run_command([self.scontrol, *args], self.timeout, max_output=max_output)
        if result.error:
            detail = result.stderr.strip().splitlines()[-1:] or [result.error]
            raise SlurmError(f"scontrol {' '.join(args)}: {detail[0][:200]}")
        return result.stdout

    def node(self, name: str) -> NodeState:
        found = [n for n in parse_nodes(self.run("show", "node", name, "--json")) if n.name == name]
        if not found:
            raise SlurmError(f"scontrol show node {name}: Slurm does not know this node")
        return found[0]

    def nodes(self) -> list[NodeState]:
        return parse_nodes(self.run("show", "nodes", "--json"))

    def drain(self, name: str, reason: str) -> None:
        self.run("update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}")

    def resume(self, name: str) -> None:
        self.run("update", f"NodeName={name}", "State=RESUME")


class SlurmError(RuntimeError):
    pass


def load_state(path: str) -> dict[str, Any]:
    """Counters and history of this program; a file of any other shape starts afresh."""
    text = read_small(path)
    try:
        data = json.loads(text) if text else {}
    except (ValueError, RecursionError):
        data = {}
    state: dict[str, Any] = {"actions": dict.fromkeys(ACTIONS, 0), "passing_runs": 0}
    state["resumes"] = []
    if isinstance(data, dict):
        actions = data.get("actions")
        if isinstance(actions, dict):
            for action in ACTIONS:
                value = actions.get(action)
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    state["actions"][action] = value
        runs = data.get("passing_runs")
        if isinstance(runs, int) and not isinstance(runs, bool) and runs >= 0:
            state["passing_runs"] = runs
        resumes = data.get("resumes")
        if isinstance(resumes, list):
            state["resumes"] = [
                number for number in map(finite, resumes[-100:]) if number is not None
            ]
    return state


def metrics(config: Config, state: dict[str, Any], outcome: Outcome, now: float) -> str:
    reg = Registry()
    actions = reg.family(
        "node_gpu_health_actions_total",
        "What gpufleet-gpu-health did to this node in Slurm: drain, resume, blocked (the "
        "safety valve kept it from draining), undone (drained together with too many others).",
        "counter",
    )
    for action in ACTIONS:
        actions.set(state["actions"][action], action=action)
    for mode in MODES:
        reg.gauge(
            "node_gpu_health_mode",
            "The health program's mode (alert, drain, drain+resume); value is 1.",
            1.0 if mode == config.mode else 0.0,
            mode=mode,
        )
    reg.gauge(
        "node_gpu_health_drain_blocked",
        "1 if the last run wanted to drain this node and the safety valve refused.",
        1.0 if outcome.action == "blocked" else 0.0,
    )
    reg.gauge(
        "node_gpu_health_drained",
        "1 if the node is drained in Slurm with gpufleet's reason (as of the last run).",
        1.0 if outcome.drained_by_us else 0.0,
    )
    reg.gauge(
        "node_gpu_health_run_success",
        "1 if the last run read the verdict and Slurm's node state, else 0.",
        1.0 if outcome.ok else 0.0,
    )
    reg.gauge(
        "node_gpu_health_last_run_timestamp_seconds",
        "Unix time of the health program's last run.",
        round(now, 3),
    )
    return render(reg.families.values())


class Outcome(NamedTuple):
    action: str  # none, drain, resume, blocked, undone
    drained_by_us: bool
    ok: bool


def act(
    config: Config, slurm: Slurm, verdict: Verdict, state: dict[str, Any], now: float
) -> Outcome:
    node = slurm.node(config.node)
    passing = verdict.state in ("ok", "warn")
    state["passing_runs"] = state["passing_runs"] + 1 if passing else 0
    resumes = recent(state["resumes"], now)
    wanted = intent(
        verdict,
        config.mode,
        node,
        state["passing_runs"],
        len(resumes),
        config.resume_after,
        config.max_resumes_per_day,
        now,
    )
    if wanted.action == "drain":
        return drain(config, slurm, node, wanted, state, verdict)
    if wanted.action == "resume":
        slurm.resume(node.name)
        state["resumes"] = [*resumes, now]
        state["actions"]["resume"] += 1
        log(f"resumed {node.name}: every check passes (was: {node.reason})")
        return Outcome("resume", False, True)
    if verdict.state in ("fail", "unknown"):
        log(f"{node.name}: {wanted.reason}", syslog.LOG_WARNING)
    elif node.drained_by_us:  # healthy, not yet resumed: say why
        log(f"{node.name}: {wanted.reason}")
    return Outcome("none", node.drained_by_us, True)


def drain(
    config: Config,
    slurm: Slurm,
    node: NodeState,
    wanted: Intent,
    state: dict[str, Any],
    verdict: Verdict,
) -> Outcome:
    jobs = sorted({job for failure in verdict.failures for job in failure.jobs})
    on_jobs = f"; jobs on the GPU: {', '.join(jobs)}" if jobs else ""
    problem = valve_problem(node, slurm.nodes(), config.limits)
    if problem:
        state["actions"]["blocked"] += 1
        log(f"not draining {node.name} ({wanted.reason}): {problem}{on_jobs}", syslog.LOG_CRIT)
        return Outcome("blocked", False, True)
    slurm.drain(node.name, wanted.reason)
    state["actions"]["drain"] += 1
    log(f"drained {node.name}: {wanted.reason}{on_jobs}", syslog.LOG_WARNING)
    after = slurm.nodes()
    me = next((n for n in after if n.name == node.name), None)
    step_back = over_valve(me, after, config.limits) if me and me.drained_by_us else ""
    if step_back:
        slurm.resume(node.name)
        state["actions"]["undone"] += 1
        log(f"resumed {node.name} again: {step_back}", syslog.LOG_CRIT)
        return Outcome("blocked", False, True)
    return Outcome("drain", True, True)


def save(config: Config, state: dict[str, Any], outcome: Outcome, now: float) -> None:
    try:
        os.makedirs(config.state_dir, exist_ok=True)
        write_textfile(Path(config.state_dir, "state.json"), json.dumps(state, sort_keys=True))
        write_textfile(Path(config.textfile_dir, OUTPUT), metrics(config, state, outcome, now))
    except OSError as exc:
        log(f"cannot write state or metrics: {exc.strerror or exc}", syslog.LOG_ERR)


def run_chain(config: Config) -> int:
    """The site's own HealthCheckProgram (NHC, say), run first; its status is ours."""
    if not config.chain:
        return 0
    result = run_command([config.chain], config.timeout)
    if result.error:
        log(f"chained {config.chain}: {result.error}", syslog.LOG_ERR)
        return 1
    return 0


def check(config: Config) -> int:
    # slurmd names the node it runs the program for; the config's name is the fallback.
    config = config._replace(node=os.environ.get("SLURMD_NODENAME") or config.node)
    status = run_chain(config)
    now = time.time()
    state = load_state(os.path.join(config.state_dir, "state.json"))
    verdict = parse_verdict(read_small(config.verdict), now, config.max_age)
    try:
        outcome = act(config, Slurm(config.scontrol, config.timeout), verdict, state, now)
    except (SlurmError, SlurmShapeError) as exc:
        log(f"nothing done: {exc}", syslog.LOG_ERR)
        outcome = Outcome("none", False, False)
    save(config, state, outcome, now)
    return status


def status(config: Config) -> int:
    now = time.time()
    text = read_small(config.verdict)
    verdict = parse_verdict(text, now, config.max_age)
    why = f" ({verdict.why_unknown})" if verdict.why_unknown else ""
    print(f"{config.node}: {verdict.state}{why}")
    try:
        document = json.loads(text or "{}")
    except (ValueError, RecursionError):
        document = {}
    checks = document.get("checks") if isinstance(document, dict) else None
    if verdict.state != "unknown" and isinstance(checks, list):
        for item in checks:  # parse_verdict checked each one's shape
            if item["state"] == "ok":
                continue
            where = f"gpu{item['gpu']}" if item["gpu"] else "node"
            jobs = item.get("jobs") if isinstance(item.get("jobs"), list) else []
            on_jobs = f" [jobs {', '.join(map(str, jobs))}]" if jobs else ""
            print(f"  {where} {item['check']}: {item['state']}: {item['reason']}{on_jobs}")
    try:
        node = Slurm(config.scontrol, config.timeout).node(config.node)
        drained = "drained" if node.drained else "not drained"
        print(f"  slurm: {drained}{': ' + node.reason if node.reason else ''} (mode {config.mode})")
    except (SlurmError, SlurmShapeError) as exc:
        print(f"  slurm: unknown ({exc})")
    return 0


def clear(config: Config, gpu: str | None) -> int:
    """Take the XID counts now as the baseline (for one GPU, or all)."""
    data = load_json_value(config.xid_state)
    if data is None and os.path.exists(config.xid_state):
        print(f"gpufleet-gpu-health: {config.xid_state} is not JSON", file=sys.stderr)
        return 1
    problem = xid_state_problem(data if data is not None else {})
    if problem:
        print(f"gpufleet-gpu-health: {config.xid_state}: wrong shape: {problem}", file=sys.stderr)
        return 1
    state = load_xid_state(config.xid_state)
    found = load_xid_baseline(config.xid_baseline)
    counts: dict[str, int] = state.get("counts", {})
    pci_map: dict[str, list[str]] = state.get("pci_map", {})
    pcis = None if gpu is None else {pci for pci, ids in pci_map.items() if ids[:1] == [gpu]}
    if pcis == set():
        print(f"gpufleet-gpu-health: the collector knows no GPU {gpu}", file=sys.stderr)
        return 1
    boot = boot_id()
    # A baseline of an earlier boot is void: a reboot cleared every GPU's XIDs.
    new = dict(found[1]) if found and found[0] == boot else dict(counts)
    for key, count in counts.items():
        if pcis is None or key.split("|")[0] in pcis:
            new[key] = count
    try:
        write_textfile(Path(config.xid_baseline), json.dumps(xid_baseline_document(boot, new)))
    except OSError as exc:
        print(f"gpufleet-gpu-health: cannot write {config.xid_baseline}: {exc}", file=sys.stderr)
        return 1
    log(f"XIDs cleared on {config.node}" + (f" gpu{gpu}" if gpu else "") + " by an admin")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpufleet-gpu-health", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument(
        "command", nargs="?", default="check", choices=("check", "status", "clear", "validate")
    )
    parser.add_argument("--gpu", help="clear: only this GPU's XIDs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    text = read_small(args.config)
    try:
        if text is None:
            raise ConfigError("cannot be read")
        config = parse_config(text)
    except ConfigError as err:
        print(f"gpufleet-gpu-health: {args.config}: {err}", file=sys.stderr)
        return 2
    if args.command == "validate":  # the role's check of a new config before it is live
        return 0
    if args.command == "status":
        return status(config)
    if args.command == "clear":
        return clear(config, args.gpu)
    return check(config)


if __name__ == "__main__":
    sys.exit(main())
