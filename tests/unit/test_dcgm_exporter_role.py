"""The dcgm_exporter role, offline: nothing of NVIDIA's is reachable from the test hosts.

What runs for real:
- ansible-playbook renders every template of the role with the role's defaults, vars and
  preflight (one localhost alias per scenario, inventory host vars as overrides), with
  ansible's own filters and gpufleet's bcrypt filter;
- the whole role in check mode (container method), which also validates
  meta/argument_specs.yml against the defaults;
- ansible-playbook --syntax-check on a playbook that uses the role;
- the rendered Slurm prolog and epilog, executed with dash and bash against a temporary
  mapping directory, including concurrent jobs and an unwritable directory;
- systemd-analyze verify on the rendered units, where available.
The package and container installs themselves (NVIDIA's repository, nvcr.io) are not run.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from once_per_run import once_per_run, start_early
from render_role import TRUSTED_FILES, evaluate, systemd_verify_problems, template_value
from test_openpgp import gpg, gpg_fingerprints

from gpufleet.openpgp import OpenPGPError, normalize_fingerprint

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "dcgm_exporter"
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")

# Every DCGM field name listed in ../shared/reference/gpu-metrics.md section 1 (the
# rows of dcgm-exporter's etc/default-counters.csv, the exporter-owned DCGM_EXP_*
# families of section 1.2 and the fields named in the version notes of section 1.8),
# for the pinned exporter 4.8.x. Nothing here is guessed.
REFERENCE_FIELDS = frozenset(
    [
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
        "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        "DCGM_EXP_CLOCK_EVENTS_COUNT",
        "DCGM_EXP_XID_ERRORS_COUNT",
        "DCGM_EXP_GPU_HEALTH_STATUS",
        "DCGM_EXP_P2P_STATUS",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_RETIRED_DBE",
        "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DRIVER_VERSION",
        "DCGM_FI_NVML_VERSION",
        "DCGM_FI_DEV_BRAND",
        "DCGM_FI_DEV_SERIAL",
        "DCGM_FI_DEV_OEM_INFOROM_VER",
        "DCGM_FI_DEV_ECC_INFOROM_VER",
        "DCGM_FI_DEV_POWER_INFOROM_VER",
        "DCGM_FI_DEV_INFOROM_IMAGE_VER",
        "DCGM_FI_DEV_VBIOS_VERSION",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    ]
)
# Asked for by the issue (FB total, remap pending, the minor number Slurm's GPU index
# means) but not in the reference: checked in NVIDIA/DCGM dcgmlib/dcgm_fields.h (commit
# 28bfbd4), field ids 250, 396 and 55.
# DCGM_FI_DEV_SLOWDOWN_TEMP (158) and DCGM_FI_DEV_CLOCKS_EVENT_REASONS (112, formerly
# CLOCK_THROTTLE_REASONS): NVIDIA/DCGM testing/python3/dcgm_fields.py; the rules read both.
DCGM_HEADER_FIELDS = frozenset(
    {
        "DCGM_FI_DEV_FB_TOTAL",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "DCGM_FI_DEV_MINOR_NUMBER",
        "DCGM_FI_DEV_SLOWDOWN_TEMP",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    }
)
KNOWN_FIELDS = REFERENCE_FIELDS | DCGM_HEADER_FIELDS

DIGEST = "sha256:" + "c" * 64
# NVIDIA's CUDA key (Debian/Ubuntu), the role's default pin; the EL key has no default,
# so the scenarios add a stand-in for it (the render runs on whatever the test host is).
CUDA_KEY_FINGERPRINT = "EB693B3035CD5710E231E123A4B469963BF863CC"
EL_PIN = "0123456789ABCDEF0123456789ABCDEF01234567"
PINS = {"3bf863cc.pub": CUDA_KEY_FINGERPRINT, "D42D0685.pub": EL_PIN}
# As gpg prints them: groups of four, lower case here.
SPACED_PINS = {
    name: " ".join(pin[i : i + 4] for i in range(0, 40, 4)).lower() for name, pin in PINS.items()
}

# One localhost alias per scenario; host vars override the role defaults.
SCENARIOS: dict[str, dict] = {
    "pkg_default": {
        "dcgm_exporter_repo_key_fingerprint": PINS,
    },
    "pkg_profiling": {
        "dcgm_exporter_repo_key_fingerprint": SPACED_PINS,
        "dcgm_exporter_profiling": True,
        "gpufleet_gpu_count": 4,
        "dcgm_exporter_device_allow": "gpu_count",
        "dcgm_exporter_hostengine": "remote",
        "dcgm_exporter_scrape_interval": 30,
        "dcgm_exporter_listen_address": "::",
        "dcgm_exporter_repo_url": "http://mirror.example/nvidia/cuda/repos/",
        "dcgm_exporter_extra_counters": [
            {"field": "DCGM_FI_DEV_RETIRED_PENDING", "type": "counter", "help": "Pages pending."}
        ],
    },
    "pkg_no_jobmap": {
        "dcgm_exporter_manage_repo": False,
        "dcgm_exporter_hpc_job_mapping_dir": "",
    },
    "ctr_podman": {
        "dcgm_exporter_install_method": "container",
        "dcgm_exporter_image_digest": DIGEST,
        "dcgm_exporter_basic_auth_users": {"prometheus": "s3cret"},
        "dcgm_exporter_tls_cert": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        "dcgm_exporter_tls_key": "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n",
    },
    "ctr_docker_profiling": {
        "dcgm_exporter_install_method": "container",
        "dcgm_exporter_container_engine": "docker",
        "dcgm_exporter_image_digest": DIGEST,
        "dcgm_exporter_profiling": True,
        "dcgm_exporter_image": "registry.example:5000/nvidia/k8s/dcgm-exporter",
    },
}
# Scenarios preflight must refuse, with a part of the message it must give.
REFUSED: dict[str, tuple[dict, str]] = {
    "bad_no_digest": (
        {"dcgm_exporter_install_method": "container"},
        "dcgm_exporter_image_digest must be set",
    ),
    "bad_no_key": (
        {"dcgm_exporter_repo_key_fingerprint": {}},
        "must be pinned by its OpenPGP fingerprint",
    ),
    # The long key id apt prints is not a fingerprint.
    "bad_key_id_only": (
        {
            "dcgm_exporter_repo_key_fingerprint": {
                "3bf863cc.pub": "A4B469963BF863CC",
                "D42D0685.pub": "A4B469963BF863CC",
            }
        },
        'dcgm_exporter_repo_key_fingerprint has "A4B469963BF863CC" for it',
    ),
    "bad_prof_field_without_profiling": (
        {
            "dcgm_exporter_manage_repo": False,
            "dcgm_exporter_extra_counters": [
                {"field": "DCGM_FI_PROF_SM_ACTIVE", "type": "gauge", "help": "SM active."}
            ],
        },
        "DCGM_FI_PROF_* fields need dcgm_exporter_profiling",
    ),
    "bad_duplicate_field": (
        {
            "dcgm_exporter_manage_repo": False,
            "dcgm_exporter_extra_counters": [
                {"field": "DCGM_FI_DEV_GPU_TEMP", "type": "gauge", "help": "Again."}
            ],
        },
        "twice now: DCGM_FI_DEV_GPU_TEMP",
    ),
    "bad_interval": (
        {"dcgm_exporter_manage_repo": False, "dcgm_exporter_collect_interval_ms": 60000},
        "at most the scrape interval",
    ),
    "bad_exporter_49": (
        {"dcgm_exporter_manage_repo": False, "dcgm_exporter_version": "4.9.0"},
        "before 4.9.0",
    ),
}

RENDER_PLAYBOOK = """
- name: Render the dcgm_exporter role's files per scenario
  hosts: all
  gather_facts: true
  gather_subset: [min]
  tasks:
    - name: Run the role's preflight (also exposes its defaults and vars)
      ansible.builtin.import_role:
        name: dcgm_exporter
        tasks_from: preflight.yml

    - name: Create the output directory
      ansible.builtin.file:
        path: "{{ out }}/{{ inventory_hostname }}"
        state: directory
        mode: "0755"

    - name: Render the role's templates
      ansible.builtin.template:
        src: "{{ templates }}/{{ item }}.j2"
        dest: "{{ out }}/{{ inventory_hostname }}/{{ item }}"
        mode: "0644"
      loop:
        - dcgm-counters.csv
        - dcgm-exporter.service
        - dcgm-exporter-container.service
        - cuda.sources
        - cuda.repo
        - gpufleet-dcgm-exporter.tmpfiles

    - name: Render the web configuration as the role does (roles/_common/tasks/web_config.yml)
      ansible.builtin.template:
        src: "{{ templates }}/../../_common/templates/web-config.yml.j2"
        dest: "{{ out }}/{{ inventory_hostname }}/web-config.yml"
        mode: "0644"
      vars:
        __common_web: "{{ {'format': 'yaml'} | combine(_dcgm_exporter_web) }}"
        __common_web_tls_cert: "{{ dcgm_exporter_tls_cert }}"
        __common_web_tls_client_ca: "{{ dcgm_exporter_tls_client_ca }}"
        __common_web_basic_auth_users: "{{ dcgm_exporter_basic_auth_users }}"

    - name: Render the prolog and the epilog as the role does
      ansible.builtin.template:
        src: "{{ templates }}/gpufleet-dcgm-job-map.sh.j2"
        dest: "{{ out }}/{{ inventory_hostname }}/{{ item.name }}"
        mode: "0755"
      loop:
        - {name: prolog.sh, action: add}
        - {name: epilog.sh, action: remove}
      vars:
        _dcgm_exporter_job_map_action: "{{ item.action }}"

    - name: Save the computed values
      ansible.builtin.copy:
        dest: "{{ out }}/{{ inventory_hostname }}/values.json"
        mode: "0644"
        content: >-
          {{ {'args': _dcgm_exporter_args,
              'package_specs': _dcgm_exporter_package_specs,
              'repo_url': _dcgm_exporter_repo_full_url,
              'image_ref': _dcgm_exporter_image_ref,
              'collect_interval_ms': dcgm_exporter_collect_interval_ms | int,
              'os_family': ansible_facts['os_family'],
              'distribution': ansible_facts['distribution'],
              'distribution_major_version': ansible_facts['distribution_major_version'],
              'distribution_version': ansible_facts['distribution_version']} | to_nice_json }}
