#!/usr/bin/python3
"""TEST DOUBLE of Grafana Loki's single binary (`loki`), for the gpufleet test bed only.

Loki's release zip cannot be downloaded on the test bed, so `build.py loki-zip` packs
this file as `loki-linux-<arch>` into a release-shaped zip, and molecule's
`observability` scenario installs it with roles/loki exactly as it would install Loki.
Standard library only: test hosts have python3 but no YAML library.

What it imitates:
  * Loki's flag syntax (Go's flag package: `-flag value`, `-flag=value`, one or two
    dashes, booleans without a value); an unknown flag fails with exit status 2. Only a
    few flags are known: -config.file, -config.expand-env, -verify-config,
    -print-config-stderr, -log-config-reverse-order, -version, -target (only `all`),
    -log.level.
  * `-verify-config -config.file F`: reads F (a YAML subset, see below) and applies
    checks real Loki 3.x applies: YAML well-formed (no tabs, no duplicate keys); every
    top-level key one of Loki's configuration blocks ("field X not found in type
    loki.ConfigWrapper", as Loki's strict unmarshalling says for a misplaced
    `retention_period`); blocks are mappings; auth_enabled a boolean; ports integers;
    schema_config present with at least one period, dates ascending, known stores and
    schema versions, a 24h index period for tsdb/boltdb-shipper; structured metadata
    (on by default) needs schema v13 on tsdb; retention needs the compactor's
    delete_request_store; Prometheus durations in limits_config and Go durations in the
    compactor. Prints `msg="config is valid"` and exits 0, or a Loki-like error and 1.
  * `-version`: `loki, version X (branch: standin, revision: standin)`.
  * Otherwise it is the server: it refuses to start (exit 1) on a config that fails the
    checks above, listens on server.http_listen_address:http_listen_port and answers
    `GET /ready` ("ready"), `GET /metrics` (loki_build_info with this version,
    lines/bytes received per tenant, process start time, in Prometheus text format),
    `GET /config` (the configuration file as loaded, not Loki's fully defaulted one),
    `GET /loki/api/v1/status/buildinfo`, and `POST /loki/api/v1/push` with a JSON body
    (optionally gzip), counting streams' lines per tenant (X-Scope-OrgID, or `fake`
    without auth_enabled; with auth_enabled and no tenant: 401 "no org id"). A protobuf
    push (what Alloy sends) is accepted with 204 and counted as a request, not decoded.
    SIGTERM/SIGINT end it cleanly (exit 0). Like Loki (a Go program that handles only
    SIGINT, SIGTERM and SIGQUIT), it does not handle SIGHUP: the default action ends it.

What it does not do: store or index anything (no chunks, no TSDB, nothing written under
the data directory), no querying or LogQL, no ruler (rule files are not read), no
compactor or retention, no gRPC port, no ring or memberlist, no readiness delay, no
configuration defaults beyond the few values read here, and only a subset of YAML:
block mappings and sequences, plain/quoted/flow scalars and `|`/`>` block scalars; no
anchors, aliases, tags or multiple documents (the stand-in reports them as unsupported).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# build.py replaces this line with the release version it packs.
VERSION = "0.0.0-standin"

BOOL_FLAGS = {
    "config.expand-env",
    "verify-config",
    "print-config-stderr",
    "log-config-reverse-order",
    "version",
}
VALUE_FLAGS = {"config.file", "target", "log.level"}

# Loki 3.x's top-level configuration blocks (docs: "Configuration", supported contents).
TOP_LEVEL_BLOCKS = {
    "server",
    "internal_server",
    "distributor",
    "querier",
    "query_scheduler",
    "frontend",
    "query_range",
    "ruler",
    "ingester_client",
    "ingester",
    "block_builder",
    "block_scheduler",
    "pattern_ingester",
    "index_gateway",
    "bloom_build",
    "bloom_gateway",
    "storage_config",
    "chunk_store_config",
    "schema_config",
    "compactor",
    "compactor_grpc_client",
    "limits_config",
    "frontend_worker",
    "table_manager",
    "memberlist",
    "kafka_config",
    "dataobj",
    "ui",
    "runtime_config",
    "operational_config",
    "tracing",
    "analytics",
    "profiling",
    "common",
    "ingest_limits",
    "ingest_limits_frontend",
    "ingest_limits_frontend_client",
}
TOP_LEVEL_SCALARS = {
    "target",
    "auth_enabled",
    "ballast_bytes",
    "http_prefix",
    "shutdown_delay",
    "metrics_namespace",
    "use_buffered_logger",
    "use_sync_logger",
}
INDEX_STORES = {
    "tsdb",
    "boltdb-shipper",
    "boltdb",
    "aws",
    "aws-dynamo",
    "gcp",
    "gcp-columnkey",
    "bigtable",
    "bigtable-hashed",
    "cassandra",
    "grpc-store",
}
SCHEMAS = {f"v{n}" for n in range(1, 14)}
PROM_DURATION = re.compile(r"^((\d+)y)?((\d+)w)?((\d+)d)?((\d+)h)?((\d+)m)?((\d+)s)?((\d+)ms)?$")
GO_DURATION = re.compile(r"^[-+]?(\d+(\.\d*)?(ns|us|µs|ms|s|m|h))+$|^0$")


class ConfigError(Exception):
    """A configuration Loki would reject; str() is the message Loki-like."""


class YamlError(ConfigError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"yaml: line {line}: {message}")
        self.line = line


# ----------------------------------------------------------------------- YAML subset


class LineDict(dict):
    """A mapping that remembers the line of each key (for Loki-style error messages)."""

    key_lines: dict[str, int]


class _Line:
    __slots__ = ("indent", "number", "text")

    def __init__(self, number: int, indent: int, text: str) -> None:
        self.number, self.indent, self.text = number, indent, text


def _strip_comment(text: str) -> str:
    """Cut a trailing `# comment` that is not inside quotes."""
    quote = ""
    for i, char in enumerate(text):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"" and (i == 0 or text[i - 1] in " \t:[{,-"):
            quote = char
        elif char == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip()
    return text.rstrip()


class YamlSubset:
    """Block-style YAML as Ansible's to_nice_yaml and people write it (see module doc)."""

    def __init__(self, text: str) -> None:
        self.raw = text.splitlines()
        self.lines: list[_Line] = []
        for number, raw in enumerate(self.raw, start=1):
            body = raw.lstrip(" ")
            if body.startswith("\t"):
                raise YamlError(number, "found character that cannot start any token")
            stripped = _strip_comment(body)
            if not stripped:
                continue
            if stripped in ("---", "...") and raw.startswith(stripped):
                if self.lines:
                    raise YamlError(number, "the stand-in reads only one YAML document")
                continue
            if stripped[0] in "&*!%@`":
                raise YamlError(number, f"the stand-in does not support {stripped[0]!r} here")
            self.lines.append(_Line(number, len(raw) - len(body), stripped))

    def parse(self) -> Any:
        if not self.lines:
            return None
        value, index = self._block(0, self.lines[0].indent)
        if index < len(self.lines):
            raise YamlError(self.lines[index].number, "did not find expected key")
        return value

    @staticmethod
    def _is_item(line: _Line) -> bool:
        return line.text == "-" or line.text.startswith("- ")

    def _block(self, index: int, indent: int) -> tuple[Any, int]:
        line = self.lines[index]
        if line.indent < indent:
            return None, index
        if self._is_item(line):
            return self._sequence(index, line.indent)
        if self._split_key(line) is None:
            value, index = self._scalar_lines(index, line.indent - 1)
            return value, index
        return self._mapping(index, line.indent)

    def _split_key(self, line: _Line) -> tuple[str, str] | None:
        text = line.text
        if text[0] in "'\"":
            end = self._quote_end(text, 0)
            if end is None or not text[end + 1 :].startswith(":"):
                return None
            key = self._scalar(text[: end + 1], line.number)
            rest = text[end + 2 :]
            if rest and not rest.startswith(" "):
                return None
            return str(key), rest.strip()
        match = re.search(r":(\s|$)", text)
        if match is None or text[0] in "[{":
            return None
        key = text[: match.start()].rstrip()
        return (key, text[match.end() :].strip()) if key else None

    @staticmethod
    def _quote_end(text: str, start: int) -> int | None:
        quote = text[start]
        i = start + 1
        while i < len(text):
            if quote == '"' and text[i] == "\\":
                i += 2
                continue
            if text[i] == quote:
                if quote == "'" and i + 1 < len(text) and text[i + 1] == "'":
                    i += 2
                    continue
                return i
            i += 1
        return None

    def _mapping(self, index: int, indent: int) -> tuple[LineDict, int]:
        result = LineDict()
        result.key_lines = {}
        while index < len(self.lines):
            line = self.lines[index]
            if line.indent < indent:
                break
            if line.indent > indent:
                raise YamlError(line.number, "mapping values are not allowed in this context")
            if self._is_item(line):
                raise YamlError(line.number, "did not find expected key")
            split = self._split_key(line)
            if split is None:
                raise YamlError(line.number, "could not find expected ':'")
            key, rest = split
            if key in result:
                raise YamlError(
                    line.number,
                    f'mapping key "{key}" already defined at line {result.key_lines[key]}',
                )
            result.key_lines[key] = line.number
            index += 1
            if rest in ("|", "|-", "|+", ">", ">-", ">+"):
                result[key], index = self._block_scalar(index, indent, rest)
            elif rest:
                self.lines[index - 1] = _Line(line.number, indent + 1, rest)
                result[key], index = self._scalar_lines(index - 1, indent)
            elif index < len(self.lines) and (
                self.lines[index].indent > indent
                or (self.lines[index].indent == indent and self._is_item(self.lines[index]))
            ):
                result[key], index = self._block(index, self.lines[index].indent)
            else:
                result[key] = None
        return result, index

    def _sequence(self, index: int, indent: int) -> tuple[list[Any], int]:
        items: list[Any] = []
        while index < len(self.lines):
            line = self.lines[index]
            if line.indent < indent or (line.indent == indent and not self._is_item(line)):
                break
            if line.indent > indent:
                raise YamlError(line.number, "did not find expected '-' indicator")
            rest = line.text[1:].lstrip(" ")
            if not rest:
                index += 1
                if index < len(self.lines) and self.lines[index].indent > indent:
                    value, index = self._block(index, self.lines[index].indent)
                else:
                    value = None
                items.append(value)
                continue
            column = indent + len(line.text) - len(rest)
            self.lines[index] = _Line(line.number, column, rest)
            value, index = self._block(index, column)
            items.append(value)
        return items, index

    def _scalar_lines(self, index: int, parent_indent: int) -> tuple[Any, int]:
        """A scalar starting at lines[index], continued on more-indented lines."""
        first = self.lines[index]
        parts = [first.text]
        index += 1
        while (
            index < len(self.lines)
            and self.lines[index].indent > parent_indent
            and (first.text[0] in "'\"[{" or self._split_key(self.lines[index]) is None)
            and not self._is_item(self.lines[index])
        ):
            parts.append(self.lines[index].text)
            index += 1
        return self._scalar(" ".join(parts), first.number), index

    def _block_scalar(self, index: int, indent: int, style: str) -> tuple[str, int]:
        if index >= len(self.lines) or self.lines[index].indent <= indent:
            return "", index
        first, block_indent = self.lines[index].number, self.lines[index].indent
        last = first
        while index < len(self.lines) and self.lines[index].indent >= block_indent:
            last = self.lines[index].number
            index += 1
        body = [raw[block_indent:] for raw in self.raw[first - 1 : last]]
        text = "\n".join(body) if style[0] == "|" else " ".join(p for p in body if p)
        return (text if style.endswith("-") else text + "\n"), index

    def _scalar(self, text: str, number: int) -> Any:
        text = text.strip()
        if text.startswith(("[", "{")):
            value, end = self._flow(text, 0, number)
            if text[end:].strip():
                raise YamlError(number, "did not find expected <document start>")
            return value
        if text[0] in "'\"":
            end = self._quote_end(text, 0)
            if end is None:
                raise YamlError(number, "found unexpected end of stream")
            if text[end + 1 :].strip():
                raise YamlError(number, "did not find expected key")
            return self._unquote(text[: end + 1], number)
        if text[0] in "&*!%@`|>":
            raise YamlError(number, f"the stand-in does not support {text[0]!r} here")
        if ": " in text:
            raise YamlError(number, "mapping values are not allowed in this context")
        return self._resolve(text)

    @staticmethod
    def _unquote(text: str, number: int) -> str:
        if text[0] == "'":
            return text[1:-1].replace("''", "'")
        try:
            return json.loads(text)
        except ValueError as error:
            raise YamlError(number, f"found unknown escape character ({error})") from None

    @staticmethod
    def _resolve(text: str) -> Any:
        # YAML 1.1 as Go's yaml.v2 (Loki's parser) resolves plain scalars.
        lower = text.lower()
        if lower in ("null", "~", ""):
            return None
        if lower in ("true", "yes", "on", "y"):
            return True
        if lower in ("false", "no", "off", "n"):
            return False
        if re.fullmatch(r"[-+]?(0|[1-9][0-9_]*)", text):
            return int(text.replace("_", ""))
        if re.fullmatch(r"0x[0-9a-fA-F_]+", text):
            return int(text, 16)
        if re.fullmatch(r"0[0-7]+", text):
            return int(text, 8)
        if re.fullmatch(r"[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?", text):
            return float(text.replace("_", ""))
        return text

    def _flow(self, text: str, i: int, number: int) -> tuple[Any, int]:
        closer = "]" if text[i] == "[" else "}"
        is_map = closer == "}"
        result: Any = {} if is_map else []
        i += 1
        while True:
            while i < len(text) and text[i] == " ":
                i += 1
            if i >= len(text):
                raise YamlError(number, f"did not find expected ',' or '{closer}'")
            if text[i] == closer:
                return result, i + 1
            item, i = self._flow_item(text, i, number, is_map)
            if is_map:
                key, value = item
                result[key] = value
            else:
                result.append(item)
            while i < len(text) and text[i] == " ":
                i += 1
            if i < len(text) and text[i] == ",":
                i += 1
            elif i >= len(text) or text[i] != closer:
                raise YamlError(number, f"did not find expected ',' or '{closer}'")

    def _flow_item(self, text: str, i: int, number: int, is_map: bool) -> tuple[Any, int]:
        def atom(i: int, stops: str, key: bool = False) -> tuple[Any, int]:
            if text[i] in "[{":
                return self._flow(text, i, number)
            if text[i] in "'\"":
                end = self._quote_end(text, i)
                if end is None:
                    raise YamlError(number, "found unexpected end of stream")
                return self._unquote(text[i : end + 1], number), end + 1
            j = i
            while j < len(text) and text[j] not in stops:
                if text[j] == ":" and (j + 1 == len(text) or text[j + 1] == " "):
                    break
                j += 1
            plain = text[i:j].strip()
            return (plain if key else self._resolve(plain)), j

        if not is_map:
            return atom(i, ",]")
        key, i = atom(i, ",}", key=True)
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == ":":
            i += 1
            while i < len(text) and text[i] == " ":
                i += 1
            value, i = atom(i, ",}") if i < len(text) else (None, i)
        else:
            value = None
        return (str(key), value), i


