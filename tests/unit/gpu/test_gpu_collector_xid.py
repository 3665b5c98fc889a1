"""XID parsing, PCI id normalisation, persisted counters."""

from __future__ import annotations

import pytest
from gpu_helpers import gc, stateless_argv, values_of
from test_gpu_collector_hardening import journal_json

from gpufleet_node.gpu_collector import xid

LINES = [
    "NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
    "[   12.3] NVRM: Xid (0000:03:00): 14, Channel 00000001",
    "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping.",
    "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01",
    "[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0",
    "Feb 01 14:25:31 host kernel: NVRM: Xid (PCI:0000:61:00): 119, pid=123417, name=nv-hostengine,"
    " Timeout after 6s of waiting for RPC response from GPU0 GSP!",
    "[ 130.456250] [ T1946] NVRM: Xid (PCI:0000:3B:00): 13, Graphics Exception",
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
    "NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
    "NVRM: GPU at PCI:0000:01:00: GPU-34d7319c-5b19-1e75-186d-c187099e4fe5",
    "nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 11001, Fatal, ingress invalid command",
    "usb 1-1: new high-speed USB device number 2",
]


def test_parse_all_line_shapes():
    assert gc.parse_xid_lines(LINES) == [
        ("0000:05:00", 79),
        ("0000:01:00", 79),
        ("0000:03:00", 14),
        ("0000:10:1c", 63),
        ("0009:01:00", 149),
        ("0009:01:00", 154),
        ("0000:61:00", 119),
        ("0000:3b:00", 13),
        ("0000:b3:00", 79),
        ("0000:29:00", 79),
    ]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("PCI:0000:3b:00", "0000:3b:00"),
        ("0000:3B:00", "0000:3b:00"),
        ("00000000:3B:00.0", "0000:3b:00"),
        ("00000009:01:00.0", "0009:01:00"),
        ("0000:b3:00.0", "0000:b3:00"),
    ],
)
def test_normalize_pci_id(raw, expected):
    assert gc.normalize_pci_id(raw) == expected


def test_nvidia_pci_form_matches_nvidia_smi():
    assert gc.nvidia_pci_form("0000:3b:00") == "00000000:3B:00.0"


@pytest.mark.parametrize(
    ("xid", "critical"),
    [
        (79, True),
        (48, True),
        (64, True),
        (74, True),
        (95, True),
        (119, True),
        (145, True),
        (154, True),
        (63, False),
        (92, False),
        (94, False),
        (13, False),
        (31, False),
    ],
)
def test_critical_codes(xid, critical):
    assert (xid in gc.CRITICAL_XIDS) is critical


def test_counts_are_pure_and_cumulative():
    first = gc.count_xids({}, [("0000:3b:00", 79), ("0000:3b:00", 79)])
    second = gc.count_xids(first, [("0000:3b:00", 13)])
    assert first == {"0000:3b:00|79": 2}
    assert second == {"0000:3b:00|79": 2, "0000:3b:00|13": 1}


def test_kmsg_record():
    record = "3,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
    message = record.split(";", 1)[1].strip()
    assert gc.parse_kmsg_record(record) == (1234, gc.KernelRecord(message, True))
    assert gc.parse_kmsg_record(" SUBSYSTEM=pci") is None
    # facility 1 (user): written to /dev/kmsg from user space, not the kernel's
    assert gc.parse_kmsg_record("14,7,1,-;" + message) == (7, gc.KernelRecord(message, False))
    # escaped control bytes come back: one multi-line printk is one record
    escaped = "4,8,1,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: fallen off the bus and is"
    assert gc.parse_kmsg_record(escaped)[1].message.split("\n")[1].startswith("NVRM: fallen")


def test_journald_cursor_is_passed_and_kept(monkeypatch):
    seen = []

    def fake_run(argv, timeout, *_bounds, **_kw):
        seen.append(argv)
        out = journal_json("NVRM: Xid (PCI:0000:3b:00): 31, pid=1, MMU Fault", "s=abc;i=2")
        return gc.CommandResult(out + "\n", 0.0, None, "", 0)

    monkeypatch.setattr(xid, "run_command", fake_run)
    records, position = gc.read_xid_journald({"cursor": "s=abc;i=1"}, 5)
    assert records == [gc.KernelRecord("NVRM: Xid (PCI:0000:3b:00): 31, pid=1, MMU Fault", True)]
    assert position == {"cursor": "s=abc;i=2"}
    assert "--after-cursor=s=abc;i=1" in seen[0]
    assert seen[0][:3] == ["journalctl", "-k", "-b"]


