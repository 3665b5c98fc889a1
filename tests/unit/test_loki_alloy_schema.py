"""The rendered Loki and Alloy configurations against the upstream documented schemas.

The observability scenario runs the roles against stand-ins that refuse only a marker,
so what the configurations mean is checked here: the keys, sections, types and values
the role writes against the subset of Loki's configuration reference it uses, and the
components, arguments and blocks of config.alloy against Alloy's component reference.
Each schema below is data written from the named documentation page for the pinned
version (loki_version 3.7.8, alloy_version 1.18.1); a key the role starts writing must
be added here from that page, or the test fails.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from config_schema import schema_problems
from render_role import render

# ------------------------------------------------------------------ Loki

KV_STORES = ("inmemory", "consul", "etcd", "memberlist", "multi")
OBJECT_STORES = ("filesystem", "s3", "gcs", "azure", "swift", "bos", "cos", "alibabacloud")

# Subset of "Grafana Loki configuration parameters",
# https://grafana.com/docs/loki/v3.7.x/configure/ (docs/sources/shared/configuration.md
# at v3.7.8): the blocks and keys the role writes, with their documented types.
LOKI_SCHEMA: dict[str, Any] = {
    "auth_enabled": "bool",
    "server": {
        "http_listen_address": "string",
        "http_listen_port": "int",
        "grpc_listen_port": "int",
        "log_level": ("debug", "info", "warn", "error"),
    },
    "common": {
        "instance_addr": "string",
        "path_prefix": "string",
        "replication_factor": "int",
        "ring": {"kvstore": {"store": KV_STORES}},
        "storage": {
            "filesystem": {"chunks_directory": "string", "rules_directory": "string"},
            "s3": {
                "endpoint": "string",
                "bucketnames": "string",
                "region": "string",
                "access_key_id": "string",
                "secret_access_key": "string",
                "insecure": "bool",
                "s3forcepathstyle": "bool",
            },
        },
    },
    "schema_config": {
        "configs": [
            {
                "from": "date",
                "store": ("tsdb", "boltdb-shipper"),
                "object_store": OBJECT_STORES,
                "schema": ("v11", "v12", "v13"),
                "index": {"prefix": "string", "period": ("24h",)},
            }
        ]
    },
    "storage_config": {
        "tsdb_shipper": {"active_index_directory": "string", "cache_location": "string"},
    },
    "compactor": {
        "working_directory": "string",
        "compaction_interval": "go_duration",
        "retention_enabled": "bool",
        "retention_delete_delay": "go_duration",
        "retention_delete_worker_count": "int",
        "delete_request_store": OBJECT_STORES,
    },
    "limits_config": {
        "retention_period": "prom_duration",
        "reject_old_samples": "bool",
        "reject_old_samples_max_age": "prom_duration",
        "allow_structured_metadata": "bool",
        "volume_enabled": "bool",
        "max_query_lookback": "prom_duration",
        "ingestion_rate_mb": "number",
        "ingestion_burst_size_mb": "number",
    },
    "ruler": {
        "enable_api": "bool",
        "alertmanager_url": "string",
        "rule_path": "string",
        "storage": {"type": ("local", "s3", "gcs", "azure"), "local": {"directory": "string"}},
        "ring": {"kvstore": {"store": KV_STORES}},
        "alertmanager_client": {
            "tls_ca_path": "string",
            "basic_auth_username": "string",
            "basic_auth_password": "string",
        },
    },
    "analytics": {"reporting_enabled": "bool"},
}


def loki_problems(cfg: dict) -> list[str]:
    """The schema, and the documented rules between sections the role relies on."""
    problems = schema_problems(cfg, LOKI_SCHEMA)
    # Retention page: "delete_request_store also needs to be configured when retention
    # is enabled".
    compactor = cfg.get("compactor", {})
    if compactor.get("retention_enabled") and not compactor.get("delete_request_store"):
        problems.append("compactor: retention_enabled needs delete_request_store")
    # Upgrade guide (3.0): structured metadata, on by default, needs schema v13 on tsdb.
    last = cfg["schema_config"]["configs"][-1]
    if cfg.get("limits_config", {}).get("allow_structured_metadata", True) and (
        last.get("schema"),
        last.get("store"),
    ) != ("v13", "tsdb"):
        problems.append("limits_config: structured metadata needs schema v13 on tsdb")
    return problems


def loki_config(**overrides: Any) -> dict:
    return yaml.safe_load(render("loki", "loki.yml.j2", "mon03", overrides))


S3 = {
    "loki_storage": "s3",
    "loki_s3_endpoint": "minio.example.org:9000",
    "loki_s3_bucket": "loki",
    "loki_s3_access_key_id": "id",
    "loki_s3_secret_access_key": "secret",
}


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        S3,
        {"loki_retention_period": "90d", "loki_log_level": "debug"},
        {"loki_limits_config": {"ingestion_rate_mb": 16}},
    ],
    ids=["default", "s3", "retention-and-level", "limits"],
)
def test_loki_config_matches_the_documented_schema(overrides):
    assert loki_problems(loki_config(**overrides)) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        # Loki's strict unmarshalling refuses a limit misplaced at the top level.
        (lambda c: c.update(retention_period="30d"), ".retention_period: not a documented"),
        # What "{{ port | int }}" nested in YAML renders under ansible-core 2.18.
        (lambda c: c["server"].update(http_listen_port="3100"), "'3100' is not a int"),
        (lambda c: c["compactor"].update(compaction_interval="1d"), "is not a go_duration"),
        (lambda c: c["limits_config"].update(retention_period="30 days"), "prom_duration"),
        (lambda c: c["compactor"].pop("delete_request_store"), "needs delete_request_store"),
        (lambda c: c["schema_config"]["configs"][0].update(schema="v12"), "needs schema v13"),
    ],
    ids=["misplaced-key", "string-port", "go-duration", "prom-duration", "retention", "v12"],
)
def test_loki_schema_check_finds_what_loki_refuses(change, problem):
    cfg = loki_config()
    change(cfg)
    assert any(problem in p for p in loki_problems(cfg)), loki_problems(cfg)


def test_loki_schema_check_sees_extra_settings():
    cfg = loki_config(loki_config_extra={"limits_config": {"retention_perid": "30d"}})
    assert loki_problems(cfg) == [".limits_config.retention_perid: not a documented key"]


# ------------------------------------------------------------------ Alloy


def arguments(*names: str, required: tuple[str, ...] = (), blocks: dict | None = None) -> dict:
    """A block's documented arguments (name -> value kind), required ones and blocks."""
    kinds = {name.split(":")[0]: name.split(":")[1] for name in names}
    return {"args": kinds, "required": set(required), "blocks": blocks or {}}


