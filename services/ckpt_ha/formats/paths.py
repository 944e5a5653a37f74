"""Paths named inside a checkpoint (manifests, index files) must stay inside it."""

from __future__ import annotations

from pathlib import PurePosixPath


def inside(relative: object) -> str | None:
    """The normalised relative path, or None when it is absolute, escapes, or is not a string."""
    if not isinstance(relative, str) or not relative or "\x00" in relative or "\\" in relative:
        return None
    path = PurePosixPath(relative)
    if path.is_absolute() or any(part in ("..", "") for part in path.parts):
        return None
    return str(path)


def join(prefix: str, relative: str) -> str:
    return f"{prefix.rstrip('/')}/{relative}" if prefix else relative
