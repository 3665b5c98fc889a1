"""The collector's verdict end to end: nvidia-smi double, kernel log, state directory, and
the health program's `clear` that rewrites the XID baseline."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from health_helpers import BUS, FAKE_SMI, H100, make_config, parse_prom, values_of, write_config

from gpufleet_node.gpu_collector import cli as collector_cli
from gpufleet_node.gpu_collector import collect, state
from gpufleet_node.gpu_collector.state import boot_id
from gpufleet_node.gpu_health import cli, decide

XID79 = "NVRM: Xid (PCI:0000:{bus}:00): 79, pid=1, GPU has fallen off the bus."
XID48 = "NVRM: Xid (PCI:0000:{bus}:00): 48, pid=1, DBE (0x1,0x0)."
XID63 = "NVRM: Xid (PCI:0000:{bus}:00): 63, pid=1896, Row Remapper: New row marked for remapping."
XID13 = "NVRM: Xid (PCI:0000:{bus}:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0)"


class Node:
    """One GPU node: a fake nvidia-smi with 8 H100s, a kernel log, a proc root whose boot
    id is this machine's, and the collector's state directory."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp_path
        self.smi = tmp_path / "bin" / "nvidia-smi"
        self.smi.parent.mkdir()
        self.smi.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_SMI}" "$@"\n')
        self.smi.chmod(0o755)
        monkeypatch.setenv("FAKE_NVIDIA_SMI_CONFIG", str(tmp_path / "no-such.conf"))
        for key in ("MODE", "UNKNOWN_FIELDS", "APPS", "APPS_FILE", "CALL_LOG"):
            monkeypatch.delenv(f"FAKE_NVIDIA_SMI_{key}", raising=False)
        self.monkeypatch = monkeypatch
        self.set(capture=H100, state="idle", gpus=8)
        self.textfile = tmp_path / "textfile"
        self.textfile.mkdir()
        self.state = tmp_path / "collector-state"
        self.proc = tmp_path / "proc"
        self.set_boot_id(boot_id())
        self.kern = tmp_path / "kern.log"
        self.kern.write_text("")
        self.config = make_config(tmp_path)  # the health program's paths: self.state/*

    def set(self, **values: object) -> None:
        for key, value in values.items():
            self.monkeypatch.setenv(f"FAKE_NVIDIA_SMI_{key.upper()}", str(value))

    def set_boot_id(self, boot: str) -> None:
        path = self.proc / "sys" / "kernel" / "random" / "boot_id"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(boot + "\n")

    def argv(self, *extra: str) -> list[str]:
        return [
            "--once",
            "--nvidia-smi",
            str(self.smi),
            "--textfile-dir",
            str(self.textfile),
            "--state-dir",
            str(self.state),
            "--proc-root",
            str(self.proc),
            "--xid-source",
            str(self.kern),
            "--expected-gpus",
            "8",
            *extra,
        ]

    def run(self, *extra: str, rc: int = 0) -> str:
        assert collector_cli.main(self.argv(*extra)) == rc
        return (self.textfile / "gpufleet_gpu.prom").read_text()

    def xid(self, template: str, gpu: int) -> None:
        with self.kern.open("a") as handle:
            handle.write(template.format(bus=BUS[gpu]) + "\n")

    def document(self) -> dict[str, Any]:
        return json.loads((self.state / "health.json").read_text())

    def verdict(self) -> decide.Verdict:
        text = (self.state / "health.json").read_text()
        return decide.parse_verdict(text, self.document()["time"] + 1, 120)

    def baseline(self) -> dict[str, Any]:
        return json.loads((self.state / "xid_baseline.json").read_text())


@pytest.fixture
def gpu_node(tmp_path, monkeypatch) -> Node:
    return Node(tmp_path, monkeypatch)


def check_state(text: str, gpu: str, check: str) -> str:
    """The state of one check: its series (only a check that is not ok has one), else the
    health document's (which holds every check)."""
    found = [
        labels
        for labels in _labels(text, "node_gpu_health_check")
        if labels["gpu"] == gpu and labels["check"] == check
    ]
    assert len(found) <= 1, (gpu, check, found)
    return found[0]["state"] if found else "ok"


def _labels(text: str, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels), v in parse_prom(text).items() if n == name and v == 1]


def verdict_series(text: str) -> dict[str, float]:
    return {s: values_of(text, "node_gpu_health_verdict", state=s)[0] for s in decide.STATES}


