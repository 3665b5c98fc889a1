"""The provisioned Grafana dashboards: structure, valid PromQL, and no unknown metric.

Every PromQL query of every panel and template variable is written into a rule file as
a recording rule (Grafana variables replaced by valid placeholders) and checked with
`promtool check rules`. Every metric name a query reads must be produced by a gpufleet
component: a recording rule in roles/prometheus/files/rules, a series of the GPU
collector, dcgm-exporter's counters file, the Slurm exporter, node_exporter or
Prometheus/Alertmanager themselves (lists built from the sources in this repository).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "roles" / "grafana" / "files" / "dashboards"
RULES = ROOT / "roles" / "prometheus" / "files" / "rules"
FILES = sorted(DASHBOARDS.glob("*.json"))
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
VARIABLES = {"datasource", "cluster", "rack", "partition", "node", "gpu"}
# One job's dashboard selects the job, not nodes: its nodes and GPUs follow from the job.
JOB_VARIABLES = {"datasource", "cluster", "job_id"}

# node_exporter and Prometheus/Alertmanager self-metrics the dashboards read. Each is a
# standard series of those programs (node_exporter 1.5+, Prometheus 2.42+/3.x,
# Alertmanager 0.25+); the list is closed on purpose so a typo fails.
NODE_EXPORTER = {
    "node_cpu_seconds_total",
    "node_memory_MemTotal_bytes",
    "node_memory_MemAvailable_bytes",
    "node_filesystem_avail_bytes",
    "node_filesystem_size_bytes",
    "node_network_receive_bytes_total",
    "node_network_transmit_bytes_total",
    "node_textfile_mtime_seconds",
}
PROMETHEUS = {
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "prometheus_tsdb_head_series",
    "prometheus_tsdb_head_samples_appended_total",
    "prometheus_rule_group_last_duration_seconds",
    "prometheus_rule_group_interval_seconds",
    "prometheus_rule_evaluation_failures_total",
    "prometheus_rule_group_iterations_missed_total",
    "prometheus_notifications_alertmanagers_discovered",
    "prometheus_notifications_dropped_total",
    "prometheus_engine_query_duration_seconds_sum",
    "prometheus_engine_query_duration_seconds_count",
    "prometheus_engine_queries",
    "prometheus_engine_queries_concurrent_max",
    "prometheus_http_requests_total",
    "alertmanager_cluster_members",
    "alertmanager_cluster_failed_peers",
    "alertmanager_alerts",
    "alertmanager_notifications_total",
    "alertmanager_notifications_failed_total",
}
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def panels(dash: dict) -> list[dict]:
    out = []
    for panel in dash["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def queries(dash: dict, kind: str) -> list[tuple[str, str]]:
    """(where, expression) of every query of this datasource type (prometheus/loki)."""
    out = []
    for panel in panels(dash):
        for target in panel.get("targets", []):
            if target.get("datasource", {}).get("type") == kind and target.get("expr"):
                out.append((f"{dash['uid']}: {panel['title']} ({target['refId']})", target["expr"]))
    if kind == "prometheus":
        for var in dash["templating"]["list"]:
            if var["type"] == "query":
                out.append((f"{dash['uid']}: variable {var['name']}", variable_expr(var)))
    return out


def variable_expr(var: dict) -> str:
    """label_values(selector, label) -> selector; query_result(expr) -> expr."""
    query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
    match = re.fullmatch(r"label_values\((.*),\s*\w+\)", query.strip())
    if match:
        return match.group(1)
    match = re.fullmatch(r"query_result\((.*)\)", query.strip(), re.S)
    assert match, f"variable {var['name']}: unsupported query {query}"
    return match.group(1)


def substitute(expr: str) -> str:
    """Grafana variables -> placeholders promtool accepts."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    expr = expr.replace("$__range", "1h").replace("$__auto", "1m")
    expr = expr.replace("${series_capacity}", "3000000")
    return re.sub(r"\$\{?\w+\}?", "x", expr)


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (identifiers that are not functions,
    keywords, label names or durations)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^{}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text
    )  # label lists
    names = set()
    for match in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


