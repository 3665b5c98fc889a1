"""Pinning a repository key by fingerprint, checked against keys gpg itself made."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from gpufleet.openpgp import OpenPGPError, primary_fingerprints, select_key


def gpg(home: str, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["gpg", "--homedir", home, "--batch", "--quiet", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def gpg_fingerprints(text: str) -> list[str]:
    home = tempfile.mkdtemp(prefix="gf-", dir="/tmp")
    try:
        listing = gpg(home, "--with-colons", "--show-keys", stdin=text)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    # Each primary key ("pub") is followed by its own "fpr" line.
    lines = listing.splitlines()
    return [lines[i + 1].split(":")[9] for i, line in enumerate(lines) if line.startswith("pub:")]


@pytest.fixture(scope="module")
def two_keys() -> Iterator[tuple[str, str, str, str]]:
    """Two signing keys with a subkey each: (fingerprint, armored) twice."""
    # gpg-agent's socket path must stay short: a home under /tmp, not pytest's tmp_path.
    home = tempfile.mkdtemp(prefix="gk-", dir="/tmp")
    try:
        made = []
        for name in ("Repo One <one@example.org>", "Repo Two <two@example.org>"):
            gpg(home, "--passphrase", "", "--quick-gen-key", name, "ed25519", "sign", "never")
            fpr = gpg_fingerprints(gpg(home, "--armor", "--export", name))[0]
            gpg(home, "--passphrase", "", "--quick-add-key", fpr, "cv25519", "encr", "never")
            made += [fpr, gpg(home, "--armor", "--export", fpr)]
        yield tuple(made)
    finally:
        subprocess.run(["gpgconf", "--homedir", home, "--kill", "all"], check=False)
        shutil.rmtree(home, ignore_errors=True)


def test_fingerprints_agree_with_gpg(two_keys) -> None:
    fpr_one, key_one, fpr_two, key_two = two_keys
    assert primary_fingerprints(key_one) == [fpr_one]
    assert primary_fingerprints(key_one + key_two) == [fpr_one, fpr_two]


def test_select_keeps_only_the_pinned_key_and_gpg_reads_it(two_keys) -> None:
    _fpr_one, key_one, fpr_two, key_two = two_keys
    selected = select_key(key_one + key_two, fpr_two)
    assert gpg_fingerprints(selected) == [fpr_two]
    # The key keeps its subkey and signatures: byte for byte what gpg exported.
    assert select_key(key_two, fpr_two) == selected
    assert len(selected) > 0.9 * len(key_two)


def test_pin_may_be_lower_case_or_spaced(two_keys) -> None:
    fpr_one, key_one, *_ = two_keys
    spaced = " ".join(fpr_one[i : i + 4] for i in range(0, 40, 4)).lower()
    assert gpg_fingerprints(select_key(key_one, spaced)) == [fpr_one]


def test_a_file_without_the_pinned_key_is_refused_with_what_it_holds(two_keys) -> None:
    fpr_one, key_one, fpr_two, _ = two_keys
    with pytest.raises(OpenPGPError, match=f"no key with fingerprint {fpr_two}.*{fpr_one}"):
        select_key(key_one, fpr_two)


def test_a_damaged_key_file_is_refused(two_keys) -> None:
    _, key_one, *_ = two_keys
    lines = key_one.splitlines()
    # Flip one character in the middle of the base64 body: the CRC-24 no longer matches.
    middle = len(lines) // 2
    lines[middle] = ("B" if lines[middle][0] != "B" else "C") + lines[middle][1:]
    with pytest.raises(OpenPGPError):
        select_key("\n".join(lines), primary_fingerprints(key_one)[0])


@pytest.mark.parametrize("text", ["", "not a key", "<html>404 Not Found</html>"])
def test_something_that_is_not_a_key_is_refused(text) -> None:
    with pytest.raises(OpenPGPError, match="no 'BEGIN PGP PUBLIC KEY BLOCK'"):
        select_key(text, "B53AE77BADB630A683046005963FA27710458545")


@pytest.mark.parametrize("pin", ["", "B53AE77B", "Z53AE77BADB630A683046005963FA27710458545"])
def test_a_malformed_pin_is_refused(two_keys, pin) -> None:
    with pytest.raises(OpenPGPError, match="not a 40 or 64 hex digit"):
        select_key(two_keys[1], pin)
