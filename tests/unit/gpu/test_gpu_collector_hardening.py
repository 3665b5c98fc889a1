"""Regression tests for broken, huge, hanging and odd vendor-tool output and state files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gpu_helpers import COLLECTOR_ZIPAPP, gc, names_of, values_of

from gpufleet_node.commands import BoundedBuffer
from gpufleet_node.gpu_collector import collect, xid

GPU_SERIES = ("node_gpu_info", "node_gpu_devices", "node_gpu_power_draw_watts")


def one(text: str, name: str, **labels: str) -> float:
    values = values_of(text, name, **labels)
    assert len(values) == 1, (name, labels, values)
    return values[0]


def real_csv(fake_smi, gpus: int = 1) -> str:
    """What the collector's query gets from the H100 capture (nounits)."""
    fake_smi.set(gpus=gpus)
    query = "--query-gpu=" + ",".join(gc.all_query_fields())
    result = fake_smi.run(query, "--format=csv,nounits")
    assert result.returncode == 0, result.stderr
    return result.stdout


def scripted_smi(tmp_path: Path, gpu_text: str, apps_text: str = "", rc: int = 0) -> Path:
    """An nvidia-smi that prints fixed text: gpu_text for --query-gpu, else apps_text."""
    folder = tmp_path / "scripted"
    folder.mkdir(exist_ok=True)
    (folder / "gpu.csv").write_text(gpu_text)
    (folder / "apps.csv").write_text(apps_text or "gpu_uuid, pid, used_memory [MiB]\n")
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  --query-gpu=*) cat "{folder}/gpu.csv"; exit {rc} ;;\n'
        f'  *) cat "{folder}/apps.csv" ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return script


def replace_field(text: str, field: str, old: str, new: str, row: int = 1) -> str:
    lines = text.splitlines()
    header = [gc.canonical_field(h) for h in lines[0].split(",")]
    values = lines[row].split(", ")
    position = header.index(field)
    assert values[position] == old, values[position]
    values[position] = new
    lines[row] = ", ".join(values)
    return "\n".join(lines) + "\n"


def assert_failed_without_gpu_series(text: str, reason: str) -> None:
    assert one(text, "node_gpu_collector_success") == 0
    assert one(text, "node_gpu_collector_error_info", reason=reason) == 1
    for name in GPU_SERIES:
        assert name not in names_of(text), name


# ------------------------------------------------ 5: output that breaks the CSV parser


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        # a 200,000-byte name: over csv's field limit (131,072) and the line bound
        (lambda t: replace_field(t, "name", "NVIDIA H100 80GB HBM3", "N" * 200_000), "bad_row"),
        # a 2,000-byte field in a line under the line bound
        (lambda t: replace_field(t, "vbios_version", "96.00.A5.00.01", "9" * 2000), "bad_row"),
        # an unterminated quote swallows the rest of its line
        (
            lambda t: replace_field(t, "driver_version", "590.48.01", '"590.48.01', row=2),
            "bad_row",
        ),
        (lambda t: t.replace("\n", "\n1, GPU-x, 2\n", 1), "bad_row"),  # a short row
        (lambda t: "index, uu id, name\n0, a, b\n", "parse_error"),  # not a header
    ],
    ids=["field_200k", "field_2k", "unterminated_quote", "short_row", "bad_header"],
)
def test_unparseable_output_fails_the_cycle(mutate, reason, fake_smi, run_collector, tmp_path):
    good = real_csv(fake_smi, gpus=2)
    first = run_collector()
    last_success = one(first, "node_gpu_collector_last_success_timestamp_seconds")
    script = scripted_smi(tmp_path, mutate(good))
    text = run_collector("--nvidia-smi", str(script), expect_success=False)
    assert_failed_without_gpu_series(text, reason)
    assert one(text, "node_gpu_collector_last_success_timestamp_seconds") == last_success


def test_csv_module_errors_become_parse_errors(monkeypatch):
    import csv

    old = csv.field_size_limit(16)
    try:
        with pytest.raises(gc.CollectorError) as err:
            gc.parse_nvidia_gpus("index, uuid\n0, GPU-" + "a" * 40 + "\n")
    finally:
        csv.field_size_limit(old)
    assert err.value.reason == "parse_error"


