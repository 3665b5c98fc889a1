"""roles/prometheus: query limits sized from the memory bound, and the query log.

The sizing (src/gpufleet/query_limits.py) on its own, then the role's files as Ansible
renders them (render_role) for a standalone, a shard and a global instance: the unit's
--query.* flags and its writable log directory, prometheus.yml's query_log_file (checked
with promtool), the logrotate drop-in (checked with logrotate -d, the task's validate)
and the preflight's one-line refusals.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.plugins.loader import filter_loader
from render_role import ROLES, ROOT, example_inventory, render, template_value, trust_as_template

from gpufleet import query_limits
from gpufleet.query_limits import MAX_MAX_SAMPLES, MIN_MAX_SAMPLES, max_samples, memory_bytes

filter_loader.add_directory(str(ROOT / "plugins" / "filter"))

GIB = 2**30
INSTANCES = {
    "standalone": {"name": "standalone", "mode": "standalone", "shard": None, "replica": 0},
    "shard": {"name": "shard-1", "mode": "shard", "shard": 1, "replica": 1},
    "global": {"name": "global", "mode": "global", "shard": None, "replica": 0},
}
TASKS = ROLES / "prometheus" / "tasks"


# --------------------------------------------------------------- the sizing


def test_the_formula_is_a_quarter_of_the_bound_at_16_bytes_a_sample_per_query():
    # 8 GiB, 10 queries: 8 GiB / 4 / 16 / 10.
    assert max_samples(8 * GIB, 10) == 8 * GIB // 4 // 16 // 10 == 13_421_772
    assert max_samples(8 * GIB, 20) == 6_710_886
    # Whatever the bound, concurrency x limit x 16 bytes stays within a quarter of it.
    for gib in (2, 4, 16, 32):
        for concurrency in (1, 5, 10, 20):
            samples = max_samples(gib * GIB, concurrency)
            if MIN_MAX_SAMPLES < samples < MAX_MAX_SAMPLES:
                assert concurrency * samples * 16 <= gib * GIB / 4


def test_the_limit_is_clamped_between_one_million_and_upstreams_default():
    assert max_samples(1 * GIB, 20) == MIN_MAX_SAMPLES == 1_000_000  # 838,860 computed
    assert max_samples(512 * 2**20, 1) == 8_388_608
    assert max_samples(1, 1) == MIN_MAX_SAMPLES
    assert max_samples(64 * GIB, 10) == MAX_MAX_SAMPLES == 50_000_000  # 107M computed
    assert max_samples(2**50, 1) == MAX_MAX_SAMPLES
    # No bound (infinity): upstream's default.
    assert max_samples(None, 10) == MAX_MAX_SAMPLES


def test_the_limit_never_grows_with_more_concurrent_queries():
    limits = [max_samples(16 * GIB, c) for c in range(1, 41)]
    assert limits == sorted(limits, reverse=True)


@pytest.mark.parametrize("concurrency", [0, -1])
def test_a_concurrency_below_one_is_refused(concurrency):
    with pytest.raises(ValueError, match="at least 1"):
        max_samples(GIB, concurrency)


@pytest.mark.parametrize(
    ("value", "host", "expected"),
    [
        ("2G", None, 2 * GIB),
        ("512M", None, 512 * 2**20),
        ("1048576", None, 1048576),
        ("64K", None, 65536),
        ("1T", None, 2**40),
        ("infinity", None, None),
        ("40%", 100 * GIB, 40 * GIB),
        ("100%", 3, 3),
        (" 4G ", None, 4 * GIB),
    ],
)
def test_memory_max_values_in_bytes(value, host, expected):
    assert memory_bytes(value, host) == expected


@pytest.mark.parametrize("value", ["", "0", "2GB", "1.5G", "101%", "auto", "unlimited"])
def test_values_that_are_no_systemd_size_are_refused(value):
    with pytest.raises(ValueError, match="no systemd size"):
        memory_bytes(value, GIB)


@pytest.mark.parametrize("host", [None, 0])
def test_a_share_of_an_unknown_host_memory_is_refused_with_the_way_out(host):
    with pytest.raises(ValueError, match="prometheus_query_max_samples"):
        memory_bytes("40%", host)


def test_the_role_setting_auto_or_a_number():
    assert query_limits.sized_max_samples("auto", "8G", 10) == 13_421_772
    assert query_limits.sized_max_samples("auto", "8G", "20") == 6_710_886
    # A share of the host: memtotal_mb (Ansible's fact, in MiB).
    assert query_limits.sized_max_samples("auto", "50%", 10, 16384) == 13_421_772
    assert query_limits.sized_max_samples("auto", "infinity", 10) == MAX_MAX_SAMPLES
    # A number is the site's, as set (even beyond the clamps).
    assert query_limits.sized_max_samples(123, "8G", 10) == 123
    assert query_limits.sized_max_samples("90000000", "8G", 10) == 90_000_000


def test_the_settings_are_checked_one_line_each():
    assert query_limits.setting_problems(10, "2m", "auto") == []
    assert query_limits.setting_problems("20", "1m30s", 5_000_000) == []
    problems = query_limits.setting_problems(0, "2 minutes", "lots")
    assert [p.split(" ")[0] for p in problems] == [
        "prometheus_query_max_concurrency",
        "prometheus_query_timeout",
        "prometheus_query_max_samples",
    ]
    assert all("\n" not in p for p in problems)
    for timeout in ("0s", "", "1s1m", 120, None):
        (problem,) = query_limits.setting_problems(10, timeout, "auto")
        assert problem.startswith("prometheus_query_timeout"), timeout
    for bad in (True, -3, "1e6", 0):
        assert len(query_limits.setting_problems(bad, "2m", bad)) == 2, bad


def test_extra_flags_may_not_set_the_limits_again():
    assert query_limits.flag_conflicts(["--query.lookback-delta=5m", "--log.level=debug"]) == []
    problems = query_limits.flag_conflicts(
        ["--query.timeout=5m", "--query.max-samples 100", "--query.max-concurrency"]
    )
    assert [p.split(" ")[2] for p in problems] == [
        "--query.timeout,",
        "--query.max-samples,",
        "--query.max-concurrency,",
    ]
    assert problems[0] == (
        "prometheus_extra_flags sets --query.timeout, which gpufleet sets from "
        "prometheus_query_timeout: set that variable instead (docs/prometheus.md)"
    )


def test_the_log_settings_are_checked():
    assert query_limits.log_problems("/var/log/gpufleet/prometheus", "50M", 5) == []
    assert query_limits.log_problems("/srv/logs", "500k", "2") == []
    for directory in ("relative", "/", "/var/log/my logs", '/var/"x"', "/var/../etc", "/a/*"):
        (problem,) = query_limits.log_problems(directory, "50M", 5)
        assert problem.startswith("prometheus_log_dir"), directory
    for size in ("50MB", "", "0", "1.5G", True):
        (problem,) = query_limits.log_problems("/var/log/x", size, 5)
        assert problem.startswith("prometheus_query_log_max_size"), size
    for rotate in (0, -1, "x", True):
        (problem,) = query_limits.log_problems("/var/log/x", "50M", rotate)
        assert problem.startswith("prometheus_query_log_rotate"), rotate


# --------------------------------------------------------------- the role's files


def host_of(mode: str) -> str:
    groups, _ = example_inventory()
    return groups["prometheus_global" if mode == "global" else "prometheus"][0]


def unit(mode: str, overrides: dict | None = None) -> str:
    return render(
        "prometheus",
        "prometheus.service.j2",
        host_of(mode),
        {"_instance": INSTANCES[mode], **(overrides or {})},
    )


def bounds(mode: str, overrides: dict | None = None, inventory=None) -> str:
    return render(
        "prometheus",
        "prometheus-bounds.conf.j2",
        host_of(mode),
        {"_instance": INSTANCES[mode], **(overrides or {})},
        inventory,
    )


def flags(mode: str, overrides: dict | None = None, inventory=None) -> dict[str, str]:
    """The unit's --query.* flags, its ${...} taken from the drop-in's Environment=."""
    text = render(
        "prometheus",
        "prometheus.service.j2",
        host_of(mode),
        {"_instance": INSTANCES[mode], **(overrides or {})},
        inventory,
    )
    environment = dict(
        re.findall(r"^Environment=(\w+)=(\S+)$", bounds(mode, overrides, inventory), re.M)
    )
    found = dict(re.findall(r"^\s+--(query\.[a-z-]+)=(\S+)", text, re.M))
    return {
        name: re.sub(r"\$\{(\w+)\}", lambda m: environment[m.group(1)], value)
        for name, value in found.items()
    }


def memory_max(mode: str, overrides: dict | None = None) -> str:
    (value,) = re.findall(r"^MemoryMax=(.*)$", bounds(mode, overrides), re.M)
    return value


@pytest.mark.parametrize("mode", sorted(INSTANCES))
def test_every_instance_runs_with_the_three_limits_sized_from_its_bound(mode):
    bound = memory_max(mode)
    assert flags(mode) == {
        "query.max-concurrency": "20",
        "query.timeout": "2m",
        "query.max-samples": str(max_samples(memory_bytes(bound), 20)),
    }
    # The example inventory: a shard and the global tier are bounded to 2 GiB (2 GiB / 4 /
    # 16 / 20), a standalone Prometheus scraping the whole cluster to 4 GiB.
    expected = {"standalone": ("4G", "3355443")}.get(mode, ("2G", "1677721"))
    assert (bound, flags(mode)["query.max-samples"]) == expected


def test_the_limit_follows_the_bound_the_drop_in_gets():
    assert flags("shard", {"prometheus_memory_max": "8G"})["query.max-samples"] == "6710886"
    assert flags("shard", {"prometheus_memory_max": "48G"})["query.max-samples"] == "40265318"
    assert flags("shard", {"prometheus_memory_max": "64G"})["query.max-samples"] == "50000000"
    assert flags("global", {"prometheus_memory_max": "infinity"})["query.max-samples"] == (
        "50000000"
    )
    facts = {"os_family": "Debian", "architecture": "x86_64", "memtotal_mb": 16384}
    share = {"prometheus_memory_max": "50%", "ansible_facts": facts}
    assert flags("standalone", share)["query.max-samples"] == "6710886"
    # auto grows with the shard: a shard of 2048 hosts of 8000 series is bounded to 128G.
    groups, hostvars = example_inventory()
    names = [f"n{i:04d}" for i in range(2048)]
    inventory = (
        {**groups, "all": names, "prometheus_shard_1": names},
        {**{n: {"gpufleet_expected_series": 8000} for n in names}, **hostvars},
    )
    grown = flags("shard", {"prometheus_query_max_concurrency": 10}, inventory)
    assert grown["query.max-samples"] == "50000000" and grown["query.max-concurrency"] == "10"
    assert memory_max_of(bounds("shard", {}, inventory)) == "128G"


def memory_max_of(text: str) -> str:
    (value,) = re.findall(r"^MemoryMax=(.*)$", text, re.M)
    return value


def test_a_bound_that_doubles_changes_the_drop_in_only():
    """The sample limit is the drop-in's (a daemon-reload), never the unit's (a restart)."""
    groups, hostvars = example_inventory()
    names = [f"n{i:04d}" for i in range(64)]
    small = ({**groups, "prometheus_shard_1": names[:32]}, hostvars)
    large = ({**groups, "prometheus_shard_1": names}, hostvars)
    for inventory in (small, large):
        for name in names:
            inventory[1].setdefault(name, {"gpufleet_expected_series": 20000})
    assert memory_max_of(bounds("shard", {}, small)) == "8G"
    assert memory_max_of(bounds("shard", {}, large)) == "16G"
    unit_of = {
        key: render(
            "prometheus",
            "prometheus.service.j2",
            host_of("shard"),
            {"_instance": INSTANCES["shard"]},
            inventory,
        )
        for key, inventory in (("small", small), ("large", large))
    }
    assert unit_of["small"] == unit_of["large"]
    assert flags("shard", {}, small)["query.max-samples"] == "6710886"
    assert flags("shard", {}, large)["query.max-samples"] == "13421772"
    (task,) = [t for t in tasks("instance.yml") if t["name"].startswith("Write the bounds")]
    assert task["notify"] == "apply prometheus bounds"


def test_the_site_sets_each_limit():
    site = {
        "prometheus_query_max_concurrency": 4,
        "prometheus_query_timeout": "30s",
        "prometheus_query_max_samples": 2_000_000,
    }
    assert flags("shard", site) == {
        "query.max-concurrency": "4",
        "query.timeout": "30s",
        "query.max-samples": "2000000",
    }
    # Smaller concurrency, larger share per query: 2 GiB / 4 / 16 / 5.
    assert flags("shard", {"prometheus_query_max_concurrency": 5})["query.max-samples"] == (
        "6710886"
    )


@pytest.mark.parametrize("mode", sorted(INSTANCES))
def test_the_unit_lets_the_instance_write_its_log_directory(mode):
    name = INSTANCES[mode]["name"]
    paths = re.findall(r"^ReadWritePaths=(.*)$", unit(mode), re.M)
    assert paths == [f"/var/lib/gpufleet/prometheus/{name}", f"/var/log/gpufleet/prometheus/{name}"]
    # Log or no log: switching it never changes the unit (a reload, not a restart).
    assert unit(mode, {"prometheus_query_log": False}) == unit(mode)


@pytest.mark.parametrize("mode", sorted(INSTANCES))
def test_the_unit_passes_systemd_analyze(tmp_path: Path, mode):
    from render_role import systemd_verify_problems

    path = tmp_path / f"gpufleet-prometheus-{INSTANCES[mode]['name']}.service"
    path.write_text(unit(mode))
    assert systemd_verify_problems(path) == []


def config(mode: str, overrides: dict | None = None) -> dict:
    return yaml.safe_load(
        render(
            "prometheus",
            "prometheus.yml.j2",
            host_of(mode),
            {"_instance": INSTANCES[mode], **(overrides or {})},
        )
    )


@pytest.mark.parametrize("mode", sorted(INSTANCES))
def test_each_instance_logs_its_queries_to_a_file_of_its_own(mode):
    name = INSTANCES[mode]["name"]
    assert (
        config(mode)["global"]["query_log_file"] == f"/var/log/gpufleet/prometheus/{name}/query.log"
    )
    moved = config(mode, {"prometheus_log_dir": "/srv/log/prom"})
    assert moved["global"]["query_log_file"] == f"/srv/log/prom/{name}/query.log"
    assert "query_log_file" not in config(mode, {"prometheus_query_log": False})["global"]


@pytest.mark.parametrize("mode", sorted(INSTANCES))
def test_the_config_with_the_query_log_passes_promtool(tmp_path: Path, mode):
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config(mode)))
    result = subprocess.run(
        ["promtool", "check", "config", "--syntax-only", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------- logrotate


def tasks(name: str) -> list[dict]:
    return yaml.safe_load((TASKS / name).read_text())


def logrotate_text(overrides: dict | None = None) -> str:
    return render("prometheus", "prometheus-logrotate.conf.j2", "mon01", overrides)


def test_the_drop_in_rotates_every_instances_log_by_size_with_copytruncate():
    text = logrotate_text()
    assert '"/var/log/gpufleet/prometheus/*/query.log" {' in text
    body = {line.strip() for line in text.splitlines() if line.startswith("    ")}
    assert {"size 50M", "rotate 5", "copytruncate", "missingok", "su prometheus prometheus"} <= body
    (task,) = [t for t in tasks("query_log.yml") if t["name"] == "Rotate the query logs"]
    template = task["ansible.builtin.template"]
    assert template["dest"] == "/etc/logrotate.d/gpufleet-prometheus"
    assert template["validate"] == "logrotate -d %s"
    assert template["mode"] == "0644" and template["owner"] == "root"


LOGROTATE = "/usr/sbin/logrotate"  # scripts/packages.txt; /usr/sbin is not on every PATH


def test_the_drop_in_passes_logrotate_and_a_broken_one_does_not(tmp_path: Path):
    if not Path(LOGROTATE).exists():
        pytest.fail(f"{LOGROTATE} missing (scripts/packages.txt: logrotate)", pytrace=False)

    def check(overrides: dict) -> subprocess.CompletedProcess:
        path = tmp_path / "gpufleet-prometheus"
        path.write_text(logrotate_text(overrides))
        path.chmod(0o644)
        # The task's own validate command; -s keeps logrotate's state out of /var/lib.
        argv = [LOGROTATE, "-s", str(tmp_path / "state"), "-d", str(path)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    # As root: this machine has no prometheus account (the role creates it first).
    here = {"prometheus_system_user": "root", "prometheus_system_group": "root"}
    result = check({**here, "prometheus_log_dir": str(tmp_path / "log")})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "error" not in result.stderr
    for broken in (
        {"prometheus_query_log_max_size": "50Q"},
        {"prometheus_system_user": "nobody-here"},
    ):
        assert check({**here, **broken}).returncode != 0, broken


def test_switching_the_log_off_removes_the_rotation():
    by_name = {t["name"]: t for t in tasks("query_log.yml")}
    assert by_name["Rotate the query logs"]["when"] == "prometheus_query_log | bool"
    gone = by_name["Stop rotating the query logs"]
    assert gone["ansible.builtin.file"]["state"] == "absent"
    assert gone["when"] == "not (prometheus_query_log | bool)"
    main = tasks("main.yml")
    assert any(t.get("ansible.builtin.import_tasks") == "query_log.yml" for t in main)


def test_the_instance_gets_its_log_directory_owned_by_prometheus():
    (block,) = [t for t in tasks("instance.yml") if t["name"].startswith("The directories")]
    (task,) = [t for t in block["block"] if t["name"].startswith("Create the directories")]
    assert task["ansible.builtin.file"]["owner"] == "{{ item.owner }}"
    loop = block["vars"]["_dirs"]
    assert {
        "path": "{{ prometheus_log_dir }}/{{ _instance.name }}",
        "owner": "{{ prometheus_system_user }}",
    } in loop


# --------------------------------------------------------------- preflight

PREFLIGHT = tasks("preflight.yml")
CHECK = next(t for t in PREFLIGHT if t["name"] == "Check the query limits and the query log")


def preflight_message(overrides: dict) -> str:
    values = {
        **{name: trust_as_template(value) for name, value in CHECK["vars"].items()},
        **overrides,
    }
    return template_value(
        "prometheus", CHECK["ansible.builtin.assert"]["fail_msg"], "mon01", values
    )


def test_the_defaults_pass_the_preflight():
    assert preflight_message({}) == ""


def test_a_limit_in_the_extra_flags_fails_the_preflight_with_one_line():
    message = preflight_message({"prometheus_extra_flags": ["--query.max-samples=1000"]})
    assert message == (
        "prometheus_extra_flags sets --query.max-samples, which gpufleet sets from "
        "prometheus_query_max_samples: set that variable instead (docs/prometheus.md)"
    )


def test_bad_settings_fail_the_preflight_with_one_line():
    message = preflight_message(
        {"prometheus_query_timeout": "soon", "prometheus_query_log_max_size": "big"}
    )
    assert "\n" not in message
    assert message.startswith("prometheus_query_timeout must be") and "; " in message
    assert "prometheus_query_log_max_size must be" in message


def test_the_new_variables_are_checked_for_control_characters():
    names = yaml.safe_load((ROLES / "prometheus" / "vars" / "main.yml").read_text())[
        "_prometheus_line_vars"
    ]
    assert {
        "prometheus_query_max_concurrency",
        "prometheus_query_timeout",
        "prometheus_query_max_samples",
        "prometheus_log_dir",
        "prometheus_query_log_max_size",
        "prometheus_query_log_rotate",
    } <= set(names)
