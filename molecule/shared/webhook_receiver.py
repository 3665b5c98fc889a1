#!/usr/bin/env python3
"""Test bed only: an Alertmanager webhook receiver that appends each notification
(one JSON document per line) to a log file, so tests can count deliveries."""

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, HTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=9999)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with open(args.log, "a", encoding="utf-8") as log:
                log.write(json.dumps({"received": time.time(), "payload": json.loads(body)}) + "\n")
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_args) -> None:
            pass

    HTTPServer(("0.0.0.0", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
