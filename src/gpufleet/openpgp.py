"""Pin a repository signing key by its OpenPGP fingerprint, without gpg.

Vendors publish their apt/yum key as an armored file that changes whenever they extend
an expiry date or add a subkey, so a sha256 of the file breaks on every such edit. The
fingerprint of the primary key does not change. :func:`select_key` (filter
gpufleet_openpgp_select, plugins/filter/gpufleet_filters.py) keeps, out of a downloaded key
file, only the key whose fingerprint is pinned (with its user IDs, subkeys and
signatures), and fails when that key is not there.

RFC 9580: packet framing (section 4.2), v4 fingerprints (SHA-1 over 0x99, a two-octet
length and the key packet body) and v6 fingerprints (SHA-256 over 0x9B, a four-octet
length and the body); ASCII armor with its CRC-24 (section 6).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

_PUBLIC_KEY = 6
_ARMOR = re.compile(
    r"-----BEGIN PGP PUBLIC KEY BLOCK-----\n(?P<body>.*?)-----END PGP PUBLIC KEY BLOCK-----",
    re.DOTALL,
)


class OpenPGPError(ValueError):
    """The key file is not what the pin says it should be."""


def dearmor(text: str) -> bytes:
    """The binary packets of every public key block in an armored file."""
    blocks = list(_ARMOR.finditer(text.replace("\r\n", "\n")))
    if not blocks:
        raise OpenPGPError("no 'BEGIN PGP PUBLIC KEY BLOCK' armor found")
    data = b""
    for block in blocks:
        body = block.group("body").split("\n")
        # Armor headers (Version:, Comment:) end at the first blank line.
        if "" in body[:-1]:
            body = body[body.index("") + 1 :]
        lines = [line.strip() for line in body if line.strip()]
        checksum = lines.pop() if lines and lines[-1].startswith("=") else None
        try:
            payload = base64.b64decode("".join(lines), validate=True)
        except binascii.Error as error:
            raise OpenPGPError(f"armored key is not valid base64: {error}") from None
        if checksum is not None and base64.b64decode(checksum[1:]) != crc24(payload).to_bytes(
            3, "big"
        ):
            raise OpenPGPError("armor checksum does not match: the key file is damaged")
        data += payload
    return data


def crc24(data: bytes) -> int:
    crc = 0xB704CE
    for byte in data:
        crc ^= byte << 16
        for _ in range(8):
            crc <<= 1
            if crc & 0x1000000:
                crc ^= 0x1864CFB
    return crc & 0xFFFFFF


def packets(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """(tag, header, body) for each packet; header + body is the packet's exact bytes."""
    result: list[tuple[int, bytes, bytes]] = []
    offset = 0
    while offset < len(data):
        start = offset
        first = data[offset]
        if not first & 0x80:
            raise OpenPGPError(f"byte {offset} is not a packet header")
        if first & 0x40:  # new format
            tag = first & 0x3F
            octet = data[offset + 1]
            if octet < 192:
                length, offset = octet, offset + 2
            elif octet < 224:
                length, offset = ((octet - 192) << 8) + data[offset + 2] + 192, offset + 3
            elif octet == 255:
                length, offset = int.from_bytes(data[offset + 2 : offset + 6], "big"), offset + 6
            else:
                raise OpenPGPError("partial body lengths do not occur in key files")
        else:  # old format
            tag = (first >> 2) & 0x0F
            size = {0: 1, 1: 2, 2: 4}.get(first & 0x03)
            if size is None:
                raise OpenPGPError("indeterminate packet length in a key file")
            length = int.from_bytes(data[offset + 1 : offset + 1 + size], "big")
            offset += 1 + size
        if offset + length > len(data):
            raise OpenPGPError("key file is truncated")
        result.append((tag, data[start:offset], data[offset : offset + length]))
        offset += length
    return result


def fingerprint(key_body: bytes) -> str:
    """Fingerprint of a public key packet body (v4 or v6), upper-case hex."""
    version = key_body[0]
    if version == 4:
        return (
            hashlib.sha1(b"\x99" + len(key_body).to_bytes(2, "big") + key_body).hexdigest().upper()
        )
    if version == 6:
        return (
            hashlib.sha256(b"\x9b" + len(key_body).to_bytes(4, "big") + key_body)
            .hexdigest()
            .upper()
        )
    raise OpenPGPError(f"version {version} keys are not supported")


def keys(data: bytes) -> dict[str, bytes]:
    """Each transferable public key (primary key and what follows it), by fingerprint."""
    found: dict[str, bytes] = {}
    current: str | None = None
    for tag, header, body in packets(data):
        if tag == _PUBLIC_KEY:
            current = fingerprint(body)
            found[current] = b""
        if current is None:
            raise OpenPGPError("key file does not start with a public key packet")
        found[current] += header + body
    return found


def armor(data: bytes) -> str:
    encoded = base64.b64encode(data).decode()
    lines = [encoded[i : i + 64] for i in range(0, len(encoded), 64)]
    checksum = base64.b64encode(crc24(data).to_bytes(3, "big")).decode()
    return "\n".join(
        [
            "-----BEGIN PGP PUBLIC KEY BLOCK-----",
            "",
            *lines,
            f"={checksum}",
            "-----END PGP PUBLIC KEY BLOCK-----",
            "",
        ]
    )


def normalize_fingerprint(value: str) -> str:
    pinned = re.sub(r"\s+", "", str(value)).upper()
    if not re.fullmatch(r"[0-9A-F]{40}|[0-9A-F]{64}", pinned):
        raise OpenPGPError(f"{value!r} is not a 40 or 64 hex digit OpenPGP fingerprint")
    return pinned


def select_key(text: str, pinned_fingerprint: str) -> str:
    """The armored key with pinned_fingerprint out of text, alone; an error without it."""
    pinned = normalize_fingerprint(pinned_fingerprint)
    found = keys(dearmor(text))
    if pinned not in found:
        held = ", ".join(found) or "none"
        raise OpenPGPError(f"the key file holds no key with fingerprint {pinned}; it holds {held}")
    return armor(found[pinned])


def primary_fingerprints(text: str) -> list[str]:
    """Fingerprints of the primary keys in an armored key file."""
    return list(keys(dearmor(text)))
