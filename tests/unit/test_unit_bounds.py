"""Every systemd service gpufleet runs is bounded and sandboxed, and its files stay lines.

Finds every unit and drop-in the roles write (template tasks whose destination is under
/etc/systemd/system), renders each in the scenarios below, and checks, per service
(its unit plus its drop-ins): MemoryMax=, TasksMax= from the role's variables,
NoNewPrivileges=yes and a CapabilityBoundingSet= line; `systemd-analyze verify` on the
result. A timer carries no [Service] settings: its service must be bounded.

Also: the GPU collector runs unprivileged; the Prometheus memory bound grows with the
shard; and every role variable written into a line-based file (units, grafana.ini,
environment files, package sources) is covered by the role's preflight check that
refuses control characters, which names the variable.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml
from render_role import (
    ROLES,
    TEXT_GUARD,
    example_inventory,
    systemd_verify_problems,
    templar,
    template_value,
    trust_as_template,
)
from test_secrets_audit import all_roles, jinja_refs, templates_of, walk_definitions

SYSTEMD_DIR = "/etc/systemd/system/"
REQUIRED = ("MemoryMax", "TasksMax", "NoNewPrivileges", "CapabilityBoundingSet")
MEMORY = re.compile(r"^([1-9][0-9]*[KMGT]?|([1-9][0-9]?|100)%|infinity)$")


def render(role: str, template: str, host: str, overrides: dict | None = None) -> str:
    """As the template action renders a file (Jinja's own backslash escapes apply)."""
    source = (ROLES / role / "templates" / template).read_text()
    text = templar(role, host, overrides).template(
        trust_as_template(TEXT_GUARD + source), escape_backslashes=False
    )
    return text[len(TEXT_GUARD) :]


@cache
def systemd_templates() -> dict[str, dict[str, str]]:
    """role -> {template: destination} for every unit and drop-in a role writes."""
    out: dict[str, dict[str, str]] = {}
    for role in all_roles():
        for task in role.tasks:
            if task.module != "ansible.builtin.template":
                continue
            dest = str(task.data[task.module].get("dest", ""))
            if dest.startswith(SYSTEMD_DIR):
                for name in templates_of(role, task):
                    out.setdefault(role.name, {})[name] = dest
    return out


@dataclass
class Scenario:
    role: str
    host: str
    overrides: dict


INSTANCE = {"name": "shard-0", "mode": "shard", "shard": 0, "replica": 0}
SCENARIOS = {
    "node_exporter": Scenario(
        "node_exporter", "gpu001", {"node_exporter_install_method": "binary"}
    ),
    "gpu_collector": Scenario("gpu_collector", "l40s01", {}),
    "gpu_collector_kmsg": Scenario("gpu_collector", "l40s01", {"gpu_collector_xid_source": "kmsg"}),
    "gpu_collector_root": Scenario("gpu_collector", "l40s01", {"gpu_collector_user": "root"}),
    "gpu_collector_timer": Scenario("gpu_collector", "l40s01", {"gpu_collector_mode": "timer"}),
    "dcgm_package": Scenario("dcgm_exporter", "gpu001", {}),
    "dcgm_profiling": Scenario("dcgm_exporter", "gpu001", {"dcgm_exporter_profiling": True}),
    "dcgm_podman": Scenario(
        "dcgm_exporter",
        "gpu001",
        {
            "dcgm_exporter_install_method": "container",
            "dcgm_exporter_image_digest": "sha256:" + "a" * 64,
        },
    ),
    "dcgm_docker": Scenario(
        "dcgm_exporter",
        "gpu001",
        {
            "dcgm_exporter_install_method": "container",
            "dcgm_exporter_container_engine": "docker",
            "dcgm_exporter_image_digest": "sha256:" + "a" * 64,
        },
    ),
    "slurm_exporter": Scenario(
        "slurm_exporter", "slurmctl01", {"slurm_exporter_slurm_conf": "/etc/slurm/slurm.conf"}
    ),
    "prometheus_shard": Scenario("prometheus", "mon01", {"_instance": INSTANCE}),
    "prometheus_global": Scenario(
        "prometheus",
        "mon01",
        {"_instance": {**INSTANCE, "name": "global", "mode": "global", "shard": None}},
    ),
    "alertmanager": Scenario("alertmanager", "mon01", {}),
    "loki": Scenario("loki", "mon03", {}),
    "alloy": Scenario("alloy", "gpu001", {}),
    "grafana": Scenario("grafana", "mon03", {}),
    "victoriametrics": Scenario("victoriametrics", "mon01", {}),
    "exporter_firewall": Scenario(
        "exporter_firewall", "cpu01", {"exporter_firewall_enabled": True}
    ),
}


def registry_scenarios() -> dict[str, Scenario]:
    """For every exporter of the registry without a scenario above, the first host of its
    group in the example inventory, with the role's defaults: a new exporter needs no
    edit here to be checked."""
    registry = yaml.safe_load((ROLES / "_exporters" / "defaults" / "main.yml").read_text())
    groups, _ = example_inventory()
    listed = {scenario.role for scenario in SCENARIOS.values()}
    return {
        entry["role"]: Scenario(entry["role"], sorted(groups[entry["group"]])[0], {})
        for entry in registry["exporters_registry"].values()
        if entry.get("role") and entry["role"] not in listed
    }


SCENARIOS.update(registry_scenarios())


def templates_for(scenario: Scenario) -> dict[str, str]:
    found = systemd_templates()[scenario.role]
    if scenario.role == "dcgm_exporter":
        container = scenario.overrides.get("dcgm_exporter_install_method") == "container"
        keep = "dcgm-exporter-container.service.j2" if container else "dcgm-exporter.service.j2"
        found = {name: dest for name, dest in found.items() if name == keep}
    return found


def service_settings(text: str) -> dict[str, list[str]]:
    """key -> values of the [Service] section (continuation lines joined)."""
    settings: dict[str, list[str]] = {}
    section = None
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith(("#", ";")):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def services(scenario: Scenario) -> dict[str, list[tuple[str, str]]]:
    """service name -> [(template, rendered text)] of its unit and drop-ins."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, dest in templates_for(scenario).items():
        text = render(scenario.role, name, scenario.host, scenario.overrides)
        # A looped task (src "{{ item }}.j2") names its destination after the item.
        item = {"item": name.removesuffix(".j2")}
        dest = template_value(
            scenario.role, trust_as_template(dest), scenario.host, {**scenario.overrides, **item}
        )
        if ".service.d/" in dest:
            service = dest[len(SYSTEMD_DIR) :].split(".d/")[0]
        else:
            service = dest[len(SYSTEMD_DIR) :]
        out.setdefault(service, []).append((name, text))
    return out


def test_every_role_that_runs_a_service_writes_a_unit_or_drop_in():
    found = systemd_templates()
    # _common is the roles' shared machinery; every other role runs a service.
    runs = {p.name for p in ROLES.iterdir() if (p / "tasks" / "main.yml").exists()} - {
        "_common",
    }
    assert set(found) == runs
    # The three package units gpufleet does not write get its drop-in.
    drop_ins = {dest for dests in found.values() for dest in dests.values() if ".d/" in dest}
    assert {d.split("/")[4] for d in drop_ins} >= {
        "alloy.service.d",
        "victoria-metrics.service.d",
        "{{ _grafana_service }}.d",
    }
    assert {scenario.role for scenario in SCENARIOS.values()} == set(found)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_service_is_bounded_and_has_no_spare_privilege(name: str):
    scenario = SCENARIOS[name]
    units = services(scenario)
    assert units
    for service, files in units.items():
        if service.endswith(".timer"):
            ((_, text),) = files
            assert "[Timer]" in text and "[Service]" not in text
            bounded = services(scenario).get(service.replace(".timer", ".service"))
            assert bounded, f"{service}: its service is not written by the role"
            continue
        settings: dict[str, list[str]] = {}
        for _, text in files:
            for key, values in service_settings(text).items():
                settings.setdefault(key, []).extend(values)
        missing = [key for key in REQUIRED if key not in settings]
        assert not missing, f"{name}: {service} lacks {missing}"
        assert settings["NoNewPrivileges"][-1] == "yes"
        assert MEMORY.match(settings["MemoryMax"][-1]), settings["MemoryMax"]
        assert re.fullmatch(r"[1-9][0-9]*", settings["TasksMax"][-1]), settings["TasksMax"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_bounds_come_from_the_roles_variables(name: str):
    scenario = SCENARIOS[name]
    role = scenario.role
    values = {
        **scenario.overrides,
        f"{role}_memory_max": "777M",
        f"{role}_tasks_max": 77,
    }
    for service, files in services(Scenario(role, scenario.host, values)).items():
        if service.endswith(".timer"):
            continue
        settings: dict[str, list[str]] = {}
        for _, text in files:
            for key, found in service_settings(text).items():
                settings.setdefault(key, []).extend(found)
        assert settings["MemoryMax"] == ["777M"], service
        assert settings["TasksMax"] == ["77"], service


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_units_and_drop_ins_pass_systemd_analyze_verify(name: str, tmp_path: Path):
    scenario = SCENARIOS[name]
    for service, files in services(scenario).items():
        unit = tmp_path / service
        if service.endswith(".timer"):
            (tmp_path / service.replace(".timer", ".service")).write_text(
                "[Service]\nType=oneshot\nExecStart=/bin/true\n"
            )
        parts = []
        if not any(name.endswith((".service.j2", ".timer.j2")) for name, _ in files):
            # A drop-in of a package's unit: verified on a stand-in of that unit.
            parts.append("[Unit]\nDescription=stand-in\n[Service]\nExecStart=/bin/true\n")
        parts.extend(text for _, text in files)
        text = "\n".join(parts)
        # The executables do not exist here; everything else is checked as written.
        text = re.sub(r"(Exec\w+=[-@!+]*)(/\S+)", r"\1/bin/true", text)
        unit.write_text(text)
        assert not systemd_verify_problems(unit), (name, service, systemd_verify_problems(unit))


# --------------------------------------------------------------- the GPU collector


def collector_unit(**overrides) -> dict[str, list[str]]:
    text = render("gpu_collector", "gpufleet-gpu-collector.service.j2", "l40s01", overrides)
    return service_settings(text)


def test_the_gpu_collector_runs_unprivileged():
    unit = collector_unit()
    assert unit["User"] == ["gpufleet-gpu-collector"]
    assert unit["CapabilityBoundingSet"] == [""]
    assert unit["AmbientCapabilities"] == [""]
    assert unit["SupplementaryGroups"] == ["systemd-journal video render"]
    assert unit["ProtectKernelLogs"] == ["yes"]
    # It writes its own state directory only; node_exporter reads it through a link.
    state = "/var/lib/gpufleet-gpu-collector"
    command = unit["ExecStart"][0].split()
    assert command[command.index("--textfile-dir") + 1] == state
    assert command[command.index("--state-dir") + 1] == state
    assert command[command.index("--output-name") + 1] == "gpufleet_gpu.prom"
    assert "ReadWritePaths" not in unit and unit["StateDirectory"] == ["gpufleet-gpu-collector"]
    # /dev/nvidia* must stay open: nothing that implies a device policy.
    for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock"):
        assert key not in unit, key
    install = yaml.safe_load((ROLES / "gpu_collector/tasks/install.yml").read_text())
    (link,) = [t for t in install if "Link" in t["name"]]
    args = link["ansible.builtin.file"]
    assert args["state"] == "link" and args["force"] is True
    assert args["src"] == "{{ _gpu_collector_state_dir }}/gpufleet_gpu.prom"
    assert args["dest"] == "{{ gpu_collector_textfile_dir }}/gpufleet_gpu.prom"


def test_the_gpu_collector_gets_only_the_groups_the_host_has():
    unit = collector_unit(__gpu_collector_groups=["systemd-journal"])
    assert unit["SupplementaryGroups"] == ["systemd-journal"]
    assert "SupplementaryGroups" not in collector_unit(__gpu_collector_groups=[])
    configure = yaml.safe_load((ROLES / "gpu_collector/tasks/configure.yml").read_text())
    (keep,) = [t for t in configure if "ansible.builtin.set_fact" in t]
    kept = template_value(
        "gpu_collector",
        keep["ansible.builtin.set_fact"]["__gpu_collector_groups"],
        "l40s01",
        {"ansible_facts": {"getent_group": {"systemd-journal": ["x", "101", ""], "video": []}}},
    )
    assert kept == ["systemd-journal", "video"]


def test_the_gpu_collector_gains_one_capability_for_kmsg_and_root_keeps_one():
    kmsg = collector_unit(gpu_collector_xid_source="kmsg")
    assert kmsg["CapabilityBoundingSet"] == ["CAP_SYSLOG"]
    assert kmsg["AmbientCapabilities"] == ["CAP_SYSLOG"]
    assert "ProtectKernelLogs" not in kmsg
    root = collector_unit(gpu_collector_user="root")
    assert "User" not in root
    assert root["CapabilityBoundingSet"] == ["CAP_SYS_PTRACE"]
    both = collector_unit(gpu_collector_user="root", gpu_collector_xid_source="kmsg")
    assert both["CapabilityBoundingSet"] == ["CAP_SYS_PTRACE CAP_SYSLOG"]


# --------------------------------------------------------------- Prometheus memory


def prometheus_memory(instance: dict, **overrides) -> str:
    text = render(
        "prometheus", "prometheus-bounds.conf.j2", "mon01", {"_instance": instance, **overrides}
    )
    (value,) = service_settings(text)["MemoryMax"]
    return value


def with_series(per_host: int, hosts: int):
    groups, hostvars = example_inventory()
    names = [f"n{i:04d}" for i in range(hosts)]
    groups = {**groups, "all": names, "prometheus_shard_0": names}
    hostvars = {name: {"gpufleet_expected_series": per_host} for name in names}
    return groups, hostvars


def test_prometheus_memory_grows_with_the_shard_in_powers_of_two():
    # The example inventory: shard 0 holds about 96,000 series (1 GiB + 0.75 GiB), the
    # cluster 192,000 (the global tier counts a tenth).
    assert prometheus_memory(INSTANCE) == "2G"
    assert prometheus_memory({**INSTANCE, "name": "global", "mode": "global"}) == "2G"
    sizes = []
    for hosts in (4, 64, 512, 2048):
        inventory = with_series(8000, hosts)
        text = templar("prometheus", "mon01", {"_instance": INSTANCE}, inventory).template(
            trust_as_template(
                (ROLES / "prometheus/templates/prometheus-bounds.conf.j2").read_text()
            )
        )
        (value,) = service_settings(text)["MemoryMax"]
        gib = int(value.removesuffix("G"))
        assert gib & (gib - 1) == 0, value
        # At least 1 GiB plus 8 KiB for each of the shard's series.
        assert gib * 2**30 >= 2**30 + 8192 * 8000 * hosts
        sizes.append(gib)
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
    assert prometheus_memory(INSTANCE, prometheus_memory_max="48G") == "48G"


def test_prometheus_memory_is_a_drop_in_that_applies_without_a_restart():
    instance = yaml.safe_load((ROLES / "prometheus/tasks/instance.yml").read_text())
    (bounds,) = [t for t in instance if t["name"].startswith("Write the bounds")]
    assert bounds["notify"] == "apply prometheus bounds"
    handlers = yaml.safe_load((ROLES / "prometheus/handlers/main.yml").read_text())
    (apply,) = [h for h in handlers if h.get("listen") == "apply prometheus bounds"]
    assert apply["ansible.builtin.systemd_service"] == {"daemon_reload": True}
    unit = render("prometheus", "prometheus.service.j2", "mon01", {"_instance": INSTANCE})
    assert "MemoryMax" not in service_settings(unit)


# --------------------------------------------------------------- control characters
# The shared piece (roles/_common/tasks/preflight.yml) is tested once, on every role's
# own variables; each role's contract: it includes the piece, and its _<role>_line_vars
# name every public variable its line-based files take.

LINE_BASED = re.compile(r"\.(service|timer|conf|ini|env|default|repo|sources|tmpfiles|sh)\.j2$")
SHARED = ROLES / "_common" / "tasks" / "preflight.yml"


def shared_check(name: str) -> dict:
    (task,) = [t for t in yaml.safe_load(SHARED.read_text()) if t["name"] == name]
    return task


def public_reached(role, refs: set) -> set[str]:
    """The role's defaults (public variables) these references can carry."""
    public = set(yaml.safe_load((role.path / "defaults" / "main.yml").read_text()) or {})
    found: set[str] = set()

    def follow(name: str, _attr: str | None) -> bool:
        if name in public:
            found.add(name)
        return True

    walk_definitions(role, refs, follow)
    return found


ROLE_MODELS = {role.name: role for role in all_roles()}
LINE_ROLES = sorted(
    role.name
    for role in ROLE_MODELS.values()
    if any(LINE_BASED.search(p.name) for p in (role.path / "templates").glob("*.j2"))
)


def line_vars(role: str) -> list[str]:
    return yaml.safe_load((ROLES / role / "vars" / "main.yml").read_text())[f"_{role}_line_vars"]


@pytest.mark.parametrize("role_name", LINE_ROLES)
def test_every_value_of_a_line_based_file_is_checked_for_control_characters(role_name: str):
    role = ROLE_MODELS[role_name]
    written = set()
    for template in (role.path / "templates").glob("*.j2"):
        if LINE_BASED.search(template.name):
            written |= public_reached(role, jinja_refs(template.read_text()))
    assert sorted(written - set(line_vars(role_name))) == [], f"add them to _{role_name}_line_vars"
    # ... and the role runs the shared check, in its preflight, before anything is written.
    steps = yaml.safe_load((ROLES / role_name / "tasks" / "main.yml").read_text())
    assert steps[0]["ansible.builtin.import_tasks"] == "preflight.yml"
    included = [
        t["ansible.builtin.include_role"]
        for t in yaml.safe_load((ROLES / role_name / "tasks" / "preflight.yml").read_text())
        if "ansible.builtin.include_role" in t
    ]
    assert {"name": "_common", "tasks_from": "preflight", "apply": {"tags": ["always"]}} in included


def deep_trust(value):
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: deep_trust(v) for k, v in value.items()}
    if isinstance(value, list):
        return [deep_trust(v) for v in value]
    return value


