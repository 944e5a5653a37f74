"""Secrets and transport security for every client ckpt-ha builds, in one place.

A secret (a NATS or Redis password, the signing key) is read from the environment variable
``NAME`` or from the file named by ``NAME_FILE`` (a mounted secret; its content with one trailing
newline removed), never both. It is held as a pydantic ``SecretStr`` so that no repr, log line
or error message shows it, and a URL that carries a password is shown through `redact_url`.

Clients that speak TLS (``tls://`` NATS, ``rediss://`` Redis) verify the server against the CA
file the settings name (`client_tls`), else against the system's trust store.

Stdlib and pydantic only: the training SDK reads its credentials through this module too.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr

from ckpt_ha.contracts.subjects import inbox_prefix

FILE_SUFFIX = "_FILE"
REDACTED = "***"


class CredentialsError(ValueError):
    """Credentials or transport settings that cannot work: ``$NAME: reason``, one line."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"${name}: {reason}")


class SecretUnreadable(CredentialsError):
    """A secret's ``NAME_FILE`` names a file that cannot be read, or both forms are set."""


def read_secret_file(path: str | Path, name: str = "secret file") -> SecretStr:
    """The file's text without one trailing newline (``echo pw > file`` adds one)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SecretUnreadable(name, f"cannot read {path}: {why}") from None
    return SecretStr(text.removesuffix("\n").removesuffix("\r"))


def read_secret(env: Mapping[str, str], name: str) -> SecretStr | None:
    """``env[name]``, or the content of the file ``env[name + "_FILE"]``; None if neither is
    set (an empty value counts as unset). Both set is an error: which one wins would be a guess.
    """
    value = env.get(name) or ""
    path = env.get(name + FILE_SUFFIX) or ""
    if value and path:
        raise SecretUnreadable(name, f"set ${name} or ${name}{FILE_SUFFIX}, not both")
    if path:
        return read_secret_file(path, name + FILE_SUFFIX)
    return SecretStr(value) if value else None


def reveal(secret: SecretStr | None) -> str | None:
    """The secret's value, for the one call that hands it to a client library."""
    return secret.get_secret_value() if secret is not None else None


def redact_url(url: str) -> str:
    """``url`` with the password of its user info replaced (``redis://u:***@host/0``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    if parts.password is None and "@" not in parts.netloc:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user, sep, _password = userinfo.partition(":")
    shown = f"{user}:{REDACTED}" if sep or not user else REDACTED
    return urlunsplit(parts._replace(netloc=f"{shown}@{host}"))


class PlaintextWithCa(CredentialsError):
    """A CA file is configured for a URL that does not ask for TLS: the client would talk in
    the clear while its operator believes it verifies the server, so it refuses to start."""

    def __init__(self, setting: str, url: str, want: str) -> None:
        super().__init__(
            setting, f"set, but {redact_url(url)} is not a {want}:// URL (TLS would be off)"
        )


def scheme(url: str) -> str:
    """The URL's scheme, lower case ("" when it has none)."""
    return url.split("://", 1)[0].lower() if "://" in url else ""


def nats_servers(url: str) -> list[str]:
    """Each server a NATS URL names: it may list a cluster's nodes separated by commas
    (``nats://n1:4222,nats://n2:4222``), which ``nats.connect`` takes as a list."""
    return [part.strip() for part in url.split(",") if part.strip()]


def nats_tls(url: str, ca_file: str | None) -> ssl.SSLContext | None:
    """The client TLS context for a ``tls://`` NATS URL (None: plain NATS)."""
    if scheme(url) != "tls":
        return None
    return client_tls(ca_file, "CKPT_HA_NATS_CA_FILE")


def nats_options(
    url: str, user: str | None, password: SecretStr | None, ca_file: str | None
) -> dict[str, Any]:
    """Who we are and how the connection is secured, as ``nats.connect`` takes them: every
    direct connection (services' tools, runner, CLI, SDK) builds them here. Replies come back
    under the user's own inbox prefix, the only one it may subscribe to."""
    return {
        "user": user,
        "password": reveal(password),
        "tls": nats_tls(url, ca_file),
        "inbox_prefix": nats_inbox_prefix(url, user),
    }


def nats_inbox_prefix(url: str, user: str | None) -> str:
    """The inbox prefix of a connection to ``url`` as ``user`` (or as the user the URL names):
    `ckpt_ha.contracts.subjects.inbox_prefix`."""
    if user is None:
        servers = nats_servers(url)
        user = urlsplit(servers[0]).username if servers else None
    return inbox_prefix(user)


def client_tls(ca_file: str | None, name: str = "CA file") -> ssl.SSLContext:
    """A client TLS context that verifies the server's certificate and host name against
    ``ca_file`` (PEM, may hold several CAs: the old and the new one during a rotation), or
    against the system's trust store when None."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise SecretUnreadable(name, f"cannot load {ca_file}: {exc}") from None
