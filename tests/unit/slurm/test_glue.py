"""Subprocess timeouts, a hung squeue, slurmctld down (real 22.05 errors), HTTP end to end."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import EXPORTER, FIXTURES, ROLE_DIR, exp, metric_samples, write_fake_slurm

REAL = FIXTURES / "22.05"
DOWN = FIXTURES / "22.05-ctld-down"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def test_run_command_kills_process_group_on_timeout(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = tmp_path / "hang.sh"
    script.write_text(f"#!/bin/sh\nsleep 30 &\necho $! > {pidfile}\nwait\n")
    script.chmod(0o755)
    start = time.monotonic()
    res = exp.run_command([str(script)], timeout=3.0)
    assert res.error == "timeout"
    assert time.monotonic() - start < 10  # not the grandchild's 30 s
    child = int(pidfile.read_text())
    gone_by = time.monotonic() + 5
    while _alive(child) and time.monotonic() < gone_by:
        time.sleep(0.05)
    assert not _alive(child)  # the grandchild went with the group


def test_run_command_errors(tmp_path):
    assert exp.run_command([str(tmp_path / "missing")], 1.0).error == "not_found"
    assert exp.run_command(["sh", "-c", "echo out; exit 3"], 5.0).error == "exit_code"
    ok = exp.run_command(["sh", "-c", "echo hi"], 5.0)
    assert ok.error is None and ok.stdout == "hi\n"


def test_hung_squeue_on_path_collect_returns_within_timeout(fake_path):
    write_fake_slurm(fake_path, REAL, overrides={"squeue": "exec sleep 60"})
    c = exp.Collector(command_timeout=3.0)  # commands resolved through PATH
    start = time.monotonic()
    m = metric_samples(c.collect().decode())
    assert time.monotonic() - start < 10  # commands run concurrently, each bounded
    assert m["slurm_up"] == 0
    assert m['slurm_exporter_command_errors_total{command="squeue",reason="timeout"}'] == 1
    assert m['slurm_exporter_command_success{command="sinfo_nodes"}'] == 1
    assert m['slurm_exporter_command_duration_seconds{command="squeue"}'] >= 3.0
    assert m["slurm_gpus_alloc"] == 6  # the other commands still publish
    assert "slurm_jobs_pending" not in m  # squeue never succeeded


def _down_overrides() -> dict[str, str]:
    """Scripts replaying the real stderr and exit codes captured with slurmctld stopped."""
    out = {}
    for binary, name in (
        ("squeue", "squeue"),
        ("scontrol", "scontrol_jobs"),
        ("sdiag", "sdiag"),
        ("sshare", "sshare"),
    ):
        rc = (DOWN / f"{name}.rc").read_text().strip()
        out[binary] = f"cat '{DOWN}/{name}.stderr' >&2\nexit {rc}"
    rc = (DOWN / "sinfo_nodes.rc").read_text().strip()
    out["sinfo"] = (
        f"case \"$1\" in --version) cat '{DOWN}/sinfo_version.txt' ;;\n"
        f"*) cat '{DOWN}/sinfo_nodes.stderr' >&2; exit {rc} ;; esac"
    )
    return out


def test_slurmctld_down_real_errors(tmp_path):
    bin_dir = write_fake_slurm(tmp_path / "bin", REAL)
    c = exp.Collector(bin_dir=str(bin_dir), command_timeout=5)
    assert metric_samples(c.collect().decode())["slurm_up"] == 1
    write_fake_slurm(bin_dir, REAL, overrides=_down_overrides())
    m = metric_samples(c.collect().decode())
    assert m["slurm_up"] == 0
    assert m['slurm_exporter_command_errors_total{command="sinfo_nodes",reason="exit_code"}'] == 1
    assert m['slurm_exporter_command_errors_total{command="sshare",reason="exit_code"}'] == 1
    assert m["slurm_nodes_total"] == 3  # last good values, flagged by slurm_up 0
    assert not any(k.startswith("slurm_job_gpus_allocated") for k in m)
    assert m['slurm_info{type="general",version="22.05.8"}'] == 1


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def test_http_server_in_process(tmp_path):
    bin_dir = write_fake_slurm(tmp_path / "bin", REAL)
    c = exp.Collector(bin_dir=str(bin_dir))
    c.collect()
    server = exp.make_server("127.0.0.1:0", c)
    port = server.server_address[1]
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        code, ctype, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert code == 200 and ctype.startswith("text/plain; version=0.0.4")
        m = metric_samples(body)
        assert m["slurm_up"] == 1
        assert m['slurm_job_gpu_index_info{gpu="1",job_id="1",node="gpu02"}'] == 1
        assert _get(f"http://127.0.0.1:{port}/")[0] == 200
        assert _get(f"http://127.0.0.1:{port}/nope")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_exporter(
    args: list[str], timeout: float = 30.0, **popen: Any
) -> tuple[subprocess.Popen, int]:
    """The exporter script on a free port: (process, port) once it accepts connections.

    The port is free when picked but could be taken before the exporter binds it; the
    exporter then exits ("Address already in use") and is started again on another port.
    """
    for _ in range(5):
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, str(EXPORTER), f"--listen-address=127.0.0.1:{port}", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            **popen,
        )
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                time.sleep(0.05)
                continue
            return proc, port
        if proc.poll() is None:
            proc.kill()
            _, err = proc.communicate(timeout=10)
            pytest.fail(f"the exporter did not listen within {timeout} s: {err.decode()}")
        _, err = proc.communicate(timeout=10)
        if b"Address already in use" not in err:
            pytest.fail(f"the exporter exited with {proc.returncode}: {err.decode()}")
    pytest.fail("no free port for the exporter in 5 tries")


def test_exporter_process_end_to_end(tmp_path):
    """The script as systemd would run it: background collection, scrape, SIGTERM."""
    bin_dir = write_fake_slurm(
        tmp_path / "bin",
        REAL,
        overrides={"sdiag": "exec sleep 60"},  # a hung command too
    )
    proc, port = start_exporter(
        [f"--slurm-bin-dir={bin_dir}", "--collect-interval=1", "--command-timeout=6"]
    )
    try:
        deadline = time.monotonic() + 30
        m: dict[str, float] = {}
        while time.monotonic() < deadline:
            try:
                start = time.monotonic()
                _code, _, body = _get(f"http://127.0.0.1:{port}/metrics")
                assert time.monotonic() - start < 3.0  # a scrape never waits for Slurm
                m = metric_samples(body)
                if "slurm_exporter_last_collect_timestamp_seconds" in m:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.2)
        assert m.get("slurm_up") == 1
        assert m["slurm_gpus_total"] == 12
        assert m['slurm_exporter_command_errors_total{command="sdiag",reason="timeout"}'] >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("addr", "expected"),
    [(":9341", ("", 9341)), ("127.0.0.1:9341", ("127.0.0.1", 9341)), ("[::1]:80", ("::1", 80))],
)
def test_parse_listen_address(addr, expected):
    assert exp.parse_listen_address(addr) == expected


def test_parse_listen_address_rejects_garbage():
    with pytest.raises(ValueError):
        exp.parse_listen_address("9341")


def test_env_pins_time_format():
    c = exp.Collector()
    assert c._env["SLURM_TIME_FORMAT"] == "standard"


def test_the_role_unit_passes_only_flags_the_exporter_knows():
    unit = (ROLE_DIR / "templates" / "gpufleet-slurm-exporter.service.j2").read_text()
    flags = set(re.findall(r"(--[a-z][a-z-]+) ", unit))
    assert {"--job-source", "--max-gpu-index-series", "--web-max-connections"} <= flags
    usage = subprocess.run(
        [sys.executable, str(EXPORTER), "--help"], capture_output=True, text=True, timeout=30
    ).stdout
    for flag in flags:
        assert flag in usage, flag
    defaults = (ROLE_DIR / "defaults" / "main.yml").read_text()
    for name in (
        "job_source",
        "max_gpu_index_series",
        "web_max_connections",
        "web_max_connections_per_address",
        "web_read_timeout",
        "web_write_timeout",
    ):
        assert f"slurm_exporter_{name}:" in defaults