def test_internal_errors_still_write_a_failure(fake_smi, run_collector, monkeypatch):
    run_collector()

    def broken(*_args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(collect, "nvidia_gpus_and_notes", broken)
    text = run_collector(expect_success=False)
    assert_failed_without_gpu_series(text, "internal_error")


# ------------------------------------------------------- 6: size and row bounds


def test_100k_rows_are_cut_at_the_byte_limit(fake_smi, tmp_path):
    header, row = real_csv(fake_smi).splitlines()[:2]
    gen = tmp_path / "gen.py"
    gen.write_text(
        "import sys\n"
        f"header, tail = {header!r}, {row.split(', ', 1)[1]!r}\n"
        "try:\n"
        "    sys.stdout.write(header + '\\n')\n"
        "    for i in range(100000):\n"
        "        sys.stdout.write(f'{i}, {tail}\\n')\n"
        "    sys.stdout.flush()\n"
        "except BrokenPipeError:\n"
        "    pass\n"
    )
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{gen}"\n')
    smi.chmod(0o755)
    out = tmp_path / "tf"
    out.mkdir()
    wrapper = (
        "import resource, runpy, sys\n"
        "sys.argv = sys.argv[1:]\n"
        "try:\n"
        "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    argv = [
        sys.executable,
        "-c",
        wrapper,
        str(COLLECTOR_ZIPAPP),
        "--once",
        "--nvidia-smi",
        str(smi),
    ]
    argv += ["--textfile-dir", str(out), "--state-dir", "", "--timeout", "30"]
    start = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    text = (out / "gpufleet_gpu.prom").read_text()
    assert_failed_without_gpu_series(text, "output_too_large")
    assert elapsed < 10, elapsed  # was over 60 s
    assert int(result.stdout.split()[-1]) < 150_000, result.stdout  # KiB; was 2.1 GB


def test_more_than_max_gpus_fails(fake_smi, run_collector):
    fake_smi.set(gpus=gc.MAX_GPUS + 1)
    text = run_collector(expect_success=False)
    assert_failed_without_gpu_series(text, "too_many_gpus")


def test_max_gpus_is_fine(fake_smi, run_collector):
    fake_smi.set(gpus=gc.MAX_GPUS)
    text = run_collector()
    assert one(text, "node_gpu_devices") == gc.MAX_GPUS


def test_huge_compute_apps_answer_only_drops_the_process_series(fake_smi, run_collector, tmp_path):
    gpu_text = real_csv(fake_smi)
    row = "GPU-00000000-0000-0000-0000-000000000000, 11327, 2566\n"
    apps = "gpu_uuid, pid, used_memory\n" + row * 30_000  # about 1.6 MB
    text = run_collector("--nvidia-smi", str(scripted_smi(tmp_path, gpu_text, apps)))
    assert one(text, "node_gpu_collector_success") == 1
    assert one(text, "node_gpu_collector_compute_apps_success") == 0
    assert "node_gpu_compute_processes" not in names_of(text)


def test_run_command_stops_reading_at_the_limit():
    start = time.monotonic()
    result = gc.run_command(["yes", "0, GPU-a, 40"], 10, max_bytes=100_000)
    assert time.monotonic() - start < 5
    # The shared runner: killed at the limit, nothing of the cut answer is handed on.
    assert result.error == "output_limit" and not result.truncated
    assert result.stdout == ""
    with pytest.raises(gc.CollectorError, match="output_too_large"):
        gc._checked(result, "yes")


def test_bounded_buffer_head_and_tail():
    head = BoundedBuffer(10)
    head.add(b"0123456789abc")
    assert head.overflow and head.text() == "0123456789"
    tail = BoundedBuffer(10, tail=True)
    for _ in range(20):
        tail.add(b"line\n")
    assert tail.overflow and tail.text() == "line\nline\n"
    small = BoundedBuffer(10, tail=True)
    small.add(b"a\nb\n")
    assert not small.overflow and small.text() == "a\nb\n"
    cut = BoundedBuffer(5, tail=True)
    cut.add(b"abcdefghij\nxy\n")
    assert cut.text() == "xy\n"  # never the cut line "j"


def test_journal_backlog_keeps_the_newest_lines_and_the_cursor(monkeypatch, tmp_path):
    monkeypatch.setattr(xid, "JOURNAL_MAX_BYTES", 4096)
    journal = tmp_path / "bin" / "journalctl"
    journal.parent.mkdir()
    noise = journal_json("usb 1-1: noise noise noise", "s=noise")
    xid_entry = journal_json(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.", "s=new;i=9"
    )
    journal.write_text(
        "#!/bin/sh\n"
        "i=0\n"
        f"while [ $i -lt 2000 ]; do echo '{noise}'; i=$((i+1)); done\n"
        f"echo '{xid_entry}'\n"
    )
    journal.chmod(0o755)
    monkeypatch.setenv("PATH", f"{journal.parent}{os.pathsep}{os.environ['PATH']}")
    records, position = gc.read_xid_journald({"cursor": "s=old"}, 10)
    assert position == {"cursor": "s=new;i=9"}
    assert gc.parse_records(records).events == [("0000:3b:00", 79)]
    assert len("\n".join(r.message for r in records)) < 4096


def journal_json(message: str, cursor: str, transport: str = "kernel", facility: str = "0") -> str:
    """One line of `journalctl -o json --output-fields=MESSAGE,_TRANSPORT,SYSLOG_FACILITY`."""
    entry = {"__CURSOR": cursor, "MESSAGE": message, "_TRANSPORT": transport}
    return json.dumps({**entry, "SYSLOG_FACILITY": facility})


def test_xid_file_backlog_is_read_over_cycles(monkeypatch, tmp_path):
    monkeypatch.setattr(xid, "XID_FILE_MAX_BYTES", 200)
    log = tmp_path / "kern.log"
    line = "NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception\n"  # 51 bytes
    log.write_text(line * 10)
    state: dict = {}
    total = 0
    for _ in range(5):
        lines, state = gc.read_xid_file(str(log), state)
        assert len(lines) <= 3
        total += len(lines)
    assert total == 10
    log.write_text("x" * 500)  # one line longer than a read: skipped, no endless loop
    lines, state = gc.read_xid_file(str(log), {})
    assert lines == [] and state["offset"] == 200


# ----------------------------------------------------- 7: wrong-typed xid_state.json

XID_LINE = "NVRM: Xid (PCI:0000:00:09): 79, pid=1, GPU has fallen off the bus.\n"
BAD_STATES = {
    "list": [["0000:00:09|79", 3]],
    "counts_list": {"counts": [["0000:00:09|79", 3]]},
    "counts_strings": {"counts": {"0000:00:09|79": "3"}},
    "counts_null": {"counts": {"0000:00:09|79": None}},
    "counts_bad_key": {"counts": {"no pipe": 1}},
    "counts_bool": {"counts": {"0000:00:09|79": True}},
    "pci_map_null": {"pci_map": {"0000:00:09": None}},
    "pci_map_ints": {"pci_map": {"0000:00:09": [0, 1]}},
    "position_null": {"position": None, "source": "x"},
    "position_offset_string": {"position": {"offset": "12", "inode": 1}},
    "position_negative": {"position": {"offset": -5}},
    "source_int": {"source": 5},
    "null": None,
    "number": 42,
    "string": "counts",
}


@pytest.mark.parametrize("state", list(BAD_STATES.values()), ids=list(BAD_STATES))
def test_wrong_typed_xid_state_is_empty_state(state, fake_smi, run_collector, tmp_path, capsys):
    run_collector.state_dir.mkdir()
    (run_collector.state_dir / "xid_state.json").write_text(json.dumps(state))
    log = tmp_path / "kern.log"
    log.write_text(XID_LINE)
    text = run_collector("--xid-source", str(log))
    assert one(text, "node_gpu_collector_xid_success") == 1
    assert one(text, "node_gpu_xid_errors_total", gpu="0", xid="79") == 1  # from zero
    lines = [line for line in capsys.readouterr().err.splitlines() if "XID state" in line]
    assert len(lines) == 1, lines
    # the state was rewritten in the right shape: the next run is quiet and counts on
    text = run_collector("--xid-source", str(log))
    assert one(text, "node_gpu_xid_errors_total", gpu="0", xid="79") == 1
    assert "XID state" not in capsys.readouterr().err


def test_non_json_state_and_field_memory(fake_smi, run_collector, tmp_path, capsys):
    run_collector.state_dir.mkdir()
    (run_collector.state_dir / "xid_state.json").write_text("{not json")
    (run_collector.state_dir / "nvidia_fields.json").write_text(
        json.dumps({"binary": "x", "removed": 5, "aliased": "abc"})
    )
    log = tmp_path / "kern.log"
    log.write_text(XID_LINE)
    text = run_collector("--xid-source", str(log))
    assert one(text, "node_gpu_collector_success") == 1
    assert len([x for x in capsys.readouterr().err.splitlines() if "XID state" in x]) == 1


def test_field_memory_of_the_wrong_type_is_ignored(tmp_path):
    path = tmp_path / "fields.json"
    path.write_text(json.dumps({"binary": "id", "removed": 5, "aliased": [1, None]}))
    memory = gc.FieldMemory(str(path), "id")
    assert memory.removed == [] and memory.aliased == []


def test_previous_output_with_a_bad_timestamp():
    assert (
        gc.previous_last_success("node_gpu_collector_last_success_timestamp_seconds 1..2\n") is None
    )


# ---------------------------------------- 8: one deadline for the whole cycle


def _hanging_journalctl(tmp_path: Path, monkeypatch, body: str) -> None:
    folder = tmp_path / "journal-bin"
    folder.mkdir()
    script = folder / "journalctl"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_nvidia_smi_and_journalctl_both_hanging_stay_in_the_deadline(
    fake_smi, run_collector, tmp_path, monkeypatch
):
    _hanging_journalctl(tmp_path, monkeypatch, "exec sleep 61.4321\n")
    fake_smi.set(mode="hang")
    start = time.monotonic()
    text = run_collector("--xid-source", "journald", "--timeout", "3", expect_success=False)
    elapsed = time.monotonic() - start
    assert elapsed < 4.5, elapsed  # was nvidia-smi's timeout + journalctl's timeout (6 s)
    assert one(text, "node_gpu_collector_duration_seconds") <= 3.5
    assert_failed_without_gpu_series(text, "timeout")
    assert one(text, "node_gpu_collector_xid_success") == 0
    # Killed with its process group; on a loaded machine the kernel may take a moment
    # to reap it, but it must not outlive the collector by seconds.
    gone_by = time.monotonic() + 5
    while _processes_with("61.4321") and time.monotonic() < gone_by:
        time.sleep(0.05)
    assert _processes_with("61.4321") == []


def test_journalctl_keeps_its_share_when_nvidia_smi_hangs(
    fake_smi, run_collector, tmp_path, monkeypatch
):
    _hanging_journalctl(
        tmp_path,
        monkeypatch,
        f"printf '%s\\n' '{journal_json(XID_LINE.strip(), 's=a;i=1')}'\n",
    )
    fake_smi.set(mode="hang")
    text = run_collector("--xid-source", "journald", "--timeout", "3", expect_success=False)
    assert one(text, "node_gpu_collector_xid_success") == 1
    assert one(text, "node_gpu_xid_errors_total", xid="79") == 1


def test_deadline_before():
    deadline = gc.Deadline(10)
    assert 7.5 < deadline.before(2).left() <= 8


# ---------------------------------------------- 9: ERR!, duplicate index, comma in name


def test_all_values_err_are_counted_per_gpu(fake_smi, run_collector, tmp_path):
    header = gc.all_query_fields()
    keep = {"index": "0", "uuid": "GPU-a", "pci.bus_id": "00000000:3B:00.0", "name": "X"}
    row = [keep.get(field, "ERR!") for field in header]
    text_in = ", ".join(header) + "\n" + ", ".join(row) + "\n"
    text = run_collector("--nvidia-smi", str(scripted_smi(tmp_path, text_in)))
    assert one(text, "node_gpu_collector_success") == 1
    expected = len(gc.FIELD_SPECS) + len(gc.SPECIAL_FIELDS)
    assert one(text, "node_gpu_unreadable_fields", gpu="0", uuid="GPU-a") == expected
    assert "node_gpu_power_draw_watts" not in names_of(text)


@pytest.mark.parametrize("token", ["ERR!", "[Unknown Error]", "[GPU is lost]", "nan", "1e999"])
def test_one_error_token_is_one_unreadable_field(token, fake_smi, run_collector, tmp_path):
    text_in = replace_field(real_csv(fake_smi), "power.draw", "69.85", token)
    text = run_collector("--nvidia-smi", str(scripted_smi(tmp_path, text_in)))
    assert one(text, "node_gpu_unreadable_fields") == 1
    assert "node_gpu_power_draw_watts" not in names_of(text)


def test_real_captures_have_no_unreadable_fields(fake_smi, run_collector):
    from gpu_helpers import ALL_CAPTURES

    for capture in ALL_CAPTURES:
        for state in ("idle", "load"):
            fake_smi.set(capture=capture, state=state, gpus=None)
            text = run_collector()
            assert values_of(text, "node_gpu_unreadable_fields") == [0], (capture.name, state)
            assert one(text, "node_gpu_collector_skipped_lines") == 0
            assert one(text, "node_gpu_collector_duplicate_gpu_rows") == 0


def test_err_index_is_a_bad_row(fake_smi, run_collector, tmp_path):
    text_in = replace_field(real_csv(fake_smi, gpus=2), "index", "1", "ERR!", row=2)
    text = run_collector("--nvidia-smi", str(scripted_smi(tmp_path, text_in)), expect_success=False)
    assert_failed_without_gpu_series(text, "bad_row")


def test_duplicate_index_is_counted_and_fails(fake_smi, run_collector, tmp_path):
    text_in = replace_field(real_csv(fake_smi, gpus=3), "index", "2", "0", row=3)
    text = run_collector("--nvidia-smi", str(scripted_smi(tmp_path, text_in)), expect_success=False)
    assert_failed_without_gpu_series(text, "duplicate_gpu")
    assert one(text, "node_gpu_collector_duplicate_gpu_rows") == 1


def test_comma_in_the_name_is_kept_in_the_model_label(fake_smi, run_collector, tmp_path):
    name = "NVIDIA H100 80GB HBM3"
    text_in = replace_field(real_csv(fake_smi, gpus=2), "name", name, "NVIDIA H100, 80GB, HBM3")
    text = run_collector("--nvidia-smi", str(scripted_smi(tmp_path, text_in)))
    assert one(text, "node_gpu_devices") == 2
    assert one(text, "node_gpu_info", gpu="0", model="NVIDIA H100, 80GB, HBM3") == 1
    assert one(text, "node_gpu_info", gpu="1", model=name) == 1
    assert one(text, "node_gpu_power_draw_watts", gpu="0") == 69.85


def test_comma_before_the_name_is_a_bad_row(fake_smi, run_collector, tmp_path):
    text_in = replace_field(real_csv(fake_smi), "vbios_version", "96.00.A5.00.01", "96.00, A5")
    text = run_collector("--nvidia-smi", str(scripted_smi(tmp_path, text_in)), expect_success=False)
    assert_failed_without_gpu_series(text, "bad_row")


def test_lost_gpu_message_line_is_counted(fake_smi, run_collector, tmp_path):
    lines = real_csv(fake_smi, gpus=2).splitlines()
    lines.insert(2, "Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error")
    del lines[3]  # the lost GPU has no row
    script = scripted_smi(tmp_path, "\n".join(lines) + "\n", rc=15)
    text = run_collector("--nvidia-smi", str(script), "--expected-gpus", "2")
    assert one(text, "node_gpu_collector_success") == 1
    assert one(text, "node_gpu_devices") == 1
    assert one(text, "node_gpu_collector_skipped_lines") == 1


def test_amd_duplicates_and_too_many():
    gpu = gc.GpuData("0", "u", "amd", {}, [])
    with pytest.raises(gc.CollectorError) as err:
        gc.checked_gpu_list([gpu, gpu])
    assert err.value.reason == "duplicate_gpu"
    assert err.value.samples[0].value == 1
    many = [gc.GpuData(str(i), "u", "amd", {}, []) for i in range(gc.MAX_GPUS + 1)]
    with pytest.raises(gc.CollectorError) as err:
        gc.checked_gpu_list(many)
    assert err.value.reason == "too_many_gpus"