"""


def ansible_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        # Facts cached under tmp, as ansible.cfg caches them (jsonfile, gathering=smart): a
        # test's later runs on the same hosts reuse its first run's facts, as a rerun does,
        # and no facts cached elsewhere (a test bed's) come in.
        ANSIBLE_CACHE_PLUGIN="jsonfile",
        ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp / "facts"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"),
        ANSIBLE_HOME=str(tmp / "ansible-home"),
        ANSIBLE_DEPRECATION_WARNINGS="0",
    )
    return env


def ansible_playbook(tmp: Path, *args: str, timeout: int = 600) -> tuple[int, str]:
    """ansible-playbook ARGS from the repository, with its Ansible home under tmp:
    the exit status and the output (stdout, then stderr)."""
    run = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), *args],
        cwd=REPO,
        env=ansible_env(tmp),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return run.returncode, run.stdout + run.stderr


def write_inventory(path: Path, hosts: dict[str, dict]) -> Path:
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
            },
            "hosts": hosts,
        }
    }
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return path


def recap(output: str) -> dict[str, dict[str, int]]:
    result = {}
    for match in re.finditer(r"^(\S+)\s+:\s+(ok=.*)$", output, re.MULTILINE):
        counts = dict(item.split("=") for item in match.group(2).split())
        result[match.group(1)] = {key: int(value) for key, value in counts.items()}
    return result


def render_arguments(tmp: Path) -> list[str]:
    """ansible-playbook's arguments for one run rendering every scenario, one host each,
    into tmp/out (inventory and playbook written under tmp)."""
    hosts = dict(SCENARIOS)
    hosts.update({name: overrides for name, (overrides, _) in REFUSED.items()})
    inventory = write_inventory(tmp / "inventory.yml", hosts)
    playbook = tmp / "render.yml"
    playbook.write_text(RENDER_PLAYBOOK)
    extra_vars = ["-e", f"out={tmp / 'out'}", "-e", f"templates={ROLE / 'templates'}"]
    return ["-i", str(inventory), str(playbook), *extra_vars]


def render_scenarios(tmp: Path) -> dict:
    _, output = ansible_playbook(tmp, *render_arguments(tmp))
    return {"out": str(tmp / "out"), "output": output}


def start_render(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same run, started with the session (tests/conftest.py), beside other tests."""

    def command(tmp: Path) -> tuple[list[str], dict[str, str], Path]:
        # timeout: as ansible_playbook's (600 s), which ends the run with status 124.
        argv = ["timeout", "600", str(ANSIBLE_PLAYBOOK), *render_arguments(tmp)]
        return argv, ansible_env(tmp), REPO

    start_early(tmp_path_factory, "dcgm_render", command)


