#!/usr/bin/python3
"""TEST DOUBLE of the Grafana server binary (``/usr/share/grafana/bin/grafana``).

Grafana cannot be installed on the test bed, so the ``grafana`` molecule scenario
installs this file, packaged by ``grafana_repo.py`` as a ``grafana`` .deb in a signed
apt repository, and runs roles/grafana against it. It proves the mechanics around
Grafana, not Grafana's configuration rules (tests/unit/test_grafana_provisioning_schema.py
checks the rendered provisioning files and grafana.ini against Grafana's documentation):

* ``grafana server --config=F [--pidfile=P] [cfg:default.S.K=V | cfg:S.K=V ...]``:
  reads ``[server] http_addr/http_port``, ``[security] admin_user/admin_password`` and
  ``[paths] data/provisioning`` from F and the ``cfg:`` arguments (as written, no
  unquoting). Its database is ``<paths.data>/standin-state.json``.
* The admin password is taken from grafana.ini only when that database is created;
  ``grafana cli ... admin reset-admin-password [--password-from-stdin | PASSWORD]``
  changes it (the running server sees it at once).
* Provisioning, at start and on ``POST /api/admin/provisioning/{kind}/reload``: the
  sha256 of every ``*.yml``/``*.yaml`` under ``<provisioning>/{kind}`` is recorded in the
  state as what was last loaded (the tests compare it with the files on disk: a reload
  or restart happened after the last write). A file with an ``orgId:`` line naming an
  organisation the database does not hold is refused, as Grafana refuses it (the role
  must create organisations before it provisions them): exit 1 at start, 500 on reload.
* HTTP API (JSON, basic auth as the admin, organisation from ``X-Grafana-Org-Id``): the
  calls the role makes, ``GET /api/health``, ``/api/user``, ``/api/orgs``,
  ``/api/orgs/name/<name>``, ``/api/teams/search?name=``, ``POST /api/orgs``,
  ``/api/teams`` and the reloads. Every call is logged in the state for the tests.

Nothing else: no UI, datasources, dashboards, users, alerting or plugins.
"""

from __future__ import annotations

import argparse
import base64
import configparser
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import sys
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# grafana_repo.py replaces this line with the packaged version.
VERSION = "0.0.0-standin"
STATE_FILE = "standin-state.json"
CALL_LOG_LIMIT = 5000
KINDS = ("datasources", "dashboards")
ORG_ID = re.compile(r"^[\s-]*orgId:\s*(\d+)\s*$", re.M)


def log(message: str) -> None:
    print(f"logger=standin t={time.strftime('%Y-%m-%dT%H:%M:%S')} msg={message}", flush=True)


def load_config(config_file: str | None, overrides: list[str]) -> dict[str, dict[str, str]]:
    """Sections of grafana.ini: cfg:default. values, then the file, then cfg: values."""
    settings: dict[str, dict[str, str]] = {}

    def apply(prefix: str) -> None:
        for item in (i for i in overrides if i.startswith(prefix)):
            key, _, value = item[len(prefix) :].partition("=")
            section, _, option = key.rpartition(".")
            settings.setdefault(section, {})[option] = value

    apply("cfg:default.")
    if config_file:
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.read_string("[__top__]\n" + Path(config_file).read_text(encoding="utf-8"))
        for section in parser.sections():
            settings.setdefault(section, {}).update(parser.items(section, raw=True))
    apply("cfg:")
    return settings


def hash_password(password: str, salt: str | None = None) -> dict[str, str]:
    salt = salt or secrets.token_hex(8)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), 10000).hex()
    return {"salt": salt, "hash": digest}


@contextlib.contextmanager
def locked_state(data_dir: str) -> Iterator[dict[str, Any]]:
    """The state file, locked; written back atomically, owned like its directory."""
    path = Path(data_dir) / STATE_FILE
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.loads(path.read_text()) if path.exists() else {}
        yield state
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        tmp.chmod(0o640)
        if os.getuid() == 0:
            owner = path.parent.stat()
            os.chown(tmp, owner.st_uid, owner.st_gid)
        tmp.replace(path)


