"""Files and tool output that are not what they should be (issue 26, finding 8).

Principle: every file is opened without blocking and read only if it is a regular file
(a FIFO never hangs a start-up); a place the collector cannot write is one log line and
a failed cycle, never a traceback; a stored read position is range-checked; a tool's
JSON is found after any warning lines and its integers are bounded.
"""

from __future__ import annotations

import json
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gpu_helpers import DATA, gc, stateless_argv, values_of

from gpufleet_node.gpu_collector import query

SEED = 20261126
XID_LINE = "NVRM: Xid (PCI:0000:00:09): 79, pid=1, GPU has fallen off the bus.\n"


def finishes(function: Callable[[], Any], seconds: float = 10.0) -> Any:
    """function() run in a thread that must end within ``seconds`` (a hang fails the
    test instead of the suite)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = function()
        except BaseException as exc:  # re-raised in the test's thread
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s (blocked on a FIFO?)"
    if "error" in result:
        raise result["error"]
    return result.get("value")


# ------------------------------------------------------------------ FIFOs and odd files


@pytest.mark.parametrize("name", ["xid_state.json", "nvidia_fields.json"])
def test_fifo_state_file_does_not_hang(name, fake_smi, run_collector, tmp_path):
    run_collector.state_dir.mkdir()
    os.mkfifo(run_collector.state_dir / name)
    log = tmp_path / "kern.log"
    log.write_text(XID_LINE)
    text = finishes(lambda: run_collector("--xid-source", str(log)))
    assert values_of(text, "node_gpu_xid_errors_total", gpu="0", xid="79") == [1]


def test_fifo_output_file_does_not_hang_and_is_replaced(fake_smi, run_collector):
    os.mkfifo(run_collector.textfile_dir / "gpufleet_gpu.prom")
    text = finishes(run_collector)
    assert values_of(text, "node_gpu_collector_success") == [1]


def test_fifo_xid_source_is_a_failed_read_not_a_hang(fake_smi, run_collector, tmp_path):
    fifo = tmp_path / "kern.fifo"
    os.mkfifo(fifo)
    text = finishes(lambda: run_collector("--xid-source", str(fifo)))
    assert values_of(text, "node_gpu_collector_success") == [1]
    assert values_of(text, "node_gpu_collector_xid_success") == [0]


def test_fifo_proc_entries_are_no_job(tmp_path):
    proc = tmp_path / "proc" / "42"
    proc.mkdir(parents=True)
    for name in ("cgroup", "status", "environ"):
        os.mkfifo(proc / name)
    assert finishes(lambda: gc.job_of_pid(str(tmp_path / "proc"), 42)) is None


@pytest.mark.parametrize("kind", ["fifo", "directory", "missing", "socket"])
def test_read_regular_refuses_anything_but_a_file(kind, tmp_path):
    path = tmp_path / "x"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        import socket

        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    assert finishes(lambda: gc.read_regular(str(path), 100)) is None


def test_read_regular_is_bounded(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * 10_000)
    assert gc.read_regular(str(path), 100) == b"x" * 100


# ------------------------------------------------------- textfile directory problems


def _bad_dirs(tmp_path: Path) -> dict[str, Path]:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    return {"missing": tmp_path / "no-such-dir", "a_file": a_file}


@pytest.mark.parametrize("kind", ["missing", "a_file"])
def test_unwritable_textfile_dir_once_is_one_line_and_exit_1(kind, fake_smi, tmp_path, capsys):
    textfile_dir = _bad_dirs(tmp_path)[kind]
    rc = finishes(lambda: gc.main(["--once", *stateless_argv(fake_smi.bin, textfile_dir)]))
    assert rc == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot write" in lines[0], err
    assert "Traceback" not in err


def test_output_path_that_is_a_directory(fake_smi, tmp_path, capsys):
    out = tmp_path / "tf"
    (out / "gpufleet_gpu.prom").mkdir(parents=True)
    rc = gc.main(["--once", *stateless_argv(fake_smi.bin, out)])
    assert rc == 1
    assert "Traceback" not in capsys.readouterr().err


def test_loop_keeps_running_logs_once_and_recovers(fake_smi, tmp_path, capsys):
    """Service mode: cycles go on (no crash, no restart loop), the problem is logged
    once, and the file appears as soon as the directory does."""
    out = tmp_path / "later"
    collector = gc.Collector(gc.parse_args(stateless_argv(fake_smi.bin, out)))
    assert [collector.cycle() for _ in range(3)] == [False, False, False]
    err = capsys.readouterr().err
    assert err.count("cannot write") == 1, err
    out.mkdir()
    assert collector.cycle()
    assert values_of((out / "gpufleet_gpu.prom").read_text(), "node_gpu_collector_success") == [1]


# ------------------------------------------------------------ stored read positions


@pytest.mark.parametrize(
    "position",
    [
        {"offset": -1},
        {"offset": -1, "inode": 1},
        {"offset": 2**70, "inode": 1},
        {"offset": "12"},
        {"inode": -3, "offset": 0},
        {"seq": -2, "boot_id": "x"},
        None,
        [],
    ],
    ids=repr,
)
def test_corrupt_position_restarts_reading_and_keeps_counts(
    position, fake_smi, run_collector, tmp_path
):
    log = tmp_path / "kern.log"
    log.write_text(XID_LINE)
    run_collector.state_dir.mkdir()
    state = {"counts": {"0000:00:09|79": 5}, "source": str(log), "position": position}
    (run_collector.state_dir / "xid_state.json").write_text(json.dumps(state))
    for expected in (6, 6):  # the file is read again from its start, then continued
        text = run_collector("--xid-source", str(log))
        assert values_of(text, "node_gpu_collector_xid_success") == [1]
        assert values_of(text, "node_gpu_xid_errors_total", gpu="0", xid="79") == [expected]
    with log.open("a") as handle:
        handle.write(XID_LINE)
    text = run_collector("--xid-source", str(log))
    assert values_of(text, "node_gpu_xid_errors_total", gpu="0", xid="79") == [7]


def test_file_offset_property():
    """Any stored offset gives a position inside the file."""
    rng = random.Random(SEED)
    for _ in range(2000):
        size = rng.randrange(0, 10_000)
        offset = rng.choice([rng.randrange(-(2**64), 2**64), rng.randrange(-5, size + 5)])
        inode = rng.choice([7, 8])
        got = gc.file_offset({"inode": 7, "offset": offset}, inode, size)
        assert 0 <= got <= size
        assert got == (offset if inode == 7 and 0 <= offset <= size else 0)


# ----------------------------------------------------------------------- tool JSON


def _amd_doc() -> str:
    return (DATA / "amd-smi-metric.json").read_text()


@pytest.mark.parametrize(
    "lead",
    [
        "[WARNING] amd-smi: something\n",
        "[WARNING] a\n[WARNING] b\nWARNING: c\n",
        "  [1] not the document\n",
        "{\n",  # an unterminated object before the document
        "\n\n",
    ],
)
def test_json_after_warning_lines(lead):
    assert query._load_json_text(lead + _amd_doc()) == json.loads(_amd_doc())


@pytest.mark.parametrize(
    "text",
    ["[WARNING] only a warning\n", "WARNING\n" * 40 + "{}\n", '{"a": 1} trailing\n', "[1, 2"],
)
def test_no_json_document_is_a_parse_error(text):
    with pytest.raises(gc.CollectorError) as info:
        query._load_json_text(text)
    assert info.value.reason == "parse_error"


def test_huge_integers_are_bounded():
    digits = "9" * 50_000
    doc = query._load_json_text('[{"gpu": 0, "power": {"socket_power": ' + digits + "}}]")
    assert doc[0]["power"]["socket_power"] == float("inf")
    (gpu,) = gc.parse_amd_smi(doc, [])
    assert ("power_draw_watts", (), float("inf")) not in gpu.values
    assert all(v == v and abs(v) != float("inf") for _, _, v in gpu.values)
    assert query._load_json_text("[-" + digits + ", 12]") == [float("-inf"), 12]


def test_amd_smi_with_warning_and_huge_integer_end_to_end(run_collector, tmp_path):
    metric = json.loads(_amd_doc())
    metric["gpu_data"][0]["power"]["socket_power"]["value"] = 10**400
    (tmp_path / "metric.json").write_text(json.dumps(metric))
    script = tmp_path / "amd-smi"
    script.write_text(
        "#!/bin/sh\necho '[WARNING] amd-smi: the driver is old'\n"
        f'case "$1" in metric) cat "{tmp_path}/metric.json";; '
        f'static) cat "{DATA}/amd-smi-static.json";; *) exit 2;; esac\n'
    )
    script.chmod(0o755)
    text = run_collector("--vendor", "amd", "--amd-smi", str(script))
    assert values_of(text, "node_gpu_devices") == [2]
    assert values_of(text, "node_gpu_power_draw_watts", gpu="0") == []
    assert values_of(text, "node_gpu_power_limit_watts", gpu="0") == [700]


def test_proc_sys_files_are_read_in_chunks():
    """A /proc/sys file answers one read() larger than the kernel allocates with ENOMEM:
    the boot id, and with it "the same boot" of the kmsg position and the XID baseline,
    was never read."""
    from gpufleet_node.gpu_collector.files import read_regular
    from gpufleet_node.gpu_collector.state import boot_id

    assert read_regular("/proc/sys/kernel/random/boot_id", 4 << 20)
    assert len(boot_id()) == 36
