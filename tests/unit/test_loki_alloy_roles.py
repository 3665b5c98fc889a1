"""The loki and alloy roles, offline (neither binary is reachable from the test hosts).

Renders the Loki configuration, the ruler's rules, config.alloy, the Alloy drop-in and
environment file with the roles' defaults and the example inventory, and checks:
- Loki: single binary, TSDB v13, retention with the compactor, S3 option, ruler ->
  every Alertmanager; rules parse and their LogQL is sane;
- Alloy: balanced braces, every referenced component defined, every Loki host as an
  endpoint, inventory labels; the XID regex taken from the rendered config matches the
  real XID lines of gpu-metrics.md section 5 and yields the xid and the PCI id in the form
  the GPU collector (and nvidia-smi, DCGM) label GPUs with.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml
from render_role import ROLES, evaluate, example_inventory, render

from gpufleet_node.gpu_collector import health, kernlog


def collector():
    return health


# ------------------------------------------------------------------ Loki


def loki_config(**overrides) -> dict:
    return yaml.safe_load(render("loki", "loki.yml.j2", "mon03", overrides))


def test_loki_single_binary_tsdb_v13_with_retention():
    cfg = loki_config()
    assert cfg["auth_enabled"] is False
    (period,) = cfg["schema_config"]["configs"]
    assert period["store"] == "tsdb" and period["schema"] == "v13"
    assert period["object_store"] == "filesystem"
    assert period["index"] == {"prefix": "index_", "period": "24h"}
    assert cfg["compactor"]["retention_enabled"] is True
    assert cfg["compactor"]["delete_request_store"] == "filesystem"
    assert cfg["limits_config"]["retention_period"] == "30d"
    assert cfg["common"]["storage"]["filesystem"]["chunks_directory"] == "/var/lib/loki/chunks"
    assert cfg["common"]["replication_factor"] == 1
    assert cfg["server"]["http_listen_port"] == 3100


def test_loki_ruler_sends_to_every_alertmanager():
    ruler = loki_config()["ruler"]
    assert ruler["alertmanager_url"].split(",") == [
        "http://10.1.9.1:9093",
        "http://10.1.9.2:9093",
        "http://10.1.9.3:9093",
    ]
    assert ruler["storage"] == {"type": "local", "local": {"directory": "/etc/loki/rules"}}


def test_loki_ruler_sends_to_each_alertmanagers_own_port():
    # alertmanager_port in an Alertmanager's host_vars moves the ruler's URL with it.
    groups, hostvars = example_inventory()
    hostvars = copy.deepcopy(hostvars)
    hostvars["mon02"]["alertmanager_port"] = 9193
    text = render("loki", "loki.yml.j2", "mon03", {}, (groups, hostvars))
    assert yaml.safe_load(text)["ruler"]["alertmanager_url"].split(",") == [
        "http://10.1.9.1:9093",
        "http://10.1.9.2:9193",
        "http://10.1.9.3:9093",
    ]


def test_the_removed_alertmanager_port_setting_is_refused():
    tasks = yaml.safe_load((ROLES / "loki" / "tasks" / "preflight.yml").read_text())
    (task,) = [t for t in tasks if "removed port setting" in t["name"]]
    condition = task["ansible.builtin.assert"]["that"]
    assert evaluate("loki", condition, "mon03") is True
    assert evaluate("loki", condition, "mon03", {"loki_alertmanager_port": 9193}) is False
    message = " ".join(task["ansible.builtin.assert"]["fail_msg"].split())
    assert message.startswith("loki_alertmanager_port is no longer read: set alertmanager_port")


def test_loki_s3_option():
    cfg = loki_config(
        loki_storage="s3",
        loki_s3_endpoint="minio.example.org:9000",
        loki_s3_bucket="loki",
        loki_s3_access_key_id="id",
        loki_s3_secret_access_key="secret",
        loki_retention_period="90d",
    )
    assert cfg["schema_config"]["configs"][0]["object_store"] == "s3"
    assert cfg["compactor"]["delete_request_store"] == "s3"
    s3 = cfg["common"]["storage"]["s3"]
    assert s3["bucketnames"] == "loki" and s3["s3forcepathstyle"] is True
    assert s3["insecure"] is False
    assert cfg["limits_config"]["retention_period"] == "90d"


def test_loki_overrides_merge():
    cfg = loki_config(
        loki_limits_config={"ingestion_rate_mb": 16},
        loki_config_extra={"server": {"log_level": "debug"}},
    )
    assert cfg["limits_config"]["ingestion_rate_mb"] == 16
    assert cfg["limits_config"]["retention_period"] == "30d"
    assert cfg["server"]["log_level"] == "debug" and cfg["server"]["http_listen_port"] == 3100


def test_loki_config_is_validated_by_loki_after_install():
    configure = yaml.safe_load((ROLES / "loki/tasks/configure.yml").read_text())
    (task,) = [t for t in configure if t["name"] == "Write the Loki configuration"]
    assert "-verify-config -config.file %s" in task["ansible.builtin.template"]["validate"]
    main = [t["name"] for t in yaml.safe_load((ROLES / "loki/tasks/main.yml").read_text())]
    assert main.index("Install") < main.index("Configure")


def loki_rules() -> dict:
    return yaml.safe_load(render("loki", "gpufleet-logs.rules.yml.j2", "mon03"))


DURATION = re.compile(r"\[(\d+[smhdw]|\$__auto)\]")


def logql_sane(expr: str) -> None:
    """Braces, parentheses and quotes balance; every range is a duration; every stream
    selector has a matcher that cannot match the empty string."""
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    assert stripped.count('"') % 2 == 0
    assert stripped.count("{") == stripped.count("}") and stripped.count("(") == stripped.count(")")
    selectors = re.findall(r"\{([^{}]*)\}", expr)
    assert selectors, expr
    for selector in selectors:
        matchers = re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', selector)
        assert matchers, selector
        assert any(op == "=" and value for _, op, value in matchers) or any(
            op == "=~" and not re.fullmatch(value, "") for _, op, value in matchers
        ), f"{selector}: every matcher matches the empty string"
    assert DURATION.findall(expr), f"no range in {expr}"
    assert not re.search(r"\[[^\]]*\]", DURATION.sub("", expr)), expr


def test_loki_rules_parse_and_logql_is_sane():
    doc = loki_rules()
    alerts = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    assert {
        "NvidiaXidCritical",
        "NvidiaGpuFallenOffBus",
        "SlurmdLogErrors",
        "SlurmDaemonFatal",
    } <= set(alerts)
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        logql_sane(rule["expr"])
        assert re.search(r"\)\s*>\s*\d+\s*$", rule["expr"].strip()), name


def test_critical_xids_match_the_gpu_collector():
    expr = {r["alert"]: r for g in loki_rules()["groups"] for r in g["rules"]}["NvidiaXidCritical"][
        "expr"
    ]
    codes = re.search(r'xid=~"([0-9|]+)"', expr).group(1).split("|")
    assert {int(c) for c in codes} == set(collector().CRITICAL_XIDS)


def test_loki_extra_rule_groups_are_appended():
    extra = [
        {
            "name": "site",
            "rules": [{"alert": "X", "expr": 'count_over_time({source="kernel"}[5m]) > 0'}],
        }
    ]
    doc = yaml.safe_load(
        render("loki", "gpufleet-logs.rules.yml.j2", "mon03", {"loki_ruler_extra_groups": extra})
    )
    assert doc["groups"][-1]["name"] == "site"


# ------------------------------------------------------------------ Alloy


def alloy_config(host: str = "gpu001", **overrides) -> str:
    return render("alloy", "config.alloy.j2", host, overrides)


def strip_river(text: str) -> str:
    """Drop comments and string contents (keeping the quotes)."""
    out = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    return re.sub(r"//[^\n]*", "", out)


def river_strings(text: str, attribute: str) -> list[str]:
    """Decoded values of `attribute = "..."` (River strings use Go/JSON escapes)."""
    pattern = rf'\b{attribute}\s*=\s*("(?:[^"\\]|\\.)*")'
    return [json.loads(m) for m in re.findall(pattern, text)]


def test_alloy_braces_balance_and_components_resolve():
    text = alloy_config()
    code = strip_river(text)
    depth = 0
    for char in code:
        depth += {"{": 1, "}": -1}.get(char, 0)
        assert depth >= 0
    assert depth == 0
    assert code.count("[") == code.count("]") and code.count("(") == code.count(")")
    defined = set(re.findall(r"^([a-z_]+(?:\.[a-z_]+)+) \"([a-z_0-9]+)\" \{", text, re.M))
    defined = {f"{kind}.{label}" for kind, label in defined}
    assert defined == {
        "loki.write.default",
        "loki.relabel.journal",
        "loki.source.journal.system",
        "loki.process.kernel",
        "local.file_match.slurm",
        "loki.source.file.slurm",
        "loki.process.slurm",
    }
    references = re.findall(r"=\s*\[?((?:loki|local)\.[a-z_.]+)\.(receiver|rules|targets)\b", code)
    assert references
    for component, export in references:
        assert component in defined, f"{component}.{export} is not defined"
    # Every component that produces logs forwards somewhere that ends at loki.write.
    assert "forward_to = [loki.write.default.receiver]" in text


def test_alloy_ships_to_every_loki_with_inventory_labels():
    groups, hostvars = example_inventory()
    groups = {**groups, "loki": ["mon02", "mon03"]}
    text = render("alloy", "config.alloy.j2", "gpu001", None, (groups, hostvars))
    assert river_strings(text, "url") == [
        "http://10.1.9.2:3100/loki/api/v1/push",
        "http://10.1.9.3:3100/loki/api/v1/push",
    ]
    labels = dict(
        re.findall(r'^\s+(\w+) = ("[^"]*"),$', text.split("external_labels")[1].split("}")[0], re.M)
    )
    assert {k: json.loads(v) for k, v in labels.items()} == {
        "cluster": "hpc-a",
        "rack": "r01",
        "node": "gpu001",
    }


def test_alloy_leaves_out_an_empty_rack():
    groups, hostvars = example_inventory()
    hostvars = {**hostvars, "gpu001": {**hostvars["gpu001"], "gpufleet_rack": ""}}
    text = render("alloy", "config.alloy.j2", "gpu001", None, (groups, hostvars))
    assert "rack =" not in text.split("external_labels")[1].split("}")[0]


def test_alloy_kernel_lines_are_relabelled_and_slurm_files_read():
    text = alloy_config()
    assert '"__journal__transport"' in text and 'replacement   = "kernel"' in text
    assert "loki.source.journal" in text
    targets = re.findall(r'\{"__path__" = ("[^"]+"), "source" = ("[^"]+")\}', text)
    assert [(json.loads(p), json.loads(s)) for p, s in targets][:2] == [
        ("/var/log/slurm/slurmd.log", "slurmd"),
        ("/var/log/slurm/slurmctld.log", "slurmctld"),
    ]
    # Only bounded values become labels: xid and pci_bus_id, never pid or job ids.
    label_blocks = re.findall(r"stage\.labels \{\s*values = \{([^}]*)\}", text)
    label_names = {name for block in label_blocks for name in re.findall(r"(\w+)\s*=", block)}
    assert label_names == {"xid", "pci_bus_id", "level"}


# Real lines (gpu-metrics.md section 5.1), each after the xid and the PCI id the collector
# labels its GPU with.
XID_TABLE = """
79 00000000:05:00.0 NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
79 00000000:01:00.0 NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.
14 00000000:03:00.0 [  301.231516] NVRM: Xid (0000:03:00): 14, Channel 00000001
63 00000000:10:1C.0 NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.
149 00000009:01:00.0 [171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)
154 00000009:01:00.0 [171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)
119 00000000:61:00.0 NVRM: Xid (PCI:0000:61:00): 119, pid=123417, name=nv-hostengine, Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 10 (FREE) (0xc0000005 0x0).
48 00000000:3B:00.0 Feb 01 14:25:31 host kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=77, DBE
31 00000000:B3:00.0 [ 130.456250] [ T1946] NVRM: Xid (PCI:0000:b3:00): 31, pid=9, MMU Fault
"""  # noqa: E501 (verbatim log lines)
XID_LINES = [
    (line, xid, pci)
    for xid, pci, line in (row.split(maxsplit=2) for row in XID_TABLE.strip().splitlines())
]
NOT_XID = [
    "NVRM: GPU at PCI:0000:01:00: GPU-34d7319c-5b19-1e75-186d-c187099e4fe5",
    "nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 11001, Fatal, ingress invalid command",
    "NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:61:00",
]


def alloy_pci_template(groups: dict) -> str:
    """What the config's stage.template makes of the captured groups."""
    return f"0000{groups['pci_domain']}:{groups['pci_bus']}:{groups['pci_device']}.0".upper()


