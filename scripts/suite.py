#!/usr/bin/env python3
"""The body of scripts/test: runs the suite's parts in lanes and prints what each cost.

    scripts/suite.py                everything
    scripts/suite.py unit           lint, unit tests and ansible-lint only
    scripts/suite.py SCENARIO...    lint, the checks lane and the named scenarios

The machine has two cores, and a molecule scenario leaves much of one idle while its hosts
boot, its services start and its tests wait on real durations. So the scenarios run in
SCENARIO_LANES lanes side by side, the longest first (EXPECTED_SECONDS), beside one lane
of checks: the unit tests, ansible-lint, and the ansible-core top (its unit tests of what
goes through Ansible's own parsing and templating, and the multi-host gpu_node scenario, in
a venv of its own on Python 3.12+); when the checks are done, that lane takes the
scenarios still waiting too. Everything else runs in .venv, which scripts/bootstrap fills
with ansible-core's floor (playbooks/vars/ansible_core.yml).

Every part's output goes to its own log, printed whole when the part ends (lanes never
interleave their lines). At the end comes the time table: every part with its wall time,
each scenario's molecule phases, its slowest verify tests and Ansible tasks; it is also
written to .cache/test-times/ (latest.md and a dated copy). Every part has a deadline: a
hung scenario is killed and reported, not left to eat CI's 90 minutes.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TIMES_DIR = REPO / ".cache" / "test-times"
TOP_VENV = REPO / ".cache" / "venv-top"
# The ansible-core range, floor to top: the one place it is set.
ANSIBLE_CORE_RANGE = REPO / "playbooks" / "vars" / "ansible_core.yml"
# ansible-core 2.20+ runs on Python 3.12+: the top's venv takes the newest one found.
TOP_PYTHONS = ["3.14", "3.13", "3.12"]
# The multi-host scenario the top runs (in the checks lane; a full run leaves it out of the
# scenario lanes, whose hosts would clash with it).
TOP_SCENARIO = "gpu_node"
SCENARIO_LANES = 2
# Wall seconds of each scenario in the last measured full run (docs/testing.md): the
# longest start first, so the lanes end together. A scenario not listed counts as 600 s.
EXPECTED_SECONDS = {
    "cluster": 1800,
    "slurm": 1650,
    "slurm_sid": 600,
    # Its firewall reruns limited to the firewall (2026-12-07: 1,213 s in a full run).
    "exporter_firewall": 650,
    "grafana": 350,
    "observability": 350,
    "gpu_node": 250,
    "node_exporter_binary": 150,
    "default": 120,
}
# A part past its deadline is killed: four times its expected time, and at least 40 min.
# A deadline catches a hang, not a slow run: on two loaded cores a scenario took 2.5 times
# its quiet time (exporter_firewall, killed at 3 times while its verify still ran).
DEADLINE_FACTOR = 4
DEADLINE_FLOOR = 2400
# The top reruns the unit tests of what goes through Ansible's own parsing and templating.
TOP_UNIT_TESTS = [
    "tests/unit/inventory",
    "tests/unit/test_filters.py",
    "tests/unit/test_web_access.py",
    "tests/unit/test_common_upstream_release.py",
    "tests/unit/test_prometheus_config.py",
    "tests/unit/test_argument_specs.py",
    "tests/unit/test_tag_limited_handlers.py",
    "tests/unit/test_alert_for.py",
]
PHASE = re.compile(r"\[\S+ > (\w+)\] Executing$")
DURATION = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S+)")

print_lock = threading.Lock()
started = time.monotonic()
# Each part runs in its own process group (so a deadline kills its whole tree); these are
# the groups still running, for a run that is itself stopped.
running: set[int] = set()


def say(line: str) -> None:
    with print_lock:
        print(line, flush=True)


def now() -> float:
    return time.monotonic() - started


@dataclass
class Part:
    name: str
    lane: str
    start: float = 0.0
    end: float = 0.0
    rc: int | None = None
    log: Path | None = None
    note: str = ""
    phases: list[tuple[str, float]] = field(default_factory=list)
    tests: list[tuple[str, float]] = field(default_factory=list)
    tasks: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.end - self.start


parts: list[Part] = []


def run_part(
    argv: list[str],
    name: str,
    lane: str,
    logs: Path,
    *,
    env: dict[str, str] | None = None,
    deadline: float = DEADLINE_FLOOR,
    scenario: str = "",
) -> Part:
    """Run one command as a part: its output to a log, phases read from it, then the log
    printed whole. A part past its deadline has its process group killed."""
    part = Part(name=name, lane=lane, start=now())
    parts.append(part)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)
    part.log = logs / f"{slug}.log"
    tasks_file = logs / f"{slug}.tasks.jsonl"
    run_env = dict(os.environ if env is None else env)
    run_env["GPUFLEET_TASK_TIMES"] = str(tasks_file)
    say(f"== [{lane}] {name}: started at {part.start:.0f}s")
    phase, phase_start = "", 0.0
    in_verify = False
    with part.log.open("w") as log:
        process = subprocess.Popen(
            argv,
            cwd=REPO,
            env=run_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        running.add(process.pid)
        timer = threading.Timer(deadline, _kill, (process, part, deadline))
        timer.start()
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            log.flush()
            if scenario and (match := PHASE.search(line)):
                if phase:
                    part.phases.append((phase, now() - phase_start))
                seen = sum(1 for p, _ in part.phases if p.split(" ")[0] == match.group(1))
                phase = match.group(1) + (f" ({seen + 1})" if seen else "")
                phase_start = now()
                in_verify = match.group(1) == "verify"
            elif in_verify and (match := DURATION.match(line)) and match.group(2) != "teardown":
                test = match.group(3).rsplit("::", 1)[-1]
                part.tests.append((f"{test} ({match.group(2)})", float(match.group(1))))
        part.rc = process.wait()
        timer.cancel()
        running.discard(process.pid)
    if phase:
        part.phases.append((phase, now() - phase_start))
    part.end = now()
    part.tasks = read_task_times(tasks_file)
    with print_lock:
        print(f"== [{lane}] {name}: output", flush=True)
        sys.stdout.write(part.log.read_text(errors="replace"))
        verdict = "passed" if part.rc == 0 else f"FAILED (exit {part.rc})"
        print(f"== [{lane}] {name} {verdict} in {part.seconds:.0f}s{part.note}", flush=True)
    return part


def _kill(process: subprocess.Popen, part: Part, deadline: float) -> None:
    part.note = f" (killed at its {deadline:.0f}s deadline)"
    try:
        os.killpg(process.pid, signal.SIGTERM)
        time.sleep(10)
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop(signum: int, _frame: object) -> None:
    """A stopped run (Ctrl-C, CI's kill) stops every part it started, not only itself."""
    for group in list(running):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
    os._exit(128 + signum)


def read_task_times(path: Path) -> dict[str, float]:
    """Seconds per Ansible task over every playbook of a part (plugins/callback)."""
    totals: dict[str, float] = {}
    if not path.exists():
        return totals
    for line in path.read_text().splitlines():
        for task, seconds in json.loads(line)["tasks"].items():
            totals[task] = totals.get(task, 0.0) + seconds
    return totals


def scenario_deadline(scenario: str) -> float:
    return max(DEADLINE_FLOOR, DEADLINE_FACTOR * EXPECTED_SECONDS.get(scenario, 600))


def scenario_lane(lane: str, queue: list[str], lock: threading.Lock, logs: Path) -> None:
    while True:
        with lock:
            if not queue:
                return
            scenario = queue.pop(0)
        run_part(
            ["molecule", "test", "-s", scenario],
            f"scenario {scenario}",
            lane,
            logs,
            deadline=scenario_deadline(scenario),
            scenario=scenario,
        )


def top_version() -> str:
    top = yaml.safe_load(ANSIBLE_CORE_RANGE.read_text()).get("gpufleet_ansible_core_top")
    if not re.fullmatch(r"2\.[0-9]+", str(top)):
        raise SystemExit(f"suite: {ANSIBLE_CORE_RANGE} names no gpufleet_ansible_core_top (2.N)")
    return str(top)


def top_python() -> str | None:
    """The newest Python 3.12+ here: python3.N on PATH (one that runs: a pyenv shim of a
    version not selected does not), else a pyenv-installed one."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    for version in TOP_PYTHONS:
        candidates = [shutil.which(f"python{version}")]
        candidates += sorted(glob.glob(f"{pyenv}/versions/{version}.*/bin/python{version}"))[::-1]
        for candidate in candidates:
            if candidate and _runs_venv(candidate):
                return candidate
    return None


def _runs_venv(python: str) -> bool:
    try:
        probe = subprocess.run(
            [python, "-c", "import ensurepip, venv"], capture_output=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def top_env() -> dict[str, str]:
    env = dict(os.environ)
    env["VIRTUAL_ENV"] = str(TOP_VENV)
    env["PATH"] = f"{TOP_VENV / 'bin'}:{env['PATH']}"
    env["ANSIBLE_DEPRECATION_WARNINGS"] = "1"  # fail_on_deprecations reads them
    return env


def top_venv_script(top: str) -> str:
    """The top's venv: made with the newest Python 3.12+ here (this project's machines
    have pyenv's 3.13, Debian 13 has /usr/bin/python3.13 with python3.13-venv), then
    gpufleet with its test extra and ansible-core's top. Without such a Python the part
    fails with one line saying so: nothing is downloaded from outside the package indexes."""
    python = top_python()
    make = (
        f"{python} -m venv {TOP_VENV}"
        if python
        else (
            f"echo 'suite: no Python {' or '.join(TOP_PYTHONS)} with venv here: the top "
            f"(ansible-core {top}) needs one'; exit 1"
        )
    )
    return (
        f"set -e; [ -x {TOP_VENV}/bin/python ] || {{ {make}; }}; "
        f"{TOP_VENV}/bin/python -m pip install -q -e '.[test]' 'ansible-core=={top}.*'"
    )


def checks_lane(logs: Path, top: str) -> None:
    """Unit tests, ansible-lint, then the top; the top's venv installs meanwhile."""
    venv: subprocess.Popen | None = None
    if top:
        venv_log = (logs / "top-venv.log").open("w")
        venv = subprocess.Popen(
            ["bash", "-c", top_venv_script(top)],
            cwd=REPO,
            stdout=venv_log,
            stderr=subprocess.STDOUT,
        )
    run_part(
        ["pytest", "-q", "-n", "1", "-p", "no:cacheprovider", "tests"], "unit tests", "checks", logs
    )
    run_part(["ansible-lint"], "ansible-lint", "checks", logs)
    if venv is None:
        return
    venv_start = now()
    if venv.wait() != 0:
        part = Part(f"top {top}: venv", "checks", start=venv_start, end=now(), rc=1)
        part.log = logs / "top-venv.log"
        parts.append(part)
        say((logs / "top-venv.log").read_text())
        return
    env = top_env()
    version = subprocess.run(
        ["ansible", "--version"], env=env, capture_output=True, text=True, check=False
    ).stdout.splitlines()[:1]
    say(f"== [checks] the top: {' '.join(version)}")
    unit = run_part(
        ["pytest", "-q", "-n", "1", "-p", "no:cacheprovider", *TOP_UNIT_TESTS],
        f"top {top}: unit tests",
        "checks",
        logs,
        env=env,
    )
    jobstats = run_part(
        [
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/unit/jobstats/test_jobstats_client.py",
            "-k",
            "inventory",
        ],
        f"top {top}: jobstats -i",
        "checks",
        logs,
        env=env,
    )
    if unit.rc == 0 and jobstats.rc == 0:
        scenario = run_part(
            ["molecule", "test", "-s", TOP_SCENARIO],
            f"top {top}: scenario {TOP_SCENARIO}",
            "checks",
            logs,
            env=env,
            deadline=scenario_deadline(TOP_SCENARIO),
            scenario=TOP_SCENARIO,
        )
        fail_on_deprecations(scenario)


def fail_on_deprecations(part: Part) -> None:
    """A deprecation warning in a scenario's Ansible runs fails it: every playbook, role and
    plugin those runs load is gpufleet's or ansible-core's own (no collections), so each
    is a use of gpufleet's that the next ansible-core breaks (issue 27)."""
    assert part.log is not None
    lines = part.log.read_text(errors="replace").splitlines()
    found = [line for line in lines if "[DEPRECATION WARNING]" in line]
    if not found:
        return
    say(f"== [{part.lane}] {part.name}: {len(found)} deprecation warnings, the first ones:")
    say("\n".join(list(dict.fromkeys(found))[:10]))
    part.note += f" ({len(found)} deprecation warnings)"
    if part.rc == 0:
        part.rc = 1


def all_scenarios() -> list[str]:
    return sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))


