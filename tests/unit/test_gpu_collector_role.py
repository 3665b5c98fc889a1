"""roles/gpu_collector: the two ways systemd runs the collector (gpu_collector_mode).

service (default): one --interval loop, Type=notify with a watchdog of three intervals,
restarted on failure; timer: a oneshot --once run by a timer. Both keep the same bounds
and sandbox. Mode switches and the watchdog's restart are checked live in molecule
gpu_node; the notify protocol in tests/unit/gpu/test_gpu_collector_notify.py.
"""

from __future__ import annotations

import pytest
import yaml
from render_role import ROLES, evaluate, render

ROLE = "gpu_collector"
HOST = "l40s01"
# What differs between the modes by design; every other [Service] line is the same.
MODE_KEYS = {
    "Type",
    "NotifyAccess",
    "WatchdogSec",
    "Restart",
    "RestartSec",
    "ExecStart",
}


def sections(text: str) -> dict[str, dict[str, list[str]]]:
    """[Section] -> key -> values (continuation lines joined, comments dropped)."""
    out: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("["):
            current = out.setdefault(line, {})
        elif "=" in line and not line.startswith(("#", ";")):
            key, value = line.split("=", 1)
            current.setdefault(key, []).append(" ".join(value.split()))
    return out


def unit(**overrides) -> dict[str, dict[str, list[str]]]:
    return sections(render(ROLE, "gpufleet-gpu-collector.service.j2", HOST, overrides))


def test_the_default_is_a_long_running_service_with_a_watchdog():
    defaults = yaml.safe_load((ROLES / ROLE / "defaults/main.yml").read_text())
    assert defaults["gpu_collector_mode"] == "service"
    service = unit()["[Service]"]
    assert service["Type"] == ["notify"] and service["NotifyAccess"] == ["main"]
    # Three 15 s intervals; a crash and a missed watchdog alike restart it an interval later.
    assert service["WatchdogSec"] == ["45s"]
    assert service["Restart"] == ["on-failure"] and service["RestartSec"] == ["15s"]
    command = service["ExecStart"][0].split()
    assert command[command.index("--interval") + 1] == "15" and "--once" not in command
    assert unit()["[Install]"] == {"WantedBy": ["multi-user.target"]}
    # Never left failed for good by systemd's start limit.
    assert unit()["[Unit]"]["StartLimitIntervalSec"] == ["0"]


@pytest.mark.parametrize(("interval", "timeout"), [(5, 3), (15, 10), (60, 59), (2, 1)])
def test_the_watchdog_outlasts_the_longest_gap_between_two_cycles(interval, timeout):
    """Cycles start an interval apart and each ends within the timeout (below the
    interval): WATCHDOG=1 comes at most interval + timeout apart."""
    service = unit(gpu_collector_interval=interval, gpu_collector_timeout=timeout)["[Service]"]
    watchdog = int(service["WatchdogSec"][0].removesuffix("s"))
    assert watchdog == 3 * interval > interval + timeout
    # Start-up is the interpreter and the first cycle (READY=1 comes after it).
    assert int(service["TimeoutStartSec"][0]) == timeout + 5


def test_timer_mode_runs_a_oneshot_once():
    text = unit(gpu_collector_mode="timer")
    service = text["[Service]"]
    assert service["Type"] == ["oneshot"]
    assert "--once" in service["ExecStart"][0].split()
    assert "--interval" not in service["ExecStart"][0]
    assert not {"WatchdogSec", "Restart", "NotifyAccess"} & set(service)
    assert "[Install]" not in text  # the timer starts it
    timer = sections(render(ROLE, "gpufleet-gpu-collector.timer.j2", HOST, {}))
    assert timer["[Timer]"]["OnUnitActiveSec"] == ["15s"]
    assert timer["[Install]"] == {"WantedBy": ["timers.target"]}