def test_a_healthy_node_writes_series_and_document(gpu_node):
    text = gpu_node.run()
    assert _labels(text, "node_gpu_health_check") == []  # only a check that is not ok
    assert verdict_series(text) == {"ok": 1, "warn": 0, "fail": 0, "unknown": 0}
    assert "# TYPE node_gpu_health_verdict gauge" in text
    document = gpu_node.document()
    assert document["version"] == 1
    assert document["boot_id"] == boot_id()
    assert document["verdict"] == "ok"
    checks = document["checks"]
    assert len(checks) == 2 + 8 + 8 * 5
    assert {c["state"] for c in checks} == {"ok"}
    assert {c["check"] for c in checks} == {
        "collector",
        "gpu_count",
        "xid",
        "ecc_uncorrectable",
        "row_remap_failure",
        "row_remap_pending",
        "retired_pages",
        "recovery_action",
    }
    assert [c["gpu"] for c in checks if c["check"] == "xid"] == [str(i) for i in range(8)]
    assert gpu_node.verdict() == decide.Verdict("ok", document["time"], ())
    assert gpu_node.baseline() == {"boot_id": boot_id(), "counts": {}}


def test_a_critical_xid_fails_and_clear_passes_again(gpu_node):
    gpu_node.run()
    gpu_node.xid(XID79, 1)
    gpu_node.xid(XID13, 0)  # the application's own fault: no health impact
    text = gpu_node.run()
    assert check_state(text, "1", "xid") == "fail"
    assert check_state(text, "0", "xid") == "ok"
    assert values_of(
        text,
        "node_gpu_health_check",
        gpu="1",
        check="xid",
        state="fail",
        reason="xid79 (fallen off the bus)",
    ) == [1]
    assert verdict_series(text)["fail"] == 1
    verdict = gpu_node.verdict()
    assert verdict.state == "fail"
    assert [(f.check, f.gpu) for f in verdict.failures] == [("xid", "1")]
    reason = decide.drain_reason(verdict.failures, verdict.time)
    assert reason.startswith("gpufleet: xid79 gpu1 (fallen off the bus) 20")
    # no new line: the XID still counts, cycle after cycle
    assert check_state(gpu_node.run(), "1", "xid") == "fail"
    # after a GPU reset: the admin clears, the verdict passes, the counter stays
    assert cli.clear(gpu_node.config, None) == 0
    text = gpu_node.run()
    assert check_state(text, "1", "xid") == "ok"
    assert verdict_series(text)["ok"] == 1
    assert gpu_node.verdict().state == "ok"
    assert values_of(text, "node_gpu_xid_errors_total", gpu="1", xid="79") == [1]
    # a new XID after the clear fails again
    gpu_node.xid(XID79, 1)
    assert check_state(gpu_node.run(), "1", "xid") == "fail"


def test_clear_of_one_gpu_leaves_the_others_failing(gpu_node):
    gpu_node.xid(XID48, 0)
    gpu_node.xid(XID79, 1)
    text = gpu_node.run()
    assert (check_state(text, "0", "xid"), check_state(text, "1", "xid")) == ("fail", "fail")
    assert cli.main(["--config", str(write_config(gpu_node.tmp)), "clear", "--gpu", "0"]) == 0
    text = gpu_node.run()
    assert (check_state(text, "0", "xid"), check_state(text, "1", "xid")) == ("ok", "fail")
    assert gpu_node.verdict().failures[0].gpu == "1"


def test_an_xid_already_in_the_log_at_the_first_cycle_counts(gpu_node):
    """The first baseline of a boot is taken before its kernel log is read."""
    gpu_node.xid(XID79, 5)
    text = gpu_node.run()
    assert check_state(text, "5", "xid") == "fail"
    assert gpu_node.baseline()["counts"] == {}


def test_a_warning_xid_warns(gpu_node):
    gpu_node.xid(XID63, 2)
    text = gpu_node.run()
    assert check_state(text, "2", "xid") == "warn"
    assert verdict_series(text) == {"ok": 0, "warn": 1, "fail": 0, "unknown": 0}
    assert gpu_node.verdict().state == "warn"


