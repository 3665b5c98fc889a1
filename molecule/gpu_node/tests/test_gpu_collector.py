"""The GPU collector as its systemd service (and timer), served by node_exporter."""

from __future__ import annotations

import re
import subprocess

import pytest
from testbed_helpers import converge, eventually

testinfra_hosts = ["all"]
PROM = "/var/lib/node_exporter/textfile/gpufleet_gpu.prom"
UNIT = "gpufleet-gpu-collector"


def metrics(host) -> str:
    return host.check_output("curl -fsS http://127.0.0.1:9100/metrics")


def samples(body: str, name: str) -> dict[str, float]:
    """{label text: value} of every sample of metric name."""
    found = {}
    for line in body.splitlines():
        match = re.match(rf"^{name}(\{{[^}}]*\}})? (\S+)$", line)
        if match:
            found[match.group(1) or ""] = float(match.group(2))
    return found


def success(body: str) -> float | None:
    return samples(body, "node_gpu_collector_success").get("")


def wait_for(host, predicate, timeout: float = 30) -> str:
    """The first /metrics body that satisfies predicate within timeout, else the last one."""
    bodies: list[str] = []

    def check() -> bool:
        bodies.append(metrics(host))
        return predicate(bodies[-1])

    eventually(check, timeout)
    return bodies[-1]


def failing_for(body: str) -> float:
    """Seconds since the collector's last success, by the host's clock (node_time_seconds)."""
    now = samples(body, "node_time_seconds").get("", 0.0)
    last = samples(body, "node_gpu_collector_last_success_timestamp_seconds").get("", now)
    return now - last


def properties(host, unit: str = f"{UNIT}.service") -> dict[str, str]:
    names = "Type,WatchdogUSec,Restart,NRestarts,Result,ActiveState,MainPID,UnitFileState"
    out = host.check_output(f"systemctl show -p {names} {unit}")
    return dict(line.split("=", 1) for line in out.splitlines())


def expected_gpus(host) -> int:
    return {"gpufleet-gpu-1": 8, "gpufleet-gpu-2": 2}[host.backend.get_hostname()]


def test_the_collector_runs_as_a_service_with_a_watchdog(host):
    service = properties(host)
    assert service["UnitFileState"] == "enabled" and service["ActiveState"] == "active"
    assert service["Type"] == "notify" and service["Restart"] == "on-failure"
    assert service["WatchdogUSec"] == "15s"  # three 5 s intervals
    assert service["NRestarts"] == "0"  # the watchdog never had to act
    # The default mode has no timer (gpu_collector_mode timer would add it).
    assert properties(host, f"{UNIT}.timer").get("UnitFileState", "") == ""
    assert not host.file(f"/etc/systemd/system/{UNIT}.timer").exists
    body = wait_for(host, lambda b: success(b) == 1)
    assert success(body) == 1


def test_reports_every_gpu_with_the_exact_captured_values(host):
    body = wait_for(host, lambda b: "node_gpu_memory_total_bytes" in b)
    reported = host.check_output(
        "nvidia-smi --query-gpu=index,memory.total,power.limit --format=csv,noheader,nounits"
    )
    rows = [line.split(", ") for line in reported.splitlines()]
    totals = samples(body, "node_gpu_memory_total_bytes")
    assert len(totals) == len(rows)
    for index, memory_mib, _ in rows:
        label = next(labels for labels in totals if f'gpu="{index}"' in labels)
        assert totals[label] == float(memory_mib) * 1024 * 1024
    for name in (
        "node_gpu_utilization_percent",
        "node_gpu_temperature_celsius",
        "node_gpu_power_draw_watts",
        "node_gpu_power_limit_watts",
        "node_gpu_memory_used_bytes",
    ):
        assert len(samples(body, name)) == len(rows), name


def test_expected_gpu_count_comes_from_the_inventory(host):
    body = wait_for(host, lambda b: "node_gpu_expected_devices" in b)
    assert samples(body, "node_gpu_expected_devices")[""] == expected_gpus(host)
    devices = samples(body, "node_gpu_devices")[""]
    if host.backend.get_hostname() == "gpufleet-gpu-2":
        assert devices < expected_gpus(host)  # the GpuMissing situation
    else:
        assert devices == expected_gpus(host)


def test_output_passes_promtool(host):
    body = host.check_output(f"cat {PROM}") + "\n"  # check_output strips it
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=body, text=True, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def slurm_job_process(host):
    """A process in a job_4242 cgroup that slurmd did not make.

    The test hosts see cgroup v1 with only their own subtree of the name=systemd hierarchy
    writable, which any process could use (a user's systemd slice, a container): a
    slurm/uid_0/job_4242/step_0 path made there has the shape of a job but not its origin.
    """
    own = host.check_output("awk -F: '/name=systemd/{print $3}' /proc/1/cgroup")
    cgroup = f"/sys/fs/cgroup/systemd{own}/slurm/uid_0/job_4242/step_0"
    host.check_output(f"mkdir -p {cgroup}")
    pid = host.check_output(
        f"setsid sh -c 'echo $$ > {cgroup}/cgroup.procs && exec sleep 300' "
        "> /dev/null 2>&1 & echo $!"
    )
    host.check_output(f"echo {pid}:0:2048 > /run/fake-nvidia-smi-apps")
    yield pid
    host.run(f"kill {pid}; rm -f /run/fake-nvidia-smi-apps")


