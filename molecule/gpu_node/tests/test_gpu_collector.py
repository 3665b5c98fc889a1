"""The GPU collector under its systemd timer, served by node_exporter."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

testinfra_hosts = ["all"]
PROM = "/var/lib/node_exporter/textfile/gpufleet_gpu.prom"


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
    deadline = time.monotonic() + timeout
    while True:
        body = metrics(host)
        if predicate(body) or time.monotonic() > deadline:
            return body
        time.sleep(1)


def expected_gpus(host) -> int:
    return {"gpufleet-gpu-1": 8, "gpufleet-gpu-2": 2}[host.backend.get_hostname()]


def test_timer_runs_the_collector(host):
    timer = host.service("gpufleet-gpu-collector.timer")
    assert timer.is_enabled
    assert timer.is_running
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
    """A process in the cgroup Slurm's cgroup/v1 plugin makes for job 4242's step.

    The test hosts see cgroup v1 with only their own subtree writable, so the
    slurm/uid_0/job_4242/step_0 hierarchy is made inside it, as slurmstepd would.
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


def test_gpu_is_attributed_to_the_slurm_job(host, slurm_job_process):
    assert "job_4242" in host.check_output(f"cat /proc/{slurm_job_process}/cgroup")
    body = wait_for(host, lambda b: 'job_id="4242"' in b)
    jobs = samples(body, "node_gpu_slurm_job_info")
    assert [labels for labels in jobs if 'job_id="4242"' in labels and 'gpu="0"' in labels]
    assert all("pid" not in labels for labels in jobs)


def test_hung_nvidia_smi_makes_gpu_series_disappear(host):
    host.check_output("echo MODE=hang >> /etc/fake-nvidia-smi.conf")
    try:
        body = wait_for(host, lambda b: success(b) == 0)
        assert success(body) == 0
        assert "node_gpu_memory_used_bytes" not in body
        assert host.service("gpufleet-gpu-collector.timer").is_running
    finally:
        host.check_output("sed -i '/^MODE=hang$/d' /etc/fake-nvidia-smi.conf")
    body = wait_for(host, lambda b: success(b) == 1)
    assert "node_gpu_memory_used_bytes" in body