def xid_regexes() -> tuple[re.Pattern, re.Pattern]:
    expressions = river_strings(alloy_config(), "expression")
    xid = next(e for e in expressions if "NVRM: Xid" in e)
    fallen = next(e for e in expressions if "fallen off the bus" in e)
    return re.compile(xid), re.compile(fallen)


@pytest.mark.parametrize(
    ("line", "xid", "pci"), XID_LINES, ids=[x[1] + "-" + x[2] for x in XID_LINES]
)
def test_alloy_xid_regex_on_real_lines(line, xid, pci):
    regex, _ = xid_regexes()
    # Alloy's line is the journal record's MESSAGE: no syslog or dmesg head before it.
    match = regex.search(kernlog.file_record(line).message)
    assert match, line
    assert match.group("xid") == xid
    assert alloy_pci_template(match.groupdict()) == pci
    # Same join key as the GPU collector's pci_bus_id label for the same line.
    gpu = collector()
    ((key, code),) = gpu.parse_xid_lines([line])
    assert (gpu.nvidia_pci_form(key), str(code)) == (pci, xid)


@pytest.mark.parametrize("line", NOT_XID)
def test_alloy_xid_regex_ignores_other_nvrm_lines(line):
    regex, _ = xid_regexes()
    assert not regex.search(line)


