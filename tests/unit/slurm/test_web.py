"""TLS and basic auth of the Slurm exporter's HTTP server, over real sockets.

Certificates are made by openssl for each test session (a CA, a server certificate for
127.0.0.1 and a client certificate); passwords are hashed with bcrypt, as the role's
gpufleet_bcrypt filter does for node_exporter's web config.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from conftest import exp

BODY = b"slurm_up 1\n"


class Snapshot:
    """Stands in for the collector: the server only asks it for the latest snapshot."""

    def snapshot(self) -> bytes:
        return BODY


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        f"{d}/ca.key",
        "-out",
        f"{d}/ca.crt",
        "-subj",
        "/CN=gpufleet test CA",
        # Python 3.13 (Debian 13) verifies strictly: a CA without key usage is refused.
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-days",
        "2",
    )
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1"),
        ("client", "extendedKeyUsage=clientAuth"),
        ("other", "subjectAltName=IP:127.0.0.1"),
    ):
        openssl(
            "req",
            *ec,
            "-keyout",
            f"{d}/{name}.key",
            "-out",
            f"{d}/{name}.csr",
            "-subj",
            f"/CN={name}",
        )
        (d / f"{name}.ext").write_text(ext + "\n")
        openssl(
            "x509",
            "-req",
            "-in",
            f"{d}/{name}.csr",
            "-CA",
            f"{d}/ca.crt",
            "-CAkey",
            f"{d}/ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            f"{d}/{name}.ext",
            "-out",
            f"{d}/{name}.crt",
        )
    return d


def hashed(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


def write_config(path: Path, doc: dict) -> None:
    # Replace, as Ansible's template module does: a new inode and mtime.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


@pytest.fixture
def serve(tmp_path) -> Iterator:
    """serve(doc) -> (base URL, config path): the exporter's server on a free port."""
    servers = []

    def start(doc: dict | None):
        path = tmp_path / "web-config.json"
        if doc is not None:
            write_config(path, doc)
        web = exp.WebConfig(str(path) if doc is not None else None)
        server = exp.make_server("127.0.0.1:0", Snapshot(), web)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        scheme = "https" if web.current().tls else "http"
        return f"{scheme}://127.0.0.1:{server.server_address[1]}", path

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def get(url: str, user: str | None = None, password: str = "", context=None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def answered(result: tuple[int, bytes]) -> bool:
    """A 200 with the snapshot; the server's own counters follow it (cluster part)."""
    code, body = result
    return code == 200 and body.startswith(BODY) and b"\nslurm_exporter_http_" in body


def server_tls(pki: Path) -> dict[str, str]:
    return {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key")}


def client_context(pki: Path, cert: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        context.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    return context


def test_without_a_web_config_it_serves_plain_http_to_anyone(serve):
    base, _ = serve(None)
    assert answered(get(f"{base}/metrics"))


def test_basic_auth_over_http(serve):
    base, _ = serve({"basic_auth_users": {"prometheus": hashed("s3cret-scrape")}})
    assert answered(get(f"{base}/metrics", "prometheus", "s3cret-scrape"))
    assert get(f"{base}/metrics")[0] == 401
    assert get(f"{base}/metrics", "prometheus", "wrong")[0] == 401
    assert get(f"{base}/metrics", "nobody", "s3cret-scrape")[0] == 401
    assert get(f"{base}/", "prometheus", "wrong")[0] == 401  # every path, not only /metrics
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{base}/metrics", timeout=10)
    assert denied.value.headers["WWW-Authenticate"].startswith("Basic ")


def test_tls_with_basic_auth(serve, pki):
    base, _ = serve(
        {
            "tls_server_config": server_tls(pki),
            "basic_auth_users": {"prometheus": hashed("s3cret-scrape")},
        }
    )
    assert base.startswith("https://")
    context = client_context(pki)
    assert answered(get(f"{base}/metrics", "prometheus", "s3cret-scrape", context))
    assert get(f"{base}/metrics", context=context)[0] == 401
    # Plain HTTP to the TLS port gets no metrics.
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        get(base.replace("https://", "http://") + "/metrics", "prometheus", "s3cret-scrape")


def test_min_version_is_enforced(serve, pki):
    tls12 = client_context(pki)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    base, _ = serve({"tls_server_config": server_tls(pki)})  # TLS12, the default
    assert answered(get(f"{base}/metrics", context=tls12))
    base, _ = serve({"tls_server_config": server_tls(pki) | {"min_version": "TLS13"}})
    with pytest.raises((urllib.error.URLError, ssl.SSLError, OSError)):
        get(f"{base}/metrics", context=tls12)
    assert answered(get(f"{base}/metrics", context=client_context(pki)))


def test_client_certificates_when_a_client_ca_is_set(serve, pki):
    base, _ = serve(
        {
            "tls_server_config": server_tls(pki)
            | {
                "client_ca_file": str(pki / "ca.crt"),
                "client_auth_type": "RequireAndVerifyClientCert",
            }
        }
    )
    assert answered(get(f"{base}/metrics", context=client_context(pki, "client")))
    with pytest.raises((urllib.error.URLError, ssl.SSLError, OSError)):
        get(f"{base}/metrics", context=client_context(pki))


def test_a_changed_file_takes_effect_without_a_restart(serve, pki):
    base, path = serve({"basic_auth_users": {"prometheus": hashed("first-password")}})
    assert get(f"{base}/metrics", "prometheus", "first-password")[0] == 200
    write_config(path, {"basic_auth_users": {"prometheus": hashed("second-password")}})
    assert get(f"{base}/metrics", "prometheus", "first-password")[0] == 401
    assert get(f"{base}/metrics", "prometheus", "second-password")[0] == 200
    # A broken file keeps the last good settings instead of opening the exporter up.
    write_config(path, {"basic_auth_users": {"prometheus": "not-a-bcrypt-hash"}})
    assert get(f"{base}/metrics")[0] == 401
    assert get(f"{base}/metrics", "prometheus", "second-password")[0] == 200


def test_a_renewed_certificate_is_served_on_the_next_connection(serve, pki, tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes((pki / "server.crt").read_bytes())
    key.write_bytes((pki / "server.key").read_bytes())
    base, _ = serve({"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}})

    def served_cn() -> str:
        pem = ssl.get_server_certificate(("127.0.0.1", int(base.rsplit(":", 1)[1])))
        der = ssl.PEM_cert_to_DER_cert(pem)
        return "other" if b"other" in der else "server"

    assert served_cn() == "server"
    for name, target in (("other.crt", cert), ("other.key", key)):
        tmp = target.with_suffix(".new")
        tmp.write_bytes((pki / name).read_bytes())
        tmp.replace(target)
    assert served_cn() == "other"


def test_credentials_are_checked_with_bcrypt_once(serve, monkeypatch):
    calls = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed_password: bytes) -> bool:
        calls.append(password)
        return real(password, hashed_password)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    base, _ = serve({"basic_auth_users": {"prometheus": hashed("s3cret-scrape")}})
    for _ in range(5):
        assert get(f"{base}/metrics", "prometheus", "s3cret-scrape")[0] == 200
    assert get(f"{base}/metrics", "prometheus", "wrong")[0] == 401
    assert get(f"{base}/metrics", "prometheus", "wrong")[0] == 401
    assert calls == [b"s3cret-scrape", b"wrong", b"wrong"]  # failures are never remembered


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("[]", "must be an object"),
        ("{nope", "not JSON"),
        ('{"tls_config": {}}', "unknown keys ['tls_config']"),
        ('{"basic_auth_users": {"u": "plaintext"}}', "bcrypt hashes"),
        ('{"tls_server_config": {"cert_file": "a.crt"}}', "needs cert_file and key_file"),
        (
            '{"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "TLS10"}}',
            "min_version must be one of",
        ),
        (
            '{"tls_server_config": {"cert_file": "a", "key_file": "b", "client_ca_file": "c"}}',
            "client_ca_file and a client_auth_type",
        ),
        (
            '{"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"}}',
            "TLS certificate or key",
        ),
    ],
)
def test_a_bad_web_config_stops_the_exporter_at_start(tmp_path, doc, message, capsys):
    path = tmp_path / "web-config.json"
    path.write_text(doc)
    with pytest.raises(exp.WebConfigError, match=r"web-config\.json: ") as error:
        exp.WebConfig(str(path))
    assert message in str(error.value)
    code = exp.main(["--listen-address", "127.0.0.1:0", "--web-config-file", str(path)])
    assert code == 2
