"""The Prometheus client's one-line errors, basic auth and the inventory's URLs."""

from __future__ import annotations

import base64
import http.server
import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobstats_synth import free_port

from gpufleet.cli import build_parser, main
from gpufleet.jobstats.targets import from_inventory
from gpufleet.nodelist import load_node_list
from gpufleet_node.job_summary.prom import PromClient, PromError, Sample

# path -> (status, body); every request's Authorization header is recorded
ANSWERS: dict[str, tuple[int, bytes]] = {}
SEEN_AUTH: list[str] = []


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        SEEN_AUTH.append(self.headers.get("Authorization", ""))
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, body = ANSWERS.get(self.server.mode, (200, b"{}"))  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.HTTPServer]:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def url_of(httpd: http.server.HTTPServer) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}"


ERROR_CASES = {
    "http500": (500, b"boom", "HTTP 500 Internal Server Error"),
    "bad_query": (
        400,
        json.dumps({"status": "error", "error": "parse error:\n  at char 3"}).encode(),
        "HTTP 400 Bad Request: parse error: at char 3",
    ),
    "not_json": (200, b"<html>proxy login</html>", "answer is not JSON (not a Prometheus API?)"),
    "not_api": (200, b"[1, 2]", "answer is not the Prometheus API's JSON"),
    "api_error": (
        200,
        json.dumps({"status": "error", "error": "too many samples", "data": {}}).encode(),
        "too many samples",
    ),
}


@pytest.mark.parametrize("mode", ERROR_CASES)
def test_errors_are_one_line(
    server: http.server.HTTPServer, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    status, body, message = ERROR_CASES[mode]
    server.mode = mode  # type: ignore[attr-defined]
    ANSWERS[mode] = (status, body)
    assert main(["jobstats", "12", "--prometheus", url_of(server)]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_connection_refused(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["report", "idle", "--prometheus", url]) == 3
    err = capsys.readouterr().err
    assert err == f"gpufleet report: {url}: cannot connect: [Errno 111] Connection refused\n"


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "http:///", "http://[::1:9090", "http://x?a=1", "http://x#f"]
)
def test_not_a_url(url: str) -> None:
    with pytest.raises(PromError, match="is not an http"):
        PromClient(url)