# Alloy's component reference for v1.18 (https://grafana.com/docs/alloy/v1.18/reference/
# components/loki/<name>/, local/local.file_match/, config-blocks/logging/): the
# arguments and blocks of the components config.alloy uses. Value kinds: string, list,
# object, ref (a component export), number, bool.
STAGES = {
    "stage.regex": arguments(
        "expression:string", "source:string", "labels_from_groups:bool", required=("expression",)
    ),
    "stage.template": arguments(
        "source:string", "template:string", required=("source", "template")
    ),
    "stage.labels": arguments("values:object"),
    "stage.static_labels": arguments("values:object"),
    "stage.structured_metadata": arguments("values:object", "regex:string"),
}
STAGES["stage.match"] = arguments(
    "selector:string",
    "pipeline_name:string",
    "action:string",
    "drop_counter_reason:string",
    required=("selector",),
    blocks=STAGES,
)
ALLOY_COMPONENTS = {
    "logging": arguments("level:string", "format:string", "write_to:list"),
    "loki.write": arguments(
        "external_labels:object",
        "max_streams:number",
        blocks={
            "endpoint": arguments(
                "url:string",
                "name:string",
                "tenant_id:string",
                "batch_wait:string",
                "batch_size:string",
                "remote_timeout:string",
                "headers:object",
                "bearer_token:string",
                "bearer_token_file:string",
                required=("url",),
            )
        },
    ),
    "loki.relabel": arguments(
        "forward_to:list",
        "max_cache_size:number",
        required=("forward_to",),
        blocks={
            "rule": arguments(
                "source_labels:list",
                "separator:string",
                "regex:string",
                "modulus:number",
                "target_label:string",
                "replacement:string",
                "action:string",
            )
        },
    ),
    "loki.source.journal": arguments(
        "forward_to:list",
        "format_as_json:bool",
        "labels:object",
        "matches:string",
        "max_age:string",
        "path:string",
        "relabel_rules:ref",
        required=("forward_to",),
    ),
    "loki.process": arguments("forward_to:list", required=("forward_to",), blocks=STAGES),
    "local.file_match": arguments(
        "path_targets:list",
        "sync_period:string",
        "ignore_older_than:string",
        required=("path_targets",),
    ),
    "loki.source.file": arguments(
        "targets:ref",
        "forward_to:list",
        "encoding:string",
        "tail_from_end:bool",
        "legacy_positions_file:string",
        required=("targets", "forward_to"),
    ),
}
LOGGING_VALUES = {"level": {"debug", "info", "warn", "error"}, "format": {"logfmt", "json"}}

LEXEME = re.compile(r'\n|""|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*|\d+(?:\.\d+)?|\S')
NOISE = re.compile(r'"(?:[^"\\\n]|\\.)*"|`[^`]*`|//[^\n]*|/\*.*?\*/', re.S)


