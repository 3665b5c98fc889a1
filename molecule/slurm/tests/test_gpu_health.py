"""The GPU health loop on a real Slurm 24.11 cluster (converge.yml, docs/health.md).

slurmd runs gpufleet-gpu-health as its HealthCheckProgram every 5 s on both GPU nodes
(mode drain+resume, safety valve 50 %: one of the two nodes). Faults come in the way a
real GPU reports them: a critical XID as a kernel record in the journal the collector's
journald source reads (a double: no user-space program can write a kernel record), and a
pending row remap in what the nvidia-smi double answers. Then Slurm's own view is
checked: the drain and its reason, a job refused on the node, the resume.

This file runs first (before test_idle_gpu_alert.py), on an empty cluster, and leaves
both nodes resumed and every fault cleared.
"""

from __future__ import annotations

import json
import re
import shlex
import time

import pytest
from testbed_helpers import eventually

testinfra_hosts = ["gpufleet-slurmctl"]

NODE1, NODE2 = "gpufleet-slurm-gpu1", "gpufleet-slurm-gpu2"
HEALTH = "/usr/local/lib/gpufleet/gpufleet-gpu-health"
CONFIG = "/etc/gpufleet/gpu-health.json"
JOURNAL = "/var/lib/gpufleet-test/kernel-journal.jsonl"
SET_FILE = "/run/fake-nvidia-smi/set"
NODE_METRICS = "http://127.0.0.1:9100/metrics"
# 5 s collector cycles and health checks; a drain takes a cycle and a check, a resume a
# cycle and two passing checks (gpu_collector_health_resume_after_runs).
ACTS_WITHIN = 60
# The fake GPUs' PCI addresses (tests/gpu/fake_nvidia_smi.py: index 1 is bus 0x2A).
PCI = {0: "0000:18:00", 1: "0000:2a:00"}
LINE = re.compile(r"^(\w+)(?:\{([^}]*)\})? (\S+)$")  # with or without labels


def slurm_node(ctl, name: str) -> dict:
    return json.loads(ctl.check_output(f"scontrol show node {name} --json"))["nodes"][0]


def drained(ctl, name: str) -> bool:
    return "DRAIN" in slurm_node(ctl, name)["state"]


def reason(ctl, name: str) -> str:
    return slurm_node(ctl, name).get("reason") or ""


def kernel_record(node, message: str, transport: str = "kernel", facility: str = "0") -> None:
    entry = {"MESSAGE": message, "_TRANSPORT": transport, "SYSLOG_FACILITY": facility}
    node.check_output(f"echo {shlex.quote(json.dumps(entry))} >> {JOURNAL}")


def xid(gpu: int, code: int, text: str) -> str:
    return f"NVRM: Xid (PCI:{PCI[gpu]}): {code}, pid=1234, name=python3, {text}"


def node_metrics(node) -> list[tuple[str, dict[str, str], float]]:
    found = []
    for line in node.check_output(f"curl -fsS {NODE_METRICS}").splitlines():
        match = LINE.match(line)
        if match and match.group(1).startswith("node_gpu_health"):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
            found.append((match.group(1), labels, float(match.group(3))))
    return found


def failing(node) -> set[tuple[str, str]]:
    return {
        (labels["check"], labels.get("gpu", ""))
        for name, labels, _ in node_metrics(node)
        if name == "node_gpu_health_check" and labels["state"] == "fail"
    }


def actions(node) -> dict[str, float]:
    return {
        labels["action"]: value
        for name, labels, value in node_metrics(node)
        if name == "node_gpu_health_actions_total"
    }


def set_mode(node, mode: str) -> None:
    node.check_output(
        "python3 -c "
        + shlex.quote(
            "import json; p = '/etc/gpufleet/gpu-health.json'; c = json.load(open(p)); "
            f"c['mode'] = {mode!r}; open(p, 'w').write(json.dumps(c))"
        )
    )


def wait(predicate, what: str, timeout: float = ACTS_WITHIN):
    result = eventually(predicate, timeout)
    assert result, f"timed out after {timeout} s waiting for {what}"
    return result


