#!/usr/bin/python3
"""TEST DOUBLE of Grafana Alloy's `/usr/bin/alloy`, for the gpufleet test bed only.

`build.py alloy-deb` packs this file into a .deb shaped like upstream's, so the
observability scenario installs it with roles/alloy's real install path. It proves the
mechanics around Alloy, not the configuration language (tests/unit/
test_loki_alloy_schema.py checks the rendered config against Alloy's documented
components):

  * `alloy --version`: `alloy, version vX (branch: standin, revision: standin)`.
  * `alloy fmt FILE` (the role's `validate:`): exit 1 with a message when FILE contains
    REFUSE_MARKER, else print it and exit 0. Nothing else is checked.
  * `alloy run [--flag=value ...] CONFIG`: refuses to start on the marker; tells systemd
    READY=1 (the package's unit is Type=notify); serves GET /-/ready and GET /metrics
    (alloy_config_hash{sha256}, alloy_config_last_load_successful,
    alloy_config_load_failures_total and the stand-in's own
    alloy_standin_config_reloads_total) on --server.http.listen-addr. SIGHUP re-reads
    CONFIG: a good one is loaded and counted as a reload, a refused one is counted as a
    failure and the old one stays (a reload, not a restart: the PID stays).
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# build.py replaces this line with the release version it packs.
VERSION = "0.0.0-standin"
# What the scenario puts into a config to see `validate:` refuse it.
REFUSE_MARKER = "gpufleet_standin_refuse"


def read_config(path: str) -> bytes:
    with open(path, "rb") as handle:
        data = handle.read()
    if REFUSE_MARKER.encode() in data:
        raise ValueError(f"{path}: the Alloy stand-in refuses a file containing {REFUSE_MARKER}")
    return data


class Runtime:
    def __init__(self, path: str) -> None:
        self.path = path
        self.hash = hashlib.sha256(read_config(path)).hexdigest()
        self.counts = {"ok": 1, "failures": 0, "reloads": 0}

    def reload(self, *_args: Any) -> None:
        try:
            self.hash = hashlib.sha256(read_config(self.path)).hexdigest()
        except (OSError, ValueError) as error:
            print(f"Error: failed to reload config: {error}", file=sys.stderr, flush=True)
            self.counts.update(ok=0, failures=self.counts["failures"] + 1)
            return
        self.counts.update(ok=1, reloads=self.counts["reloads"] + 1)

    def metrics(self) -> str:
        return (
            f'alloy_build_info{{version="v{VERSION}"}} 1\n'
            f'alloy_config_hash{{sha256="{self.hash}"}} 1\n'
            f"alloy_config_last_load_successful {self.counts['ok']}\n"
            f"alloy_config_load_failures_total {self.counts['failures']}\n"
            f"alloy_standin_config_reloads_total {self.counts['reloads']}\n"
        )


def make_handler(runtime: Runtime) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            pages = {"/-/ready": "Alloy is ready.\n", "/metrics": runtime.metrics()}
            data = pages.get(self.path, "404 page not found\n").encode()
            self.send_response(200 if self.path in pages else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_args: Any) -> None:
            pass

    return Handler


def sd_notify(state: str) -> None:
    address = os.environ.get("NOTIFY_SOCKET", "")
    if address:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect("\0" + address[1:] if address.startswith("@") else address)
            sock.sendall(state.encode())


def run(argv: list[str]) -> int:
    flags = dict(arg[2:].partition("=")[::2] for arg in argv if arg.startswith("--"))
    (path,) = [arg for arg in argv if not arg.startswith("-")]
    try:
        runtime = Runtime(path)
    except (OSError, ValueError) as error:
        print(f"Error: could not perform the initial load successfully: {error}", file=sys.stderr)
        return 1
    host, _, port = flags.get("server.http.listen-addr", "127.0.0.1:12345").rpartition(":")
    server = ThreadingHTTPServer((host, int(port)), make_handler(runtime))
    signal.signal(signal.SIGHUP, runtime.reload)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    sd_notify("READY=1")
    server.serve_forever(poll_interval=0.2)
    return 0


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    if command in ("-v", "--version"):
        print(f"alloy, version v{VERSION} (branch: standin, revision: standin)")
        return 0
    if command == "run":
        return run(argv[1:])
    if command == "fmt" and len(argv) == 2:
        try:
            sys.stdout.buffer.write(read_config(argv[1]))
        except (OSError, ValueError) as error:
            print(f"Error: {error}", file=sys.stderr)
            return 1
        return 0
    print("usage: alloy {run|fmt FILE|--version} (gpufleet test stand-in)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