@pytest.mark.parametrize(
    "overrides",
    [{}, {"gpu_collector_xid_source": "kmsg"}, {"gpu_collector_user": "root"}],
)
def test_both_modes_keep_the_same_bounds_and_sandbox(overrides):
    service = unit(**overrides)["[Service]"]
    timer = unit(**overrides, gpu_collector_mode="timer")["[Service]"]
    assert {k: v for k, v in service.items() if k not in MODE_KEYS} == {
        k: v for k, v in timer.items() if k not in MODE_KEYS
    }
    for key in ("MemoryMax", "TasksMax", "CapabilityBoundingSet", "NoNewPrivileges"):
        assert key in service, key
    assert service["ProtectSystem"] == ["strict"]
    assert service["RestrictAddressFamilies"] == ["AF_UNIX AF_NETLINK"]  # notify: AF_UNIX


def test_preflight_refuses_an_unknown_mode():
    tasks = yaml.safe_load((ROLES / ROLE / "tasks/preflight.yml").read_text())
    (check,) = [t for t in tasks if t["name"] == "Check the collector settings"]
    that = " and ".join(f"({c})" for c in check["ansible.builtin.assert"]["that"])
    assert evaluate(ROLE, that, HOST) is True
    assert evaluate(ROLE, that, HOST, {"gpu_collector_mode": "timer"}) is True
    assert evaluate(ROLE, that, HOST, {"gpu_collector_mode": "cron"}) is False


def test_preflight_checks_the_slurm_cgroup_root_as_the_collector_does():
    from gpufleet_node.gpu_collector.slurm import valid_cgroup_root

    tasks = yaml.safe_load((ROLES / ROLE / "tasks/preflight.yml").read_text())
    (check,) = [t for t in tasks if t["name"] == "Check the collector settings"]
    that = " and ".join(f"({c})" for c in check["ansible.builtin.assert"]["that"])
    for root in ("", "/machine.slice/libpod-1.scope", "/a b/%h;$x", "/a/", "a", "/a//b", "/a/.."):
        verdict = evaluate(ROLE, that, HOST, {"gpu_collector_slurm_cgroup_root": root})
        assert verdict is valid_cgroup_root(root), root
    unit = render(ROLE, "gpufleet-gpu-collector.service.j2", HOST, {})
    assert "--slurm-cgroup-root" not in unit


def test_only_the_long_running_service_is_restarted_by_a_change():
    handlers = yaml.safe_load((ROLES / ROLE / "handlers/main.yml").read_text())
    (restart,) = [h for h in handlers if h["listen"] == "restart gpu_collector"]
    assert restart["ansible.builtin.include_tasks"].endswith("_common/tasks/restart.yml")
    assert "gpu_collector_mode == 'service'" in restart["when"]
    notifying = []
    for name in ("install.yml", "configure.yml"):
        tasks = yaml.safe_load((ROLES / ROLE / "tasks" / name).read_text())
        for task in [sub for top in tasks for sub in top.get("block", [top])]:
            if task.get("notify") == "restart gpu_collector":
                notifying.append(task["name"])
    assert notifying == ["Write the collector's service"]
    # The zipapps, installed by roles/_common/tasks/zipapp.yml: a new collector restarts
    # the service; the health program, which slurmd runs, restarts nothing.
    install = yaml.safe_load((ROLES / ROLE / "tasks" / "install.yml").read_text())
    (include,) = [t for t in install if "ansible.builtin.include_role" in t]
    assert include["ansible.builtin.include_role"]["tasks_from"] == "zipapp"
    zipapps = yaml.safe_load((ROLES / ROLE / "vars" / "main.yml").read_text())[f"_{ROLE}_zipapps"]
    assert zipapps == [
        {"app": "gpu_collector", "dest": "{{ _gpu_collector_script }}", "restart": True},
        {"app": "gpu_health", "dest": "{{ _gpu_collector_health_program }}", "restart": False},
    ]
