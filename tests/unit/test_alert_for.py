"""prometheus_alert_for: a site's `for:` duration per shipped alert, the rule files static.

gpufleet.alert_for (filters gpufleet_alert_for and gpufleet_alert_for_problems) rewrites
the named alerts' `for:` (or inserts one after the rule's `expr`) and nothing else: these
tests diff the texts, check that every shipped file deploys as shipped with no setting,
that a setting of every alert at once passes both promtool majors and changes when an
alert fires, and that a name matching no alert, a bad duration or SlurmJobGpuIdle
(prometheus_slurm_idle_gpu_duration) fail with one line naming the variable. The role's
own tasks run once under ansible-playbook (the preflight check with its lookups, the
install task's expression, the capacity template).
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.utils.unsafe_proxy import wrap_var
from render_role import (
    ROLES,
    evaluate,
    installed_rule_file,
    render,
    template_value,
    trust_as_template,
)
from test_rules import promtool  # noqa: F401  (the two-major promtool fixture)

from gpufleet import alert_for

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROLES / "prometheus" / "files" / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.rules.yml"))
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def _alert_for(text: str, overrides: object, filename: str = "test.rules.yml") -> str:
    return alert_for.set_durations(text, overrides, filename)


def _problems(overrides: object, texts: dict[str, str] | None = None) -> list[str]:
    if texts is None:
        texts = {path.name: path.read_text() for path in RULE_FILES}
    return alert_for.setting_problems(overrides, texts)


def _alerts(path: Path) -> list[dict]:
    loaded = yaml.safe_load(path.read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"] if "alert" in rule]


SHIPPED = [(path, rule) for path in RULE_FILES for rule in _alerts(path)]
DEDICATED = {"SlurmJobGpuIdle"}


def _changes(before: str, after: str) -> list[tuple[str, int, int, list[str]]]:
    """The differing line ranges: (operation, first line before, last line before, new lines)."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    return [
        (tag, i1, i2, new[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"
    ]


def _rule_lines(text: str, name: str) -> range:
    """The lines of the rule block of alert name (from its `- alert:` to the next rule)."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip() == f"- alert: {name}")
    indent = lines[first].index("-")
    last = first + 1
    while last < len(lines) and not (
        lines[last].strip() and len(lines[last]) - len(lines[last].lstrip()) <= indent
    ):
        last += 1
    return range(first, last)


def test_the_shipped_files_define_alerts() -> None:
    assert len(SHIPPED) > 30
    assert {rule["alert"] for _, rule in SHIPPED} >= DEDICATED


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda path: path.name)
@pytest.mark.parametrize("setting", [{}, None, {"NoSuchAlertHere": "30s"}])
def test_no_setting_for_the_file_deploys_it_as_shipped(path: Path, setting: object) -> None:
    """No entry, no value at all (an emptied variable), or only other files' alerts."""
    text = path.read_text()
    assert _alert_for(text, setting, path.name) == text


@pytest.mark.parametrize(
    "path,rule",
    [pair for pair in SHIPPED if pair[1]["alert"] not in DEDICATED],
    ids=lambda value: value["alert"] if isinstance(value, dict) else value.name,
)
def test_setting_one_alert_changes_its_for_line_only(path: Path, rule: dict) -> None:
    text = path.read_text()
    name = rule["alert"]
    result = _alert_for(text, {name: "42s"}, path.name)
    changes = _changes(text, result)
    block = _rule_lines(text, name)
    assert len(changes) == 1, changes
    operation, first, last, lines = changes[0]
    indent = " " * (text.splitlines()[block.start].index("-") + 2)
    assert lines == [f"{indent}for: 42s\n"]
    if "for" in rule:
        assert operation == "replace" and last == first + 1
        assert text.splitlines()[first] == f"{indent}for: {rule['for']}"
    else:
        # Inserted right after the expr (the line before is the expr's last line).
        assert operation == "insert"
        expr_line = next(i for i in block if text.splitlines()[i].startswith(f"{indent}expr:"))
        after_expr = text.splitlines()[expr_line + 1 : first]
        assert all(line.startswith(indent + " ") for line in after_expr), after_expr
    assert first in block
    loaded = {r["alert"]: r for r in _alerts_of(result)}
    assert loaded[name]["for"] == "42s"


def _alerts_of(text: str) -> list[dict]:
    loaded = yaml.safe_load(text)
    return [rule for group in loaded["groups"] for rule in group["rules"] if "alert" in rule]


def test_a_setting_of_every_alert_leaves_all_else_alone() -> None:
    """Structure, comments and formatting: only the `for:` lines differ, one per alert."""
    setting = {rule["alert"]: "1m" for _, rule in SHIPPED if rule["alert"] not in DEDICATED}
    for path in RULE_FILES:
        text = path.read_text()
        result = _alert_for(text, setting, path.name)
        changed = [line for change in _changes(text, result) for line in change[3]]
        alerts = [rule for rule in _alerts(path) if rule["alert"] not in DEDICATED]
        assert len(changed) == len(alerts), path.name
        assert {line.strip() for line in changed} <= {"for: 1m"}
        removed = [
            line
            for _, first, last, _ in _changes(text, result)
            for line in text.splitlines()[first:last]
        ]
        assert all(line.strip().startswith("for: ") for line in removed), removed


def test_comments_quotes_and_trailing_comments_survive() -> None:
    text = (
        "# head comment\n"
        "groups:\n"
        "  - name: g  # the group\n"
        "    rules:\n"
        "      # about A\n"
        "      - alert: A\n"
        "        expr: up == 0  # plain\n"
        '        for: "5m"   # quoted, with a reason\n'
        "        labels: {severity: warning}\n"
        "      - alert: B\n"
        "        expr: |\n"
        "          up\n"
        "            == 0\n"
        "\n"
        "        # labels follow\n"
        "        labels:\n"
        "          severity: info\n"
        "      - alert: C\n"
        "        expr: up == 2"
    )
    result = _alert_for(text, {"A": "30s", "B": "1m", "C": "2h"})
    assert result == (
        "# head comment\n"
        "groups:\n"
        "  - name: g  # the group\n"
        "    rules:\n"
        "      # about A\n"
        "      - alert: A\n"
        "        expr: up == 0  # plain\n"
        "        for: 30s   # quoted, with a reason\n"
        "        labels: {severity: warning}\n"
        "      - alert: B\n"
        "        expr: |\n"
        "          up\n"
        "            == 0\n"
        "        for: 1m\n"
        "\n"
        "        # labels follow\n"
        "        labels:\n"
        "          severity: info\n"
        "      - alert: C\n"
        "        expr: up == 2\n"
        "        for: 2h\n"
    )


def test_an_alert_in_several_files_is_set_in_each() -> None:
    one = "groups:\n- name: a\n  rules:\n  - alert: Twice\n    expr: up == 0\n    for: 5m\n"
    two = (
        "groups:\n- name: b\n  rules:\n  - alert: Twice\n    expr: up == 1\n"
        "  - alert: Twice\n    expr: up == 2\n    for: 1h\n"
    )
    assert _problems({"Twice": "10s"}, {"one.yml": one, "two.yml": two}) == []
    assert _alert_for(one, {"Twice": "10s"}).count("for: 10s") == 1
    result = _alert_for(two, {"Twice": "10s"})
    assert [rule["for"] for rule in _alerts_of(result)] == ["10s", "10s"]


def test_the_setting_is_checked_against_all_files_together() -> None:
    """An alert of the global tier and one of the shards in one setting: both are known."""
    assert _problems({"NodeDown": "30s", "PrometheusShardDown": "45s"}) == []


def _one_line(problems: list[str], *words: str) -> None:
    assert len(problems) == 1, problems
    assert "\n" not in problems[0]
    assert problems[0].startswith("prometheus_alert_for")
    for word in words:
        assert word in problems[0], problems[0]


def test_an_unknown_alert_name_fails() -> None:
    problems = _problems({"NodeDwn": "30s"})
    _one_line(problems, "NodeDwn", "no alert", "did you mean NodeDown?")
    _one_line(_problems({"Quux": "30s"}), "Quux", "no alert")


@pytest.mark.parametrize(
    "value",
    [
        "5 min", "5min", "1s1m", "1h1h", "1.5m", "-5m", "30", "", "m", "30S",
        "30s\nfor: 0s", "30s ", " 30s", "107000d", 30, 1.5, None, ["30s"],
    ],
)  # fmt: skip
def test_a_bad_duration_fails(value: object) -> None:
    _one_line(_problems({"NodeDown": value}), "NodeDown")
    with pytest.raises(ValueError, match=r"^prometheus_alert_for: NodeDown: "):
        _alert_for(RULES_DIR.joinpath("gpufleet-node.rules.yml").read_text(), {"NodeDown": value})


@pytest.mark.parametrize("value", ["0s", "0m", "0h0m0s", "0ms"])
def test_a_zero_duration_fails(value: str) -> None:
    _one_line(_problems({"NodeDown": value}), "NodeDown", "zero")


@pytest.mark.parametrize("value", ["30s", "2m", "1h", "1h30m", "1ms", "90s", "1d", "2w", "1y"])
def test_good_durations_pass(value: str) -> None:
    assert _problems({"NodeDown": value}) == []


def test_slurm_job_gpu_idle_takes_its_own_variable() -> None:
    problems = _problems({"SlurmJobGpuIdle": "10m"})
    _one_line(problems, "SlurmJobGpuIdle", "prometheus_slurm_idle_gpu_duration")
    slurm = RULES_DIR.joinpath("gpufleet-slurm.rules.yml").read_text()
    with pytest.raises(ValueError, match="prometheus_slurm_idle_gpu_duration"):
        _alert_for(slurm, {"SlurmJobGpuIdle": "10m"}, "gpufleet-slurm.rules.yml")


@pytest.mark.parametrize("setting", [["NodeDown"], "NodeDown=30s"])
def test_a_setting_that_is_no_mapping_fails(setting: object) -> None:
    _one_line(_problems(setting), "mapping")


def test_a_rule_file_with_a_key_twice_is_refused() -> None:
    text = "groups:\n- name: a\n  rules:\n  - alert: A\n    expr: up\n    for: 5m\n    for: 6m\n"
    with pytest.raises(ValueError, match="given twice"):
        _alert_for(text, {"A": "1m"})


def test_every_alert_set_at_once_passes_promtool(promtool: Path, tmp_path: Path) -> None:  # noqa: F811
    setting = {rule["alert"]: "45s" for _, rule in SHIPPED if rule["alert"] not in DEDICATED}
    for path in RULE_FILES:
        (tmp_path / path.name).write_text(_alert_for(path.read_text(), setting, path.name))
    result = subprocess.run(
        [str(promtool), "check", "rules", *(path.name for path in RULE_FILES)],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    for path in RULE_FILES:
        for rule in _alerts(tmp_path / path.name):
            assert rule["for"] == ("30m" if rule["alert"] in DEDICATED else "45s")


NODE_DOWN = {
    "exp_labels": {"severity": "critical", "cluster": "c1", "rack": "r1", "node": "gpu001"},
    "exp_annotations": {
        "summary": "Node gpu001 is down",
        # The annotations keep the shipped wording.
        "description": "No scrape target of node gpu001 (rack r1, cluster c1) has answered "
        "for 3 minutes: the host is down, hung or unreachable. Its GPU and exporter alerts "
        "are inhibited.",
        "runbook_url": "https://github.com/gpufleet/gpufleet/blob/main/docs/alerts.md#nodedown",
    },
}


@pytest.mark.parametrize("setting,fires", [({}, False), ({"NodeDown": "30s"}, True)])
def test_the_setting_changes_when_the_alert_fires(
    promtool: Path,  # noqa: F811
    tmp_path: Path,
    setting: dict,
    fires: bool,
) -> None:
    """gpu001 is down from 2m on: at 3m30s NodeDown fires with 30s, not with the shipped 3m."""
    path = RULES_DIR / "gpufleet-node.rules.yml"
    (tmp_path / path.name).write_text(_alert_for(path.read_text(), setting, path.name))
    up = 'up{job="node", cluster="c1", rack="r1", node="gpu001", instance="gpu001:9100"}'
    test = {
        "rule_files": [path.name],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": up, "values": "1x7 0x20"}],
                "alert_rule_test": [
                    {
                        "eval_time": "3m30s",
                        "alertname": "NodeDown",
                        "exp_alerts": [NODE_DOWN] if fires else [],
                    }
                ],
            }
        ],
    }
    (tmp_path / "node.test.yml").write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [str(promtool), "test", "rules", "node.test.yml"],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