def heal(ctl, nodes) -> None:
    """Every fault cleared, the mode back to converge's, every node back in service (by
    itself; a node a failed test left drained otherwise, by hand)."""
    for node in nodes.values():
        node.run(f"rm -f {SET_FILE}")
        node.check_output(f"{HEALTH} clear")
        set_mode(node, "drain+resume")
    for name in nodes:
        if not eventually(lambda name=name: not drained(ctl, name), ACTS_WITHIN):
            ctl.check_output(f"scontrol update nodename={name} state=resume")


def srun_on(ctl, node: str, seconds: int) -> int:
    """A real job step of alice's asked for on ``node``; its exit status."""
    cmd = ["srun", "--chdir=/tmp", f"--immediate={seconds}", "-w", node, "-p", "gpu",
           "--account=physics", "-t", "1", "true"]  # fmt: skip
    return ctl.run(f"runuser -u alice -- {shlex.join(cmd)}").rc


@pytest.fixture(scope="module")
def nodes(ctl, gpu_nodes):
    """Both GPU nodes healthy and in service before and after."""
    for name, node in gpu_nodes.items():
        node.check_output(f"touch {JOURNAL} && chmod 644 {JOURNAL}")
        wait(lambda node=node: not failing(node) and actions(node), f"{name}'s first health run")
        assert not drained(ctl, name), reason(ctl, name)
    try:
        yield gpu_nodes
    finally:
        heal(ctl, gpu_nodes)


def test_healthy_nodes_stay_in_service(ctl, nodes):
    """slurmd runs the program (its counters are served); nothing is drained."""
    for name, node in nodes.items():
        assert actions(node) == {"drain": 0, "resume": 0, "blocked": 0, "undone": 0}
        verdict = {
            labels["state"]: v
            for n, labels, v in node_metrics(node)
            if n == "node_gpu_health_verdict"
        }
        assert verdict["ok"] == 1, verdict
        assert node.check_output(f"{HEALTH} status").startswith(f"{name}: ok")
        assert not drained(ctl, name)


def test_forged_xid_records_drain_nothing(ctl, nodes):
    """A user's text cannot drain a node: an XID line logged from user space (syslog
    transport) and an XID inside a kernel record about a user's cgroup path."""
    node = nodes[NODE1]
    kernel_record(node, xid(1, 79, "GPU has fallen off the bus."), transport="syslog", facility="1")
    kernel_record(node, "cgroup: fork rejected by pids controller in /user/" + xid(1, 79, "x"))
    rejected = wait(
        lambda: (
            node.run(
                f"curl -fsS {NODE_METRICS} | grep -c "
                "'^node_gpu_xid_records_rejected_total{.*} [1-9]'"
            ).rc
            == 0
        ),
        "the collector to reject both records",
    )
    assert rejected
    time.sleep(3 * 5)  # three health checks
    assert not failing(node)
    assert not drained(ctl, NODE1)


def test_critical_xid_drains_with_gpufleets_reason_and_clear_resumes(ctl, nodes):
    node = nodes[NODE1]
    kernel_record(node, xid(1, 79, "GPU has fallen off the bus."))
    wait(lambda: drained(ctl, NODE1), f"{NODE1} to drain")
    text = reason(ctl, NODE1)
    assert re.fullmatch(
        r"gpufleet: xid79 gpu1 \(fallen off the bus\) \d{4}-\d\d-\d\dT\d\d:\d\dZ", text
    ), text
    # Jobs stop landing there: Slurm refuses one asked for on that node.
    assert srun_on(ctl, NODE1, 5) != 0
    assert ("xid", "1") in failing(node)
    assert actions(node)["drain"] == 1
    status = node.check_output(f"{HEALTH} status")
    assert "gpu1 xid: fail: xid79 (fallen off the bus)" in status, status
    journal = node.check_output("journalctl -t gpufleet-gpu-health -q --no-pager -n 20")
    assert f"drained {NODE1}: gpufleet: xid79 gpu1" in journal, journal
    # After the GPU reset, the admin clears the XIDs: the node comes back by itself.
    node.check_output(f"{HEALTH} clear --gpu 1")
    wait(lambda: not drained(ctl, NODE1), f"{NODE1} to resume")
    assert actions(node)["resume"] == 1
    assert srun_on(ctl, NODE1, 10) == 0