def suites_of(scenarios: list[str]) -> list[str]:
    suites = {"bookworm"}
    for scenario in scenarios:
        config = yaml.safe_load((REPO / "molecule" / scenario / "molecule.yml").read_text())
        for platform in (config or {}).get("platforms", []):
            suites.add(platform.get("suite", "bookworm"))
    return sorted(suites)


def table() -> str:
    """The time table as Markdown: parts by start, each scenario's phases, its slowest
    verify tests and Ansible tasks."""
    bootstrap = float(os.environ.get("GPUFLEET_BOOTSTRAP_SECONDS", "0"))
    total = bootstrap + now()
    lines = [
        f"# scripts/test time table, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        f"Machine: {os.cpu_count()} CPUs, {_memory_gib()} GiB, {_cpu_model()}. "
        f"Wall seconds; lanes run side by side, so parts overlap. Whole run: {total:.0f} s "
        f"({total / 60:.1f} min).",
        "",
        "| part | lane | starts at (s) | seconds | result |",
        "| --- | --- | ---: | ---: | --- |",
        f"| bootstrap | - | {-bootstrap:.0f} | {bootstrap:.0f} | passed |",
    ]
    for part in sorted(parts, key=lambda p: p.start):
        result = "passed" if part.rc == 0 else f"FAILED{part.note}"
        lines.append(
            f"| {part.name} | {part.lane} | {part.start:.0f} | {part.seconds:.0f} | {result} |"
        )
    for part in parts:
        if not part.phases:
            continue
        lines += ["", f"## {part.name}: {part.seconds:.0f} s", ""]
        lines += ["| phase | seconds |", "| --- | ---: |"]
        lines += [f"| {phase} | {seconds:.0f} |" for phase, seconds in part.phases]
        if part.tests:
            lines += ["", "| verify test (slowest 12) | seconds |", "| --- | ---: |"]
            slowest = sorted(part.tests, key=lambda t: -t[1])[:12]
            lines += [f"| {test} | {seconds:.1f} |" for test, seconds in slowest]
        if part.tasks:
            lines += ["", "| Ansible task, all its playbooks (slowest 12) | seconds |"]
            lines += ["| --- | ---: |"]
            slowest_tasks = sorted(part.tasks.items(), key=lambda t: -t[1])[:12]
            lines += [f"| {_cell(task)} | {seconds:.1f} |" for task, seconds in slowest_tasks]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _memory_gib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024)
    return 0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def write_table() -> None:
    text = table()
    TIMES_DIR.mkdir(parents=True, exist_ok=True)
    (TIMES_DIR / "latest.md").write_text(text)
    (TIMES_DIR / time.strftime("%Y%m%dT%H%M%SZ.md", time.gmtime())).write_text(text)
    say("== time table (also in .cache/test-times/latest.md)")
    say(text)


