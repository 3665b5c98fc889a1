#!/usr/bin/python3
"""TEST DOUBLE of the Grafana server binary (``/usr/share/grafana/bin/grafana``).

Grafana cannot be installed on the test bed (apt.grafana.com is unreachable), so the
``grafana`` molecule scenario installs this file, packaged by ``grafana_repo.py`` as a
``grafana`` .deb in a signed apt repository, and runs roles/grafana against it. It is a
test fixture, never production code: nothing under roles/, plugins/ or src/ knows it.

What it imitates (as Grafana 10+ behaves, for the parts roles/grafana relies on):

* ``grafana server --config=F [--homepath=H] [--pidfile=P] [--packaging=deb]
  [cfg:default.S.K=V | cfg:S.K=V ...]``: reads grafana.ini with Grafana's precedence
  (``cfg:default.`` values < the file < ``cfg:`` values), ``[server] http_addr/http_port``,
  ``[security] admin_user/admin_password``, ``[paths] data/provisioning``; triple-quoted
  values are unquoted. The "database" is ``<paths.data>/standin-state.json``.
* The admin password rule: ``admin_user``/``admin_password`` from grafana.ini are used
  only when the database is created (first start); later edits of grafana.ini do not
  change the stored password. The password is stored as a salted PBKDF2 hash.
* ``grafana cli [--homepath H] [--config F] admin reset-admin-password
  [--password-from-stdin | PASSWORD]``: changes the stored password; the running server
  sees it at once (it rereads the state on every request).
* Provisioning at start and on the reload API: every ``*.yml``/``*.yaml`` under
  ``<provisioning>/datasources`` and ``<provisioning>/dashboards`` is read; an ``orgId``
  naming an organisation that does not exist is an error (Grafana's rule; it depends on
  the organisations the role created, so it is kept here; what the files mean is checked
  by tests/unit/test_grafana_provisioning_schema.py). At start such an error makes the
  server exit non-zero, as Grafana refuses to start; on the reload API it answers 500.
  Datasource uids and the ``"uid"``/``"title"`` of the JSON files under each dashboard
  provider's ``options.path`` are recorded per organisation.
* HTTP API, JSON, basic auth against the stored admin user (401 ``Invalid username or
  password`` otherwise), organisation from ``X-Grafana-Org-Id`` (default 1):
  ``GET /api/health`` (no auth), ``GET /api/user``, ``GET /api/orgs``,
  ``GET /api/orgs/name/<name>``, ``POST /api/orgs``, ``GET /api/teams/search?name=``,
  ``POST /api/teams``, ``POST /api/admin/provisioning/{datasources,dashboards}/reload``,
  and, for tests, what the last provisioning run loaded: ``GET /api/datasources`` and
  ``GET /api/search?type=dash-db``. Every API call is appended to a call log in the
  state (method, path, org header, time) so tests can count reloads.

What it does NOT do: no UI, no sessions or login form, no API keys or service accounts,
no users other than the admin (teams have no members), no datasource proxying or queries,
no dashboard rendering, storage or versioning (dashboards are only the files provisioning
found), no folder permissions, no alerting, plugins or plugin provisioning, no periodic
re-read of dashboard files (``updateIntervalSeconds``: only start and the reload API
load provisioning), no ``$VAR`` expansion in provisioning files, no TLS, no database
other than the JSON file. Its provisioning reader is a line-based scan of block-style
YAML as the role writes it (top-level list items and their keys, and ``options.path``),
not a YAML parser. Error texts and status codes follow Grafana's where the role looks at
them; a request for an organisation that does not exist answers 403.
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
MAIN_ORG = "Main Org."
DEFAULT_HOMEPATH = "/usr/share/grafana"


class ProvisioningError(Exception):
    """A provisioning file Grafana would refuse."""


def log(message: str, **fields: Any) -> None:
    extra = " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in fields.items())
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"logger=standin t={now} msg={json.dumps(message)} {extra}".rstrip(), flush=True)


# ---------------------------------------------------------------------------- config


def unquote(value: str) -> str:
    value = value.strip()
    for quote in ('"""', '"', "'"):
        if len(value) >= 2 * len(quote) and value.startswith(quote) and value.endswith(quote):
            return value[len(quote) : -len(quote)]
    return value