def known_metrics() -> set[str]:
    known = set(NODE_EXPORTER) | set(PROMETHEUS)
    for path in RULES.glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            known |= {rule["record"] for rule in group["rules"] if "record" in rule}
    collector = (ROOT / "src/gpufleet_node/gpu_collector/model.py").read_text()
    families = re.search(r"FAMILIES: dict\[.*?\] = \{(.*?)\n\}", collector, re.S).group(1)
    known |= {"node_gpu_" + name for name in re.findall(r'^    "(\w+)":', families, re.M)}
    dcgm = ROOT / "roles/dcgm_exporter/templates/dcgm-counters.csv.j2"
    known |= set(re.findall(r"\b(DCGM_[A-Z0-9_]+)", dcgm.read_text()))
    known |= set(
        re.findall(
            r"\b(DCGM_[A-Z0-9_]+)", (ROOT / "roles/dcgm_exporter/defaults/main.yml").read_text()
        )
    )
    slurm_doc = (ROOT / "docs/slurm-exporter.md").read_text()
    for stem, alternatives, tail in re.findall(r"`(slurm_\w*)\{([\w,]+)\}(\w*)`", slurm_doc):
        known |= {stem + alt + tail for alt in alternatives.split(",")}
    # `slurm_queue_<state>` / `slurm_cores_<state>`: the states are listed in the same row.
    states = re.search(r"states: ([a-z_, ]+);", slurm_doc).group(1).replace(" ", "").split(",")
    known |= {f"slurm_{kind}_{state}" for kind in ("queue", "cores") for state in states}
    # "`slurm_partition_jobs_pending` / `_jobs_running`": a shorthand replaces the tail.
    for line in slurm_doc.splitlines():
        full = None
        for token in re.findall(r"`(_?\w+)`", line):
            if token.startswith("slurm_"):
                full = token
                known.add(token)
            elif token.startswith("_") and full:
                head = "_" + token.split("_")[1]
                known.add(full[: full.rfind(head)] + token)
    return known


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict]:
    return {path.name: load(path) for path in FILES}


def test_the_six_dashboards_exist(dashboards):
    assert set(dashboards) == {
        "cluster-overview.json",
        "node-detail.json",
        "slurm-jobs.json",
        "slurm-job.json",
        "monitoring-health.json",
        "logs.json",
    }


GENERATOR = [DASHBOARDS / "generate.py", *sorted((DASHBOARDS / "boards").glob("*.py"))]
MAX_FUNCTION_LINES = 60


def test_generator_functions_are_short():
    """Dashboards are built from small helpers, not one long function per dashboard."""
    assert len(GENERATOR) > 5, GENERATOR
    long = []
    for path in GENERATOR:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name}() has {lines} lines")
    assert not long, long