def test_a_job_cgroup_slurmd_did_not_make_is_no_job(host, slurm_job_process):
    """Only the hierarchy and position slurmd creates count as a job (docs/security.md):
    the process on GPU 0 is seen and attributed to no job. Attribution through slurmd's
    own job cgroups runs live in the slurm scenario."""
    assert "job_4242" in host.check_output(f"cat /proc/{slurm_job_process}/cgroup")

    def seen(body: str) -> bool:
        processes = samples(body, "node_gpu_compute_processes")
        return any('gpu="0"' in labels and value >= 1 for labels, value in processes.items())

    body = wait_for(host, seen)
    assert seen(body), "the collector did not see the process on GPU 0"
    assert 'job_id="4242"' not in body


def test_hung_nvidia_smi_makes_gpu_series_disappear(host):
    """The cycle's own timeout kills the hung nvidia-smi: cycles keep completing (as
    failures), so the loop keeps its watchdog fed and is not restarted."""
    before = properties(host)
    host.check_output("echo MODE=hang >> /etc/fake-nvidia-smi.conf")
    try:
        body = wait_for(host, lambda b: success(b) == 0)
        assert success(body) == 0
        assert "node_gpu_memory_used_bytes" not in body
        # Failing for longer than the watchdog's 15 s, every call hanging until killed:
        body = wait_for(host, lambda b: failing_for(b) > 20, timeout=40)
        assert failing_for(body) > 20 and success(body) == 0
        after = properties(host)
        assert after["ActiveState"] == "active"
        assert (after["MainPID"], after["NRestarts"]) == (before["MainPID"], before["NRestarts"])
    finally:
        host.check_output("sed -i '/^MODE=hang$/d' /etc/fake-nvidia-smi.conf")
    body = wait_for(host, lambda b: success(b) == 1)
    assert "node_gpu_memory_used_bytes" in body


def test_a_wedged_loop_is_restarted_by_the_watchdog(host):
    """A loop stopped mid-way (SIGSTOP) completes no cycle: WatchdogSec (15 s) later
    systemd aborts it (result watchdog) and, RestartSec (5 s) later, starts a new one."""
    if host.backend.get_hostname() != "gpufleet-gpu-1":
        pytest.skip("the same role on both hosts: one is enough")
    before = properties(host)
    since = host.check_output("date +%s")
    host.check_output(f"kill -STOP {before['MainPID']}")
    failed = eventually(lambda: properties(host)["Result"] == "watchdog", timeout=60)
    assert failed, properties(host)

    def restarted() -> bool:
        now = properties(host)
        return (
            int(now["NRestarts"]) == int(before["NRestarts"]) + 1
            and now["ActiveState"] == "active"
            and now["MainPID"] not in ("0", before["MainPID"])
        )

    assert eventually(restarted, timeout=60), properties(host)
    journal = host.check_output(f"journalctl -u {UNIT}.service --since @{since} -o cat --no-pager")
    assert "Watchdog timeout" in journal
    # faulthandler: where the loop was when the watchdog's SIGABRT ended it.
    assert "Fatal Python error: Aborted" in journal
    body = wait_for(host, lambda b: success(b) == 1)
    assert success(body) == 1


def test_switching_to_the_timer_and_back_is_clean_and_idempotent(host):
    """gpu_collector_mode timer: the service's loop is stopped and disabled, the timer
    runs a oneshot; back to service: the timer is stopped, disabled and removed. A
    second run of either changes nothing."""
    name = host.backend.get_hostname()
    if name != "gpufleet-gpu-2":
        pytest.skip("the same role on both hosts: one is enough")

    def run(mode: str) -> int:
        result = converge(f"gpu_collector_mode={mode}", tags="gpu_collector", limit=name)
        assert result.returncode == 0, result.stdout[-3000:]
        match = re.search(rf"{re.escape(name)}\s*:\s*ok=\d+\s+changed=(\d+)", result.stdout)
        assert match, result.stdout[-3000:]
        return int(match.group(1))

    try:
        assert run("timer") > 0
        assert run("timer") == 0
        timer, service = properties(host, f"{UNIT}.timer"), properties(host)
        assert timer["UnitFileState"] == "enabled" and timer["ActiveState"] == "active"
        assert service["Type"] == "oneshot" and service["UnitFileState"] == "static"
        assert not host.file(f"/etc/systemd/system/multi-user.target.wants/{UNIT}.service").exists
        # The timer's runs write the file: a success newer than the switch.
        switched = float(host.check_output("date +%s"))
        body = wait_for(
            host,
            lambda b: (
                samples(b, "node_gpu_collector_last_success_timestamp_seconds").get("", 0)
                > switched
            ),
        )
        assert success(body) == 1
    finally:
        assert run("service") > 0
    assert run("service") == 0
    service = properties(host)
    assert service["Type"] == "notify" and service["UnitFileState"] == "enabled"
    assert service["ActiveState"] == "active"
    assert properties(host, f"{UNIT}.timer").get("UnitFileState", "") == ""
    assert not host.file(f"/etc/systemd/system/{UNIT}.timer").exists
