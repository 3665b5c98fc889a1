#!/usr/bin/python3
"""TEST DOUBLE of Grafana Alloy's `/usr/bin/alloy`, for the gpufleet test bed only.

Alloy's packages cannot be downloaded on the test bed, so `build.py alloy-deb` packs
this file as /usr/bin/alloy into a .deb shaped like upstream's, and molecule's
`observability` scenario installs it with roles/alloy exactly as it would install
Alloy. Standard library only (test hosts have python3 and nothing else for it).

What it imitates:
  * `alloy fmt [-w] FILE|-`: the syntax check of the Alloy configuration language:
    comments (`//`, `/* */`), strings with Go escapes and raw strings, numbers,
    identifiers, blocks `a.b "label" { ... }` and attributes `name = expr` separated by
    newlines, expressions (arrays, objects with identifier or string keys, calls, member
    and index access, unary and binary operators), with commas between elements.
    Unbalanced braces/brackets/parentheses, unterminated strings or comments, a missing
    `=` or comma, and stray characters fail with `Error: FILE:LINE:COL: message` and
    exit status 1. A good file is printed unchanged (real fmt reformats it); `-w` leaves
    it as it is.
  * `alloy run [flags] CONFIG`: flags parsed like Alloy's (pflag: `--flag=value`,
    `--flag value`, booleans without a value, anywhere on the line); an unknown flag or
    not exactly one CONFIG fails like Alloy's CLI. --server.http.listen-addr (default
    127.0.0.1:12345) and --storage.path (created if missing, default data-alloy/) are
    used; the other flags of `alloy run` are accepted and ignored. It refuses to start
    (exit 1) on a config that fails the fmt check, a block label that is not an
    identifier, or two top-level blocks with the same name and label. Then it serves
    `GET /-/ready`, `GET /-/healthy`, `GET /metrics` (alloy_build_info with this
    version, alloy_config_hash{sha256}, alloy_config_last_load_successful,
    alloy_config_load_failures_total, alloy_config_last_load_success_timestamp_seconds,
    process_start_time_seconds, and the stand-in's own
    alloy_standin_config_reloads_total) and `GET|POST /-/reload`, and tells systemd
    READY=1 through $NOTIFY_SOCKET (the package's unit is Type=notify). SIGHUP or
    /-/reload re-reads and re-checks the config without exiting: a good one replaces
    the loaded one and counts a reload, a bad one is logged and counted as a load
    failure while the old one stays. SIGTERM/SIGINT end it cleanly (exit 0).
  * `alloy --version` / `-v`: `alloy, version vX (branch: standin, revision: standin)`.

What it does not do: run any component. Nothing reads the journal or files, nothing is
relabelled, processed or sent to Loki, no component names or arguments are checked
(an unknown component or a wrong attribute type passes), no UI, no clustering, no
`alloy convert`/`tools`/`otel` commands, and nothing is written under the storage path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn

# build.py replaces this line with the release version it packs.
VERSION = "0.0.0-standin"

RUN_VALUE_FLAGS = {
    "server.http.listen-addr",
    "server.http.memory-addr",
    "server.http.ui-path-prefix",
    "storage.path",
    "cluster.node-name",
    "cluster.advertise-address",
    "cluster.advertise-interfaces",
    "cluster.join-addresses",
    "cluster.discover-peers",
    "cluster.rejoin-interval",
    "cluster.max-join-peers",
    "cluster.name",
    "cluster.tls-ca-path",
    "cluster.tls-cert-path",
    "cluster.tls-key-path",
    "cluster.tls-server-name",
    "cluster.wait-for-size",
    "cluster.wait-timeout",
    "config.format",
    "config.extra-args",
    "stability.level",
    "windows.priority",
}
RUN_BOOL_FLAGS = {
    "server.http.enable-pprof",
    "cluster.enabled",
    "cluster.enable-tls",
    "config.bypass-conversion-errors",
    "disable-reporting",
    "disable-support-bundle",
    "feature.community-components.enabled",
}
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")
PUNCT = [
    "==",
    "!=",
    "<=",
    ">=",
    "&&",
    "||",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    ",",
    "=",
    ".",
    "<",
    ">",
    "+",
    "-",
    "*",
    "/",
    "%",
    "^",
    "!",
]
BINARY = {
    "||": 1,
    "&&": 2,
    "==": 3,
    "!=": 3,
    "<": 3,
    "<=": 3,
    ">": 3,
    ">=": 3,
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
    "^": 6,
}
ESCAPES = set("abfnrtv\\\"'")


class SyntaxProblem(Exception):
    def __init__(self, line: int, column: int, message: str) -> None:
        super().__init__(message)
        self.line, self.column, self.message = line, column, message

    def at(self, path: str) -> str:
        return f"{path}:{self.line}:{self.column}: {self.message}"


class Token:
    __slots__ = ("column", "kind", "line", "text")

    def __init__(self, kind: str, text: str, line: int, column: int) -> None:
        self.kind, self.text, self.line, self.column = kind, text, line, column

    def describe(self) -> str:
        if self.kind in ("EOF", "NEWLINE"):
            return self.kind if self.kind == "EOF" else "newline"
        return self.text if self.kind not in ("STRING",) else "string"


# ----------------------------------------------------------------------- lexer


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    line, line_start, i = 1, 0, 0

    def problem(offset: int, message: str) -> SyntaxProblem:
        return SyntaxProblem(line, offset - line_start + 1, message)

    while i < len(text):
        char = text[i]
        if char == "\n":
            tokens.append(Token("NEWLINE", "\n", line, i - line_start + 1))
            line, line_start, i = line + 1, i + 1, i + 1
        elif char in " \t\r":
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise problem(i, "comment not terminated")
            for offset in range(i, end):
                if text[offset] == "\n":
                    # A multi-line comment ends the line like a newline does (as in Go).
                    line, line_start = line + 1, offset + 1
            if "\n" in text[i:end]:
                tokens.append(Token("NEWLINE", "\n", line, 1))
            i = end + 2
        elif char == '"':
            start, j = i, i + 1
            while True:
                if j >= len(text) or text[j] == "\n":
                    raise problem(start, "string literal not terminated")
                if text[j] == "\\":
                    escape = text[j + 1 : j + 2]
                    if escape in ESCAPES:
                        j += 2
                    elif escape == "x" and re.match(r"[0-9a-fA-F]{2}", text[j + 2 : j + 4]):
                        j += 4
                    elif escape == "u" and re.match(r"[0-9a-fA-F]{4}", text[j + 2 : j + 6]):
                        j += 6
                    elif escape == "U" and re.match(r"[0-9a-fA-F]{8}", text[j + 2 : j + 10]):
                        j += 10
                    elif re.match(r"[0-7]{3}", text[j + 1 : j + 4]):
                        j += 4
                    else:
                        raise problem(j, "unknown escape sequence")
                    continue
                if text[j] == '"':
                    break
                j += 1
            tokens.append(Token("STRING", text[start : j + 1], line, start - line_start + 1))
            i = j + 1
        elif char == "`":
            end = text.find("`", i + 1)
            if end < 0:
                raise problem(i, "raw string literal not terminated")
            tokens.append(Token("STRING", text[i : end + 1], line, i - line_start + 1))
            for offset in range(i, end):
                if text[offset] == "\n":
                    line, line_start = line + 1, offset + 1
            i = end + 1
        elif char.isdigit():
            match = NUMBER.match(text, i)
            assert match is not None
            tokens.append(Token("NUMBER", match.group(0), line, i - line_start + 1))
            i = match.end()
        elif char.isalpha() or char == "_":
            match = IDENTIFIER.match(text, i)
            assert match is not None
            tokens.append(Token("IDENT", match.group(0), line, i - line_start + 1))
            i = match.end()
        else:
            for punct in PUNCT:
                if text.startswith(punct, i):
                    tokens.append(Token(punct, punct, line, i - line_start + 1))
                    i += len(punct)
                    break
            else:
                raise problem(i, f"illegal character U+{ord(char):04X} {char!r}")
    tokens.append(Token("EOF", "", line, i - line_start + 1))
    return tokens


# ----------------------------------------------------------------------- parser


class Parser:
    """Alloy's grammar: body = {attribute | block}; newlines end statements in a body
    and are insignificant inside (), [] and object literals."""

    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.index = 0
        self.skip_newlines = [False]
        self.blocks: list[tuple[str, str, Token]] = []

    def _next(self) -> int:
        position = self.index
        if self.skip_newlines[-1]:
            while self.tokens[position].kind == "NEWLINE":
                position += 1
        return position

    def peek(self) -> Token:
        return self.tokens[self._next()]

    def advance(self) -> Token:
        position = self._next()
        self.index = position + 1
        return self.tokens[position]

    def expect(self, kind: str, what: str | None = None) -> Token:
        token = self.peek()
        if token.kind != kind:
            self.fail(token, f"expected {what or kind}, got {token.describe()}")
        return self.advance()

    @staticmethod
    def fail(token: Token, message: str) -> NoReturn:
        raise SyntaxProblem(token.line, token.column, message)

    def parse(self) -> list[tuple[str, str, Token]]:
        self.body("EOF", depth=0)
        return self.blocks

    def body(self, end: str, depth: int) -> None:
        while True:
            while self.peek().kind == "NEWLINE":
                self.advance()
            token = self.peek()
            if token.kind == end:
                return
            if token.kind == "EOF":
                self.fail(token, "expected }, got EOF")
            self.statement(depth)
            after = self.peek()
            if after.kind not in ("NEWLINE", end):
                self.fail(after, f"expected newline, got {after.describe()}")

    def statement(self, depth: int) -> None:
        first = self.expect("IDENT", "identifier")
        if self.peek().kind == "=":
            self.advance()
            self.expression()
            return
        name = first.text
        while self.peek().kind == ".":
            self.advance()
            name += "." + self.expect("IDENT", "identifier").text
        label = ""
        if self.peek().kind == "STRING":
            label_token = self.advance()
            label = label_token.text
        if self.peek().kind != "{":
            token = self.peek()
            self.fail(token, f"expected attribute assignment or block body, got {token.describe()}")
        self.advance()
        if depth == 0:
            self.blocks.append((name, label, first))
        self.skip_newlines.append(False)
        self.body("}", depth + 1)
        self.skip_newlines.pop()
        self.expect("}", "}")

    def expression(self, precedence: int = 0) -> None:
        self.unary()
        while True:
            token = self.peek()
            op_precedence = BINARY.get(token.kind)
            if op_precedence is None or op_precedence <= precedence:
                return
            self.advance()
            # A line may end after an operator (as in Go); the operand follows.
            while self.tokens[self.index].kind == "NEWLINE":
                self.index += 1
            self.expression(op_precedence - (1 if token.kind == "^" else 0))

    def unary(self) -> None:
        while self.peek().kind in ("!", "-"):
            self.advance()
        self.primary()
        while self.peek().kind in (".", "[", "("):
            opener = self.advance()
            if opener.kind == ".":
                self.expect("IDENT", "identifier")
            elif opener.kind == "[":
                self.enclosed(lambda: self.expression(), "]", single=True)
            else:
                self.enclosed(lambda: self.expression(), ")")

    def primary(self) -> None:
        token = self.peek()
        if token.kind in ("IDENT", "NUMBER", "STRING"):
            self.advance()
        elif token.kind == "[":
            self.advance()
            self.enclosed(lambda: self.expression(), "]")
        elif token.kind == "{":
            self.advance()
            self.enclosed(self.field, "}")
        elif token.kind == "(":
            self.advance()
            self.enclosed(lambda: self.expression(), ")", single=True)
        else:
            self.fail(token, f"expected expression, got {token.describe()}")

    def field(self) -> None:
        key = self.peek()
        if key.kind not in ("IDENT", "STRING"):
            self.fail(key, f"expected field name (string or identifier), got {key.describe()}")
        self.advance()
        self.expect("=", "=")
        self.expression()

    def enclosed(self, element: Any, closer: str, single: bool = False) -> None:
        """Comma-separated elements up to closer (the opener is already consumed)."""
        self.skip_newlines.append(True)
        if self.peek().kind != closer:
            while True:
                element()
                token = self.peek()
                if token.kind == closer or single:
                    break
                if token.kind != ",":
                    self.fail(token, f"expected , or {closer}, got {token.describe()}")
                self.advance()
                if self.peek().kind == closer:
                    break
        self.expect(closer, closer)
        self.skip_newlines.pop()


def check(text: str) -> list[tuple[str, str, Token]]:
    """Syntax-check text; the top-level blocks (name, label, token) when it is good."""
    return Parser(text).parse()


def check_for_run(text: str) -> None:
    """What `alloy run` refuses beyond syntax (the part the stand-in knows)."""
    seen: dict[tuple[str, str], Token] = {}
    for name, label, token in check(text):
        plain = label[1:-1]
        if label and not IDENTIFIER.fullmatch(plain):
            raise SyntaxProblem(
                token.line, token.column, f'block label "{plain}" must be a valid identifier'
            )
        if (name, plain) in seen:
            first = seen[(name, plain)]
            raise SyntaxProblem(
                token.line,
                token.column,
                f'block {name} "{plain}" already declared at {first.line}:{first.column}',
            )
        seen[(name, plain)] = token


# ----------------------------------------------------------------------- commands


def fail(message: str, status: int = 1) -> NoReturn:
    print(f"Error: {message}", file=sys.stderr)
    sys.exit(status)


def parse_pflags(
    argv: list[str], values: set[str], booleans: set[str]
) -> tuple[dict[str, Any], list[str]]:
    flags: dict[str, Any] = {}
    positional: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        if arg == "--":
            positional += argv[index:]
            break
        if arg.startswith("--"):
            name, has_value, value = arg[2:].partition("=")
            if name in booleans:
                if has_value and value not in ("true", "false", "1", "0", "t", "f"):
                    fail(f'invalid argument "{value}" for "--{name}" flag')
                flags[name] = not has_value or value in ("true", "1", "t")
            elif name in values:
                if not has_value:
                    if index >= len(argv):
                        fail(f"flag needs an argument: --{name}")
                    value = argv[index]
                    index += 1
                flags[name] = value
            else:
                fail(f"unknown flag: --{name}")
        elif arg.startswith("-") and arg != "-":
            short = arg[1:]
            if short in ("w",) and "write" in booleans:
                flags["write"] = True
            else:
                fail(f"unknown shorthand flag: '{short[:1]}' in {arg}")
        else:
            positional.append(arg)
    return flags, positional


def read(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as error:
        fail(f"open {path}: {error.strerror}")
    except UnicodeDecodeError:
        fail(f"{path}: file is not valid UTF-8")


def command_fmt(argv: list[str]) -> int:
    flags, positional = parse_pflags(argv, set(), {"write"})
    if len(positional) > 1:
        fail(f"accepts at most 1 arg(s), received {len(positional)}")
    path = positional[0] if positional else "-"
    text = read(path)
    try:
        check(text)
    except SyntaxProblem as problem:
        print(f"Error: {problem.at(path)}", file=sys.stderr)
        print("Error: encountered errors during formatting", file=sys.stderr)
        return 1
    if not flags.get("write"):
        sys.stdout.write(text)
    return 0


def log(level: str, message: str, **fields: Any) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"
    extra = "".join(f" {key}={json.dumps(str(value))}" for key, value in fields.items())
    print(f'ts={stamp} level={level} msg="{message}"{extra}', file=sys.stderr, flush=True)


def sd_notify(state: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(state.encode())


class Runtime:
    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.started = time.time()
        self.hash = ""
        self.last_success = 1
        self.last_success_time = 0.0
        self.failures = 0
        self.reloads = 0

    def load(self) -> str:
        """Read and check the config; the error message when it is bad, else ''."""
        try:
            with open(self.path, "rb") as handle:
                data = handle.read()
            check_for_run(data.decode("utf-8"))
        except OSError as error:
            return f"open {self.path}: {error.strerror}"
        except UnicodeDecodeError:
            return f"{self.path}: file is not valid UTF-8"
        except SyntaxProblem as problem:
            return problem.at(self.path)
        self.hash = hashlib.sha256(data).hexdigest()
        self.last_success, self.last_success_time = 1, time.time()
        return ""

    def reload(self, why: str) -> str:
        with self.lock:
            error = self.load()
            if error:
                self.failures += 1
                self.last_success = 0
                log("error", "failed to reload config", err=error, trigger=why)
            else:
                self.reloads += 1
                log("info", "config reloaded", trigger=why, sha256=self.hash)
            return error

    def metrics(self) -> str:
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
        with self.lock:
            lines = [
                "# HELP alloy_build_info A metric with a constant '1' value labeled by version, "
                "revision, branch, goversion from which alloy was built, and the goos and "
                "goarch for the build.",
                "# TYPE alloy_build_info gauge",
                f'alloy_build_info{{branch="standin",goarch="{arch}",goos="linux",'
                f'goversion="",revision="standin",tags="gpufleet-standin",'
                f'version="v{VERSION}"}} 1',
                "# HELP alloy_config_hash Hash of the currently active config file.",
                "# TYPE alloy_config_hash gauge",
                f'alloy_config_hash{{sha256="{self.hash}"}} 1',
                "# HELP alloy_config_last_load_successful Config loaded successfully.",
                "# TYPE alloy_config_last_load_successful gauge",
                f"alloy_config_last_load_successful {self.last_success}",
                "# HELP alloy_config_last_load_success_timestamp_seconds Timestamp of the last "
                "successful configuration load.",
                "# TYPE alloy_config_last_load_success_timestamp_seconds gauge",
                f"alloy_config_last_load_success_timestamp_seconds {self.last_success_time:.3f}",
                "# HELP alloy_config_load_failures_total Configuration load failures.",
                "# TYPE alloy_config_load_failures_total counter",
                f"alloy_config_load_failures_total {self.failures}",
                "# HELP alloy_standin_config_reloads_total Successful reloads since start "
                "(SIGHUP or /-/reload; stand-in only, real Alloy has no such metric).",
                "# TYPE alloy_standin_config_reloads_total counter",
                f"alloy_standin_config_reloads_total {self.reloads}",
                "# HELP process_start_time_seconds Start time of the process since unix "
                "epoch in seconds.",
                "# TYPE process_start_time_seconds gauge",
                f"process_start_time_seconds {self.started:.2f}",
            ]
        return "\n".join(lines) + "\n"


def make_handler(runtime: Runtime) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"alloy-standin/{VERSION}"

        def reply(self, status: int, body: str, kind: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/-/ready":
                self.reply(200, "Alloy is ready.\n")
            elif path == "/-/healthy":
                self.reply(200, "All Alloy components are healthy.\n")
            elif path == "/metrics":
                self.reply(200, runtime.metrics(), "text/plain; version=0.0.4")
            elif path == "/-/reload":
                error = runtime.reload("http")
                self.reply(400 if error else 200, (error or "config reloaded") + "\n")
            else:
                self.reply(404, "404 page not found\n")

        do_POST = do_GET

        def log_message(self, *_args: Any) -> None:
            pass

    return Handler


def command_run(argv: list[str]) -> int:
    flags, positional = parse_pflags(argv, RUN_VALUE_FLAGS, RUN_BOOL_FLAGS)
    if len(positional) != 1:
        fail(f"accepts 1 arg(s), received {len(positional)}")
    runtime = Runtime(positional[0])
    error = runtime.load()
    if error:
        print(f"Error: {error}", file=sys.stderr)
        fail("could not perform the initial load successfully")
    storage = flags.get("storage.path", "data-alloy/")
    try:
        os.makedirs(storage, exist_ok=True)
    except OSError as err:
        fail(f"failed to create storage path {storage}: {err.strerror}")
    address = flags.get("server.http.listen-addr", "127.0.0.1:12345")
    host, _, port = address.rpartition(":")
    try:
        server = ThreadingHTTPServer((host.strip("[]"), int(port)), make_handler(runtime))
    except (OSError, ValueError) as err:
        fail(f"failed to listen on {address}: {err}")
    server.daemon_threads = True

    def on_hup(_signum: int, _frame: Any) -> None:
        runtime.reload("SIGHUP")

    def on_stop(signum: int, _frame: Any) -> None:
        log("info", "received shutdown signal", signal=signal.Signals(signum).name)
        sd_notify("STOPPING=1")
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGHUP, on_hup)
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    log("info", "now listening for http traffic", addr=address, version=f"v{VERSION}")
    log("info", "gpufleet stand-in: no components run", config=runtime.path, sha256=runtime.hash)
    sd_notify("READY=1")
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    log("info", "Alloy stopped")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage: alloy {run|fmt} ... (gpufleet test stand-in for Grafana Alloy)")
        return 0 if argv else 1
    if argv[0] in ("-v", "--version"):
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "unknown")
        print(f"alloy, version v{VERSION} (branch: standin, revision: standin)")
        print("  build user:       gpufleet test bed")
        print(f"  platform:         linux/{arch}")
        print("  tags:             gpufleet-standin")
        return 0
    if argv[0] == "fmt":
        return command_fmt(argv[1:])
    if argv[0] == "run":
        return command_run(argv[1:])
    fail(f'unknown command "{argv[0]}" for "alloy" (the gpufleet stand-in knows run and fmt)')


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