# The role's own expressions, rendered by Ansible's Templar (render_role). The rule texts
# are what the role's lookups return: data, never a template (wrap_var, for 2.18).
INSTANCE_TASKS = yaml.safe_load((ROLES / "prometheus" / "tasks" / "instance.yml").read_text())
INSTALL = next(t for t in INSTANCE_TASKS if t["name"].startswith("Install the rule files"))


PREFLIGHT = yaml.safe_load((ROLES / "prometheus" / "tasks" / "preflight.yml").read_text())
CHECK = next(t for t in PREFLIGHT if t["name"] == "Check the alert durations set per alert name")


def test_the_role_installs_node_down_with_the_sites_duration() -> None:
    path = RULES_DIR / "gpufleet-node.rules.yml"
    text = path.read_text()
    values = {
        "prometheus_alert_for": {"NodeDown": "30s"},
        # The example inventory's custom labels change the by lists too (test_rule_labels.py).
        "prometheus_node_labels": [],
        "_text": wrap_var(text),
        "item": path.name,
    }
    rendered = installed_rule_file(values)
    line = text.splitlines().index("        for: 3m")  # NodeDown's, the file's only 3m
    assert _changes(text, rendered) == [("replace", line, line + 1, ["        for: 30s\n"])]
    node_down = next(rule for rule in _alerts_of(rendered) if rule["alert"] == "NodeDown")
    assert node_down["for"] == "30s"