# Kernel records that print user-chosen text (issue 26, finding 5): XID-like text that
# is not at the start of the record never gets an xid label.
FORGED = [
    "cgroup: fork rejected by pids controller in /user.slice/user-1000.slice/"
    "user@1000.service/app.slice/NVRM: Xid (PCI:0000:3b:00): 79, x",
    "Memory cgroup out of memory: Killed process 4242 (python3) total-vm:1kB, "
    "oom_memcg=/NVRM: Xid (PCI:0000:3b:00): 48, x",
    "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/x\nNVRM: Xid (PCI:0000:3b:00): 79, y",
    "x\nNVRM: Xid (PCI:0000:3b:00): 79, after a newline inside one record",
    "x\nNVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
    " NVRM: Xid (PCI:0000:3b:00): 79, leading space",
]


@pytest.mark.parametrize("message", FORGED, ids=range(len(FORGED)))
def test_alloy_xid_regexes_are_anchored_to_the_record(message):
    for regex in xid_regexes():
        assert not regex.search(message), regex.pattern
    for selector in river_strings(alloy_config(), "selector"):
        line_filter = re.search(r'\|~ "([^"]+)"', selector).group(1)
        assert not re.search(line_filter, message), selector
    assert collector().parse_xid_lines([message]) == []


def test_loki_fallen_off_the_bus_alert_is_anchored():
    expr = {r["alert"]: r for g in loki_rules()["groups"] for r in g["rules"]}[
        "NvidiaGpuFallenOffBus"
    ]["expr"]
    pattern = json.loads(re.search(r'\|~ ("(?:[^"\\]|\\.)*")', expr).group(1))
    genuine = (
        "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this "
        "system has\nNVRM: fallen off the bus and is not responding to commands."
    )
    assert re.search(pattern, genuine)
    for forged in [*FORGED, "cgroup: fork rejected by pids controller in /fallen off the bus"]:
        assert not re.search(pattern, forged), forged


