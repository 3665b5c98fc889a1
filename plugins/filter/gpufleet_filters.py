"""Jinja2 filters shared by gpufleet's roles."""

from __future__ import annotations

import base64
import hashlib

import bcrypt

# bcrypt's own base64 alphabet (not the standard one).
_BCRYPT_ALPHABET = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_STD_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def bcrypt_salt(seed: str, rounds: int = 10) -> bytes:
    """A bcrypt salt derived from seed, so a rerun renders the same hash (idempotence).

    The seed is host and user specific; the salt still differs between hosts and users.
    """
    digest = hashlib.sha256(seed.encode()).digest()[:16]
    encoded = base64.b64encode(digest).decode().rstrip("=")
    translated = encoded.translate(str.maketrans(_STD_ALPHABET, _BCRYPT_ALPHABET))
    # 16 bytes make 22 characters; bcrypt ignores the low bits of the last one.
    return f"$2b${rounds:02d}${translated[:22]}".encode()


def gpufleet_bcrypt(password: str, seed: str, rounds: int = 10) -> str:
    """Hash password with bcrypt, as the Prometheus exporter-toolkit web config expects."""
    if not password:
        raise ValueError("gpufleet_bcrypt: refusing to hash an empty password")
    return bcrypt.hashpw(str(password).encode(), bcrypt_salt(seed, rounds)).decode()


class FilterModule:
    def filters(self) -> dict:
        return {"gpufleet_bcrypt": gpufleet_bcrypt}