def test_the_role_installs_the_slurm_file_with_both_settings() -> None:
    path = RULES_DIR / "gpufleet-slurm.rules.yml"
    values = {
        "prometheus_alert_for": {"SlurmNodeDown": "20s"},
        "prometheus_slurm_idle_gpu_duration": "10m",
        "_text": wrap_var(path.read_text()),
        "item": path.name,
    }
    rendered = installed_rule_file(values)
    alerts = {rule["alert"]: rule for rule in _alerts_of(rendered)}
    assert alerts["SlurmNodeDown"]["for"] == "20s"
    assert alerts["SlurmJobGpuIdle"]["for"] == "10m"


def test_the_capacity_alert_takes_the_setting_too() -> None:
    shipped = render("prometheus", "capacity.rules.yml.j2", "mon01")
    rendered = render(
        "prometheus",
        "capacity.rules.yml.j2",
        "mon01",
        {"prometheus_alert_for": {"PrometheusSeriesNearBudget": "5m"}},
    )
    assert [change[3] for change in _changes(shipped, rendered)] == [["        for: 5m\n"]]


def test_the_preflight_check_names_the_problem() -> None:
    texts = {path.name: wrap_var(path.read_text()) for path in RULE_FILES}
    values = {
        **{name: trust_as_template(value) for name, value in CHECK["vars"].items()},
        "__prometheus_rule_texts": texts,
        "prometheus_alert_for": {"NodeDwn": "30s"},
    }
    assert evaluate("prometheus", CHECK["when"], "mon01", values) is True
    message = template_value(
        "prometheus", CHECK["ansible.builtin.assert"]["fail_msg"], "mon01", values
    )
    assert message == (
        "prometheus_alert_for: NodeDwn is no alert of gpufleet's rule files "
        "(did you mean NodeDown?)"
    )
    values["prometheus_alert_for"] = {}
    assert evaluate("prometheus", CHECK["when"], "mon01", values) is False