def test_basic_auth_password_from_file_or_env(
    server: http.server.HTTPServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.mode = "empty"  # type: ignore[attr-defined]
    ANSWERS["empty"] = (200, json.dumps({"status": "success", "data": {}}).encode())
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n", encoding="utf-8")
    SEEN_AUTH.clear()
    main(["jobstats", "12", "--prometheus", url_of(server), "--user", "ops", "--password-file",
          str(secret)])  # fmt: skip
    monkeypatch.setenv("GPUFLEET_PROMETHEUS_PASSWORD", "fromenv")
    main(["jobstats", "12", "--prometheus", url_of(server), "--user", "ops"])
    sent = {base64.b64decode(h.split()[1]).decode() for h in SEEN_AUTH}
    assert sent == {"ops:s3cret", "ops:fromenv"}


def test_no_password_option_on_argv() -> None:
    for argv in (["jobstats", "1", "--prometheus", "http://x"], ["report", "idle", "-i", "x"]):
        args = vars(build_parser().parse_args(argv))
        assert "password" not in args


def test_inventory_urls(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.gpufleet.yml"
    nodes.write_text(
        """plugin: gpufleet
cluster: c1
nodes:
  - hosts: "n[1-3]"
    address: "10.9.0.{num}"
servers:
  - hosts: "mon[1-2]"
    address: "10.9.1.{num}"
monitoring:
  shards: 3
  replicas: 2
  prometheus_hosts: "mon[1-2]"
  global_hosts: mon1
""",
        encoding="utf-8",
    )
    where = from_inventory(load_node_list(str(nodes)), "https")
    assert where.sharded
    assert [(i.name, i.urls) for i in where.data] == [
        ("shard-0", ("https://10.9.1.1:9091", "https://10.9.1.2:9091")),
        ("shard-1", ("https://10.9.1.1:9092", "https://10.9.1.2:9092")),
        ("shard-2", ("https://10.9.1.1:9093", "https://10.9.1.2:9093")),
    ]
    assert where.rollups is not None and where.rollups.urls == ("https://10.9.1.1:9090",)


class Redirect(http.server.BaseHTTPRequestHandler):
    """A proxy's login redirect: the client must not follow it with the credentials."""

    def do_POST(self) -> None:
        SEEN_AUTH.append(self.headers.get("Authorization", ""))
        self.send_response(302)
        self.send_header("Location", f"http://127.0.0.1:{self.server.target_port}/api/v1/query")  # type: ignore[attr-defined]
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_redirect_is_an_error_and_the_credentials_stay(server: http.server.HTTPServer) -> None:
    server.mode = "ok"  # type: ignore[attr-defined]
    ANSWERS["ok"] = (
        200,
        json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode(),
    )
    proxy = http.server.HTTPServer(("127.0.0.1", 0), Redirect)
    proxy.target_port = server.server_address[1]  # type: ignore[attr-defined]
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    SEEN_AUTH.clear()
    try:
        client = PromClient(url_of(proxy), username="ops", password="s3cret")
        with pytest.raises(PromError, match="HTTP 302"):
            client.query("up")
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert len(SEEN_AUTH) == 1, "the redirect target was asked too"


@pytest.mark.parametrize("url", ["http://ops:s3cret@127.0.0.1:9090", "ftp://ops:s3cret@x"])
def test_credentials_in_the_url_are_refused_and_not_repeated(url: str) -> None:
    with pytest.raises(PromError, match="no user or password") as raised:
        PromClient(url)
    assert "s3cret" not in str(raised.value)


def test_an_empty_username_is_no_login(server: http.server.HTTPServer) -> None:
    """The epilog's configuration says "" for no login: no Authorization header."""
    server.mode = "ok"  # type: ignore[attr-defined]
    ANSWERS["ok"] = (200, success({"resultType": "vector", "result": []}))
    SEEN_AUTH.clear()
    assert PromClient(url_of(server), username="", password="x").query("up", 0) == []
    assert SEEN_AUTH == [""]


def success(data: dict) -> bytes:
    return json.dumps({"status": "success", "data": data}).encode()


def test_non_finite_values_come_back_as_given(server: http.server.HTTPServer) -> None:
    """NaN and +/-Inf are the callers' to judge (report idle counts what it leaves out):
    the client neither drops them nor fails on them, in vectors, scalars and ranges."""
    server.mode = "finite"  # type: ignore[attr-defined]
    client = PromClient(url_of(server))
    values = ["NaN", "+Inf", "-Inf", "1.5"]
    result = [{"metric": {"k": v}, "value": [1, v]} for v in values]
    ANSWERS["finite"] = (200, success({"resultType": "vector", "result": result}))
    samples = client.query("up")
    assert [labels["k"] for labels, _ in samples] == values
    assert [repr(s.value) for s in samples] == ["nan", "inf", "-inf", "1.5"]
    ANSWERS["finite"] = (200, success({"resultType": "scalar", "result": [1, "NaN"]}))
    assert [(s.labels, repr(s.value)) for s in client.query("up")] == [({}, "nan")]
    points = [[1, "NaN"], [2.5, "+Inf"], [4, "3"]]
    series = [{"metric": {"job": "x"}, "values": points}]
    ANSWERS["finite"] = (200, success({"resultType": "matrix", "result": series}))
    [(labels, got)] = client.query_range("up", 1, 4, 1)
    assert labels == {"job": "x"} and repr(got) == "[(1.0, nan), (2.5, inf), (4.0, 3.0)]"


MALFORMED = {
    "no result": ("query", {"resultType": "vector"}),
    "result not a list": ("query", {"resultType": "vector", "result": 5}),
    "label value not a string": (
        "query",
        {"resultType": "vector", "result": [{"metric": {"node": 7}, "value": [1, "1"]}]},
    ),
    "no labels": ("query", {"resultType": "vector", "result": [{"value": [1, "1"]}]}),
    "value a JSON number": (
        "query",
        {"resultType": "vector", "result": [{"metric": {}, "value": [1, 1]}]},
    ),
    "value true": (
        "query",
        {"resultType": "vector", "result": [{"metric": {}, "value": [1, True]}]},
    ),
    "value no number": (
        "query",
        {"resultType": "vector", "result": [{"metric": {}, "value": [1, "x\ny"]}]},
    ),
    "time a string": (
        "query",
        {"resultType": "vector", "result": [{"metric": {}, "value": ["1", "1"]}]},
    ),
    "sample not an object": ("query", {"resultType": "vector", "result": [[1, "1"]]}),
    "scalar not a pair": ("query", {"resultType": "scalar", "result": "x"}),
    "a matrix for an instant query": ("query", {"resultType": "matrix", "result": []}),
    "a vector for a range": ("query_range", {"resultType": "vector", "result": []}),
    "range labels": (
        "query_range",
        {"resultType": "matrix", "result": [{"metric": {"a": None}, "values": []}]},
    ),
    "range values not a list": (
        "query_range",
        {"resultType": "matrix", "result": [{"metric": {}, "values": "x"}]},
    ),
    "range point not a pair": (
        "query_range",
        {"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "1", 2]]}]},
    ),
    "range time too large": (
        "query_range",
        {"resultType": "matrix", "result": [{"metric": {}, "values": [[10**400, "1"]]}]},
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_answers_are_one_line_errors(server: http.server.HTTPServer, case: str) -> None:
    how, result = MALFORMED[case]
    server.mode = "malformed"  # type: ignore[attr-defined]
    ANSWERS["malformed"] = (200, success(result))
    client = PromClient(url_of(server))
    with pytest.raises(PromError) as raised:
        if how == "query":
            client.query("up")
        else:
            client.query_range("up", 0, 60, 60)
    message = str(raised.value)
    assert message.startswith(f"{url_of(server)}: ") and "\n" not in message, message


def test_a_sample_is_a_pair_with_names() -> None:
    """The epilog unpacks (labels, value); jobstats reads .labels and .value."""
    sample = Sample({"node": "g1"}, 2.0)
    labels, value = sample
    assert (labels, value) == (sample.labels, sample.value) == ({"node": "g1"}, 2.0)


def test_a_dripping_answer_is_cut_at_the_deadline() -> None:
    """The socket timeout bounds one read only: the whole answer has a deadline."""
    import time

    from gpufleet_node.httpclient import read_body

    class Drip:
        def read1(self, size: int) -> bytes:
            time.sleep(0.05)
            return b"x"

    start = time.monotonic()
    with pytest.raises(TimeoutError):
        read_body(Drip(), start + 0.3, 1024 * 1024)  # type: ignore[arg-type]
    assert time.monotonic() - start < 2


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", "/CN=mon1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def tls_inventory(tmp_path: Path) -> Iterator[Path]:
    """An HTTPS "Prometheus" with a self-signed certificate on 127.0.0.1, and an inventory
    whose group_vars give its certificate and gpufleet's password (as the role reads them),
    and whose host_vars give its port base."""
    cert, key = self_signed(tmp_path)
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    httpd.mode = "empty"  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    inventory = tmp_path / "inv"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    (inventory / "host_vars").mkdir()
    (inventory / "nodes.gpufleet.yml").write_text(
        """plugin: gpufleet
cluster: c1
nodes:
  - hosts: "n1"
    address: "10.9.0.1"
servers:
  - hosts: "mon1"
    address: "127.0.0.1"
monitoring:
  prometheus_hosts: mon1
""",
        encoding="utf-8",
    )
    pem = json.dumps(cert.read_text(encoding="utf-8"))
    (inventory / "group_vars" / "all" / "web.yml").write_text(
        f"vault_cert: {pem}\n"
        "prometheus_tls_cert: '{{ vault_cert }}'\n",  # templated, as a vault reference is
        encoding="utf-8",
    )
    (inventory / "group_vars" / "all" / "login.yml").write_text(
        "prometheus_basic_auth_users: {gpufleet: inv-s3cret, alice: other}\n", encoding="utf-8"
    )
    (inventory / "port").write_text(str(httpd.server_address[1]), encoding="utf-8")
    (inventory / "host_vars" / "mon1.yml").write_text(  # a magic variable in a template
        "prometheus_port_base: \"{{ lookup('file', inventory_dir ~ '/port') }}\"\n",
        encoding="utf-8",
    )
    SEEN_AUTH.clear()
    yield inventory
    httpd.shutdown()
    httpd.server_close()


def logins() -> set[str]:
    return {base64.b64decode(h.split()[1]).decode() for h in SEEN_AUTH}


def test_inventory_tls_and_login_as_the_roles_clients(
    tls_inventory: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-i alone: https, the inventory's CA and gpufleet's password, the host's port base."""
    assert main(["jobstats", "12", "-i", str(tls_inventory)]) == 3  # no such job, no data
    out, err = capsys.readouterr()
    assert SEEN_AUTH, err
    assert logins() == {"gpufleet:inv-s3cret"}
    assert "cannot connect" not in err and "inv-s3cret" not in out + err


def test_inventory_vault(tls_inventory: Path, tmp_path: Path) -> None:
    """A vaulted password is read with Ansible's configured vault password file; without
    it, one line that names no secret."""
    from ansible.constants import DEFAULT_VAULT_ID_MATCH
    from ansible.parsing.vault import VaultLib, VaultSecret

    login = tls_inventory / "group_vars" / "all" / "login.yml"
    vault = VaultLib([(DEFAULT_VAULT_ID_MATCH, VaultSecret(b"vault-pw"))])
    login.write_bytes(vault.encrypt(login.read_text(encoding="utf-8")))
    (tmp_path / "vault-pass").write_text("vault-pw\n", encoding="utf-8")
    command = [sys.executable, "-m", "gpufleet", "jobstats", "12", "-i", str(tls_inventory)]
    env = {**os.environ, "ANSIBLE_VAULT_PASSWORD_FILE": str(tmp_path / "vault-pass")}
    opened = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert opened.returncode == 3 and logins() == {"gpufleet:inv-s3cret"}, opened.stderr
    assert opened.stderr.count("\n") == 1, opened.stderr  # the unknown job, no warnings
    env.pop("ANSIBLE_VAULT_PASSWORD_FILE")
    SEEN_AUTH.clear()
    locked = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert locked.returncode == 3 and not SEEN_AUTH
    assert locked.stderr.count("\n") == 1 and "Traceback" not in locked.stderr, locked.stderr
    assert "cannot read the Prometheus hosts' TLS and login settings" in locked.stderr
    assert "inv-s3cret" not in opened.stdout + opened.stderr + locked.stderr