def test_a_reboot_clears_xids(gpu_node):
    gpu_node.xid(XID79, 1)
    assert check_state(gpu_node.run(), "1", "xid") == "fail"
    gpu_node.set_boot_id("0b5e1c7e-0000-4000-8000-000000000001")
    text = gpu_node.run()
    assert check_state(text, "1", "xid") == "ok"
    assert gpu_node.baseline() == {
        "boot_id": "0b5e1c7e-0000-4000-8000-000000000001",
        "counts": {"0000:2a:00|79": 1},
    }
    assert gpu_node.document()["boot_id"] == "0b5e1c7e-0000-4000-8000-000000000001"


def test_a_missing_gpu_fails_gpu_count(gpu_node):
    gpu_node.set(gpus=7)
    text = gpu_node.run()
    assert check_state(text, "", "gpu_count") == "fail"
    assert values_of(text, "node_gpu_health_check", check="gpu_count", reason="7 of 8 GPUs present")
    verdict = gpu_node.verdict()
    assert decide.drain_reason(verdict.failures, verdict.time).startswith(
        "gpufleet: gpu_count node (7 of 8 GPUs present) "
    )


def test_a_failed_cycle_is_unknown_and_never_drains(gpu_node):
    gpu_node.set(mode="crash")
    text = gpu_node.run(rc=1)
    assert check_state(text, "", "collector") == "unknown"
    assert check_state(text, "", "gpu_count") == "unknown"
    assert verdict_series(text) == {"ok": 0, "warn": 0, "fail": 0, "unknown": 1}
    verdict = gpu_node.verdict()
    assert (verdict.state, verdict.failures) == ("unknown", ())
    node = decide.NodeState("gpu-a", frozenset({"IDLE"}), "", 0, ("gpu",))
    assert decide.intent(verdict, "drain", node, 0, 0, 3, 2, verdict.time).action == "none"


def test_a_failed_cycle_still_counts_xids_on_their_gpu(gpu_node):
    """XID 79: nvidia-smi no longer answers, but the GPU is in the collector's PCI map
    from an earlier cycle, so the XID stays that GPU's, not the node's."""
    gpu_node.run()  # the PCI map is known
    gpu_node.set(mode="crash")
    gpu_node.xid(XID79, 3)
    text = gpu_node.run(rc=1)
    assert check_state(text, "3", "xid") == "fail"
    assert check_state(text, "", "xid") == "ok"
    verdict = gpu_node.verdict()
    assert verdict.state == "fail"
    assert [(f.check, f.gpu) for f in verdict.failures] == [("xid", "3")]
    reason = decide.drain_reason(verdict.failures, verdict.time)
    assert reason.startswith("gpufleet: xid79 gpu3 (fallen off the bus) ")


def test_without_an_xid_source_there_is_no_xid_check(gpu_node):
    argv = gpu_node.argv()
    argv[argv.index("--xid-source") + 1] = "none"
    assert collector_cli.main(argv) == 0
    text = (gpu_node.textfile / "gpufleet_gpu.prom").read_text()
    assert "xid" not in {c["check"] for c in _labels(text, "node_gpu_health_check")}


def test_without_a_state_dir_there_is_no_document(gpu_node):
    argv = gpu_node.argv()
    argv[argv.index("--state-dir") + 1] = ""
    assert collector_cli.main(argv) == 0
    text = (gpu_node.textfile / "gpufleet_gpu.prom").read_text()
    assert verdict_series(text)["ok"] == 1
    assert not gpu_node.state.exists()


def test_an_unwritable_document_is_logged_not_fatal(gpu_node, capsys):
    gpu_node.state.mkdir()
    (gpu_node.state / "health.json").mkdir()  # a directory in the way
    text = gpu_node.run()
    assert verdict_series(text)["ok"] == 1
    assert "cannot write" in capsys.readouterr().err


# --- the baseline file (Collector.load_baseline, state.load_xid_baseline) -----------


def collector_of(gpu_node: Node) -> collect.Collector:
    return collect.Collector(collector_cli.parse_args(gpu_node.argv()))


def write_state(gpu_node: Node, counts: dict[str, int]) -> None:
    gpu_node.state.mkdir(exist_ok=True)
    (gpu_node.state / "xid_state.json").write_text(json.dumps({"counts": counts}))


