"""Storage damage for tests: what a silently failing disk or object store does to a write."""

from __future__ import annotations

from typing import BinaryIO


def flip_last_byte(data: bytes | BinaryIO) -> bytes:
    """``data``'s bytes with the last one flipped (same size, other bytes). A stream is read
    whole first, as a store reads it: a hashing reader (`ckpt_ha.formats.checksum.HashingReader`,
    what `sdk.save` hands a filesystem store) still sees the bytes the writer meant."""
    raw = data if isinstance(data, bytes) else bytes(data.read())
    return raw[:-1] + bytes([raw[-1] ^ 0x01])