def test_counters_persist_and_each_line_counts_once(fake_smi, run_collector, tmp_path):
    fake_smi.set(gpus=8)
    log = tmp_path / "kern.log"
    log.write_text(
        "NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n"
        "NVRM: Xid (PCI:0000:2a:00): 13, Graphics Exception\n"
    )
    text = run_collector("--xid-source", str(log))
    labels = {"gpu": "0", "pci_bus_id": "00000000:18:00.0", "xid": "79", "critical": "true"}
    assert values_of(text, "node_gpu_xid_errors_total", **labels) == [1]
    assert values_of(text, "node_gpu_xid_errors_total", gpu="1", xid="13", critical="false") == [1]
    assert values_of(text, "node_gpu_collector_xid_success") == [1]
    # same lines again: no new counts; one new line: +1
    text = run_collector("--xid-source", str(log))
    assert values_of(text, "node_gpu_xid_errors_total", gpu="0", xid="79") == [1]
    with log.open("a") as handle:
        handle.write("NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n")
        handle.write("NVRM: Xid (PCI:0000:18:00): 7")  # incomplete line: not yet
    text = run_collector("--xid-source", str(log))
    assert values_of(text, "node_gpu_xid_errors_total", gpu="0", xid="79") == [2]
    with log.open("a") as handle:
        handle.write("9, pid=1, GPU has fallen off the bus.\n")
    text = run_collector("--xid-source", str(log))
    assert values_of(text, "node_gpu_xid_errors_total", gpu="0", xid="79") == [3]


def test_log_rotation_keeps_counters(fake_smi, run_collector, tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("NVRM: Xid (PCI:0000:00:09): 48, DBE\n" * 3)
    run_collector("--xid-source", str(log))
    log.unlink()
    log.write_text("NVRM: Xid (PCI:0000:00:09): 48, DBE\n")
    text = run_collector("--xid-source", str(log))
    assert values_of(text, "node_gpu_xid_errors_total", gpu="0", xid="48", critical="true") == [4]


def test_xid_counters_survive_an_nvidia_smi_hang(fake_smi, run_collector, tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    run_collector("--xid-source", str(log))  # learns PCI -> GPU mapping
    log.write_text("NVRM: Xid (PCI:0000:00:09): 79, pid=1, GPU has fallen off the bus.\n")
    fake_smi.set(mode="hang")
    text = run_collector("--xid-source", str(log), "--timeout", "1", expect_success=False)
    assert values_of(text, "node_gpu_collector_success") == [0]
    xid = values_of(text, "node_gpu_xid_errors_total", gpu="0", xid="79", critical="true")
    assert xid == [1]
    assert "node_gpu_memory_used_bytes" not in text


def test_unknown_pci_and_missing_source(run_collector, tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("NVRM: Xid (PCI:0000:ee:00): 31, pid=1, MMU Fault\n")
    text = run_collector("--xid-source", str(log))
    assert values_of(text, "node_gpu_xid_errors_total", gpu="unknown", xid="31") == [1]
    text = run_collector("--xid-source", str(tmp_path / "missing.log"))
    assert values_of(text, "node_gpu_collector_xid_success") == [0]
    assert values_of(text, "node_gpu_xid_errors_total", gpu="unknown", xid="31") == [1]


def test_loop_mode_without_state_dir_counts_each_line_once(fake_smi, tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("NVRM: Xid (PCI:0000:00:09): 94, pid=1, Contained\n")
    out = tmp_path / "tf"
    out.mkdir()
    args = gc.parse_args([*stateless_argv(fake_smi.bin, out), "--xid-source", str(log)])
    collector = gc.Collector(args)
    assert collector.cycle() and collector.cycle()
    text = (out / "gpufleet_gpu.prom").read_text()
    assert values_of(text, "node_gpu_xid_errors_total", gpu="0", xid="94", critical="false") == [1]
