#!/usr/bin/env python3
"""Test bed only: an SMTP sink that appends each mail it accepts (recipients and text,
one JSON document per line) to a log file, so tests can count deliveries. Plain SMTP,
no TLS, no auth; Python 3.13 has no smtpd module, and this is all Alertmanager needs."""

import argparse
import json
import socketserver
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=2525)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()

    class Handler(socketserver.StreamRequestHandler):
        def say(self, text: str) -> None:
            self.wfile.write(f"{text}\r\n".encode())

        def handle(self) -> None:
            self.say("220 gpufleet-test-smtp-sink")
            rcpt: list[str] = []
            data: list[str] | None = None
            for raw in self.rfile:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if data is not None:
                    if line == ".":
                        record = {"received": time.time(), "rcpt": rcpt, "data": "\n".join(data)}
                        with open(args.log, "a", encoding="utf-8") as log:
                            log.write(json.dumps(record) + "\n")
                        data, rcpt = None, []
                        self.say("250 ok")
                    else:  # dot-stuffing: a leading "." is doubled on the wire
                        data.append(line[1:] if line.startswith("..") else line)
                    continue
                verb = line[:4].upper()
                if verb == "RCPT":
                    rcpt.append(line.split(":", 1)[1].strip())
                    self.say("250 ok")
                elif verb == "DATA":
                    data = []
                    self.say("354 end with <CRLF>.<CRLF>")
                elif verb == "QUIT":
                    self.say("221 bye")
                    return
                else:  # EHLO, HELO, MAIL, RSET, NOOP: no extensions, so no STARTTLS or AUTH
                    self.say("250 ok")

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    socketserver.ThreadingTCPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