# ----------------------------------------------------------------------- Loki checks


def load_config(path: str, expand_env: bool = False) -> tuple[LineDict, str]:
    """Read and check path; raise ConfigError with Loki's wording on what Loki rejects."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise ConfigError(f"failed parsing config: open {path}: {error.strerror}") from None
    if expand_env:
        text = re.sub(
            r"\$\{(\w+)(?::-([^}]*))?\}",
            lambda m: os.environ.get(m.group(1), m.group(2) or ""),
            text,
        )
    try:
        config = YamlSubset(text).parse()
    except YamlError as error:
        raise ConfigError(f"failed parsing config: {path}: {error}") from None
    if config is None:
        config = LineDict()
        config.key_lines = {}
    if not isinstance(config, LineDict):
        raise ConfigError(
            f"failed parsing config: {path}: yaml: unmarshal errors:\n"
            "  line 1: cannot unmarshal !!seq into loki.ConfigWrapper"
        )
    unmarshal: list[str] = []
    for key, value in config.items():
        line = config.key_lines[key]
        if key not in TOP_LEVEL_BLOCKS | TOP_LEVEL_SCALARS:
            unmarshal.append(f"  line {line}: field {key} not found in type loki.ConfigWrapper")
        elif key in TOP_LEVEL_BLOCKS and value is not None and not isinstance(value, dict):
            unmarshal.append(f"  line {line}: cannot unmarshal !!{_tag(value)} into {key} config")
    if "auth_enabled" in config and not isinstance(config["auth_enabled"], bool):
        unmarshal.append(
            f"  line {config.key_lines['auth_enabled']}: cannot unmarshal "
            f"!!{_tag(config['auth_enabled'])} `{config['auth_enabled']}` into bool"
        )
    server = config["server"] if isinstance(config.get("server"), dict) else {}
    for port in ("http_listen_port", "grpc_listen_port"):
        value = server.get(port, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            line = getattr(server, "key_lines", {}).get(port, 0)
            unmarshal.append(f"  line {line}: cannot unmarshal !!{_tag(value)} `{value}` into int")
    if unmarshal:
        raise ConfigError(
            f"failed parsing config: {path}: yaml: unmarshal errors:\n" + "\n".join(unmarshal)
        )
    validate(config)
    return config, text


def _tag(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, list):
        return "seq"
    if isinstance(value, dict):
        return "map"
    return "str"


def validate(config: dict) -> None:
    """Loki's Config.Validate() checks the stand-in knows (see module doc)."""
    server = config.get("server") or {}
    for port in ("http_listen_port", "grpc_listen_port"):
        if not 0 <= server.get(port, 0) <= 65535:
            raise ConfigError(f"invalid server config: {port} must be between 0 and 65535")
    periods = (config.get("schema_config") or {}).get("configs") or []
    if not isinstance(periods, list) or not periods:
        raise ConfigError(
            "invalid schema config: schema_config.configs must define at least one period"
        )
    previous = ""
    for number, period in enumerate(periods):
        where = f"schema_config.configs[{number}]"
        if not isinstance(period, dict):
            raise ConfigError(f"invalid schema config: {where} must be a mapping")
        start = str(period.get("from") or "")
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", start):
            raise ConfigError(f'invalid schema config: {where}.from "{start}" is not YYYY-MM-DD')
        if start <= previous:
            raise ConfigError("invalid schema config: schema periods must be in ascending order")
        previous = start
        store, schema = period.get("store"), period.get("schema")
        if store not in INDEX_STORES:
            raise ConfigError(f'invalid schema config: {where}: unknown index store "{store}"')
        if schema not in SCHEMAS:
            raise ConfigError(f'invalid schema config: {where}: unknown schema version "{schema}"')
        index = period.get("index") if isinstance(period.get("index"), dict) else {}
        index_period = str(index.get("period") or "")
        if store in ("tsdb", "boltdb-shipper") and index_period != "24h":
            raise ConfigError(
                f"invalid schema config: {store} works best with 24h periodic index config. "
                "Either add a new config with future date set to 24h to retain the existing "
                "index or change the existing config to use 24h period"
            )
    limits = config.get("limits_config") or {}
    last = periods[-1]
    if limits.get("allow_structured_metadata", True) is True:
        if last.get("schema") != "v13":
            raise ConfigError(
                "CONFIG ERROR: schema v13 is required to store Structured Metadata and use "
                f"native OTLP ingestion, your schema version is {last.get('schema')}. Set "
                "`allow_structured_metadata: false` in the `limits_config` section"
            )
        if last.get("store") != "tsdb":
            raise ConfigError(
                "CONFIG ERROR: `tsdb` index type is required to store Structured Metadata and "
                f"use native OTLP ingestion, your index type is `{last.get('store')}`"
            )
    for key in ("retention_period", "max_query_lookback", "reject_old_samples_max_age"):
        if key in limits and not _prom_duration(limits[key]):
            raise ConfigError(
                f'invalid limits config: not a valid duration string: "{limits[key]}" ({key})'
            )
    compactor = config.get("compactor") or {}
    for key in ("compaction_interval", "retention_delete_delay", "apply_retention_interval"):
        if key in compactor and not GO_DURATION.match(str(compactor[key])):
            raise ConfigError(
                f'invalid compactor config: time: invalid duration "{compactor[key]}" ({key})'
            )
    if compactor.get("retention_enabled") is True and not compactor.get("delete_request_store"):
        raise ConfigError(
            "invalid compactor config: compactor.delete-request-store should be configured "
            "when retention is enabled"
        )


