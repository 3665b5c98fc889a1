"""roles/_common/tasks/zipapp.yml: the node programs a role builds and installs.

A role declares them in its vars/main.yml, _<role>_zipapps ({app, dest, restart,
wanted}), and includes the shared task file from its install step. Ansible finds an app
that gpufleet_node.build does not know, or a restart no handler listens on, only on a
live run; this finds them for every role that ships a zipapp.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from render_role import ROLES, template_value
from role_tasks import common_includes, load, tasks
from role_tasks import declared as declared_settings

from gpufleet_node import build

ZIPAPP = ROLES / "_common" / "tasks" / "zipapp.yml"
KEYS = {"app", "dest", "restart", "wanted"}


def includes(role: str) -> list[tuple[str, dict]]:
    return common_includes(role, "zipapp")


def declared() -> dict[str, list[dict]]:
    return declared_settings("zipapps")


DECLARED = declared()
INCLUDING = sorted(p.name for p in ROLES.iterdir() if includes(p.name))


def handler_topics(role: str) -> set[str]:
    """What the role's handlers are named or listen on."""
    found = set()
    for handler in tasks(load(ROLES / role / "handlers" / "main.yml") or []):
        listen = handler.get("listen") or []
        found |= {handler.get("name"), *([listen] if isinstance(listen, str) else listen)}
    return found - {None}


def shared_tasks() -> dict[str, dict]:
    (outer,) = load(ZIPAPP)
    named = {t["name"]: t for t in tasks(outer["block"] + outer["always"])}
    return {"outer": outer, **named}


def test_the_roles_that_ship_zipapps_are_found():
    assert {"gpu_collector", "slurm_exporter"} <= set(DECLARED)
    assert sorted(DECLARED) == INCLUDING, "a role declares zipapps it never installs, or not"


@pytest.mark.parametrize("role", sorted(DECLARED))
def test_every_zipapp_is_one_the_builder_knows(role: str) -> None:
    zipapps = DECLARED[role]
    assert zipapps, f"_{role}_zipapps is empty"
    for entry in zipapps:
        assert {"app", "dest", "restart"} <= set(entry) <= KEYS, entry
        assert entry["app"] in build.APPS, entry["app"]
        assert isinstance(entry["restart"], bool), entry
        assert isinstance(entry["dest"], str) and entry["dest"], entry
    # One scratch file per app on the controller, one copy per destination on the host.
    assert len({e["app"] for e in zipapps}) == len(zipapps)
    assert len({e["dest"] for e in zipapps}) == len(zipapps)


@pytest.mark.parametrize("role", sorted(DECLARED))
def test_a_restarting_zipapp_reaches_a_handler_of_its_role(role: str) -> None:
    if not any(e["restart"] for e in DECLARED[role]):
        pytest.skip(f"{role}: no zipapp restarts anything")
    (copy,) = [t for t in tasks([shared_tasks()["outer"]]) if t.get("notify")]
    topic = template_value(role, copy["notify"], "localhost", {"ansible_parent_role_names": [role]})
    assert topic == f"restart {role}"
    assert topic in handler_topics(role), f"{role}: no handler listens on {topic!r}"


@pytest.mark.parametrize("role", sorted(DECLARED))
def test_the_zipapps_are_read_from_the_including_role(role: str) -> None:
    """The lookup the shared file makes, in the role's context, and where each goes."""
    outer = shared_tasks()["outer"]
    zipapps = template_value(
        role, outer["vars"]["__common_zipapps"], "localhost", {"ansible_parent_role_names": [role]}
    )
    assert [z["app"] for z in zipapps] == [e["app"] for e in DECLARED[role]]
    for entry in zipapps:
        assert entry["dest"].startswith("/") and "{{" not in entry["dest"], entry


@pytest.mark.parametrize("role", sorted(DECLARED))
def test_the_include_carries_the_install_steps_tags(role: str) -> None:
    """The included tasks run under the tags of the step that imports the task file (an
    include's own tasks get only the tags apply gives them)."""
    steps = load(ROLES / role / "tasks" / "main.yml")
    for name, task in includes(role):
        (step,) = [s for s in steps if s.get("ansible.builtin.import_tasks") == name]
        assert f"{role}_install" in step["tags"]
        apply = task["ansible.builtin.include_role"]["apply"]
        assert apply["tags"] == step["tags"], name


def test_every_app_is_built_once_on_the_controller_whatever_the_host_wants():
    """run_once takes the first host's view: a `when` on the build (or a filter on
    wanted) would leave a later host that wants the app with nothing to copy."""
    shared = shared_tasks()
    scratch = shared["Create a scratch directory on the controller"]
    (build_task,) = [t for t in tasks([shared["outer"]]) if "ansible.builtin.command" in t]
    for task in (scratch, build_task):
        for key, value in {
            "delegate_to": "localhost",
            "run_once": True,
            "become": False,
            "check_mode": False,  # check mode builds too: the copy reports its diff
            "changed_when": False,
        }.items():
            assert task[key] == value, (task["name"], key)
    assert "when" not in build_task
    assert build_task["loop"] == "{{ __common_zipapps }}"
    argv = build_task["ansible.builtin.command"]["argv"]
    assert argv[:5] == [
        "{{ ansible_playbook_python }}",
        "-m",
        "gpufleet_node.build",
        "--app",
        "{{ item.app }}",
    ]
    # This checkout's package: role_path is roles/_common.
    assert (ROLES / "_common" / "../../src/gpufleet_node/build.py").resolve() == Path(
        build.__file__
    ).resolve()
    assert build_task["environment"]["PYTHONPATH"] == "{{ role_path }}/../../src"
    assert build_task["environment"]["PYTHONDONTWRITEBYTECODE"] == "1"


def test_the_copies_notify_only_for_restarting_apps_and_install_only_wanted_ones():
    copies = [t for t in tasks([shared_tasks()["outer"]]) if "ansible.builtin.copy" in t]
    assert len(copies) == 2
    restarting, other = copies
    assert restarting["loop"] == "{{ __common_zipapps | selectattr('restart') | list }}"
    assert restarting["notify"] == "restart {{ ansible_parent_role_names[0] }}"
    assert other["loop"] == "{{ __common_zipapps | rejectattr('restart') | list }}"
    assert "notify" not in other
    for copy in copies:
        args = copy["ansible.builtin.copy"]
        assert (args["owner"], args["group"], args["mode"]) == ("root", "root", "0755")
        assert args["dest"] == "{{ item.dest }}"
        assert copy["when"] == "item.wanted | default(true) | bool"


def test_the_scratch_directory_always_goes():
    shared = shared_tasks()
    (remove,) = shared["outer"]["always"]
    assert remove["ansible.builtin.file"] == {
        "path": "{{ __common_zipapp_dir.path }}",
        "state": "absent",
    }
    assert remove["delegate_to"] == "localhost" and remove["run_once"] is True
    scratch = shared["Create a scratch directory on the controller"]
    assert scratch["register"] == "__common_zipapp_dir"
