"""Shared helpers for the gpufleet inventory tests (a uniquely named module, not conftest,
so that other test directories can have their own conftest.py)."""

from __future__ import annotations

import atexit
import json
import locale
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[3]
SRC = REPO_ROOT / "src"
ANSIBLE_INVENTORY = Path(sys.executable).with_name("ansible-inventory")


def ansible_env() -> dict[str, str]:
    """Run Ansible with the repo's config and the package from this checkout.

    Failing the run on an unparsable source is what ansible.cfg's
    ``[inventory] any_unparsed_is_failed`` does; it is set here too so the tests do not
    depend on that line.
    """
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO_ROOT / "ansible.cfg")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env["ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED"] = "True"
    env["ANSIBLE_INVENTORY_UNPARSED_FAILED"] = "True"
    env["ANSIBLE_NOCOLOR"] = "1"
    env.setdefault("LC_ALL", "C.UTF-8")  # ansible refuses to run without a UTF-8 locale
    env["ANSIBLE_CACHE_PLUGIN"] = "memory"  # facts cached by test beds must not leak in
    env["ANSIBLE_LOCAL_TEMP"] = str(Path(os.environ.get("TMPDIR", "/tmp")) / "gpufleet-ansible-tmp")
    return env


def run_ansible_inventory(*args: str) -> subprocess.CompletedProcess[str]:
    """``ansible-inventory ARGS`` from the repository: its exit status and its output."""
    env = ansible_env()
    # pytest names the running test in the environment: a server serves every test.
    key = tuple(sorted((k, v) for k, v in env.items() if k != "PYTEST_CURRENT_TEST"))
    if key not in _WARM:
        _WARM[key] = _WarmAnsibleInventory(env)
    return _WARM[key].run(list(args), env)