# The role under ansible-playbook: the preflight check with its lookups of every file,
# the install task's own expression with promtool as its validate, the capacity template.
PLAYBOOK = """
- name: Check and render the rule files as the prometheus role does
  hosts: all
  gather_facts: false
  tasks:
    - name: Run the role's preflight
      ansible.builtin.import_role:
        name: prometheus
        tasks_from: preflight.yml

    - {install}

    - name: Render the capacity rules
      ansible.builtin.template:
        src: {templates}/capacity.rules.yml.j2
        dest: "{out}/{{{{ inventory_hostname }}}}/gpufleet-capacity.rules.yml"
        mode: "0644"
"""
HOSTS = {
    "shipped": {},
    "tuned": {
        "prometheus_alert_for": {
            "NodeDown": "30s",
            "GpuXidCritical": "1m",
            "PrometheusShardDown": "45s",
            "PrometheusSeriesNearBudget": "2m",
        }
    },
    "typo": {"prometheus_alert_for": {"NodeDwn": "30s"}},
    "bad_duration": {"prometheus_alert_for": {"NodeDown": "5 minutes"}},
    "dedicated": {"prometheus_alert_for": {"SlurmJobGpuIdle": "5m"}},
}


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("alert_for")
    out = tmp / "out"
    for host in HOSTS:
        (out / host).mkdir(parents=True)
    # The install task's lookup reads rules/<file> from the playbook's files/.
    (tmp / "files").symlink_to(ROLES / "prometheus" / "files")
    install = {
        "name": INSTALL["name"].replace(" of {{ _instance.name }}", ""),
        "ansible.builtin.copy": {
            **INSTALL["ansible.builtin.copy"],
            "dest": f"{out}/{{{{ inventory_hostname }}}}/{{{{ item | basename }}}}",
            "mode": "0644",
            "validate": "/usr/bin/promtool check rules %s",
        },
        "loop": "{{ _rules.keys() | list }}",
        "vars": {
            **INSTALL["vars"],
            "_names": "{{ _prometheus_rule_files.values() | flatten | unique | list }}",
            "_instance": {"name": "standalone", "mode": "standalone"},
        },
    }
    for key in ("owner", "group"):
        install["ansible.builtin.copy"].pop(key)
    (tmp / "play.yml").write_text(
        PLAYBOOK.format(
            install=json.dumps(install), templates=ROLES / "prometheus" / "templates", out=out
        )
    )
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "prometheus_instances": [{"name": "standalone", "mode": "standalone"}],
            },
            "hosts": HOSTS,
        }
    }
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_CACHE_PLUGIN="memory",
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"),
        ANSIBLE_HOME=str(tmp / "ansible-home"),
        # Ansible requires a UTF-8 locale (tests/unit/gpu sets LC_ALL=C for its own runs).
        LC_ALL="C.UTF-8",
    )
    run = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "inventory.yml", "play.yml"],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    return out, run.stdout + run.stderr