def load_config(
    config_file: str | None, homepath: str, overrides: list[str]
) -> dict[str, dict[str, str]]:
    """grafana.ini with Grafana's precedence: cfg:default. < file < cfg:."""
    settings: dict[str, dict[str, str]] = {
        "paths": {
            "data": str(Path(homepath) / "data"),
            "provisioning": str(Path(homepath) / "conf" / "provisioning"),
        },
        "server": {"http_addr": "", "http_port": "3000"},
        "security": {"admin_user": "admin", "admin_password": "admin"},
    }

    def apply(prefix: str) -> None:
        for item in overrides:
            if not item.startswith(prefix):
                continue
            key, _, value = item[len(prefix) :].partition("=")
            section, _, option = key.rpartition(".")
            settings.setdefault(section, {})[option] = value

    apply("cfg:default.")
    if config_file:
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        text = Path(config_file).read_text(encoding="utf-8")
        parser.read_string("[__top__]\n" + text, source=config_file)
        for section in parser.sections():
            for option, value in parser.items(section, raw=True):
                settings.setdefault(section, {})[option] = unquote(value)
    apply("cfg:")
    for item in overrides:
        if not item.startswith("cfg:"):
            raise SystemExit(f"grafana: unknown argument {item!r}")
    return settings


# ----------------------------------------------------------------------------- state


def hash_password(password: str, salt: str | None = None) -> dict[str, str]:
    salt = salt or secrets.token_hex(8)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), 10000).hex()
    return {"salt": salt, "hash": digest}


