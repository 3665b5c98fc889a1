#!/usr/bin/python3
"""TEST DOUBLE of Grafana Loki's `loki` binary, for the gpufleet test bed only.

`build.py loki-zip` packs this file into a release-shaped zip, so the observability
scenario installs it with roles/loki's real install path. It proves the mechanics
around Loki, not Loki's configuration rules (tests/unit/test_loki_alloy_schema.py
checks the rendered config against Loki's documented reference):

  * `-version`: `loki, version X (branch: standin, revision: standin)`.
  * `-verify-config -config.file F` (the role's `validate:`): exit 1 with a message when
    F contains REFUSE_MARKER, else exit 0. Nothing else is checked.
  * otherwise the server: refuses to start on the same marker; listens on the
    http_listen_address/http_listen_port lines of the file; answers GET /ready,
    GET /metrics (loki_build_info, lines received per tenant), GET /config (the file as
    read) and POST /loki/api/v1/push (a JSON push counted per X-Scope-OrgID, `fake` by
    default). Like Loki it has no reload: SIGHUP ends it, a config change needs a restart.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# build.py replaces this line with the release version it packs.
VERSION = "0.0.0-standin"
# What the scenario puts into a config to see `validate:` refuse it.
REFUSE_MARKER = "gpufleet_standin_refuse"


def parse_flags(argv: list[str]) -> dict[str, str]:
    """Go-style `-name=value`, `-name value` (value flags) and bare booleans."""
    flags: dict[str, str] = {}
    args = iter(argv)
    for arg in args:
        name, has_value, value = arg.lstrip("-").partition("=")
        if name in ("config.file", "target") and not has_value:
            value = next(args, "")
        flags[name] = value if has_value or name in ("config.file", "target") else "true"
    return flags


def read_config(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if REFUSE_MARKER in text:
        raise ValueError(f"{path}: the Loki stand-in refuses a file containing {REFUSE_MARKER}")
    return text


def setting(text: str, key: str, default: str) -> str:
    match = re.search(rf"^\s+{key}:\s*['\"]?([^'\"\s]+)", text, re.M)
    return match.group(1) if match else default


def make_handler(text: str, lines: dict[str, int]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def reply(self, status: int, body: str = "") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/ready":
                self.reply(200, "ready\n")
            elif self.path == "/config":
                self.reply(200, text)
            elif self.path == "/metrics":
                out = [f'loki_build_info{{version="{VERSION}"}} 1']
                out += [
                    f'loki_distributor_lines_received_total{{tenant="{tenant}"}} {count}'
                    for tenant, count in sorted(lines.items())
                ]
                self.reply(200, "\n".join(out) + "\n")
            else:
                self.reply(404, "404 page not found\n")

        def do_POST(self) -> None:
            if self.path != "/loki/api/v1/push":
                self.reply(404, "404 page not found\n")
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                streams = json.loads(body)["streams"]
                count = sum(len(stream["values"]) for stream in streams)
            except (ValueError, KeyError, TypeError) as error:
                self.reply(400, f"bad push: {error}\n")
                return
            tenant = self.headers.get("X-Scope-OrgID") or "fake"
            lines[tenant] = lines.get(tenant, 0) + count
            self.reply(204)

        def log_message(self, *_args: Any) -> None:
            pass

    return Handler


def main(argv: list[str]) -> int:
    flags = parse_flags(argv)
    if "version" in flags:
        print(f"loki, version {VERSION} (branch: standin, revision: standin)")
        return 0
    try:
        text = read_config(flags.get("config.file", ""))
    except (OSError, ValueError) as error:
        print(
            f'level=error msg="error loading config" err={json.dumps(str(error))}', file=sys.stderr
        )
        return 1
    if "verify-config" in flags:
        print('level=info msg="config is valid"')
        return 0
    address = setting(text, "http_listen_address", "0.0.0.0")
    port = int(setting(text, "http_listen_port", "3100"))
    server = ThreadingHTTPServer((address, port), make_handler(text, {}))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