def _prom_duration(value: Any) -> bool:
    text = str(value)
    return text != "" and PROM_DURATION.match(text) is not None


# ----------------------------------------------------------------------- command line


def parse_flags(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Go flag package semantics for the flags above; exit 2 on a flag Loki would refuse."""
    values: dict[str, Any] = {}
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            return values, argv[index + 1 :]
        if not arg.startswith("-") or arg == "-":
            return values, argv[index:]
        name = arg[2:] if arg.startswith("--") else arg[1:]
        if not name or name.startswith("-") or name.startswith("="):
            usage_error(f"bad flag syntax: {arg}")
        value: str | None = None
        if "=" in name:
            name, value = name.split("=", 1)
        index += 1
        if name in BOOL_FLAGS:
            text = "true" if value is None else value
            if text not in ("1", "0", "t", "f", "T", "F", "true", "false", "TRUE", "FALSE"):
                usage_error(f'invalid boolean value "{text}" for -{name}: parse error')
            values[name] = text in ("1", "t", "T", "true", "TRUE")
        elif name in VALUE_FLAGS:
            if value is None:
                if index >= len(argv):
                    usage_error(f"flag needs an argument: -{name}")
                value = argv[index]
                index += 1
            values[name] = value
        else:
            usage_error(
                f"flag provided but not defined: -{name} (the gpufleet Loki stand-in knows "
                f"only -{', -'.join(sorted(BOOL_FLAGS | VALUE_FLAGS))})"
            )
    return values, []


def usage_error(message: str) -> None:
    print(message, file=sys.stderr)
    print("Usage of loki (gpufleet test stand-in):", file=sys.stderr)
    sys.exit(2)


def log(level: str, message: str, **fields: Any) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"
    extra = "".join(f" {key}={json.dumps(str(value))}" for key, value in fields.items())
    print(f'level={level} ts={stamp} caller=standin msg="{message}"{extra}', file=sys.stderr)


# ----------------------------------------------------------------------- server


class State:
    def __init__(self, config: dict, text: str) -> None:
        self.config, self.text = config, text
        self.lock = threading.Lock()
        self.lines: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.requests: dict[str, int] = {"json": 0, "protobuf": 0}
        self.started = time.time()

    def metrics(self) -> str:
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
        out = [
            "# HELP loki_build_info A metric with a constant '1' value labeled by version, "
            "revision, branch, goversion from which loki was built, and the goos and goarch "
            "for the build.",
            "# TYPE loki_build_info gauge",
            f'loki_build_info{{branch="standin",goarch="{arch}",goos="linux",goversion="",'
            f'revision="standin",tags="gpufleet-standin",version="{VERSION}"}} 1',
            "# HELP loki_distributor_lines_received_total The total number of lines received "
            "per tenant.",
            "# TYPE loki_distributor_lines_received_total counter",
        ]
        with self.lock:
            out += [
                f'loki_distributor_lines_received_total{{tenant="{t}"}} {n}'
                for t, n in sorted(self.lines.items())
            ]
            out += [
                "# HELP loki_distributor_bytes_received_total The total number of uncompressed "
                "bytes received per tenant.",
                "# TYPE loki_distributor_bytes_received_total counter",
            ]
            out += [
                f'loki_distributor_bytes_received_total{{tenant="{t}"}} {n}'
                for t, n in sorted(self.bytes.items())
            ]
            out += [
                "# HELP loki_standin_push_requests_total Push requests the gpufleet stand-in "
                "accepted, by body format (stand-in only; real Loki has no such metric).",
                "# TYPE loki_standin_push_requests_total counter",
            ]
            out += [
                f'loki_standin_push_requests_total{{format="{f}"}} {n}'
                for f, n in sorted(self.requests.items())
            ]
        out += [
            "# HELP process_start_time_seconds Start time of the process since unix epoch "
            "in seconds.",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.started:.2f}",
        ]
        return "\n".join(out) + "\n"

    def push(self, tenant: str, body: bytes) -> None:
        document = json.loads(body)
        streams = document.get("streams") if isinstance(document, dict) else None
        if not isinstance(streams, list):
            raise ValueError("no streams in push request")
        lines = size = 0
        for stream in streams:
            values = stream.get("values") if isinstance(stream, dict) else None
            if not isinstance(stream.get("stream"), dict) or not isinstance(values, list):
                raise ValueError("a stream needs a 'stream' label map and a 'values' list")
            for entry in values:
                if not (
                    isinstance(entry, list)
                    and len(entry) in (2, 3)
                    and all(isinstance(part, str) for part in entry[:2])
                    and entry[0].isdigit()
                ):
                    raise ValueError(f'invalid entry {entry!r}: want ["<unix ns>", "<line>"]')
                lines += 1
                size += len(entry[1].encode())
        with self.lock:
            self.lines[tenant] = self.lines.get(tenant, 0) + lines
            self.bytes[tenant] = self.bytes.get(tenant, 0) + size
            self.requests["json"] += 1


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"loki-standin/{VERSION}"

        def reply(self, status: int, body: str = "", kind: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/ready":
                self.reply(200, "ready\n")
            elif path == "/metrics":
                self.reply(200, state.metrics(), "text/plain; version=0.0.4")
            elif path == "/config":
                self.reply(200, state.text, "text/yaml")
            elif path == "/loki/api/v1/status/buildinfo":
                info = {"version": VERSION, "revision": "standin", "branch": "standin"}
                self.reply(200, json.dumps(info), "application/json")
            elif path == "/loki/api/v1/push":
                self.reply(405, "method not allowed\n")
            else:
                self.reply(404, "404 page not found\n")

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != "/loki/api/v1/push":
                self.reply(404, "404 page not found\n")
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            tenant = self.headers.get("X-Scope-OrgID") or ""
            if not tenant:
                if state.config.get("auth_enabled", True) is not False:
                    self.reply(401, "no org id\n")
                    return
                tenant = "fake"
            kind = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if kind == "application/x-protobuf":
                with state.lock:
                    state.requests["protobuf"] += 1
                self.reply(204)
                return
            try:
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                state.push(tenant, body)
            except (ValueError, OSError, AttributeError) as error:
                self.reply(400, f"loghttp.ParsePushRequest: {error}\n")
                return
            self.reply(204)

        def log_message(self, *_args: Any) -> None:
            pass

    return Handler


def serve(config: dict, text: str) -> None:
    server_config = config.get("server") or {}
    address = str(server_config.get("http_listen_address") or "0.0.0.0")
    port = int(server_config.get("http_listen_port", 3100))
    state = State(config, text)
    server = ThreadingHTTPServer((address, port), make_handler(state))
    server.daemon_threads = True

    def stop(signum: int, _frame: Any) -> None:
        log("info", "=== received SIGINT or SIGTERM ===", signal=signal.Signals(signum).name)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log("info", "Loki started", version=VERSION, addr=f"{address}:{port}", standin="true")
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    log("info", "Loki stopped")


def main(argv: list[str]) -> int:
    flags, _rest = parse_flags(argv)
    if flags.get("version"):
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "unknown")
        print(f"loki, version {VERSION} (branch: standin, revision: standin)")
        print("  build user:       gpufleet test bed")
        print(f"  platform:         linux/{arch}")
        print("  tags:             gpufleet-standin")
        return 0
    path = flags.get("config.file")
    if not path:
        log("error", "error loading config", err="config file not specified (-config.file)")
        return 1
    target = flags.get("target", "all")
    if target != "all":
        log("error", "the gpufleet Loki stand-in runs only -target=all", target=target)
        return 1
    try:
        config, text = load_config(path, flags.get("config.expand-env", False))
    except ConfigError as error:
        message = str(error)
        if message.startswith("failed parsing config"):
            print(message, file=sys.stderr)
        else:
            log("error", "validating config", err=message)
        return 1
    if flags.get("print-config-stderr"):
        print(text, file=sys.stderr)
    if flags.get("verify-config"):
        log("info", "config is valid")
        return 0
    serve(config, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