def initialise(state: dict[str, Any], settings: dict[str, dict[str, str]]) -> None:
    """A new database: the main organisation and the admin from grafana.ini."""
    if state:
        return
    security = settings.get("security", {})
    admin = {"login": security.get("admin_user", "admin")}
    admin.update(hash_password(security.get("admin_password", "admin")))
    state.update({"admin": admin, "orgs": {"Main Org.": 1}, "teams": [], "calls": [], "loaded": {}})


def load_provisioning(state: dict[str, Any], directory: Path, kind: str) -> None:
    """Record what provisioning would read now; refuse an unknown orgId."""
    files = sorted(p for p in (directory / kind).glob("*.y*ml") if p.suffix in (".yml", ".yaml"))
    loaded = {}
    for path in files:
        text = path.read_text(encoding="utf-8")
        for org in ORG_ID.findall(text):
            if int(org) not in state["orgs"].values():
                raise ValueError(f'failed to provision "{path}": orgId {org}: org not found')
        loaded[path.name] = hashlib.sha256(text.encode()).hexdigest()
    state["loaded"][kind] = loaded


def basic_credentials(header: str) -> tuple[str, str] | None:
    """(login, password) of a basic ``Authorization`` header, read as Grafana reads it
    (Go's ``Request.BasicAuth``): the scheme ``Basic`` in any ASCII case and one space,
    standard padded base64, a ``:`` after the login; None for anything else."""
    scheme, encoded = header[:6], header[6:]
    # ASCII only, as Go's ascii.EqualFold: "ba\u017fic " casefolds to "basic " but is none.
    if not scheme.isascii() or scheme.lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(encoded, validate=True).decode()
    except ValueError:  # binascii.Error and UnicodeDecodeError both are
        return None
    login, colon, password = decoded.partition(":")
    return (login, password) if colon else None