SECRETS = {
    "grafana": {"grafana_admin_password": "c0rrect-horse-battery", "grafana_secret_key": "k" * 20}
}


def shared_result(check: str, result: str, role: str, **values):
    """A variable of a shared check, as the role that includes it sees it."""
    task_vars = deep_trust(shared_check(check)["vars"])
    context = {**task_vars, **SECRETS.get(role, {}), "ansible_parent_role_names": [role], **values}
    return template_value(role, task_vars[result], "mon01", context)


def refused(role: str, **values) -> list[str]:
    return shared_result(
        "Check that no value of a line-based file holds a control character",
        "__common_control",
        role,
        **values,
    )


@pytest.mark.parametrize("role_name", LINE_ROLES)
def test_the_check_refuses_control_characters_and_names_the_variable(role_name: str):
    assert refused(role_name) == []
    names = line_vars(role_name)
    for index, bad in enumerate(["a\nb", "a\rb", "a\x00b", "a\tb", "a\x1bb", "a\x7fb", "a\x85b"]):
        name = names[index % len(names)]
        assert refused(role_name, **{name: bad}) == [name], repr(bad)
        # In a list (flags, groups) and in a mapping's key or value as well.
        assert refused(role_name, **{name: ["ok", bad]}) == [name], repr(bad)
        assert refused(role_name, **{name: {bad: "ok"}}) == [name], repr(bad)
    # A backslash followed by "n" is two characters, not a newline.
    assert refused(role_name, **{names[0]: "C:\\new\\\\nope"}) == []
    task = shared_check("Check that no value of a line-based file holds a control character")
    message = template_value(
        role_name,
        trust_as_template(task["ansible.builtin.assert"]["fail_msg"]),
        "mon01",
        {"__common_control": [names[0]]},
    )
    assert "\n" not in message and message.startswith(f"{names[0]} must not contain control")