def lint(logs: Path) -> bool:
    results = [
        run_part(["ruff", "check", "."], "lint: ruff check", "main", logs),
        run_part(["ruff", "format", "--check", "."], "lint: ruff format", "main", logs),
        # The node package, strictly, for its Python 3.9 floor (pyproject.toml [tool.mypy]).
        run_part(
            ["mypy", "--python-version", "3.9", "src/gpufleet_node"],
            "lint: mypy node",
            "main",
            logs,
        ),
        # The controller package, strictly, for Python 3.10+ (pyproject.toml [tool.mypy]).
        run_part(["mypy", "src/gpufleet"], "lint: mypy gpufleet", "main", logs),
    ]
    return all(part.rc == 0 for part in results)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logs = TIMES_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for old in logs.iterdir():
        old.unlink()
    full = not argv
    if argv == ["unit"]:
        scenarios: list[str] = []
    elif argv:
        unknown = [s for s in argv if s not in all_scenarios()]
        if unknown:
            say(f"suite: no molecule scenario {', '.join(unknown)} (molecule/*/molecule.yml)")
            return 2
        scenarios = list(argv)
    else:
        # A full run's top scenario runs under the ansible-core top only (the checks lane).
        scenarios = [s for s in all_scenarios() if s != TOP_SCENARIO]
    top = top_version() if full else ""

    images: threading.Thread | None = None
    if scenarios or full:
        suites = [f"--suite={s}" for s in suites_of(scenarios or ["default"])]
        testbed = [sys.executable, "molecule/testbed/testbed.py", "image", *suites]
        images = threading.Thread(target=run_part, args=(testbed, "images", "main", logs))
        images.start()
    lint_ok = lint(logs)
    if images is not None:
        images.join()
    if not lint_ok or any(p.rc != 0 for p in parts):
        write_table()
        return 1

    queue = sorted(scenarios, key=lambda s: -EXPECTED_SECONDS.get(s, 600))
    lock = threading.Lock()

    def checks_then_scenarios() -> None:
        # The checks end long before the scenarios: then this lane takes scenarios too.
        checks_lane(logs, top)
        scenario_lane("checks", queue, lock, logs)

    lanes = [threading.Thread(target=checks_then_scenarios)]
    for index in range(min(SCENARIO_LANES, len(queue))):
        lane = f"lane {chr(ord('A') + index)}"
        lanes.append(threading.Thread(target=scenario_lane, args=(lane, queue, lock, logs)))
    for thread in lanes:
        thread.start()
    for thread in lanes:
        thread.join()

    failed = [p for p in parts if p.rc != 0]
    # A failure scrolls far up a full run's output: its last lines again, at the end.
    for part in failed:
        say(f"== the last lines of {part.name}")
        if part.log and part.log.exists():
            say("\n".join(part.log.read_text(errors="replace").splitlines()[-80:]))
    write_table()
    molecule = [p for p in parts if p.phases]
    molecule_failed = sum(1 for p in molecule if p.rc != 0)
    if failed:
        say(f"failed: {', '.join(p.name for p in failed)}")
    say(f"molecule: {len(molecule) - molecule_failed} passed, {molecule_failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