class State:
    """The stand-in's database: one JSON file, read and written under a lock."""

    def __init__(self, data_dir: str) -> None:
        self.path = Path(data_dir) / STATE_FILE
        self.lock_path = Path(data_dir) / (STATE_FILE + ".lock")

    def exists(self) -> bool:
        return self.path.exists()

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        """The state, locked; written back (atomically) when the block ends."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(self.path.read_text()) if self.path.exists() else {}
            before = json.dumps(state, sort_keys=True)
            yield state
            if json.dumps(state, sort_keys=True) != before:
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
                tmp.chmod(0o640)
                owner = self.path.parent.stat()
                if os.getuid() == 0:
                    os.chown(tmp, owner.st_uid, owner.st_gid)
                tmp.replace(self.path)


def initialise(state: dict[str, Any], settings: dict[str, dict[str, str]]) -> None:
    """A new database: the main organisation and the admin from grafana.ini."""
    security = settings.get("security", {})
    state.update(
        {
            "created": time.time(),
            "admin": {
                "login": security.get("admin_user", "admin"),
                **hash_password(security.get("admin_password", "admin")),
            },
            "orgs": [{"id": 1, "name": MAIN_ORG}],
            "teams": [],
            "provisioned": {"datasources": {}, "dashboards": {}},
            "calls": [],
        }
    )


# ---------------------------------------------------------------------- provisioning


_KEY = re.compile(r"^(?P<key>[A-Za-z_][\w.-]*):(?:[ \t]+(?P<value>.*?))?\s*$")


def yaml_scalar(value: str | None) -> Any:
    if value is None:
        return None
    value = value.strip()
    if value.startswith(("'", '"')):
        return unquote(value)
    value = re.sub(r"\s+#.*$", "", value)
    if value in ("true", "True"):
        return True
    if value in ("false", "False"):
        return False
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    return value


def yaml_lists(text: str) -> dict[str, list[dict[str, Any]]]:
    """Items of the top-level block lists: {list name: [{key or parent.key: scalar}]}.

    Only keys directly on a list item, and one mapping level below them
    (``options.path``), are read; deeper structure and nested lists are skipped.
    """
    result: dict[str, list[dict[str, Any]]] = {}
    items: list[dict[str, Any]] | None = None
    item: dict[str, Any] = {}
    item_indent: int | None = None
    key_indent = child_indent = -1
    parent: str | None = None

    def record(indent: int, text: str) -> None:
        nonlocal parent, child_indent
        match = _KEY.match(text)
        if not match:
            return
        key, value = match.group("key"), match.group("value")
        if indent == key_indent:
            item[key] = yaml_scalar(value)
            parent, child_indent = (key, -1) if value in (None, "") else (None, -1)
        elif parent is not None and indent > key_indent:
            if child_indent < 0:
                child_indent = indent
            if indent == child_indent:
                item[f"{parent}.{key}"] = yaml_scalar(value)

    for line in text.splitlines():
        stripped = line.lstrip(" ")
        if not stripped.strip() or stripped.startswith("#"):
            continue
        indent = len(line) - len(stripped)
        if indent == 0 and not stripped.startswith("- "):
            items, item_indent, parent = None, None, None
            match = _KEY.match(stripped)
            if match and match.group("value") in (None, ""):
                items = result.setdefault(match.group("key"), [])
            continue
        if items is None:
            continue
        if stripped.startswith("- "):
            if item_indent is None:
                item_indent = indent
            if indent == item_indent:
                item, parent = {}, None
                items.append(item)
                rest = stripped[1:].lstrip(" ")
                key_indent = indent + len(stripped) - len(rest)
                record(key_indent, rest)
            continue
        if item_indent is not None and indent > item_indent:
            record(indent, stripped)
    return result


def provisioning_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix in (".yml", ".yaml") and p.is_file())


def org_ids(state: dict[str, Any]) -> set[int]:
    return {org["id"] for org in state["orgs"]}


def org_id_of(entry: dict[str, Any], path: Path) -> int:
    value = entry.get("orgId", 1)
    if value in (None, 0, ""):
        return 1
    if not isinstance(value, int):
        raise ProvisioningError(f"{path}: orgId {value!r} is not a number")
    return value


def load_datasources(provisioning: Path, state: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    existing = org_ids(state)
    loaded: dict[str, list[dict[str, Any]]] = {}
    for path in provisioning_files(provisioning / "datasources"):
        lists = yaml_lists(path.read_text(encoding="utf-8"))
        for entry in lists.get("deleteDatasources", []):
            org = org_id_of(entry, path)
            if org not in existing:
                raise ProvisioningError(
                    f'failed to provision "{path}": orgId {org}: organization not found'
                )
        for entry in lists.get("datasources", []):
            org = org_id_of(entry, path)
            if org not in existing:
                raise ProvisioningError(
                    f'failed to provision "{path}": orgId {org}: organization not found'
                )
            loaded.setdefault(str(org), []).append(
                {
                    "orgId": org,
                    "uid": entry.get("uid"),
                    "name": entry.get("name"),
                    "type": entry.get("type"),
                    "url": entry.get("url"),
                    "isDefault": entry.get("isDefault") is True,
                    "file": str(path),
                }
            )
    for datasources in loaded.values():
        for number, ds in enumerate(datasources, start=1):
            ds["id"] = number
    return loaded


def load_dashboards(provisioning: Path, state: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    existing = org_ids(state)
    loaded: dict[str, list[dict[str, Any]]] = {}
    for path in provisioning_files(provisioning / "dashboards"):
        for provider in yaml_lists(path.read_text(encoding="utf-8")).get("providers", []):
            org = org_id_of(provider, path)
            name = provider.get("name", "")
            if org not in existing:
                raise ProvisioningError(
                    f'failed to provision dashboards with "{name}" reader from "{path}":'
                    f" orgId {org}: organization not found"
                )
            folder = Path(str(provider.get("options.path") or provider.get("path") or ""))
            if not folder.is_dir():
                log("Cannot read directory", provider=name, path=str(folder))
                continue
            for dashboard in sorted(folder.rglob("*.json")):
                try:
                    doc = json.loads(dashboard.read_text(encoding="utf-8"))
                except ValueError as error:
                    log("failed to load dashboard", file=str(dashboard), error=str(error))
                    continue
                loaded.setdefault(str(org), []).append(
                    {
                        "orgId": org,
                        "uid": doc.get("uid"),
                        "title": doc.get("title"),
                        "type": "dash-db",
                        "folderTitle": provider.get("folder", ""),
                        "folderUid": provider.get("folderUid", ""),
                        "provider": name,
                        "file": str(dashboard),
                    }
                )
    for dashboards in loaded.values():
        for number, dashboard in enumerate(dashboards, start=1):
            dashboard["id"] = number
    return loaded


# ------------------------------------------------------------------------------- API


class Api(BaseHTTPRequestHandler):
    server_version = "Grafana-standin"
    store: State
    provisioning: Path

    def log_message(self, format: str, *args: Any) -> None:
        log(
            "Request Completed",
            method=self.command,
            path=self.path.split("?")[0],
            status=args[1] if len(args) > 1 else "",
        )

    def send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.dispatch()

    def do_POST(self) -> None:
        self.dispatch()

    def body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return {}
        try:
            value = json.loads(self.rfile.read(length))
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def authenticated(self, state: dict[str, Any]) -> bool:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        try:
            login, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return False
        admin = state["admin"]
        expected = hash_password(password, admin["salt"])["hash"]
        return login == admin["login"] and hmac.compare_digest(expected, admin["hash"])

    def dispatch(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        org_header = self.headers.get("X-Grafana-Org-Id")
        payload = self.body() if self.command == "POST" else {}
        with self.store.locked() as state:
            state["calls"].append(
                {"method": self.command, "path": url.path, "org": org_header, "time": time.time()}
            )
            del state["calls"][:-CALL_LOG_LIMIT]
            status, answer = self.handle_call(state, url.path, query, org_header, payload)
        self.send_json(status, answer)

    def handle_call(
        self,
        state: dict[str, Any],
        path: str,
        query: dict[str, list[str]],
        org_header: str | None,
        payload: dict[str, Any],
    ) -> tuple[int, Any]:
        method = self.command
        if method == "GET" and path == "/api/health":
            return 200, {"commit": "standin", "database": "ok", "version": VERSION}
        if not path.startswith("/api/"):
            return 404, {"message": "Not found"}
        if not self.authenticated(state):
            return 401, {"message": "Invalid username or password"}
        try:
            org = int(org_header) if org_header else 1
        except ValueError:
            return 400, {"message": "Invalid X-Grafana-Org-Id header"}
        if org not in org_ids(state):
            return 403, {
                "message": f"User is not a member of organization {org}: organization not found"
            }
        if method == "GET" and path == "/api/user":
            return 200, {
                "id": 1,
                "login": state["admin"]["login"],
                "email": "admin@localhost",
                "orgId": org,
                "isGrafanaAdmin": True,
            }
        if method == "GET" and path == "/api/orgs":
            return 200, [{"id": o["id"], "name": o["name"]} for o in state["orgs"]]
        if method == "GET" and path.startswith("/api/orgs/name/"):
            name = urllib.parse.unquote(path[len("/api/orgs/name/") :])
            for existing in state["orgs"]:
                if existing["name"] == name:
                    return 200, {"id": existing["id"], "name": existing["name"], "address": {}}
            return 404, {"message": "Organization not found"}
        if method == "POST" and path == "/api/orgs":
            name = str(payload.get("name", "")).strip()
            if not name:
                return 400, {"message": "bad request data"}
            if any(o["name"] == name for o in state["orgs"]):
                return 409, {"message": "Organization name taken"}
            new_id = max(org_ids(state)) + 1
            state["orgs"].append({"id": new_id, "name": name})
            return 200, {"orgId": new_id, "message": "Organization created"}
        if method == "GET" and path == "/api/teams/search":
            name = query.get("name", [None])[0]
            teams = [
                t
                for t in state["teams"]
                if t["orgId"] == org and (name is None or t["name"] == name)
            ]
            return 200, {"totalCount": len(teams), "teams": teams, "page": 1, "perPage": 1000}
        if method == "POST" and path == "/api/teams":
            name = str(payload.get("name", "")).strip()
            if not name:
                return 400, {"message": "bad request data"}
            if any(t["orgId"] == org and t["name"] == name for t in state["teams"]):
                return 409, {"message": "Team name taken"}
            new_id = max([t["id"] for t in state["teams"]], default=0) + 1
            state["teams"].append(
                {
                    "id": new_id,
                    "orgId": org,
                    "name": name,
                    "email": payload.get("email", ""),
                    "memberCount": 0,
                }
            )
            return 200, {"message": "Team created", "teamId": new_id}
        if method == "POST" and path in (
            "/api/admin/provisioning/datasources/reload",
            "/api/admin/provisioning/dashboards/reload",
        ):
            kind = path.split("/")[-2]
            loader = load_datasources if kind == "datasources" else load_dashboards
            try:
                state["provisioned"][kind] = loader(self.provisioning, state)
            except ProvisioningError as error:
                log("Failed to reload provisioning", kind=kind, error=str(error))
                return 500, {"message": f"Failed to reload {kind} config: {error}"}
            return 200, {"message": f"{kind.capitalize()} config reloaded"}
        if method == "GET" and path == "/api/datasources":
            return 200, state["provisioned"]["datasources"].get(str(org), [])
        if method == "GET" and path == "/api/search":
            dashboards = state["provisioned"]["dashboards"].get(str(org), [])
            if query.get("type", ["dash-db"])[0] != "dash-db":
                return 200, []
            return 200, dashboards
        return 404, {"message": "Not found"}


# ------------------------------------------------------------------------- commands


def server(args: argparse.Namespace) -> int:
    settings = load_config(args.config, args.homepath, args.overrides)
    paths, http = settings["paths"], settings["server"]
    store = State(paths["data"])
    provisioning = Path(paths["provisioning"])
    with store.locked() as state:
        if not state:
            initialise(state, settings)
            log("Created the database and the admin user", login=state["admin"]["login"])
        try:
            state["provisioned"] = {
                "datasources": load_datasources(provisioning, state),
                "dashboards": load_dashboards(provisioning, state),
            }
        except ProvisioningError as error:
            print(f"Error: ✗ Provisioning error: {error}", file=sys.stderr, flush=True)
            return 1
    if args.pidfile:
        Path(args.pidfile).write_text(f"{os.getpid()}\n")
    handler = type("BoundApi", (Api,), {"store": store, "provisioning": provisioning})
    address = http.get("http_addr") or "0.0.0.0"
    httpd = ThreadingHTTPServer((address, int(http.get("http_port") or 3000)), handler)
    httpd.daemon_threads = True

    def stop(signum: int, _frame: object) -> None:
        log("Shutdown started", reason=signal.Signals(signum).name)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    log("HTTP Server Listen", address=f"{address}:{http.get('http_port')}", version=VERSION)
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()
    return 0


def cli(args: argparse.Namespace) -> int:
    rest = list(args.rest)
    if rest[:2] != ["admin", "reset-admin-password"]:
        print(
            f"grafana cli: the stand-in knows only 'admin reset-admin-password', not {rest!r}",
            file=sys.stderr,
        )
        return 2
    rest = rest[2:]
    if "--password-from-stdin" in rest:
        password = sys.stdin.readline().rstrip("\n")
    elif len(rest) == 1:
        password = rest[0]
    else:
        print(
            "Error: ✗ Admin password is missing (new password or --password-from-stdin)",
            file=sys.stderr,
        )
        return 1
    if not password:
        print("Error: ✗ New password is too short", file=sys.stderr)
        return 1
    settings = load_config(args.config, args.homepath, [])
    store = State(settings["paths"]["data"])
    with store.locked() as state:
        if not state:
            initialise(state, settings)
        state["admin"].update(hash_password(password))
    print("Admin password changed successfully ✔")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grafana", description="Grafana stand-in (test double)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_server = sub.add_parser("server")
    p_server.add_argument("--config")
    p_server.add_argument("--homepath", default=DEFAULT_HOMEPATH)
    p_server.add_argument("--pidfile")
    p_server.add_argument("--packaging")
    p_server.add_argument("overrides", nargs="*", metavar="cfg:SECTION.KEY=VALUE")
    p_cli = sub.add_parser("cli")
    p_cli.add_argument("--config")
    p_cli.add_argument("--homepath", default=DEFAULT_HOMEPATH)
    p_cli.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "server":
        return server(args)
    return cli(args)


if __name__ == "__main__":
    sys.exit(main())
