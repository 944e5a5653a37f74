"""A throwaway CA and a server certificate for 127.0.0.1 / localhost, made for one test, and
the committed deploy/redis/redis.conf (TLS only) started with them."""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ckpt_ha.lab.devstack import procs

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROD_TLS = "/etc/ckpt-ha/tls/"
"""Where the committed server configs expect their certificate, key and CA."""


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_tls(folder: Path, name: str = "server") -> TlsFiles:
    """``ca.crt`` (a fresh CA), ``<name>.crt`` / ``<name>.key`` signed by it, valid for a day."""
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("ckpt-ha test CA"))
        .issuer_name(_name("ckpt-ha test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(folder / "ca.crt", folder / f"{name}.crt", folder / f"{name}.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    files.key.chmod(0o600)
    return files


def prod_copy(src: Path, dst: Path, replace: dict[str, Path]) -> Path:
    """The deploy folder ``src`` copied to ``dst``, its production paths replaced."""
    shutil.copytree(src, dst)
    for conf in dst.iterdir():
        text = conf.read_text()
        for old, new in replace.items():
            text = text.replace(old, str(new))
        conf.write_text(text)
    assert PROD_TLS not in "".join(c.read_text() for c in dst.iterdir())
    return dst


def tls_redis_server() -> Path:
    """The first redis-server built with TLS (a build without says 'Bad directive')."""
    candidates = [procs.redis_server_binary()]
    if found := shutil.which("redis-server"):
        candidates.append(Path(found))
    for binary in candidates:
        out = subprocess.run(
            [str(binary), "--port", "0", "--tls-port", "1", "--daemonize", "no"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        if "Bad directive" not in out.stdout + out.stderr:
            return binary
    pytest.fail(f"no redis-server built with TLS among {candidates}")


def _tls_pong(port: int, ca: Path, login: tuple[str, str]) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=0.5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
        ):
            sock.sendall(f"AUTH {login[0]} {login[1]}\r\nPING\r\n".encode())
            answer = b""
            while answer.count(b"\r\n") < 2:
                answer += sock.recv(64) or b"\r\n\r\n"
            return answer.endswith(b"+PONG\r\n")
    except OSError:
        return False


def start_tls_redis(
    tmp_path: Path, tls: TlsFiles, acl_text: str, login: tuple[str, str]
) -> procs.ManagedProcess:
    """The committed deploy/redis/redis.conf (TLS only, ACL file) on a free loopback port, its
    certificate paths and dirs replaced, with ``acl_text`` as its users; ready once ``login``
    gets a PONG over TLS. Its URL is ``rediss://127.0.0.1:<port>/0``."""
    binary = tls_redis_server()
    data = tmp_path / "redis-data"
    data.mkdir()
    names = {PROD_TLS + "redis.crt": tls.cert, PROD_TLS + "redis.key": tls.key,
             PROD_TLS + "ca.crt": tls.ca, "/var/lib/ckpt-ha/redis": data,
             "/etc/ckpt-ha/redis": tmp_path / "redis-deploy"}  # fmt: skip
    folder = prod_copy(DEPLOY / "redis", tmp_path / "redis-deploy", names)
    (folder / "users.acl").write_text(acl_text)
    port = procs.free_port()
    argv = [
        str(binary), str(folder / "redis.conf"),
        "--bind", "127.0.0.1",
        "--tls-port", str(port),
        "--daemonize", "no",
        "--logfile", "",
    ]  # fmt: skip
    return procs.start_process(
        "redis-tls",
        argv,
        home=tmp_path,
        port=port,
        url=f"rediss://127.0.0.1:{port}/0",
        marker=binary.name,
        ready=lambda: _tls_pong(port, tls.ca, login),
    )