def run_ansible_inventory_process(
    args: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``ansible-inventory ARGS`` as a process of its own (what run_ansible_inventory
    answers as, and does when the import cannot be shared)."""
    return subprocess.run(
        [str(ANSIBLE_INVENTORY), *args],
        cwd=REPO_ROOT,
        env=env or ansible_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


# The ansible-inventory console script is `sys.exit(main())` after `from ansible.cli.inventory
# import main`. That import is about 0.45 s of the 0.65 s of CPU of a run, and the tests make
# some sixty runs. So one process per environment makes the import once (same environment,
# same working directory, same argv[0]) and forks a child per run, which runs the script's
# line with the run's arguments, its stdout and stderr in files and its exit status a
# process's, in the run's own environment: the same code on the same inputs. (A server
# serves the runs whose environment differs from its own in PYTEST_CURRENT_TEST alone,
# which nothing reads at import.) Each child starts from the imported state
# (no plugin loaded, no inventory parsed, nothing shown yet) and leaves with os._exit, so
# the import's atexit cleanup (its local temporary directory) runs once, in the server.
# An import that prints anything, or fails, would have shown that in every run: then the
# server answers so and each run is a process of its own, as without it.
_WARM_SERVER = r"""
import json, os, signal, sys, tempfile, traceback
script = sys.argv[1]
sys.path[0] = os.path.dirname(script)  # as for the script, not -c
replies = os.fdopen(os.dup(1), "w")
shown = tempfile.TemporaryFile()
for fd in (1, 2):
    os.dup2(shown.fileno(), fd)
sys.argv[:] = [script]
try:
    from ansible.cli.inventory import main
except BaseException:
    traceback.print_exc()
sys.stdout.flush()
sys.stderr.flush()
shown.seek(0)
said = shown.read().decode(errors="replace")
replies.write(json.dumps({"warm": not said, "why": said[-2000:]}) + "\n")
replies.flush()
if said:
    sys.exit(0)
null = os.open(os.devnull, os.O_RDONLY)
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
            os.dup2(null, 0)
            os.environ.clear()
            os.environ.update(request["env"])
            signal.alarm(request["timeout"])
            sys.argv[:] = [script, *request["args"]]
            try:
                sys.exit(main())
            except SystemExit as end:  # as the interpreter ends a script
                if end.code is None or isinstance(end.code, int):
                    code = end.code or 0
                else:
                    print(end.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
    replies.flush()
"""

_WARM: dict[tuple, _WarmAnsibleInventory] = {}


class _WarmAnsibleInventory:
    TIMEOUT = 300  # seconds, as subprocess.run's timeout was

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.server = subprocess.Popen(
            [sys.executable, "-c", _WARM_SERVER, str(ANSIBLE_INVENTORY)],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        atexit.register(self.close)
        assert self.server.stdout is not None
        hello = json.loads(self.server.stdout.readline() or '{"warm": false, "why": "ended"}')
        self.warm = hello["warm"]
        if not self.warm:
            self.close()

    def close(self) -> None:
        if self.server.poll() is None:
            assert self.server.stdin is not None
            self.server.stdin.close()
            self.server.wait(timeout=60)

    def run(self, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        if not self.warm:
            return run_ansible_inventory_process(args, env)
        command = [str(ANSIBLE_INVENTORY), *args]
        with tempfile.TemporaryDirectory(prefix="gpufleet-ansible-inventory-") as tmp:
            out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
            out.touch()
            err.touch()
            request = {"args": args, "env": env, "stdout": str(out), "stderr": str(err)}
            request["timeout"] = self.TIMEOUT
            assert self.server.stdin is not None and self.server.stdout is not None
            self.server.stdin.write(json.dumps(request) + "\n")
            self.server.stdin.flush()
            reply = self.server.stdout.readline()
            if not reply:
                raise RuntimeError(f"the ansible-inventory server ended: {self.server.wait()}")
            code = json.loads(reply)
            stdout, stderr = _as_text(out.read_bytes()), _as_text(err.read_bytes())
        if code == -signal.SIGALRM:
            raise subprocess.TimeoutExpired(command, self.TIMEOUT, stdout, stderr)
        return subprocess.CompletedProcess(command, code, stdout, stderr)


def close_warm_servers() -> None:
    while _WARM:
        _WARM.popitem()[1].close()


def _as_text(data: bytes) -> str:
    """As subprocess.run(text=True) decodes a pipe: the locale's encoding, newlines."""
    text = data.decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


# A Python warning raised in an installed library, with the source line Python prints
# after it: e.g. cryptography 51's CryptographyDeprecationWarning when ansible-core imports
# its DSA support. Not gpufleet's output, and not in its control.
_LIBRARY_WARNING_RE = re.compile(r"^\S*/(?:site|dist)-packages/\S+\.py:\d+: \w*Warning: ")


def _without_library_warnings(lines: list[str]) -> list[str]:
    kept: list[str] = []
    skip_source = False
    for line in lines:
        if _LIBRARY_WARNING_RE.match(line):
            skip_source = True
            continue
        if skip_source and line.startswith((" ", "\t")):
            skip_source = False
            continue
        skip_source = False
        kept.append(line)
    return kept


def assert_one_error(stderr: str, source: str, message: str) -> None:
    """stderr holds gpufleet's message once and Ansible's fixed closing line for a failed
    source, nothing else. ansible-core 2.19 prints ``[WARNING]: Failed to parse inventory
    with 'gpufleet' plugin: MESSAGE`` and ``[ERROR]: Completely failed ...``; 2.18 prints
    ``[WARNING]:  * Failed to parse SOURCE with gpufleet plugin: MESSAGE``, wrapped at 80
    columns (so compared without whitespace), and ``ERROR! Completely failed ...``."""
    lines = _without_library_warnings([line for line in stderr.splitlines() if line.strip()])
    closings = {
        f"[ERROR]: Completely failed to parse inventory source {source}",
        f"ERROR! Completely failed to parse inventory source {source}",
    }
    assert closings & set(lines), stderr
    rest = [line for line in lines if line not in closings]
    if rest and rest[0].startswith("[WARNING]:  * Failed to parse"):
        squeeze = "".join
        want = f"[WARNING]: * Failed to parse {source} with gpufleet plugin: {message}"
        assert squeeze("".join(rest).split()) == squeeze(want.split()), stderr
    else:
        assert rest == [
            f"[WARNING]: Failed to parse inventory with 'gpufleet' plugin: {message}"
        ], stderr


def minimal_node_list(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "plugin": "gpufleet",
        "cluster": "test",
        "nodes": [
            {
                "hosts": "gpu[001-004]",
                "address": "10.0.0.{num}",
                "rack": "r01",
                "partition": ["gpu"],
                "gpu": {"vendor": "nvidia", "model": "H100", "count": 8},
                "gpu_collector": "dcgm",
                "cpus": 224,
            },
            {"hosts": "cpu[1-2]", "address": "10.0.1.{num}", "rack": "r02", "cpus": 64},
        ],
        "servers": [{"hosts": "mon[01-02]", "address": "10.0.9.{num}"}],
        "monitoring": {
            "shards": 2,
            "replicas": 2,
            "prometheus_hosts": "mon[01-02]",
            "global_hosts": "mon01",
            "alertmanager_hosts": "mon[01-02]",
            "grafana_hosts": "mon01",
            "loki_hosts": "mon02",
        },
    }
    data.update(overrides)
    return data


def write_node_list(directory: Path, data: Any, name: str = "nodes.gpufleet.yml") -> Path:
    path = directory / name
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
    path.write_text(text)
    return path


def synthetic_cluster(seed: int, min_hosts: int = 1000) -> dict[str, int]:
    """Host -> weight for a heterogeneous cluster shaped like real ones.

    Racks of 8..64 hosts; 0, 4 or 8 GPUs; 32..256 threads; series from the same formula
    the node list uses, so weights vary about 6x between the lightest and heaviest host.
    """
    from gpufleet.sizing import HostShape, estimate_series, exporters

    # The exporters whose series the planner's stability bounds (test_sharding.py) were
    # measured with. An exporter added to the registry since (the IPMI exporter's
    # estimated, constant 300 series per compute node) makes the weights more alike and
    # moves the measured collateral: re-measure those bounds before adding it here.
    measured = {job: exporters()[job] for job in ("node", "dcgm")}

    rnd = random.Random(seed)
    weights: dict[str, int] = {}
    rack = 0
    while len(weights) < min_hosts:
        rack += 1
        size = rnd.choice([8, 16, 16, 32, 32, 48, 64])
        gpus = rnd.choice([0, 4, 8, 8, 8])
        cpus = rnd.choice([32, 64, 96, 128, 192, 256])
        collector = rnd.choice(["smi", "dcgm"])
        weight = estimate_series(HostShape(cpus, gpus, collector), measured)
        prefix = rnd.choice(["gpu", "node", "nid", "a100-", "cpu"])
        for index in range(1, size + 1):
            weights[f"r{rack:03d}-{prefix}{index:03d}"] = weight
    return weights


def racks_of(weights: dict[str, int]) -> dict[str, str]:
    return {host: host.split("-", 1)[0] for host in weights}
