"""XIDs only from the kernel's own records, anchored to the driver's layout (issue 26,
finding 5).

A record counts when its source says the kernel logged it and it STARTS with
"NVRM: Xid (PCI:dddd:bb:dd): N, "; the kernel prints user-chosen text (cgroup paths,
task names) inside its own records, and XID-like text there never counts: it is
counted in node_gpu_xid_records_rejected_total{reason} instead.
"""

from __future__ import annotations

import json
import random
import time

import pytest
from gpu_helpers import gc, values_of
from test_gpu_collector_hardening import journal_json

from gpufleet_node.gpu_collector import xid

SEED = 20261128
ITERATIONS = 3000
GENUINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
# The finding's shapes: the kernel's own records with a user-chosen string in them.
FORGED_KERNEL = [
    "cgroup: fork rejected by pids controller in /user.slice/user-1000.slice/"
    "user@1000.service/app.slice/" + GENUINE,
    "Memory cgroup out of memory: Killed process 77 (x) oom_memcg=/user.slice/" + GENUINE,
    "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/a/b\n" + GENUINE,  # a later line
    'audit: type=1400 name="NVRM: Xid (PCI:0000:3b:00): 48, x"',
    "x\nNVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
    "usb 1-1: Product: NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
    " " + GENUINE,
]
MALFORMED = [
    "NVRM: Xid (PCI:zzzz:3b:00): 79, x",
    "NVRM: Xid (PCI:0000:3b:00): 123456, x",
    "NVRM: Xid (PCI:0000:3b:00) 79, x",
    "NVRM: Xid (PCI:0000:3b:00): 79",
    "NVRM: Xid (PCI:0000:3b:00): 79x, y",
]


def rec(message: str, kernel: bool = True) -> gc.KernelRecord:
    return gc.KernelRecord(message, kernel)


def test_genuine_records_count():
    parsed = gc.parse_records([rec(GENUINE), rec("NVRM: Xid (0000:03:00): 14, Channel 1")])
    assert parsed.events == [("0000:3b:00", 79), ("0000:03:00", 14)]
    assert parsed.rejected == {"not_kernel": 0, "unanchored": 0, "malformed": 0}


@pytest.mark.parametrize("message", FORGED_KERNEL, ids=range(len(FORGED_KERNEL)))
def test_text_inside_a_kernel_record_never_counts(message):
    parsed = gc.parse_records([rec(message)])
    assert parsed.events == []
    assert parsed.rejected["unanchored"] == 1


@pytest.mark.parametrize("message", MALFORMED)
def test_malformed_records_are_rejected(message):
    parsed = gc.parse_records([rec(message)])
    assert parsed.events == [] and parsed.rejected["malformed"] == 1


def test_records_not_from_the_kernel_never_count():
    parsed = gc.parse_records([rec(GENUINE, kernel=False), rec("usb: fine", kernel=False)])
    assert parsed.events == [] and parsed.rejected["not_kernel"] == 1


def test_fallen_off_the_bus_one_record_or_three_lines():
    head = "NVRM: The NVIDIA GPU 0000:b3:00.0"
    middle = "NVRM: (PCI ID: 10de:26b5) installed in this system has"
    tail = "NVRM: fallen off the bus and is not responding to commands."
    one = gc.parse_records([rec("\n".join([head, middle, tail]))])
    three = gc.parse_records([rec(head), rec(middle), rec(tail)])
    assert one.events == three.events == [("0000:b3:00", 79)]
    # the same head with another message (an unsupported GPU): nothing
    other = "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: installed in this system is not supported"
    assert gc.parse_records([rec(other)]).events == []
    # a tail without its head (the head in an earlier read) is the driver's: not rejected
    alone = gc.parse_records([rec(tail)])
    assert alone.events == [] and not any(alone.rejected.values())
    # a tail too far after the head does not count
    far = gc.parse_records([rec(head), rec("a"), rec("b"), rec(tail)])
    assert far.events == []