def alloy_tree(text: str) -> list[tuple[str, dict]]:
    """Top-level blocks of an Alloy file as (name, {"args": {name: kind}, "blocks": [...]}).

    Only the structure: strings are blanked and comments dropped first, and an
    attribute's value is classified by its first lexeme.
    """

    def blank(match: re.Match) -> str:
        found = match.group()
        return '""' if found[0] in '"`' else "\n" * found.count("\n")

    tokens = [*LEXEME.findall(NOISE.sub(blank, text)), "EOF"]

    def value(i: int) -> tuple[str, int]:
        first, depth = tokens[i], 0
        kind = {"[": "list", "{": "object", '""': "string", "true": "bool", "false": "bool"}
        kind_of = kind.get(
            first, "ref" if "." in first else "number" if first[0].isdigit() else "expr"
        )
        while not (depth == 0 and tokens[i] in ("\n", "}", "EOF")):
            depth += (tokens[i] in "([{") - (tokens[i] in ")]}")
            i += 1
        return kind_of, i

    def body(i: int, closer: str) -> tuple[dict, int]:
        node: dict = {"args": {}, "blocks": []}
        while tokens[i] != closer:
            if tokens[i] == "\n":
                i += 1
            elif tokens[i + 1] == "=":
                node["args"][tokens[i]], i = value(i + 2)
            else:
                name, i = tokens[i], i + 1 + (tokens[i + 1] == '""')
                assert tokens[i] == "{", f"block {name}: expected {{, got {tokens[i]!r}"
                child, i = body(i + 1, "}")
                node["blocks"].append((name, child))
        return node, i + 1

    return body(0, "EOF")[0]["blocks"]


def block_problems(name: str, node: dict, spec: dict) -> list[str]:
    problems = [
        f"{name}: {arg} is not a documented argument"
        for arg in node["args"]
        if arg not in spec["args"]
    ]
    problems += [f"{name}: {arg} is required" for arg in spec["required"] - node["args"].keys()]
    for arg, kind in node["args"].items():
        if arg in spec["args"] and kind != spec["args"][arg]:
            problems.append(f"{name}: {arg} is documented as {spec['args'][arg]}, got {kind}")
    for child, child_node in node["blocks"]:
        if child not in spec["blocks"]:
            problems.append(f"{name}: {child} is not a documented block")
        else:
            problems += block_problems(f"{name} > {child}", child_node, spec["blocks"][child])
    return problems


def alloy_problems(text: str) -> list[str]:
    problems = []
    for name, node in alloy_tree(text):
        if name not in ALLOY_COMPONENTS:
            problems.append(f"{name}: not a documented component")
        else:
            problems += block_problems(name, node, ALLOY_COMPONENTS[name])
    for setting, allowed in LOGGING_VALUES.items():
        for found in re.findall(rf'^logging \{{[^}}]*\b{setting}\s*=\s*"([^"]*)"', text, re.M):
            if found not in allowed:
                problems.append(f"logging: {setting} {found!r} is not one of {sorted(allowed)}")
    return problems


def alloy_config(**overrides: Any) -> str:
    return render("alloy", "config.alloy.j2", "gpu001", overrides)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"alloy_extra_labels": {"site": "a"}, "alloy_journal_max_age": "12h"}],
    ids=["default", "labels-and-max-age"],
)
def test_alloy_config_uses_documented_components_and_arguments(overrides):
    text = alloy_config(**overrides)
    assert {name for name, _ in alloy_tree(text)} == set(ALLOY_COMPONENTS)
    assert alloy_problems(text) == []


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ('loki.echo "debug" {\n}', "loki.echo: not a documented component"),
        (
            'loki.relabel "x" {\n  forward_to = []\n  max_age = "1h"\n}',
            "loki.relabel: max_age is not a documented argument",
        ),
        (
            'loki.source.journal "y" {\n  max_age = "1h"\n}',
            "loki.source.journal: forward_to is required",
        ),
        (
            'loki.process "z" {\n  forward_to = loki.write.default.receiver\n}',
            "forward_to is documented as list, got ref",
        ),
        (
            'loki.process "w" {\n  forward_to = []\n'
            "  stage.match {\n    stage.regexp {\n    }\n  }\n}",
            "stage.match: stage.regexp is not a documented block",
        ),
    ],
    ids=["component", "argument", "required", "type", "nested-block"],
)
def test_alloy_check_finds_what_alloy_refuses(extra, problem):
    problems = alloy_problems(alloy_config(alloy_config_extra=extra))
    assert any(problem in p for p in problems), problems


def test_alloy_check_reads_the_logging_level():
    text = alloy_config().replace('level  = "info"', 'level  = "verbose"', 1)
    assert alloy_problems(text) == [
        "logging: level 'verbose' is not one of ['debug', 'error', 'info', 'warn']"
    ]