def test_pending_row_remap_drains_and_its_end_resumes(ctl, nodes):
    node = nodes[NODE2]
    node.check_output(f"echo '0:remapped_rows.pending=Yes' > {SET_FILE}")
    wait(lambda: drained(ctl, NODE2), f"{NODE2} to drain")
    assert reason(ctl, NODE2).startswith(
        "gpufleet: row_remap_pending gpu0 (row remap pending, reset the GPU) "
    ), reason(ctl, NODE2)
    node.check_output(f"rm -f {SET_FILE}")  # the GPU was reset: the remap took effect
    wait(lambda: not drained(ctl, NODE2), f"{NODE2} to resume")


def test_a_node_drained_by_an_admin_stays_drained(ctl, nodes):
    node = nodes[NODE2]
    ctl.check_output(f"scontrol update nodename={NODE2} state=drain reason='disk swap'")
    try:
        before = actions(node)
        node.check_output(f"echo '0:remapped_rows.pending=Yes' > {SET_FILE}")
        wait(lambda: ("row_remap_pending", "0") in failing(node), "the fault to show")
        time.sleep(3 * 5)
        assert reason(ctl, NODE2) == "disk swap"  # not replaced by gpufleet's
        node.check_output(f"rm -f {SET_FILE}")
        wait(lambda: not failing(node), "the fault to clear")
        time.sleep(4 * 5)  # more passing checks than a resume needs
        assert drained(ctl, NODE2) and reason(ctl, NODE2) == "disk swap"
        assert actions(node) == before
    finally:
        ctl.check_output(f"scontrol update nodename={NODE2} state=resume")


def test_the_safety_valve_lets_only_one_of_two_failing_nodes_drain(ctl, nodes):
    before = {name: actions(node) for name, node in nodes.items()}
    for node in nodes.values():
        node.check_output(f"echo '0:remapped_rows.pending=Yes' > {SET_FILE}")
    wait(
        lambda: all(("row_remap_pending", "0") in failing(n) for n in nodes.values()),
        "both faults to show",
    )
    time.sleep(4 * 5)
    out = [name for name in nodes if drained(ctl, name)]
    assert len(out) == 1, out
    held = next(name for name in nodes if name not in out)
    blocked = {
        name: actions(node)["blocked"] - before[name]["blocked"] for name, node in nodes.items()
    }
    assert blocked[held] >= 1, blocked
    gauge = [v for n, _, v in node_metrics(nodes[held]) if n == "node_gpu_health_drain_blocked"]
    assert gauge == [1.0], gauge
    journal = nodes[held].check_output("journalctl -t gpufleet-gpu-health -q --no-pager -n 5")
    assert f"not draining {held}" in journal and "limit is 50%" in journal, journal
    for node in nodes.values():
        node.check_output(f"rm -f {SET_FILE}")
    wait(lambda: not any(drained(ctl, name) for name in nodes), "both nodes in service")


def test_alert_mode_drains_nothing(ctl, nodes):
    node = nodes[NODE1]
    set_mode(node, "alert")
    try:
        node.check_output(f"echo '1:remapped_rows.pending=Yes' > {SET_FILE}")
        wait(lambda: ("row_remap_pending", "1") in failing(node), "the fault to show")
        time.sleep(3 * 5)
        assert not drained(ctl, NODE1)
        modes = {
            labels["mode"]: v for n, labels, v in node_metrics(node) if n == "node_gpu_health_mode"
        }
        assert modes["alert"] == 1, modes
    finally:
        node.check_output(f"rm -f {SET_FILE}")
        set_mode(node, "drain+resume")
