"""Every notification reaches a handler of its role, under one spelling of topics.

Ansible finds out that a notified handler does not exist only when the notifying task
changes something, on a live host; this finds it for every task. A topic is spelled
`<verb> <role>` or `<verb> <role> <what>` (restart node_exporter, reload grafana
dashboards), so a reader knows from the notify whose handler runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from role_tasks import tasks

ROLES = Path(__file__).resolve().parents[2] / "roles"
HANDLED = sorted(p.name for p in ROLES.iterdir() if (p / "handlers" / "main.yml").exists())
TOPIC = re.compile(r"(restart|reload|apply|forget) ({role})( [a-z]+)*")


def as_list(value: object) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def release_notify(role: str) -> list[str]:
    """What roles/_common/tasks/upstream_release.yml notifies for the role: the notify of
    its _<role>_release (vars/main.yml)."""
    internal = ROLES / role / "vars" / "main.yml"
    variables = (yaml.safe_load(internal.read_text()) or {}) if internal.is_file() else {}
    return as_list((variables.get(f"_{role}_release") or {}).get("notify"))


def notified(role: str) -> dict[str, list[str]]:
    """topic -> the task files that notify it (an include of _common's upstream_release
    too, with its _<role>_release's notify)."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROLES / role / "tasks").glob("*.yml")):
        for task in tasks(yaml.safe_load(path.read_text())):
            topics = as_list(task.get("notify"))
            include = task.get("ansible.builtin.include_role") or {}
            if include.get("name") == "_common" and include.get("tasks_from") == "upstream_release":
                topics += release_notify(role)
            for topic in topics:
                found.setdefault(topic, []).append(path.name)
    return found


def handler_topics(role: str) -> set[str]:
    handlers = yaml.safe_load((ROLES / role / "handlers" / "main.yml").read_text())
    return {t for h in tasks(handlers) for t in [h.get("name"), *as_list(h.get("listen"))] if t}


@pytest.mark.parametrize("role", HANDLED)
def test_every_notification_reaches_a_handler_of_the_role(role: str) -> None:
    missing = {t: f for t, f in notified(role).items() if t not in handler_topics(role)}
    assert missing == {}, "notified, but no handler has the name or listens"


@pytest.mark.parametrize("role", HANDLED)
def test_topics_name_their_role(role: str) -> None:
    handlers = yaml.safe_load((ROLES / role / "handlers" / "main.yml").read_text())
    spelling = re.compile(TOPIC.pattern.format(role=re.escape(role)))
    for handler in tasks(handlers):
        for topic in as_list(handler.get("listen")):
            assert spelling.fullmatch(topic), f"{handler['name']}: listen {topic!r}"
    for topic in notified(role):
        assert spelling.fullmatch(topic) or "{{" in topic, topic


def test_the_rule_finds_a_missing_handler() -> None:
    assert "restart nobody" not in handler_topics("node_exporter")
    assert not re.compile(TOPIC.pattern.format(role="dcgm_exporter")).fullmatch(
        "restart dcgm-exporter"
    )