@pytest.mark.parametrize(
    "content",
    [
        "",
        "garbage",
        "[]",
        json.dumps({"counts": {}}),
        json.dumps({"boot_id": 5, "counts": {}}),
        json.dumps({"boot_id": "B", "counts": []}),
        json.dumps({"boot_id": "B", "counts": {"0000:18:00|79": True}}),
        json.dumps({"boot_id": "B", "counts": {"0000:18:00|79": -1}}),
        json.dumps({"boot_id": "B", "counts": {"0000:18:00|79": 1.0}}),
        json.dumps({"boot_id": "B", "counts": {"0000:18:00|79": 2**53}}),
        json.dumps({"boot_id": "B", "counts": {"18:00|79": 1}}),
        json.dumps({"boot_id": "B", "counts": {"0000:18:00|abc": 1}}),
    ],
)
def test_baselines_of_another_shape_are_replaced(gpu_node, content):
    assert state.load_xid_baseline(_write_baseline(gpu_node, content)) is None
    write_state(gpu_node, {"0000:18:00|79": 4})
    assert collector_of(gpu_node).xid_baseline == {"0000:18:00|79": 4}
    assert gpu_node.baseline() == {"boot_id": boot_id(), "counts": {"0000:18:00|79": 4}}


def _write_baseline(gpu_node: Node, content: str) -> str:
    gpu_node.state.mkdir(exist_ok=True)
    path = gpu_node.state / "xid_baseline.json"
    path.write_text(content)
    return str(path)


def test_load_xid_baseline():
    assert state.load_xid_baseline(None) is None
    assert state.load_xid_baseline("/nonexistent/xid_baseline.json") is None


def test_a_baseline_of_this_boot_is_kept(gpu_node):
    counts = {"0000:18:00|79": 2, "0000:2a:00|48": 7}
    path = _write_baseline(gpu_node, json.dumps({"boot_id": boot_id(), "counts": counts}))
    assert state.load_xid_baseline(path) == (boot_id(), counts)
    write_state(gpu_node, {"0000:18:00|79": 9})
    collector = collector_of(gpu_node)
    assert collector.xid_baseline == counts
    assert collector.load_baseline() == counts
    assert gpu_node.baseline()["counts"] == counts


def test_a_baseline_of_another_boot_takes_the_counts_now(gpu_node):
    _write_baseline(gpu_node, json.dumps({"boot_id": "old", "counts": {"0000:18:00|79": 1}}))
    write_state(gpu_node, {"0000:18:00|79": 3})
    assert collector_of(gpu_node).xid_baseline == {"0000:18:00|79": 3}
    assert gpu_node.baseline()["boot_id"] == boot_id()


def test_the_baseline_is_read_again_every_cycle(gpu_node):
    """Loop mode: one Collector, and `clear` rewriting the file between its cycles."""
    gpu_node.xid(XID79, 1)
    collector = collector_of(gpu_node)
    assert collector.cycle()
    assert gpu_node.verdict().state == "fail"
    assert cli.clear(gpu_node.config, "1") == 0
    assert collector.cycle()
    assert gpu_node.verdict().state == "ok"


def test_xids_still_fail_when_the_baseline_cannot_be_written(gpu_node):
    """Regression: with a baseline file that cannot be written (a directory in the way),
    load_baseline once took "the counts now" every cycle, after this cycle's XIDs were
    read: a critical XID never failed the verdict. The baseline of this boot is kept in
    memory once taken."""
    gpu_node.state.mkdir()
    (gpu_node.state / "xid_baseline.json").mkdir()
    collector = collector_of(gpu_node)
    assert collector.cycle()
    assert collector.xid_baseline == {}
    gpu_node.xid(XID79, 1)
    assert collector.cycle()
    assert collector.xid_baseline == {}
    assert gpu_node.verdict().state == "fail"
    assert [(f.check, f.gpu) for f in gpu_node.verdict().failures] == [("xid", "1")]
    assert collector.cycle()  # and cycle after cycle
    assert gpu_node.verdict().state == "fail"


def test_a_reboot_clears_xids_when_the_baseline_cannot_be_written(gpu_node):
    """The in-memory baseline belongs to its boot: the collector of a new boot takes the
    counts now, unwritable file or not."""
    gpu_node.state.mkdir()
    (gpu_node.state / "xid_baseline.json").mkdir()
    gpu_node.xid(XID79, 1)
    assert collector_of(gpu_node).cycle()
    assert gpu_node.verdict().state == "fail"
    gpu_node.set_boot_id("0b5e1c7e-0000-4000-8000-000000000002")
    collector = collector_of(gpu_node)
    assert collector.xid_baseline == {f"0000:{BUS[1]}:00|79": 1}
    assert collector.cycle()
    assert gpu_node.verdict().state == "ok"