def rendered_early(tmp: Path, status: int, stdout: str, stderr: str) -> dict:
    if status == 124:
        raise subprocess.TimeoutExpired("ansible-playbook", 600, stdout, stderr)
    return {"out": str(tmp / "out"), "output": stdout + stderr}


START_EARLY = {"rendered": start_render}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict]:
    # About a minute of CPU: made once per test run, also when xdist splits this module,
    # and started with the session when a selected test needs it (START_EARLY).
    made = once_per_run(tmp_path_factory, "dcgm_render", render_scenarios, rendered_early)
    return Path(made["out"]), made["output"], recap(made["output"])


def scenario(rendered: tuple[Path, str, dict], name: str) -> Path:
    out, output, summary = rendered
    assert summary.get(name, {}).get("failed") == 0, output[-6000:]
    return out / name


def read_values(path: Path) -> dict:
    return yaml.safe_load((path / "values.json").read_text())


def counter_rows(path: Path) -> list[list[str]]:
    lines = [
        line
        for line in (path / "dcgm-counters.csv").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return list(csv.reader(lines, skipinitialspace=True))


def unit_lines(path: Path, unit: str) -> list[str]:
    return (path / unit).read_text().splitlines()


def exec_start(path: Path, unit: str) -> list[str]:
    """The ExecStart command of a rendered unit as tokens (continuations joined)."""
    text = (path / unit).read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    return line.removeprefix("ExecStart=").split()


# --- preflight ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_valid_scenarios_pass_preflight(rendered, name: str) -> None:
    assert (scenario(rendered, name) / "dcgm-counters.csv").exists()


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_preflight_refuses_with_a_clear_message(rendered, name: str) -> None:
    _, output, summary = rendered
    assert summary[name]["failed"] == 1, output[-6000:]
    message = REFUSED[name][1]
    failure = re.search(
        rf"fatal: \[{name}\]: FAILED!.*?(?=\n(?:fatal|ok|TASK|PLAY)\b|\Z)", output, re.S
    )
    assert failure and message in " ".join(failure.group(0).split()), output[-6000:]


# --- the repository key: pinned by OpenPGP fingerprint ---------------------------------

FACTS = {
    "Debian": {"os_family": "Debian", "distribution": "Debian", "distribution_major_version": "12"},
    "Ubuntu": {"os_family": "Debian", "distribution": "Ubuntu", "distribution_version": "24.04"},
    "EL": {"os_family": "RedHat", "distribution": "RedHat", "distribution_major_version": "9"},
}
PIN_TASK = "Check that the repository key is pinned by its fingerprint"


def role_tasks(name: str) -> list[dict]:
    return yaml.safe_load((ROLE / "tasks" / name).read_text())


def task_named(tasks: list[dict], name: str) -> dict:
    for task in tasks:
        if task.get("name") == name:
            return task
        found = [t for t in task.get("block", []) + task.get("rescue", []) if t["name"] == name]
        if found:
            return found[0]
    raise AssertionError(f"no task {name!r}")


def pin_check(system: str, overrides: dict | None = None) -> tuple[bool, str]:
    """Preflight's fingerprint assert for a host of that system: (passes, fail_msg)."""
    task = task_named(role_tasks("preflight.yml"), PIN_TASK)
    assert task["when"] == [
        "dcgm_exporter_install_method == 'package'",
        "dcgm_exporter_manage_repo | bool",
    ]
    values = {
        "ansible_facts": {**FACTS[system], "architecture": "x86_64"},
        "dcgm_exporter_download_dir": "/cache",  # its default needs a lookup
        **(overrides or {}),
    }
    check = task["ansible.builtin.assert"]
    passes = evaluate("dcgm_exporter", check["that"], "gpu001", values)
    message = template_value("dcgm_exporter", check["fail_msg"], "gpu001", values)
    return passes, " ".join(message.split())


def test_default_pins_nvidias_cuda_key() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["dcgm_exporter_repo_key_fingerprint"] == {"3bf863cc.pub": CUDA_KEY_FINGERPRINT}
    assert CUDA_KEY_FINGERPRINT.endswith("A4B469963BF863CC"), "the long key id apt prints"


@pytest.mark.parametrize("system", ["Debian", "Ubuntu"])
def test_preflight_accepts_the_default_pin(system: str) -> None:
    assert pin_check(system)[0] is True


def test_preflight_refuses_el_without_a_fingerprint_and_says_how_to_get_it() -> None:
    passes, message = pin_check("EL")
    assert passes is False
    assert "dcgm_exporter_repo_key_fingerprint has no entry for it" in message
    assert "gpg --show-keys D42D0685.pub" in message
    url = "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/D42D0685.pub"
    assert url in message
    pinned = {"3bf863cc.pub": CUDA_KEY_FINGERPRINT, "D42D0685.pub": EL_PIN}
    assert pin_check("EL", {"dcgm_exporter_repo_key_fingerprint": pinned})[0] is True


# The filter decides what a fingerprint is; preflight must agree with it, so a pin it lets
# through never fails only later, on the controller, and no valid pin is refused.
PIN_SHAPES = [
    CUDA_KEY_FINGERPRINT,
    CUDA_KEY_FINGERPRINT.lower(),
    SPACED_PINS["3bf863cc.pub"],
    "EB69 3B30 35CD 5710 E231  E123 A4B4 6996 3BF8 63CC",  # gpg's two-space middle
    "ab" * 32,  # v6 fingerprint
    "",
    "A4B469963BF863CC",  # long key id
    "3BF863CC",  # short key id
    CUDA_KEY_FINGERPRINT[:-1],
    CUDA_KEY_FINGERPRINT + "0",
    "0x" + CUDA_KEY_FINGERPRINT,
    "G" + CUDA_KEY_FINGERPRINT[1:],
    "ab" * 32 + "c",
]


@pytest.mark.parametrize("pin", PIN_SHAPES)
def test_preflight_accepts_exactly_what_the_select_filter_accepts(pin: str) -> None:
    try:
        normalize_fingerprint(pin)
        valid = True
    except OpenPGPError:
        valid = False
    pins = {"3bf863cc.pub": pin}
    passes, message = pin_check("Debian", {"dcgm_exporter_repo_key_fingerprint": pins})
    assert passes is valid
    if not valid:
        assert f'has "{pin}" for it' in message


def test_preflight_refuses_a_malformed_fingerprint() -> None:
    for pin in ("A4B469963BF863CC", CUDA_KEY_FINGERPRINT[:-1], "not a fingerprint"):
        pins = {"3bf863cc.pub": pin}
        assert pin_check("Debian", {"dcgm_exporter_repo_key_fingerprint": pins})[0] is False


def key_include() -> dict:
    """The role's include of the shared task file roles/_common/tasks/repository_key.yml."""
    tasks = role_tasks("install_package.yml")
    return task_named(tasks, "Install the repository signing key")


def key_piece_vars() -> dict:
    """The variables of the shared task file's outer block, trusted as Ansible loads them."""
    path = REPO / "roles" / "_common" / "tasks" / "repository_key.yml"
    (block,) = DataLoader().load_from_file(str(path), **TRUSTED_FILES)
    return dict(block["vars"])


def test_each_host_gets_its_families_key_url_and_normalized_pin() -> None:
    for system, key_file, distro in (
        ("Debian", "3bf863cc.pub", "debian12"),
        ("Ubuntu", "3bf863cc.pub", "ubuntu2404"),
        ("EL", "D42D0685.pub", "rhel9"),
    ):
        facts = {**FACTS[system], "architecture": "aarch64"}
        values = {
            **key_piece_vars(),
            "ansible_parent_role_names": ["dcgm_exporter"],
            "ansible_facts": facts,
            "dcgm_exporter_download_dir": "/cache",
            "dcgm_exporter_repo_key_fingerprint": SPACED_PINS,
        }
        # What the shared task file makes of the role's _dcgm_exporter_repository_key.
        key = evaluate("dcgm_exporter", "__common_key_resolved", "gpu001", values)
        base = "https://developer.download.nvidia.com/compute/cuda/repos"
        assert key["url"] == f"{base}/{distro}/sbsa/{key_file}"
        assert key["pin"] == PINS[key_file]
        download = (
            f"/cache/developer.download.nvidia.com_compute_cuda_repos_{distro}_sbsa_{key_file}"
        )
        assert key["download"] == download
        # Named after the URL and the pin: a changed pin never finds a file verified for
        # the old one.
        assert key["verified"] == f"{download}.{PINS[key_file]}.asc"


def test_the_key_is_pinned_by_the_shared_task_file() -> None:
    include = key_include()
    assert include["ansible.builtin.include_role"]["name"] == "_common"
    assert include["ansible.builtin.include_role"]["tasks_from"] == "repository_key"
    internal = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    key = internal["_dcgm_exporter_repository_key"]
    assert key["dest"] == "{{ __dcgm_exporter_repo.key_dest }}"
    assert include["when"] == "dcgm_exporter_manage_repo | bool"
    names = [task["name"] for task in role_tasks("install_package.yml")]
    assert names.index("Resolve the repository of this host") < names.index(
        "Install the repository signing key"
    )
    assert not (ROLE / "tasks" / "repository_key.yml").exists()


# The controller half of the key handling, run for real against key files gpg made,
# served from file:// URLs: one "repository" with the pinned key and an intruder, one
# mirror. The play runs the role's own tasks (the repository and the include of the
# shared task file), with the key's destination on the host moved under the test's
# directory. The include runs in a stand-in dcgm_exporter role next to the playbook
# (found before the real one) with the role's vars/main.yml: the shared task file reads
# the including role's _dcgm_exporter_repository_key.
KEY_PLAYBOOK = """
- name: Fetch and verify the CUDA repository key as the role does
  hosts: all
  gather_facts: true
  gather_subset: [min]
  vars_files: [{vars_file}]
  tasks:
    - name: Publish the key file where the role will look for it
      when: published_key is defined
      vars:
        path: "{{{{ _dcgm_exporter_key_url | regex_replace('^file://', '') }}}}"
      block:
        - name: Create the repository directory
          ansible.builtin.file:
            path: "{{{{ path | dirname }}}}"
            state: directory
            mode: "0755"

        - name: Copy the key file
          ansible.builtin.copy:
            src: "{{{{ published_key }}}}"
            dest: "{{{{ path }}}}"
            mode: "0644"

{resolve}

    - name: Move the key's destination on the host under the test's directory
      ansible.builtin.set_fact:
        __dcgm_exporter_repo: "{{{{ __dcgm_exporter_repo | combine({{'key_dest': key_dest}}) }}}}"

    - name: Run the role's include of the shared task file
      ansible.builtin.include_role:
        name: dcgm_exporter
"""


def key_playbook(path: Path) -> Path:
    tasks = role_tasks("install_package.yml")
    resolve = textwrap.indent(
        yaml.safe_dump([task_named(tasks, "Resolve the repository of this host")], sort_keys=False),
        "    ",
    )
    stand_in = path.parent / "roles" / "dcgm_exporter"
    for part, text in (
        ("tasks", yaml.safe_dump([key_include()], sort_keys=False)),
        ("vars", (ROLE / "vars" / "main.yml").read_text()),
    ):
        (stand_in / part).mkdir(parents=True, exist_ok=True)
        (stand_in / part / "main.yml").write_text(text)
    path.write_text(KEY_PLAYBOOK.format(vars_file=ROLE / "vars" / "main.yml", resolve=resolve))
    return path


@pytest.fixture(scope="module")
def signing_keys() -> Iterator[list[tuple[str, str]]]:
    """Two signing keys made by gpg: (fingerprint, armored key) each."""
    if not shutil.which("gpg"):
        pytest.skip("gpg not installed")
    # gpg-agent's socket path must stay short: a home under /tmp, not pytest's tmp_path.
    home = tempfile.mkdtemp(prefix="gk-", dir="/tmp")
    try:
        keys = []
        for name in ("CUDA stand-in <cuda@example.org>", "Intruder <intruder@example.org>"):
            gpg(home, "--passphrase", "", "--quick-gen-key", name, "ed25519", "sign", "never")
            armored = gpg(home, "--armor", "--export", name)
            keys.append((gpg_fingerprints(armored)[0], armored))
        yield keys
    finally:
        subprocess.run(["gpgconf", "--homedir", home, "--kill", "all"], check=False)
        shutil.rmtree(home, ignore_errors=True)


def task_results(output: str, task: str) -> list[str]:
    """The per-host (and per-item) result lines of one task (of the play or a role)."""
    section = re.split(rf"TASK \[(?:\w+ : )?{re.escape(task)}\]", output, maxsplit=1)[1]
    section = re.split(r"\n(?:TASK \[|PLAY RECAP|RUNNING HANDLER)", section, maxsplit=1)[0]
    return re.findall(r"^(?:ok|changed|failed|fatal|skipping): .*$", section, re.M)


def test_controller_keeps_only_the_pinned_key_once_per_url(signing_keys, tmp_path: Path) -> None:
    (pinned, pinned_key), (intruder, intruder_key) = signing_keys
    published = tmp_path / "published"
    published.mkdir()
    (published / "both.asc").write_text(pinned_key + intruder_key)
    (published / "pinned.asc").write_text(pinned_key)
    cache = tmp_path / "cache"
    pins = {"3bf863cc.pub": pinned.lower(), "D42D0685.pub": pinned}
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    common = {
        # The role's defaults, as inventory values here (the play loads no role).
        **{
            name: defaults[name] for name in ("dcgm_exporter_manage_repo", "dcgm_exporter_repo_url")
        },
        "dcgm_exporter_download_dir": str(cache),
        "dcgm_exporter_repo_key_fingerprint": pins,
    }
    repos = {"dcgm_exporter_repo_url": f"file://{tmp_path}/repos"}
    mirror = {"dcgm_exporter_repo_url": f"file://{tmp_path}/mirror/"}
    hosts = {
        "node_a": {**common, **repos, "published_key": str(published / "both.asc")},
        "node_b": {**common, **repos},
        "node_m": {**common, **mirror, "published_key": str(published / "pinned.asc")},
        "node_unmanaged": {**common, "dcgm_exporter_manage_repo": False},
    }
    for name, host in hosts.items():
        host["key_dest"] = str(tmp_path / f"{name}.asc")
    inventory = write_inventory(tmp_path / "inventory.yml", hosts)
    playbook = key_playbook(tmp_path / "key.yml")

    def play(inventory: Path = inventory) -> tuple[int, str]:
        return ansible_playbook(tmp_path, "-i", str(inventory), str(playbook), timeout=300)

    rc, output = play()
    assert rc == 0, output[-6000:]
    downloads = task_results(output, "Download the repository key files")
    assert len(downloads) == 2, "one download per distinct URL"
    assert all(line.startswith("changed: [") for line in downloads), downloads
    assert "skipping: [node_unmanaged]" in task_results(
        output, "Install the repository signing key"
    )
    verified = sorted(cache.glob(f"*.{pinned}.asc"))
    assert ["_mirror_" in path.name for path in verified] == [True, False]
    for path in verified:
        # gpg, not gpufleet's code, reads what the hosts would get: the pinned key alone.
        assert gpg_fingerprints(path.read_text()) == [pinned]
    downloaded = [path for path in cache.iterdir() if not path.name.endswith(".asc")]
    assert sorted(len(gpg_fingerprints(path.read_text())) for path in downloaded) == [1, 2]
    kept = {path: path.read_bytes() for path in verified}
    # Each managed host got the verified key alone; the unmanaged one nothing.
    for name in ("node_a", "node_b", "node_m"):
        assert gpg_fingerprints((tmp_path / f"{name}.asc").read_text()) == [pinned]
    assert not (tmp_path / "node_unmanaged.asc").exists()

    # Nothing new: nothing changes.
    rc, output = play()
    assert rc == 0, output[-6000:]
    assert {counts["changed"] for counts in recap(output).values()} == {0}, output[-6000:]

    # The vendor re-publishes the file (here: the keys in another order). The download
    # changes; the verified key, which is all the hosts see, does not.
    (published / "both.asc").write_text(intruder_key + pinned_key)
    rc, output = play()
    assert rc == 0, output[-6000:]
    assert any(
        line.startswith("changed:")
        for line in task_results(output, "Download the repository key files")
    )
    keep = task_results(output, "Keep only the key with the pinned fingerprint")
    assert keep and not [line for line in keep if not line.startswith("ok:")], keep
    assert {path: path.read_bytes() for path in verified} == kept

    # A mirror that serves another key than the pin: refused before any host changes.
    wrong = {"3bf863cc.pub": intruder, "D42D0685.pub": intruder}
    hosts["node_m"] = {**hosts["node_m"], "dcgm_exporter_repo_key_fingerprint": wrong}
    rc, output = play(write_inventory(tmp_path / "wrong-pin.yml", hosts))
    assert rc != 0
    flat = " ".join(output.split())
    assert f"holds no key with fingerprint {intruder}; it holds {pinned}" in flat
    assert "/mirror/" in flat and "Nothing was changed on the hosts" in flat
    assert not list(cache.glob(f"*.{intruder}.asc")), "no verified file for a refused key"
    assert gpg_fingerprints((tmp_path / "node_m.asc").read_text()) == [pinned]


# --- counters file -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_counters_csv_is_valid_and_uses_known_fields_only(rendered, name: str) -> None:
    rows = counter_rows(scenario(rendered, name))
    assert rows, "no counters rendered"
    for row in rows:
        assert len(row) == 3, f"not field, type, help: {row}"
        field, kind, help_text = row
        assert field in KNOWN_FIELDS, f"{field} is not a DCGM field from the reference"
        assert kind in {"gauge", "counter", "label"}
        assert help_text
    fields = [row[0] for row in rows]
    assert len(fields) == len(set(fields)), "duplicate fields"


def test_curated_counters_cover_what_the_issue_asks_for(rendered) -> None:
    fields = {row[0] for row in counter_rows(scenario(rendered, "pkg_default"))}
    wanted = {
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_TOTAL",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK",
    }
    assert wanted <= fields, wanted - fields


def test_profiling_counters_follow_the_toggle(rendered) -> None:
    off = {row[0] for row in counter_rows(scenario(rendered, "pkg_default"))}
    on = {row[0] for row in counter_rows(scenario(rendered, "pkg_profiling"))}
    assert not {field for field in off if field.startswith("DCGM_FI_PROF_")}
    assert {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"} <= on
    assert "DCGM_FI_DEV_RETIRED_PENDING" in on, "extra counters are appended"


# --- systemd units ---------------------------------------------------------------------


def test_package_unit_grants_cap_sys_admin_only_with_profiling(rendered) -> None:
    plain = unit_lines(scenario(rendered, "pkg_default"), "dcgm-exporter.service")
    profiling = unit_lines(scenario(rendered, "pkg_profiling"), "dcgm-exporter.service")
    assert "CapabilityBoundingSet=" in plain
    assert "AmbientCapabilities=" in plain
    assert not [line for line in plain if "CAP_SYS_ADMIN" in line]
    assert "AmbientCapabilities=CAP_SYS_ADMIN" in profiling
    assert "CapabilityBoundingSet=CAP_SYS_ADMIN" in profiling


def test_package_unit_is_sandboxed_with_gpu_devices_allowed(rendered) -> None:
    lines = unit_lines(scenario(rendered, "pkg_default"), "dcgm-exporter.service")
    for expected in (
        "User=dcgm-exporter",
        "DevicePolicy=closed",
        "PrivateDevices=no",
        "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=/dev/nvidia-uvm rw",
        "DeviceAllow=char-nvidia-frontend rw",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
    ):
        assert expected in lines, expected
    assert not [line for line in lines if line.startswith("DeviceAllow=/dev/nvidia0")]


def test_package_unit_lists_each_gpu_from_the_inventory_count(rendered) -> None:
    lines = unit_lines(scenario(rendered, "pkg_profiling"), "dcgm-exporter.service")
    gpus = [line for line in lines if re.fullmatch(r"DeviceAllow=/dev/nvidia\d+ rw", line)]
    assert gpus == [f"DeviceAllow=/dev/nvidia{index} rw" for index in range(4)]
    assert "DeviceAllow=char-nvidia-frontend rw" not in lines


def test_command_line(rendered) -> None:
    default = exec_start(scenario(rendered, "pkg_default"), "dcgm-exporter.service")
    assert default[0] == "/usr/bin/dcgm-exporter"
    assert "--collect-interval=15000" in default
    assert "--kubernetes=false" in default
    assert "--address=0.0.0.0:9400" in default
    assert "--hpc-job-mapping-dir=/run/gpufleet/dcgm-job-map" in default
    assert "--collectors=/etc/gpufleet/dcgm-exporter/dcgm-counters.csv" in default
    unwanted = ("--remote-hostengine-info", "--web-config")
    assert not [arg for arg in default if arg.startswith(unwanted)]

    remote = exec_start(scenario(rendered, "pkg_profiling"), "dcgm-exporter.service")
    assert "--collect-interval=30000" in remote, "collect interval follows the scrape interval"
    assert "--remote-hostengine-info=localhost:5555" in remote
    assert "--address=[::]:9400" in remote
    lines = unit_lines(scenario(rendered, "pkg_profiling"), "dcgm-exporter.service")
    assert "After=nvidia-dcgm.service" in lines

    no_map = exec_start(scenario(rendered, "pkg_no_jobmap"), "dcgm-exporter.service")
    assert not [arg for arg in no_map if arg.startswith("--hpc-job-mapping-dir")]


def test_collect_interval_is_computed_from_the_scrape_interval(rendered) -> None:
    assert read_values(scenario(rendered, "pkg_default"))["collect_interval_ms"] == 15000
    assert read_values(scenario(rendered, "pkg_profiling"))["collect_interval_ms"] == 30000


def test_container_unit_never_pulls_and_runs_by_digest(rendered) -> None:
    path = scenario(rendered, "ctr_podman")
    command = exec_start(path, "dcgm-exporter-container.service")
    assert command[:2] == ["/usr/bin/podman", "run"]
    assert "--pull=never" in command
    image = f"nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless@{DIGEST}"
    assert image in command
    # Image first, then the exporter's own flags.
    assert command.index("--collect-interval=15000") > command.index(image)
    assert "--device=nvidia.com/gpu=all" in command
    assert "--cap-add=SYS_ADMIN" not in command
    assert "--web-config-file=/etc/gpufleet/dcgm-exporter/web-config.yml" in command
    assert "--volume=/run/gpufleet/dcgm-job-map:/run/gpufleet/dcgm-job-map:ro" in command
    text = (path / "dcgm-exporter-container.service").read_text().replace("\\\n", " ")
    exec_lines = [line for line in text.splitlines() if line.startswith("Exec")]
    assert len(exec_lines) == 3
    assert not [line for line in exec_lines if " pull " in f"{line} "], "no pull at start"

    docker = exec_start(
        scenario(rendered, "ctr_docker_profiling"), "dcgm-exporter-container.service"
    )
    assert docker[:2] == ["/usr/bin/docker", "run"]
    assert "--gpus=all" in docker
    assert "--cap-add=SYS_ADMIN" in docker, "profiling needs SYS_ADMIN"
    mirrored = "registry.example:5000/nvidia/k8s/dcgm-exporter"
    assert f"{mirrored}:4.5.3-4.8.2-distroless@{DIGEST}" in docker


UNIT_FILES = ["dcgm-exporter.service", "dcgm-exporter-container.service"]


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
@pytest.mark.parametrize(
    "name", ["pkg_default", "pkg_profiling", "ctr_podman", "ctr_docker_profiling"]
)
def test_units_pass_systemd_analyze_verify(rendered, name: str, tmp_path: Path) -> None:
    unit = "dcgm-exporter-container.service" if name.startswith("ctr") else "dcgm-exporter.service"
    text = (scenario(rendered, name) / unit).read_text()
    # The executables do not exist here; everything else is checked as written.
    text = re.sub(r"(ExecStart(?:Pre)?=-?|ExecStop=)/usr/bin/\S+", r"\1/bin/true", text)
    copy = tmp_path / "dcgm-exporter.service"
    copy.write_text(text)
    assert not systemd_verify_problems(copy)


# --- web config, repository ---------------------------------------------------------------


def test_web_config_has_tls_and_a_verifiable_bcrypt_hash(rendered) -> None:
    config = yaml.safe_load((scenario(rendered, "ctr_podman") / "web-config.yml").read_text())
    assert config["tls_server_config"]["cert_file"] == "/etc/gpufleet/dcgm-exporter/tls.crt"
    hashed = config["basic_auth_users"]["prometheus"]
    assert bcrypt.checkpw(b"s3cret", hashed.encode())


def test_repository_definitions(rendered) -> None:
    default = scenario(rendered, "pkg_default")
    values = read_values(default)
    if values["distribution"] == "Ubuntu":
        distro = "ubuntu" + values["distribution_version"].replace(".", "")
    elif values["os_family"] == "RedHat":
        distro = "rhel" + values["distribution_major_version"]
    else:
        distro = "debian" + values["distribution_major_version"]
    base = "https://developer.download.nvidia.com/compute/cuda/repos"
    assert values["repo_url"] == f"{base}/{distro}/{values['repo_url'].rsplit('/', 1)[1]}"
    sources = (default / "cuda.sources").read_text()
    assert f"URIs: {values['repo_url']}/" in sources
    assert "Suites: /" in sources
    assert "Signed-By: /etc/apt/keyrings/gpufleet-cuda.asc" in sources
    repo = (default / "cuda.repo").read_text()
    assert f"baseurl={values['repo_url']}" in repo
    assert "gpgcheck=1" in repo
    mirror = read_values(scenario(rendered, "pkg_profiling"))["repo_url"]
    assert mirror.startswith("http://mirror.example/nvidia/cuda/repos/" + distro + "/")


def test_package_versions_are_pinned_as_a_pair(rendered) -> None:
    plain = read_values(scenario(rendered, "pkg_default"))["package_specs"]
    assert plain["Debian"] == [
        "datacenter-gpu-manager-4-core=*4.5.3-*",
        "datacenter-gpu-manager-exporter=*4.8.2-*",
    ]
    assert plain["RedHat"] == [
        "datacenter-gpu-manager-4-core-4.5.3",
        "datacenter-gpu-manager-exporter-4.8.2",
    ]
    profiling = read_values(scenario(rendered, "pkg_profiling"))["package_specs"]
    assert "datacenter-gpu-manager-4-proprietary=*4.5.3-*" in profiling["Debian"]
    assert "datacenter-gpu-manager-4-proprietary-4.5.3" in profiling["RedHat"]


# --- whole role: syntax check, check mode, lint-clean templates ---------------------------------


def test_playbook_using_the_role_passes_syntax_check(tmp_path: Path) -> None:
    playbook = tmp_path / "site.yml"
    playbook.write_text(
        textwrap.dedent(
            """\
            - name: DCGM exporter on GPU nodes
              hosts: all
              roles:
                - role: dcgm_exporter
            """
        )
    )
    rc, output = ansible_playbook(
        tmp_path, "--syntax-check", "-i", "localhost,", str(playbook), timeout=300
    )
    assert rc == 0, output


def test_whole_role_runs_in_check_mode(tmp_path: Path) -> None:
    """Argument specs, preflight, every task and the handler guards, changing nothing."""
    inventory = write_inventory(
        tmp_path / "inventory.yml",
        {
            "check_mode_host": {
                "dcgm_exporter_install_method": "container",
                "dcgm_exporter_image_digest": DIGEST,
                "dcgm_exporter_basic_auth_users": {"prometheus": "s3cret"},
                "dcgm_exporter_hpc_job_mapping_dir": str(tmp_path / "run" / "job-map"),
                "dcgm_exporter_slurm_prolog_dir": str(tmp_path / "slurm" / "prolog.d"),
                "dcgm_exporter_slurm_epilog_dir": str(tmp_path / "slurm" / "epilog.d"),
            }
        },
    )
    playbook = tmp_path / "check.yml"
    playbook.write_text("- name: Whole role\n  hosts: all\n  roles:\n    - role: dcgm_exporter\n")
    rc, output = ansible_playbook(tmp_path, "--check", "-i", str(inventory), str(playbook))
    assert rc == 0, output[-6000:]
    assert "Validating arguments against arg spec" in output
    assert recap(output)["check_mode_host"]["failed"] == 0
    assert not (tmp_path / "slurm").exists(), "check mode changed the host"
    assert not (tmp_path / "run").exists(), "check mode changed the host"


# --- the Slurm prolog and epilog, run for real ---------------------------------------------------

SHELLS = [shell for shell in ("dash", "bash") if shutil.which(shell)]


@pytest.fixture(scope="module")
def scripts(rendered) -> tuple[Path, Path]:
    path = scenario(rendered, "pkg_default")
    return path / "prolog.sh", path / "epilog.sh"


def run_script(
    shell: str,
    script: Path,
    map_dir: Path,
    job: str | None,
    gpus: str | None = None,
    variable: str = "SLURM_JOB_GPUS",
    user: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "GPUFLEET_DCGM_JOB_MAP_DIR": str(map_dir)}
    if job is not None:
        env["SLURM_JOB_ID"] = job
    if gpus is not None:
        env[variable] = gpus
    env.update(extra_env or {})
    command = [shell, str(script)]
    if user:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def start_script(shell: str, script: Path, map_dir: Path, job: str, gpus: str) -> subprocess.Popen:
    env = {
        "PATH": "/usr/bin:/bin",
        "GPUFLEET_DCGM_JOB_MAP_DIR": str(map_dir),
        "SLURM_JOB_ID": job,
        "SLURM_JOB_GPUS": gpus,
        # 24 prologs queue on one lock: on a loaded machine the last waits longer than
        # the 10 s default (test_busy_lock_never_fails_the_job covers that timeout).
        "GPUFLEET_DCGM_JOB_MAP_LOCK_TIMEOUT": "120",
    }
    return subprocess.Popen(
        [shell, str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def mapping(map_dir: Path) -> dict[str, list[str]]:
    """The mapping files dcgm-exporter would read (names ^\\d+(\\.\\d+)?$)."""
    return {
        path.name: path.read_text().splitlines()
        for path in sorted(map_dir.iterdir())
        if re.fullmatch(r"\d+(\.\d+)?", path.name) and path.is_file()
    }


@pytest.mark.parametrize("shell", SHELLS)
def test_scripts_parse(scripts, shell: str) -> None:
    for script in scripts:
        run = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_two_jobs_sharing_a_node(scripts, shell: str, tmp_path: Path) -> None:
    prolog, epilog = scripts
    map_dir = tmp_path / "map"
    assert run_script(shell, prolog, map_dir, "101", "0,1").returncode == 0
    assert run_script(shell, prolog, map_dir, "102", "1,2").returncode == 0
    assert mapping(map_dir) == {"0": ["101"], "1": ["101", "102"], "2": ["102"]}
    # Idempotent: a second prolog run changes nothing.
    assert run_script(shell, prolog, map_dir, "101", "0,1").returncode == 0
    assert sorted(mapping(map_dir)["1"]) == ["101", "102"]
    assert mapping(map_dir)["0"] == ["101"]
    # The epilog removes only its own job; emptied files disappear.
    assert run_script(shell, epilog, map_dir, "101", "0,1").returncode == 0
    assert mapping(map_dir) == {"1": ["102"], "2": ["102"]}
    assert run_script(shell, epilog, map_dir, "101", "0,1").returncode == 0
    assert mapping(map_dir) == {"1": ["102"], "2": ["102"]}
    assert run_script(shell, epilog, map_dir, "102", "1,2").returncode == 0
    assert mapping(map_dir) == {}
    assert not [path for path in map_dir.iterdir() if path.name.startswith(".tmp")]


@pytest.mark.parametrize("shell", SHELLS)
def test_concurrent_jobs_lose_no_update(scripts, shell: str, tmp_path: Path) -> None:
    prolog, epilog = scripts
    map_dir = tmp_path / "map"
    map_dir.mkdir()
    jobs = [str(1000 + number) for number in range(24)]
    running = [start_script(shell, prolog, map_dir, job, "0,1,2,3") for job in jobs]
    assert [process.wait(timeout=60) for process in running] == [0] * len(jobs)
    for gpu in "0123":
        assert sorted(mapping(map_dir)[gpu]) == jobs
    leaving = jobs[::2]
    running = [start_script(shell, epilog, map_dir, job, "0,1,2,3") for job in leaving]
    assert [process.wait(timeout=60) for process in running] == [0] * len(leaving)
    for gpu in "0123":
        assert sorted(mapping(map_dir)[gpu]) == jobs[1::2]


@pytest.mark.parametrize(
    ("variable", "gpus", "expected"),
    [
        ("SLURM_JOB_GPUS", "0-2,5", ["0", "1", "2", "5"]),
        ("SLURM_STEP_GPUS", "3", ["3"]),
        ("CUDA_VISIBLE_DEVICES", "1,GPU-7099682b-a20d-2bcc-74ab-b9060454d81e", ["1"]),
        ("SLURM_JOB_GPUS", "2.1", ["2.1"]),
    ],
)
def test_gpu_lists(scripts, variable: str, gpus: str, expected: list[str], tmp_path: Path) -> None:
    prolog, _ = scripts
    map_dir = tmp_path / "map"
    run = run_script(SHELLS[0], prolog, map_dir, "77", gpus, variable)
    assert run.returncode == 0
    assert mapping(map_dir) == {gpu: ["77"] for gpu in expected}


def test_epilog_without_gpu_list_still_removes_the_job(scripts, tmp_path: Path) -> None:
    prolog, epilog = scripts
    map_dir = tmp_path / "map"
    run_script(SHELLS[0], prolog, map_dir, "5", "0,1")
    run_script(SHELLS[0], prolog, map_dir, "6", "1")
    assert run_script(SHELLS[0], epilog, map_dir, "5").returncode == 0
    assert mapping(map_dir) == {"1": ["6"]}


@pytest.mark.parametrize("job", [None, "", "12_3", "abc"])
def test_no_or_bad_job_id_does_nothing(scripts, job: str | None, tmp_path: Path) -> None:
    prolog, _ = scripts
    map_dir = tmp_path / "map"
    run = run_script(SHELLS[0], prolog, map_dir, job, "0")
    assert run.returncode == 0
    assert not map_dir.exists()


def test_job_without_gpus_does_nothing(scripts, tmp_path: Path) -> None:
    prolog, _ = scripts
    map_dir = tmp_path / "map"
    assert run_script(SHELLS[0], prolog, map_dir, "9").returncode == 0
    assert not map_dir.exists()


@pytest.mark.parametrize("shell", SHELLS)
def test_unwritable_directory_never_fails_the_job(scripts, shell: str, tmp_path: Path) -> None:
    prolog, epilog = scripts
    # A path below a regular file cannot be created, even by root.
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    for script in (prolog, epilog):
        run = run_script(shell, script, blocker / "map", "31", "0")
        assert run.returncode == 0, run.stderr
    assert "cannot create" in run_script(shell, prolog, blocker / "map", "31", "0").stderr

    # A read-only directory with an existing mapping. Root ignores permissions, so as
    # root the scripts run as nobody, from a directory nobody can reach (pytest's own
    # temporary directories are private to root).
    user = None
    base = tmp_path
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: cannot drop privileges")
        user = "65534"
        base = Path(tempfile.mkdtemp(prefix="gpufleet-dcgm-test-"))
        base.chmod(0o755)
    try:
        copies = []
        for script in (prolog, epilog):
            copies.append(base / script.name)
            shutil.copy(script, copies[-1])
            copies[-1].chmod(0o755)
        map_dir = base / "ro"
        run_script(shell, copies[0], map_dir, "40", "0")
        map_dir.chmod(0o555)
        for script in copies:
            run = run_script(shell, script, map_dir, "41", "0", user=user)
            assert run.returncode == 0, run.stderr
            assert "could not" in run.stderr
        assert mapping(map_dir) == {"0": ["40"]}
        map_dir.chmod(0o755)
    finally:
        if base != tmp_path:
            shutil.rmtree(base)


def test_busy_lock_never_fails_the_job(scripts, tmp_path: Path) -> None:
    if not shutil.which("flock"):
        pytest.skip("flock not installed")
    prolog, _ = scripts
    map_dir = tmp_path / "map"
    map_dir.mkdir()
    holder = subprocess.Popen(["flock", str(map_dir / ".lock"), "sleep", "30"])
    try:
        for _ in range(50):  # wait until the holder has the lock
            probe = subprocess.run(["flock", "-n", str(map_dir / ".lock"), "true"])
            if probe.returncode != 0:
                break
            subprocess.run(["sleep", "0.1"])
        run = run_script(
            SHELLS[0],
            prolog,
            map_dir,
            "50",
            "0",
            extra_env={"GPUFLEET_DCGM_JOB_MAP_LOCK_TIMEOUT": "1"},
        )
        assert run.returncode == 0
        assert "could not" in run.stderr
        assert mapping(map_dir) == {}
    finally:
        holder.kill()
        holder.wait()