def _failure(output: str, host: str) -> str:
    """The msg of host's failed task (the JSON result on its `fatal:` line)."""
    prefix = f"fatal: [{host}]: FAILED! => "
    line = next(line for line in output.splitlines() if line.startswith(prefix))
    return json.loads(line[len(prefix) :])["msg"]


@pytest.mark.parametrize(
    "host,words",
    [
        ("typo", ["NodeDwn", "did you mean NodeDown?"]),
        ("bad_duration", ["NodeDown", "'5 minutes' is not a Prometheus duration"]),
        ("dedicated", ["SlurmJobGpuIdle", "prometheus_slurm_idle_gpu_duration"]),
    ],
)
def test_the_play_fails_with_one_line(played: tuple[Path, str], host: str, words: list) -> None:
    out, output = played
    message = _failure(output, host)
    _one_line([message], *words)
    assert not any((out / host).iterdir()), "nothing is installed"


def test_the_play_installs_the_files_as_shipped_without_a_setting(
    played: tuple[Path, str],
) -> None:
    out, output = played
    assert "fatal: [shipped]" not in output, output[-6000:]
    for path in RULE_FILES:
        assert (out / "shipped" / path.name).read_text() == path.read_text()
    shipped = render("prometheus", "capacity.rules.yml.j2", "shipped")
    assert (out / "shipped" / "gpufleet-capacity.rules.yml").read_text() == shipped


def test_the_play_installs_the_sites_durations(played: tuple[Path, str]) -> None:
    out, output = played
    assert "fatal: [tuned]" not in output, output[-6000:]
    wanted = HOSTS["tuned"]["prometheus_alert_for"]
    seen = {}
    for path in (out / "tuned").iterdir():
        for rule in _alerts_of(path.read_text()):
            if rule["alert"] in wanted:
                seen[rule["alert"]] = rule.get("for")
    assert seen == wanted