@pytest.mark.parametrize(
    ("line", "events"),
    [
        ("[   12.345678] " + GENUINE, [("0000:3b:00", 79)]),
        ("[ 130.456250] [ T1946] " + GENUINE, [("0000:3b:00", 79)]),
        ("Feb 01 14:25:31 host kernel: " + GENUINE, [("0000:3b:00", 79)]),
        ("2026-11-26T10:00:00.123456+01:00 gpu01 kernel: " + GENUINE, [("0000:3b:00", 79)]),
        ("Feb 01 14:25:31 host kernel: [  1.2] " + GENUINE, [("0000:3b:00", 79)]),
        ("Feb 01 14:25:31 host python3: " + GENUINE, []),  # not the kernel's tag
        ("[abc] " + GENUINE, []),
        ("[   12.3] cgroup: fork rejected by pids controller in /" + GENUINE, []),
    ],
)
def test_file_lines_only_after_a_fixed_head(line, events):
    assert gc.parse_xid_lines([line]) == events


def test_kmsg_origin_and_escapes():
    kernel = gc.parse_kmsg_record("3,5,1,-;" + GENUINE)
    user = gc.parse_kmsg_record("11,6,1,-;" + GENUINE)  # <11>: LOG_USER, written by root
    assert kernel[1].kernel and not user[1].kernel
    # the kernel escapes a backslash as \x5c: a user's literal "\x0a" stays text
    forged = gc.parse_kmsg_record("6,7,1,-;fork rejected in /a\\x5cx0a" + GENUINE)
    assert "\n" not in forged[1].message
    assert gc.parse_records([forged[1]]).events == []


def test_journal_entry_origin_fields():
    entry = gc.journal_entry
    assert entry(journal_json(GENUINE, "c1"))[1] == rec(GENUINE, True)
    assert entry(journal_json(GENUINE, "c2", facility="1"))[1] == rec(GENUINE, False)
    assert entry(journal_json(GENUINE, "c3", transport="syslog"))[1] == rec(GENUINE, False)
    raw = json.dumps({"__CURSOR": "c4", "MESSAGE": list(b"NVRM: \xff"), "_TRANSPORT": "kernel"})
    cursor, record = entry(raw)
    assert cursor == "c4" and record.message.startswith("NVRM: ") and not record.kernel
    assert entry("not json") == (None, None)
    assert entry('{"MESSAGE": ["a", "b"], "__CURSOR": 5}') == (None, None)