class Api(BaseHTTPRequestHandler):
    data_dir: str
    provisioning: Path

    def log_message(self, format: str, *args: Any) -> None:
        log(f"{self.command} {self.path.split('?')[0]} {args[1] if len(args) > 1 else ''}")

    def do_GET(self) -> None:
        self.dispatch()

    def do_POST(self) -> None:
        self.dispatch()

    def dispatch(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        org = self.headers.get("X-Grafana-Org-Id")
        length = int(self.headers.get("Content-Length") or 0)
        try:
            payload = json.loads(self.rfile.read(length)) if length else {}
        except ValueError:
            payload = {}
        with locked_state(self.data_dir) as state:
            call = {"method": self.command, "path": url.path, "org": org, "time": time.time()}
            state["calls"] = [*state["calls"][-CALL_LOG_LIMIT:], call]
            status, answer = self.answer(state, url, org, payload)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authenticated(self, admin: dict[str, str]) -> bool:
        credentials = basic_credentials(self.headers.get("Authorization", ""))
        if credentials is None:
            return False
        login, password = credentials
        expected = hash_password(password, admin["salt"])["hash"]
        return login == admin["login"] and hmac.compare_digest(expected, admin["hash"])

    def answer(
        self,
        state: dict[str, Any],
        url: urllib.parse.SplitResult,
        org_header: str | None,
        payload: Any,
    ) -> tuple[int, Any]:
        call, path = f"{self.command} {url.path}", url.path
        if call == "GET /api/health":
            return 200, {"commit": "standin", "database": "ok", "version": VERSION}
        if not self.authenticated(state["admin"]):
            return 401, {"message": "Invalid username or password"}
        org = int(org_header) if org_header and org_header.isdigit() else 1
        if org not in state["orgs"].values():
            return 403, {"message": f"User is not a member of organization {org}"}
        name = str(payload.get("name", "")).strip() if isinstance(payload, dict) else ""
        if call == "GET /api/user":
            return 200, {"id": 1, "login": state["admin"]["login"], "isGrafanaAdmin": True}
        if call == "GET /api/orgs":
            return 200, [{"id": i, "name": n} for n, i in state["orgs"].items()]
        if call.startswith("GET /api/orgs/name/"):
            wanted = urllib.parse.unquote(path.rpartition("/")[2])
            if wanted in state["orgs"]:
                return 200, {"id": state["orgs"][wanted], "name": wanted}
            return 404, {"message": "Organization not found"}
        if call == "POST /api/orgs" and name:
            if name in state["orgs"]:
                return 409, {"message": "Organization name taken"}
            state["orgs"][name] = max(state["orgs"].values()) + 1
            return 200, {"orgId": state["orgs"][name], "message": "Organization created"}
        if call == "GET /api/teams/search":
            wanted = urllib.parse.parse_qs(url.query).get("name", [None])[0]
            teams = [t for t in state["teams"] if t["orgId"] == org and wanted in (None, t["name"])]
            return 200, {"totalCount": len(teams), "teams": teams}
        if call == "POST /api/teams" and name:
            if any(t["orgId"] == org and t["name"] == name for t in state["teams"]):
                return 409, {"message": "Team name taken"}
            state["teams"].append({"id": len(state["teams"]) + 1, "orgId": org, "name": name})
            return 200, {"message": "Team created", "teamId": len(state["teams"])}
        kind = path.split("/")[-2] if path.startswith("/api/admin/provisioning/") else ""
        if self.command == "POST" and kind in KINDS and path.endswith("/reload"):
            try:
                load_provisioning(state, self.provisioning, kind)
            except ValueError as error:
                return 500, {"message": f"Failed to reload {kind} config: {error}"}
            return 200, {"message": f"{kind.capitalize()} config reloaded"}
        return 404, {"message": "Not found"}


def server(args: argparse.Namespace) -> int:
    settings = load_config(args.config, args.overrides)
    paths, http = settings["paths"], settings.get("server", {})
    provisioning = Path(paths["provisioning"])
    with locked_state(paths["data"]) as state:
        initialise(state, settings)
        try:
            for kind in KINDS:
                load_provisioning(state, provisioning, kind)
        except ValueError as error:
            print(f"Error: ✗ Provisioning error: {error}", file=sys.stderr, flush=True)
            return 1
    if args.pidfile:
        Path(args.pidfile).write_text(f"{os.getpid()}\n")
    handler = type("BoundApi", (Api,), {"data_dir": paths["data"], "provisioning": provisioning})
    address = (http.get("http_addr") or "0.0.0.0", int(http.get("http_port") or 3000))
    httpd = ThreadingHTTPServer(address, handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log(f"HTTP Server Listen {address} version={VERSION}")
    httpd.serve_forever()
    return 0


def cli(args: argparse.Namespace) -> int:
    rest = list(args.rest)
    if rest[:2] != ["admin", "reset-admin-password"] or len(rest) != 3:
        print(
            f"grafana cli: the stand-in knows only reset-admin-password, not {rest}",
            file=sys.stderr,
        )
        return 2
    password = sys.stdin.readline().rstrip("\n") if rest[2] == "--password-from-stdin" else rest[2]
    if not password:
        print("Error: ✗ New password is too short", file=sys.stderr)
        return 1
    settings = load_config(args.config, [])
    with locked_state(settings.get("paths", {}).get("data", "/var/lib/grafana")) as state:
        initialise(state, settings)
        state["admin"].update(hash_password(password))
    print("Admin password changed successfully ✔")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grafana", description="Grafana stand-in (test double)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_server = sub.add_parser("server")
    for flag in ("--config", "--homepath", "--pidfile", "--packaging"):
        p_server.add_argument(flag)
    p_server.add_argument("overrides", nargs="*", metavar="cfg:SECTION.KEY=VALUE")
    p_cli = sub.add_parser("cli")
    p_cli.add_argument("--config")
    p_cli.add_argument("--homepath")
    p_cli.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    return server(args) if args.command == "server" else cli(args)


if __name__ == "__main__":
    sys.exit(main())