def test_alloy_source_kernel_needs_the_kernel_facility():
    text = alloy_config()
    assert '["__journal__transport", "__journal_syslog_facility"]' in text
    assert 'regex         = "kernel;0"' in text


def test_alloy_fallen_off_the_bus_single_line_is_xid_79():
    _, regex = xid_regexes()
    match = regex.search("NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.")
    assert alloy_pci_template(match.groupdict()) == "00000000:29:00.0"
    assert 'xid = "79"' in alloy_config()


def test_alloy_match_selectors_are_logql():
    for selector in river_strings(alloy_config(), "selector"):
        assert re.fullmatch(r'\{source="kernel"\} \|~ "[^"]+"', selector), selector
        re.compile(re.search(r'\|~ "([^"]+)"', selector).group(1))


def test_alloy_drop_in_and_environment():
    drop_in = render("alloy", "gpufleet.conf.j2", "gpu001")
    assert "SupplementaryGroups=systemd-journal adm" in drop_in
    env = render("alloy", "alloy.env.j2", "gpu001")
    assert 'CONFIG_FILE="/etc/alloy/config.alloy"' in env
    assert "--server.http.listen-addr=127.0.0.1:12345" in env


def test_alloy_config_validated_and_reloaded():
    configure = yaml.safe_load((ROLES / "alloy/tasks/configure.yml").read_text())
    (task,) = [t for t in configure if t["name"] == "Write config.alloy"]
    assert "fmt %s" in task["ansible.builtin.template"]["validate"]
    assert task["notify"] == "reload alloy"
    handlers = {
        h["listen"]: h for h in yaml.safe_load((ROLES / "alloy/handlers/main.yml").read_text())
    }
    reload = handlers["reload alloy"]["ansible.builtin.include_tasks"]
    assert reload.endswith("_common/tasks/reload.yml")