def test_journald_end_to_end_counts_only_the_kernels_records(
    fake_smi, run_collector, tmp_path, monkeypatch
):
    folder = tmp_path / "journal-bin"
    folder.mkdir()
    entries = [
        journal_json(GENUINE.replace("79", "48"), "s=1"),
        journal_json(FORGED_KERNEL[0], "s=2"),
        journal_json(GENUINE, "s=3", facility="1"),
        journal_json(
            "NVRM: The NVIDIA GPU 0000:18:00.0\nNVRM: fallen off the bus and is not responding",
            "s=4",
        ),
    ]
    (folder / "out.json").write_text("\n".join(entries) + "\n")
    script = folder / "journalctl"
    script.write_text(f'#!/bin/sh\ncat "{folder}/out.json"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    text = run_collector("--xid-source", "journald")
    assert values_of(text, "node_gpu_xid_errors_total", pci_bus_id="00000000:3B:00.0") == [1]
    assert values_of(text, "node_gpu_xid_errors_total", xid="48") == [1]
    assert values_of(text, "node_gpu_xid_errors_total", pci_bus_id="00000000:18:00.0") == [1]
    assert values_of(text, "node_gpu_xid_records_rejected_total", reason="unanchored") == [1]
    assert values_of(text, "node_gpu_xid_records_rejected_total", reason="not_kernel") == [1]
    assert values_of(text, "node_gpu_xid_records_rejected_total", reason="malformed") == [0]
    # persisted like the XID counts: the same records again (the fake ignores the
    # cursor) add to them, and a restart keeps them
    text = run_collector("--xid-source", "journald")
    assert values_of(text, "node_gpu_xid_records_rejected_total", reason="unanchored") == [2]


def test_file_source_end_to_end(fake_smi, run_collector, tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("\n".join(["[ 1.0] " + m.replace("\n", " ") for m in FORGED_KERNEL]) + "\n")
    text = run_collector("--xid-source", str(log))
    assert values_of(text, "node_gpu_xid_errors_total") == []
    assert values_of(text, "node_gpu_xid_records_rejected_total", reason="unanchored") == [
        len(FORGED_KERNEL)
    ]


def test_rejected_state_of_the_wrong_shape_is_ignored(fake_smi, run_collector, tmp_path):
    run_collector.state_dir.mkdir()
    state = {"rejected": {"unanchored": -1, "nonsense": 3}}
    (run_collector.state_dir / "xid_state.json").write_text(json.dumps(state))
    log = tmp_path / "kern.log"
    log.write_text("")
    text = run_collector("--xid-source", str(log))
    assert values_of(text, "node_gpu_xid_records_rejected_total", reason="unanchored") == [0]


# --------------------------------------------------------------- property / fuzz


def _pci(rng: random.Random) -> tuple[str, str]:
    domain, bus, device = rng.randrange(0, 0x10000), rng.randrange(256), rng.randrange(32)
    text = f"{domain:04x}:{bus:02x}:{device:02x}"
    return (text.upper() if rng.random() < 0.3 else text), text


def _genuine(rng: random.Random) -> tuple[str, tuple[str, int]]:
    raw, key = _pci(rng)
    code = rng.randrange(1, 200)
    func = rng.choice(["", ".0", ".1"])
    prefix = rng.choice(["PCI:", "PCI:", ""])
    tail = "".join(rng.choices("abc ,=()'<>:0123456789\n", k=rng.randrange(0, 80)))
    return f"NVRM: Xid ({prefix}{raw}{func}): {code}, {tail}", (key, code)


NOISE = "abcdefgh /_-.:@()[],=0123456789\t\n'\"\\\u2028\x00"


def test_property_xid_text_off_the_record_start_never_counts():
    """Genuine XID text put anywhere but at the start of a kernel record, or in a record
    that is not the kernel's, is never an event; at the start it is exactly one."""
    rng = random.Random(SEED)
    deadline = time.monotonic() + 20
    for _ in range(ITERATIONS):
        text, event = _genuine(rng)
        lead = "".join(rng.choices(NOISE, k=rng.randrange(1, 60)))
        assert gc.parse_records([rec(text)]).events == [event], text
        forged = gc.parse_records([rec(lead + text), rec(text, kernel=False)])
        assert forged.events == [], lead + text
        assert sum(forged.rejected.values()) == 2
        assert time.monotonic() < deadline


def test_property_file_lines_with_a_forged_middle():
    """A file line counts only when nothing but a fixed syslog/dmesg head precedes the
    record; any other text before it makes it no XID."""
    rng = random.Random(SEED + 1)
    heads = ["", "[  3.14] ", "Feb 01 14:25:31 host kernel: ", "[ 1.0] [ T12] "]
    for _ in range(ITERATIONS):
        text, event = _genuine(rng)
        text = text.split("\n")[0]
        head = rng.choice(heads)
        middle = "".join(rng.choices(NOISE.replace("\n", ""), k=rng.randrange(1, 40)))
        assert gc.parse_xid_lines([head + text]) == [event]
        line = head + middle + text
        only_a_head = gc.FILE_PREFIX_RE.match(line).end() == len(head + middle)
        assert gc.parse_xid_lines([line]) == ([event] if only_a_head else []), line


def test_fuzz_records_never_raise_and_stay_fast():
    rng = random.Random(SEED + 2)
    seeds = [GENUINE, *FORGED_KERNEL, *MALFORMED, "NVRM: The NVIDIA GPU 0000:b3:00.0"]
    records = []
    for _ in range(ITERATIONS):
        text = list(rng.choice(seeds))
        for _ in range(rng.randrange(1, 6)):
            position = rng.randrange(len(text) + 1)
            text[position:position] = rng.choice(NOISE)
        records.append(rec("".join(text), rng.random() < 0.8))
    start = time.monotonic()
    parsed = gc.parse_records(records)
    assert time.monotonic() - start < 5
    assert all(0 <= code < 10_000 for _, code in parsed.events)
    raw_lines = ["".join(rng.choices(NOISE + "NVRM: Xid(PCI)", k=300)) for _ in range(500)]
    for line in raw_lines:
        gc.parse_kmsg_record(line)
        gc.journal_entry(line)
        gc.parse_xid_lines([line])


def test_kmsg_reader_uses_the_record_origin(tmp_path, monkeypatch):
    """read_xid_kmsg on a regular file standing in for /dev/kmsg (one read, one record)."""
    device = tmp_path / "kmsg"
    device.write_text("11,9,1,-;" + GENUINE + "\n")
    records, position = xid.read_xid_kmsg({}, str(device))
    assert records == [rec(GENUINE, False)] and position["seq"] == 9
