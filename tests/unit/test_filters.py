"""The bcrypt filter used for exporter basic auth."""

from __future__ import annotations

import sys
from pathlib import Path

import bcrypt
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "filter"))

from gpufleet_filters import bcrypt_salt, gpufleet_bcrypt


def test_hash_verifies_and_is_stable_per_seed() -> None:
    first = gpufleet_bcrypt("correct horse", "node1/prometheus")
    assert bcrypt.checkpw(b"correct horse", first.encode())
    assert first == gpufleet_bcrypt("correct horse", "node1/prometheus")


def test_salt_differs_between_hosts_and_users() -> None:
    salts = {bcrypt_salt(seed) for seed in ("a/prometheus", "b/prometheus", "a/other")}
    assert len(salts) == 3


def test_empty_password_is_refused() -> None:
    with pytest.raises(ValueError, match="empty password"):
        gpufleet_bcrypt("", "seed")