@pytest.mark.parametrize("role_name", LINE_ROLES)
def test_the_bounds_check_accepts_systemd_sizes_only(role_name: str):
    def problems(memory, tasks) -> list[str]:
        values = {f"{role_name}_memory_max": memory, f"{role_name}_tasks_max": tasks}
        return shared_result("Check the systemd bounds", "__common_bounds", role_name, **values)

    # The role's own defaults pass.
    assert shared_result("Check the systemd bounds", "__common_bounds", role_name) == []
    for memory in ("512M", "2G", "25%", "infinity", "1048576"):
        assert problems(memory, 64) == [], memory
    for memory in ("", "0", "512MB", "2 G", "101%", "0%", "-1", "1.5G", "unlimited"):
        (problem,) = problems(memory, 64)
        assert problem.startswith(f"{role_name}_memory_max must be a systemd size"), memory
        assert "\n" not in problem
    for tasks in (0, -1, "", "infinity", "1e3", True):
        (problem,) = problems("512M", tasks)
        assert problem.startswith(f"{role_name}_tasks_max must be a positive number"), tasks
    # Prometheus alone sizes its memory itself (auto).
    assert (problems("auto", 64) == []) == (role_name == "prometheus")


def test_the_internal_role_refuses_to_run_by_itself():
    (guard,) = yaml.safe_load((ROLES / "_common" / "tasks" / "main.yml").read_text())
    assert "ansible.builtin.fail" in guard and "internal" in guard["ansible.builtin.fail"]["msg"]
