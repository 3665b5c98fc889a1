"""The node list's custom labels (``labels:``) on every node-level rule and alert.

gpufleet.rule_labels (filter gpufleet_rule_labels) adds the label names the inventory
plugin publishes (gpufleet_node_label_names, the prometheus role's prometheus_node_labels)
to every `by (...)` list naming `node` and every `group_left/group_right (...)` list naming
`rack` in the expressions of the shipped rule files, and nothing else. These tests check
the function on small expressions, that no names deploy each file byte for byte as
shipped, that the rendered files pass both promtool majors and that, rendered with
[site, hall], NodeDown, GpuTemperatureNearLimit, GpuFaultOnNode, the Slurm alerts and the
gpu:/node: rollups carry each node's own values while cluster rollups are not split; the
inventory publishes the sorted union of the names, the node list refuses a name
gpufleet's rules use, and the role installs the rendered files.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.utils.unsafe_proxy import wrap_var
from render_role import ROLES, evaluate, installed_rule_file, template_value
from test_rules import promtool  # noqa: F401  (the two-major promtool fixture)

from gpufleet import rule_labels
from gpufleet.inventory import build_inventory
from gpufleet.nodelist import RESERVED_LABELS, NodeListError, parse_node_list

RULES_DIR = ROLES / "prometheus" / "files" / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.rules.yml"))
NAMES = ["site", "hall"]


def _rewrite(expr: str, names: list[str] | None = None) -> str:
    return rule_labels.rewrite_expr(expr, NAMES if names is None else names)


# --- the pure function ---------------------------------------------------------------


def test_a_node_level_by_list_gets_the_names_once_in_order() -> None:
    assert _rewrite("max by (cluster, rack, node) (up)") == (
        "max by (cluster, rack, node, site, hall) (up)"
    )
    assert _rewrite("sum(x) by (node)") == "sum(x) by (node, site, hall)"
    assert _rewrite('count_values by (cluster, node, gpu) ("xid", x)') == (
        'count_values by (cluster, node, gpu, site, hall) ("xid", x)'
    )
    assert (
        _rewrite("max by (cluster, node, site) (up)") == "max by (cluster, node, site, hall) (up)"
    )
    assert _rewrite("max by(node,) (up)") == "max by(node, site, hall) (up)"


def test_groupings_without_node_are_left_alone() -> None:
    for expr in (
        "sum by (cluster) (node:up:max)",
        'sum by (cluster, rack) (node:up:max{rack!=""})',
        "sum by (cluster, partition) (x * on (cluster, node) group_right y)",
        "sum without (reason) (x)",
        "x and on (cluster, node) y",
        "x - ignoring (sensor) group_left y",
        "x * on (cluster, node, job_id) group_left (user, account, partition) y",
        "max by (nodes) (x)",
        "sum by (cluster) (node_up_by (node))",
    ):
        assert _rewrite(expr) == expr, expr


def test_a_join_copying_the_rack_copies_the_names_too() -> None:
    assert _rewrite("x * on (cluster, node) group_left (rack) y") == (
        "x * on (cluster, node) group_left (rack, site, hall) y"
    )
    assert _rewrite("x * on (cluster, node, gpu) group_right (rack, gpu_model) y") == (
        "x * on (cluster, node, gpu) group_right (rack, gpu_model, site, hall) y"
    )


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_no_names_deploy_the_file_as_shipped(path: Path) -> None:
    text = path.read_text()
    assert rule_labels.with_node_labels(text, [], path.name) == text
    assert rule_labels.with_node_labels(text, None, path.name) == text


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_rendering_is_idempotent_and_changes_expressions_only(path: Path) -> None:
    text = path.read_text()
    once = rule_labels.with_node_labels(text, NAMES, path.name)
    assert rule_labels.with_node_labels(once, NAMES, path.name) == once
    before, after = yaml.safe_load(text), yaml.safe_load(once)
    for group_before, group_after in zip(before["groups"], after["groups"], strict=True):
        for rule_before, rule_after in zip(
            group_before["rules"], group_after["rules"], strict=True
        ):
            assert {**rule_after, "expr": rule_before["expr"]} == rule_before
            assert rule_after["expr"] == _rewrite(rule_before["expr"])
    # Comments stay: the line count only changes where an expression does (never).
    assert len(once.splitlines()) == len(text.splitlines())
    kept = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert kept == [line for line in once.splitlines() if line.lstrip().startswith("#")]


def test_every_node_level_list_of_the_shipped_rules_gets_the_names() -> None:
    lists = re.compile(r"\b(by|group_left|group_right)\s*\(([^()]*)\)")
    for path in RULE_FILES:
        rendered = yaml.safe_load(rule_labels.with_node_labels(path.read_text(), NAMES))
        for group in rendered["groups"]:
            for rule in group["rules"]:
                for keyword, inner in lists.findall(rule["expr"]):
                    items = [item.strip() for item in inner.split(",")]
                    if "node" in items or (keyword != "by" and "rack" in items):
                        assert items[-2:] == NAMES, (path.name, rule.get("record"), inner)
                    else:
                        assert not set(NAMES) & set(items), (path.name, inner)


def test_the_global_tier_is_unchanged() -> None:
    """It reads rack/partition/gpu_model/cluster rollups (never split) and node: series,
    which the shards recorded with the labels already."""
    path = RULES_DIR / "gpufleet-global.rules.yml"
    assert rule_labels.with_node_labels(path.read_text(), NAMES, path.name) == path.read_text()


@pytest.mark.parametrize(
    "names",
    [
        "site",
        {"site": "x"},
        ["2site"],
        ["site-a"],
        [""],
        ["__site"],
        ["node"],
        ["rack"],
        ["gpu"],
        ["severity"],
        ["problem"],
        ["site", "site"],
        [1],
        ["site\n"],
    ],
)
def test_bad_names_are_refused(names: object) -> None:
    problems = rule_labels.name_problems(names)
    assert problems and all("prometheus_node_labels" in problem for problem in problems)
    with pytest.raises(ValueError, match="prometheus_node_labels"):
        rule_labels.with_node_labels(RULE_FILES[0].read_text(), names)


def test_a_file_that_is_no_rule_file_is_refused() -> None:
    for text in ("groups: [", "{}", "groups:\n  - name: g\n    rules:\n      - record: a:b:c\n"):
        with pytest.raises(ValueError):
            rule_labels.with_node_labels(text, NAMES, "bad.rules.yml")


# Every label name the shipped rules group by, match on, copy or set: a custom label of
# that name would collide (the node list refuses it, and so does prometheus_node_labels).
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
_LABEL_REPLACE = re.compile(r'label_replace\(.*?,\s*"(\w+)",\s*"[^"]*",\s*"(\w*)"', re.S)


def _used_labels() -> set[str]:
    used: set[str] = set()
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                expr = rule["expr"]
                for inner in _LABEL_LIST.findall(expr):
                    used |= {item.strip() for item in inner.split(",") if item.strip()}
                for selector in re.findall(r"\{([^{}]*)\}", expr):
                    used |= set(_MATCHER.findall(selector))
                for target, source in _LABEL_REPLACE.findall(expr):
                    used |= {target, source} - {""}
                used |= set(re.findall(r'count_values[^(]*\([^()]*\)\s*\(\s*"(\w+)"', expr))
                used |= set(rule.get("labels") or {})
    return used - {"__name__"}


def test_every_label_the_rules_use_is_reserved() -> None:
    used = _used_labels()
    assert {"node", "gpu", "xid", "severity", "problem", "job_id", "scope"} <= used
    assert used - set(RESERVED_LABELS) == set()


# --- promtool on the rendered files ---------------------------------------------------


def _render_all(tmp_path: Path) -> list[str]:
    names = []
    for path in RULE_FILES:
        (tmp_path / path.name).write_text(
            rule_labels.with_node_labels(path.read_text(), NAMES, path.name)
        )
        names.append(path.name)
    return names


def _promtool(promtool: Path, tmp_path: Path, *args: str) -> None:  # noqa: F811
    result = subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_rules_pass_promtool_check(promtool: Path, tmp_path: Path) -> None:  # noqa: F811
    for name in _render_all(tmp_path):
        _promtool(promtool, tmp_path, "check", "rules", name)


def _series(metric: str, node: str, labels: str, values: str) -> dict[str, str]:
    own = {
        "gpu001": 'rack="r1", site="berlin", hall="h1"',
        "gpu002": 'rack="r2", site="berlin", hall="h2"',
    }
    job = "node" if metric.startswith(("up", "node_")) else "slurm"
    if job == "slurm":
        # The Slurm exporter's target is the controller: its own rack and site, no hall.
        target = 'instance="slurmctl:9341", rack="r9", site="hq"'
    else:
        target = f'instance="{node}:9100", gpu_model="H100", {own[node]}'
    return {
        "series": f'{metric}{{job="{job}", cluster="c1", node="{node}", {target}{labels}}}',
        "values": values,
    }


# gpu001 (site berlin, hall h1) goes down at minute 2; gpu002 (hall h2) has two hot GPUs
# (0, 1) and two with a critical XID (1, 2), Slurm has it down and job 7 on its GPU 0.
INPUT = [
    _series("up", "gpu001", "", "1 1 0x15"),
    _series("up", "gpu002", "", "1x17"),
    *[
        _series("node_gpu_temperature_tlimit_margin_celsius", "gpu002", f', gpu="{gpu}"', "20 3x16")
        for gpu in ("0", "1")
    ],
    _series("node_gpu_temperature_tlimit_margin_celsius", "gpu002", ', gpu="2"', "20x17"),
    *[
        _series(
            "node_gpu_xid_errors_total",
            "gpu002",
            f', gpu="{gpu}", xid="79", critical="true"',
            "0 1x16",
        )
        for gpu in ("1", "2")
    ],
    _series("node_gpu_utilization_percent", "gpu002", ', gpu="0"', "20x17"),
    _series("slurm_job_gpu_index_info", "gpu002", ', job_id="7", gpu="0"', "1x17"),
    _series(
        "slurm_job_gpus_allocated",
        "gpu002",
        ', job_id="7", user="carol", account="chem", partition="gpu"',
        "1x17",
    ),
    _series(
        "slurm_node_state_reason_info",
        "gpu002",
        ', state="down", reason="hw", partition="gpu"',
        "1x17",
    ),
]
ALERTS = (
    "NodeDown|GpuTemperatureNearLimit|GpuXidCritical|GpuFaultOnNode|GpuDegradedOnNode|SlurmNodeDown"
)
H1 = 'site="berlin", hall="h1"'
H2 = 'site="berlin", hall="h2"'
FIRING = 'ALERTS{alertstate="firing", alertname=~"%s"}'
EXPECTED = [
    (
        f"count by (alertname, node, site, hall) ({FIRING % ALERTS})",
        [
            (f'{{alertname="NodeDown", node="gpu001", {H1}}}', 1),
            (f'{{alertname="GpuTemperatureNearLimit", node="gpu002", {H2}}}', 2),
            (f'{{alertname="GpuDegradedOnNode", node="gpu002", {H2}}}', 1),
            (f'{{alertname="GpuXidCritical", node="gpu002", {H2}}}', 2),
            (f'{{alertname="GpuFaultOnNode", node="gpu002", {H2}}}', 1),
            (f'{{alertname="SlurmNodeDown", node="gpu002", {H2}}}', 1),
        ],
    ),
    (
        'gpu:temperature_slowdown_margin_celsius:min{gpu="0"}',
        [
            (
                'gpu:temperature_slowdown_margin_celsius:min{cluster="c1", rack="r2", '
                f'node="gpu002", gpu="0", gpu_model="H100", {H2}}}',
                3,
            )
        ],
    ),
    (
        'node:up:max{node="gpu002"}',
        [(f'node:up:max{{cluster="c1", rack="r2", node="gpu002", gpu_model="H100", {H2}}}', 1)],
    ),
    (
        "slurm_job_gpu:gpu_utilization_percent:max",
        [
            (
                'slurm_job_gpu:gpu_utilization_percent:max{cluster="c1", rack="r2", node="gpu002", '
                'gpu="0", gpu_model="H100", job_id="7", user="carol", account="chem", '
                f'partition="gpu", {H2}}}',
                20,
            )
        ],
    ),
    # Cluster and rack rollups are never split by a custom label.
    ("cluster:nodes:count", [('cluster:nodes:count{cluster="c1"}', 2)]),
    ("cluster:nodes_up:sum", [('cluster:nodes_up:sum{cluster="c1"}', 1)]),
    (
        "rack:nodes:count",
        [
            ('rack:nodes:count{cluster="c1", rack="r1"}', 1),
            ('rack:nodes:count{cluster="c1", rack="r2"}', 1),
        ],
    ),
]


def test_rendered_alerts_and_rollups_carry_each_nodes_labels(
    promtool: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    names = [name for name in _render_all(tmp_path) if name != "gpufleet-global.rules.yml"]
    test = {
        "rule_files": names,
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": INPUT,
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "12m",
                        "exp_samples": [
                            {"labels": labels, "value": value} for labels, value in samples
                        ],
                    }
                    for expr, samples in EXPECTED
                ],
            }
        ],
    }
    (tmp_path / "labels.test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    _promtool(promtool, tmp_path, "test", "rules", "labels.test.yml")


def test_the_shipped_rules_drop_the_labels(promtool: Path, tmp_path: Path) -> None:  # noqa: F811
    """The problem the rendering solves: as shipped, NodeDown has no site."""
    for path in RULE_FILES:
        (tmp_path / path.name).write_text(path.read_text())
    test = {
        "rule_files": ["gpufleet-node.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": INPUT[:2],
                "promql_expr_test": [
                    {
                        "expr": f"count by (alertname, node, site) ({FIRING % 'NodeDown'})",
                        "eval_time": "12m",
                        "exp_samples": [
                            {"labels": '{alertname="NodeDown", node="gpu001"}', "value": 1}
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "shipped.test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    _promtool(promtool, tmp_path, "test", "rules", "shipped.test.yml")


# --- the inventory and the node list --------------------------------------------------


def _node_list(labels: dict[str, object], server_labels: dict[str, object] | None = None) -> dict:
    return {
        "plugin": "gpufleet",
        "cluster": "test",
        "nodes": [
            {"hosts": "gpu01", "address": "10.0.0.1", "rack": "r1", "labels": labels},
            {"hosts": "gpu02", "address": "10.0.0.2", "rack": "r1", "labels": {"site": "b"}},
        ],
        "servers": [{"hosts": "mon01", "address": "10.0.0.9", "labels": server_labels or {}}],
        "monitoring": {"prometheus_hosts": "mon01"},
    }


def test_the_inventory_publishes_the_sorted_union_of_the_names() -> None:
    data = _node_list({"site": "a", "hall": "h1"}, {"room": 3})
    plan = build_inventory(parse_node_list(data, "nodes.gpufleet.yml"))
    assert plan.group_vars["all"]["gpufleet_node_label_names"] == ["hall", "room", "site"]
    plain = build_inventory(parse_node_list(_node_list({}), "nodes.gpufleet.yml"))
    assert plain.group_vars["all"]["gpufleet_node_label_names"] == ["site"]


@pytest.mark.parametrize("name", ["node", "gpu", "severity", "problem", "shard", "job_id", "xid"])
def test_the_node_list_refuses_a_label_the_rules_use(name: str) -> None:
    with pytest.raises(NodeListError, match=f"labels.{name}"):
        parse_node_list(_node_list({name: "x"}), "nodes.gpufleet.yml")


# --- the role --------------------------------------------------------------------------


PREFLIGHT = yaml.safe_load((ROLES / "prometheus" / "tasks" / "preflight.yml").read_text())
CHECK = next(t for t in PREFLIGHT if t["name"] == "Check the custom node label names")


def test_the_role_reads_the_inventory_names() -> None:
    # The example inventory's labels: site and hall.
    assert evaluate("prometheus", "prometheus_node_labels", "mon01") == ["hall", "site"]
    assert (
        evaluate("prometheus", "prometheus_node_labels", "mon01", {"gpufleet_node_label_names": []})
        == []
    )


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_the_role_installs_the_rendered_rules(path: Path) -> None:
    text = path.read_text()
    values = {"_text": wrap_var(text), "item": path.name}
    rendered = installed_rule_file(values)
    assert rendered == rule_labels.with_node_labels(text, ["hall", "site"], path.name)
    shipped = installed_rule_file({**values, "prometheus_node_labels": []})
    assert shipped == text


def test_the_role_installs_node_down_with_the_labels() -> None:
    path = RULES_DIR / "gpufleet-node.rules.yml"
    values = {
        "_text": wrap_var(path.read_text()),
        "item": path.name,
        "prometheus_node_labels": NAMES,
    }
    rendered = installed_rule_file(values)
    rules = {r.get("alert"): r for g in yaml.safe_load(rendered)["groups"] for r in g["rules"]}
    assert (
        'max by (cluster, rack, node, site, hall) (up{node!=""}) == 0' in rules["NodeDown"]["expr"]
    )


def test_the_preflight_check_names_the_problem() -> None:
    condition = CHECK["ansible.builtin.assert"]["that"]
    message = CHECK["ansible.builtin.assert"]["fail_msg"]
    assert evaluate("prometheus", condition, "mon01") is True
    bad = {"prometheus_node_labels": ["site", "gpu"]}
    assert evaluate("prometheus", condition, "mon01", bad) is False
    text = template_value("prometheus", message, "mon01", bad)
    assert "prometheus_node_labels: 'gpu'" in text
