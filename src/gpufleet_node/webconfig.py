"""The exporter web config (TLS and basic auth), in the Prometheus exporter-toolkit shape."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import ssl
import threading
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet_node.reloaded import ReloadedFile, Stamp

TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
BCRYPT_MAX_PASSWORD = 72  # bytes; bcrypt >= 5 refuses longer passwords


class WebConfigError(ValueError):
    """The web config file is unreadable or not in the expected shape."""


@dataclass(frozen=True)
class WebSettings:
    """What one version of the web config file asks for."""

    tls: ssl.SSLContext | None = None
    users: Mapping[str, str] = field(default_factory=dict)  # user -> bcrypt hash


def parse_web_config(text: str, base: Path) -> tuple[dict[str, str] | None, dict[str, str]]:
    """(tls_server_config as file paths, basic_auth_users) of a web config document.

    The shape is the Prometheus exporter-toolkit's web config (the one node_exporter
    reads), written as JSON so the standard library parses it: ``tls_server_config``
    (``cert_file``, ``key_file``, optional ``client_ca_file``, ``client_auth_type``,
    ``min_version``) and ``basic_auth_users`` (user -> bcrypt hash). Relative paths are
    relative to the file's directory, as in exporter-toolkit.
    """
    try:
        doc = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise WebConfigError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise WebConfigError("the document must be an object")
    unknown = set(doc) - {"tls_server_config", "basic_auth_users"}
    if unknown:
        raise WebConfigError(f"unknown keys {sorted(unknown)}")
    users = doc.get("basic_auth_users") or {}
    if not isinstance(users, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v.startswith("$2") for k, v in users.items()
    ):
        raise WebConfigError("basic_auth_users must map user names to bcrypt hashes")
    tls = doc.get("tls_server_config")
    if tls is None:
        return None, dict(users)
    if not isinstance(tls, dict):
        raise WebConfigError("tls_server_config must be an object")
    unknown = set(tls) - {
        "cert_file",
        "key_file",
        "client_ca_file",
        "client_auth_type",
        "min_version",
    }
    if unknown:
        raise WebConfigError(f"tls_server_config: unknown keys {sorted(unknown)}")
    if not tls.get("cert_file") or not tls.get("key_file"):
        raise WebConfigError("tls_server_config needs cert_file and key_file")
    if tls.get("min_version", "TLS12") not in TLS_VERSIONS:
        raise WebConfigError(f"tls_server_config.min_version must be one of {sorted(TLS_VERSIONS)}")
    auth_type = tls.get("client_auth_type", "NoClientCert")
    if auth_type not in CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"tls_server_config.client_auth_type must be one of {sorted(CLIENT_AUTH_TYPES)}"
        )
    if (auth_type != "NoClientCert") != bool(tls.get("client_ca_file")):
        raise WebConfigError(
            "client_ca_file and a client_auth_type other than NoClientCert go together"
        )
    paths = {
        key: str(base / value) for key, value in tls.items() if key.endswith("_file") and value
    }
    return {
        **tls,
        **paths,
        "min_version": tls.get("min_version", "TLS12"),
        "client_auth_type": auth_type,
    }, dict(users)


def tls_context(tls: Mapping[str, str]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls["min_version"]]
    try:
        context.load_cert_chain(tls["cert_file"], tls["key_file"])
        if tls.get("client_ca_file"):
            context.load_verify_locations(cafile=tls["client_ca_file"])
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"TLS certificate or key: {exc}") from exc
    context.verify_mode = CLIENT_AUTH_TYPES[tls["client_auth_type"]]
    return context


class WebConfig(ReloadedFile):
    """The web config file, reread whenever it or a file it names changes.

    Like node_exporter's --web.config.file: a new certificate, key or user list takes
    effect on the next connection, with no restart. A changed file that does not load
    keeps the last good settings (and is logged); at start it is an error.
    """

    what = "web config"
    load_error = WebConfigError

    def __init__(self, path: str | None) -> None:
        super().__init__()
        self.path = Path(path) if path else None
        self._files: list[str] = []
        self._settings = WebSettings()
        if self.path is not None:
            self._load()

    def _file_stamp(self) -> Stamp:
        return self._stamp_of([str(self.path), *self._files])

    def _load(self) -> None:
        assert self.path is not None
        # Each file is stat'ed before it is read: a change in between is seen next time.
        config_stamp = self._stamp_of([str(self.path)])
        try:
            text = self.path.read_text()
            tls, users = parse_web_config(text, self.path.parent)
            files = [v for k, v in (tls or {}).items() if k.endswith("_file")]
            files_stamp = self._stamp_of(files)
            context = tls_context(tls) if tls else None
            if users:
                bcrypt_module()  # fail now, not at the first scrape
        except OSError as exc:
            raise WebConfigError(f"{self.path}: {exc}") from exc
        except WebConfigError as exc:
            raise WebConfigError(f"{self.path}: {exc}") from exc
        self._files = files
        self._settings = WebSettings(tls=context, users=users)
        self._stamp = config_stamp + files_stamp

    def current(self) -> WebSettings:
        if self.path is None:
            return self._settings
        with self._lock:
            self._reload_if_changed()
            return self._settings


def bcrypt_module() -> types.ModuleType:
    try:
        import bcrypt  # only sites with basic auth need it
    except ImportError as exc:
        raise WebConfigError(
            "basic_auth_users needs the bcrypt module (Debian/EL package python3-bcrypt)"
        ) from exc
    return bcrypt


_BCRYPT_COST_RE = re.compile(r"^\$2[abxy]?\$([0-9]{2})\$")
# RFC 7235 section 2.1: credentials = auth-scheme 1*SP token68. The scheme is a token
# and case-insensitive ("Basic", "basic", "BASIC"); ASCII only (re.ASCII, and no
# IGNORECASE: that would let U+017F match "s"). Surrounding whitespace is the header's.
_CREDENTIALS_RE = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]+([A-Za-z0-9+/]+={0,2})", re.ASCII)


def basic_credentials(headers: str | Sequence[str] | None) -> tuple[str, str] | None:
    """(user, password) of an ``Authorization`` header of the Basic scheme, else None.

    RFC 7617 over RFC 7235's grammar: the scheme matched case-insensitively, one or more
    spaces before the base64 token68, whose decoding must be UTF-8 ``user:password``.
    ``headers`` may be every Authorization header of the request: more than one is
    ambiguous (which would a proxy have checked?) and logs in as no one.
    """
    if headers is None or isinstance(headers, str):
        values = [] if headers is None else [headers]
    else:
        values = list(headers)
    if len(values) != 1:
        return None
    match = _CREDENTIALS_RE.fullmatch(values[0].strip(" \t"))
    if match is None or match.group(1).lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(match.group(2), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


class Authenticator:
    """Basic auth against bcrypt hashes, remembering credentials it already verified.

    bcrypt is deliberately slow (tens of milliseconds); Prometheus sends the same
    credentials with every scrape, so a verified (user, hash, password digest) is kept.
    An unknown user is checked against a dummy hash of the same cost, so the answer takes
    as long as for a known user and does not tell which user names exist. A password
    longer than bcrypt's 72 bytes is refused without a check (it cannot match; bcrypt >= 5
    raises on it).
    """

    def __init__(self) -> None:
        self._verified: set[tuple[str, str, bytes]] = set()
        self._dummies: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def _dummy_hash(self, users: Mapping[str, str]) -> bytes:
        """A hash of a random secret with the highest cost among ``users``' hashes."""
        costs = [int(m.group(1)) for m in map(_BCRYPT_COST_RE.match, users.values()) if m]
        rounds = min(max(max(costs, default=10), 4), 31)
        with self._lock:
            dummy = self._dummies.get(rounds)
        if dummy is None:
            dummy = bcrypt_module().hashpw(os.urandom(16), bcrypt_module().gensalt(rounds))
            with self._lock:
                self._dummies[rounds] = dummy
        return dummy

    @staticmethod
    def _checkpw(password: bytes, hashed: bytes) -> bool:
        try:
            return bool(bcrypt_module().checkpw(password, hashed))
        except ValueError:  # a malformed hash, a NUL byte: not a match
            return False

    def allowed(self, headers: str | Sequence[str] | None, users: Mapping[str, str]) -> bool:
        """Whether the request's Authorization header(s) log in as one of ``users``."""
        if not users:
            return True
        credentials = basic_credentials(headers)
        if credentials is None:
            return False
        user, password = credentials
        secret = password.encode()
        if len(secret) > BCRYPT_MAX_PASSWORD:
            return False
        hashed = users.get(user)
        if hashed is None:
            self._checkpw(secret, self._dummy_hash(users))  # same time as a known user
            return False
        key = (user, hashed, hashlib.sha256(secret).digest())
        with self._lock:
            if key in self._verified:
                return True
        if not self._checkpw(secret, hashed.encode()):
            return False
        with self._lock:
            if len(self._verified) > 1000:
                self._verified.clear()
            self._verified.add(key)
        return True