def test_committed_json_is_the_generator_output():
    result = subprocess.run(
        [sys.executable, str(DASHBOARDS / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_dashboard_structure(path):
    dash = load(path)
    assert re.fullmatch(r"gpufleet-[a-z-]+", dash["uid"]) and len(dash["uid"]) <= 40
    assert dash["title"] and dash["schemaVersion"] >= 41
    assert dash.get("id") is None, "provisioned dashboards carry no database id"
    names = {var["name"] for var in dash["templating"]["list"]}
    wanted = JOB_VARIABLES if path.name == "slurm-job.json" else VARIABLES
    assert names >= wanted, f"missing variables {wanted - names}"
    ids = [panel["id"] for panel in panels(dash)]
    assert len(ids) == len(set(ids))
    for panel in panels(dash):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24
        if panel["type"] != "row":
            assert panel["targets"], f"{panel['title']} has no query"
            assert panel["datasource"]["uid"] in ("${datasource}", "${loki}")
            for target in panel["targets"]:
                assert target["datasource"]["uid"] in ("${datasource}", "${loki}")


def test_uids_and_titles_are_unique(dashboards):
    assert len({d["uid"] for d in dashboards.values()}) == len(dashboards)
    assert len({d["title"] for d in dashboards.values()}) == len(dashboards)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_hard_coded_instances_or_ports(path):
    text = path.read_text()
    assert not re.search(r":9\d{3}\b", text), "a port in a dashboard"
    assert "instance=" not in text and "instance=~" not in text
    assert not re.search(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b", text), "an IP address"
    assert "localhost" not in text


def test_every_promql_query_parses(tmp_path, dashboards):
    if not Path(PROMTOOL).exists():
        pytest.skip("promtool not installed")
    rules, where = [], []
    for dash in dashboards.values():
        for place, expr in queries(dash, "prometheus"):
            expr = substitute(expr)
            assert "$" not in expr, f"{place}: unreplaced variable in {expr}"
            rules.append({"record": f"dashboard_query_{len(rules)}", "expr": expr})
            where.append(place)
    assert len(rules) > 60
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    # Name the panel behind a failing rule index.
    failing = [where[int(i)] for i in re.findall(r"dashboard_query_(\d+)", result.stderr)]
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{failing}"


def test_every_metric_is_produced_by_gpufleet(dashboards):
    known = known_metrics()
    unknown = {}
    for dash in dashboards.values():
        for place, expr in queries(dash, "prometheus"):
            for name in metric_names(substitute(expr)) - known:
                unknown.setdefault(name, []).append(place)
    assert not unknown, unknown


def test_vendor_agnostic_gpu_panels(dashboards):
    """Raw vendor series only where no recording rule exists (ECC, XID events, PCI ids),
    and then always both vendors side by side."""
    for dash in dashboards.values():
        for place, expr in queries(dash, "prometheus"):
            if "DCGM_" in expr:
                assert "node_gpu_" in expr, f"{place}: DCGM-only query"
            if re.search(r"\bnode_gpu_(?!collector)", expr):
                assert "DCGM_" in expr, f"{place}: collector-only GPU query"


def test_metric_name_extraction():
    expr = (
        'sum by (node, gpu) (rate(node_gpu_xid_errors_total{critical="true"}[5m])) '
        "/ on (cluster) group_left node:gpus_present:count > bool 0"
    )
    assert metric_names(expr) == {"node_gpu_xid_errors_total", "node:gpus_present:count"}


def test_thresholds_and_dashed_lines_asked_for(dashboards):
    node = {p["title"]: p for p in panels(dashboards["node-detail.json"])}

    def steps(title):
        return [s["value"] for s in node[title]["fieldConfig"]["defaults"]["thresholds"]["steps"]]

    def dashed_refs(title):
        out = {}
        for override in node[title]["fieldConfig"]["overrides"]:
            props = {p["id"]: p["value"] for p in override["properties"]}
            if props.get("custom.lineStyle", {}).get("fill") == "dash":
                out[override["matcher"]["options"]] = props.get("color", {}).get("fixedColor")
        return out

    assert steps("GPU utilization") == [None, 70, 90]
    assert steps("GPU temperature") == [None, 70, 80, 85]
    assert steps("Disk usage") == [None, 0.7, 0.85]
    assert dashed_refs("Memory used") == {"B": None}
    assert dashed_refs("GPU memory used per GPU") == {"B": "red"}
    assert dashed_refs("GPU power draw") == {"B": "red"}
    assert node["Disk usage"]["type"] == "gauge"


def test_logql_queries_select_a_stream(dashboards):
    for place, expr in queries(dashboards["logs.json"], "loki"):
        expr = substitute(expr)
        selector = re.search(r"\{([^{}]*)\}", expr)
        assert selector, place
        assert re.search(r'\b\w+="[^"]+"', selector.group(1)) or re.search(
            r'\bsource=~"[^"]+"', selector.group(1)
        ), f"{place}: a stream selector needs a non-empty matcher"
        assert expr.count("(") == expr.count(")"), place


def test_the_job_dashboard_follows_one_job_and_is_linked(dashboards):
    """Every Prometheus panel of the job dashboard is restricted to the chosen job, the Loki
    panel to its nodes, and the Slurm jobs dashboard links each job to it."""
    job = dashboards["slurm-job.json"]
    for place, expr in queries(job, "prometheus"):
        if place.endswith(("variable cluster", "variable job_id")) or expr == IDLE_THRESHOLD:
            continue  # the choice of cluster and job; the site-wide idle threshold
        assert 'job_id="${job_id}"' in expr, f"{place} is not restricted to the job"
    sources = set()
    for place, expr in queries(job, "loki"):
        assert "${job_id}" in expr, place
        if 'source="slurmctld"' in expr:  # the controller is not among the job's nodes
            sources.add("slurmctld")
        else:
            assert 'node=~"${job_nodes}"' in expr and 'source="slurmd"' in expr, place
            sources.add("slurmd")
        # The line filter as Loki reads it: a Go string literal holding an RE2 regex.
        pattern = json.loads(re.search(r'\|~ ("(?:[^"\\]|\\.)*")', expr).group(1))
        names = re.compile(pattern.replace("${job_id}", "123"))
        for line in (
            "_slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=123 uid 1000",
            "sched: Allocate JobId=123 NodeList=gpu01 #CPUs=8",
            "[123.batch] done with job",
            "[123.0] task/cgroup: _memcg_initialize: job: alloc=1024MB",
            "Launching batch job 123 for UID 1000",
            "cgroup v1: created /slurm/uid_1000/job_123",
        ):
            assert names.search(line), (place, line)
        for line in ("JobId=1234 started", "[1230.batch] done", "job 12 ended"):
            assert not names.search(line), (place, line)
    assert sources == {"slurmd", "slurmctld"}
    links = json.dumps(dashboards["slurm-jobs.json"])
    assert links.count("/d/gpufleet-slurm-job/slurm-job?var-job_id=") == 2


IDLE_THRESHOLD = "(max(gpufleet:slurm_idle_gpu_threshold:percent) or vector(5))"


@pytest.mark.parametrize("name", ["slurm-job.json", "slurm-jobs.json"])
def test_slurm_dashboards_show_the_sites_idle_threshold(dashboards, name):
    """Idle panels name the threshold the rules record (prometheus_slurm_idle_gpu_threshold_
    percent), not a copy of the default; the utilization panels draw it as a line."""
    dash = dashboards[name]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variable_expr(variables["idle_threshold"]) == IDLE_THRESHOLD
    assert variables["idle_threshold"]["hide"] == 2
    # Grafana's query_result text for the labelless max(): "{} <value> <ms>"
    regex = variables["idle_threshold"]["regex"].strip("/")
    assert re.search(regex, "{} 12.5 1764150000000").group(1) == "12.5"
    titles = [p["title"] for p in panels(dash)]
    idle_titles = [t for t in titles if "idle" in t.lower() and "unallocated" not in t]
    assert idle_titles and all("${idle_threshold} %" in t for t in idle_titles), idle_titles
    assert not [t for t in titles if re.search(r"\b(5 %|30 min)", t)]
    lines = [expr for place, expr in queries(dash, "prometheus") if expr == IDLE_THRESHOLD]
    assert len(lines) == 2  # the variable and the utilization panel's threshold line
