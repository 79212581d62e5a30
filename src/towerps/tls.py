"""Mutual TLS on the data plane: a certificate authority per job.

    tls = make_job_tls()                  # the driver, once per job (needs `cryptography`)
    tls = load_tls_dir("certs/")          # or what an operator provides (--tls-dir)
    server.add_secure_port(address, server_credentials(tls))
    grpc.secure_channel(address, channel_credentials(tls), options=(*opts, *TLS_OPTIONS))

A job's TLS material is its CA certificate, one server certificate and key
that every shard presents, and one client certificate and key that every
worker and the driver present; both certificates are signed by the CA and
shards require a client certificate. The server certificate names
SERVER_NAME (shards move between node addresses, so clients check that name,
not the address). The CA's own key exists only while `make_job_tls` runs.

`--tls-dir` holds the same five PEM files by these names: ca.pem,
server.pem, server.key, client.pem, client.key. `write_tls_dir` writes the
files a client needs (0600, in a 0700 folder).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import grpc

from towerps.errors import ConfigError
from towerps.private import make_private_dir, write_private_file

SERVER_NAME = "towerps-shard"
# The name clients expect in a shard's certificate, whatever address they dial.
TLS_OPTIONS = (("grpc.ssl_target_name_override", SERVER_NAME),)
_FILES = ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")
_VALID = datetime.timedelta(days=30)


@dataclass(frozen=True, repr=False)
class TlsMaterial:
    """PEM bytes. repr() shows no key."""

    ca_pem: bytes
    server_pem: bytes
    server_key: bytes
    client_pem: bytes
    client_key: bytes

    def __repr__(self) -> str:
        return "TlsMaterial(<keys hidden>)"


def make_job_tls() -> TlsMaterial:
    """A fresh CA, and a server and a client certificate it signs (EC P-256)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "towerps job CA")])
    ca_cert = (
        _builder(x509, ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def issue(common_name: str, usage, san: list) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        builder = (
            _builder(x509, name, ca_name, key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem

    server_pem, server_key = issue(
        SERVER_NAME, ExtendedKeyUsageOID.SERVER_AUTH, [x509.DNSName(SERVER_NAME)]
    )
    client_pem, client_key = issue("towerps-client", ExtendedKeyUsageOID.CLIENT_AUTH, [])
    return TlsMaterial(
        ca_cert.public_bytes(serialization.Encoding.PEM),
        server_pem, server_key, client_pem, client_key,
    )


def _builder(x509, subject, issuer, public_key, now):
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID)
    )


def load_tls_dir(path: str) -> TlsMaterial:
    """The five PEM files of `path` (--tls-dir); ConfigError naming a missing one."""
    missing = [name for name in _FILES if not os.path.isfile(os.path.join(path, name))]
    if missing:
        raise ConfigError(
            f"--tls-dir {path} lacks {', '.join(missing)}; it must hold {', '.join(_FILES)} "
            "(PEM: a CA, a server certificate for the name "
            f"{SERVER_NAME!r} and a client certificate, both signed by that CA)"
        )
    pems = []
    for name in _FILES:
        with open(os.path.join(path, name), "rb") as f:
            pems.append(f.read())
    return TlsMaterial(*pems)


def load_client_tls(ca_file: str, cert_file: str, key_file: str) -> TlsMaterial:
    """What a client needs (a run directory's tls/ files): no server certificate."""
    pems = []
    for path in (ca_file, cert_file, key_file):
        try:
            with open(path, "rb") as f:
                pems.append(f.read())
        except OSError as err:
            raise ConfigError(f"TLS file {path}: {err.strerror}") from None
    ca, cert, key = pems
    return TlsMaterial(ca, b"", b"", cert, key)


def write_tls_dir(path: str, tls: TlsMaterial) -> dict[str, str]:
    """Write what a client needs (ca.pem, client.pem, client.key) into `path`
    (a 0700 folder, files 0600, never written through a symlink: a link
    planted there is replaced); returns {file name: path}."""
    make_private_dir(path)
    written = {}
    for name, data in (("ca.pem", tls.ca_pem), ("client.pem", tls.client_pem),
                       ("client.key", tls.client_key)):
        target = os.path.join(path, name)
        write_private_file(target, data)
        written[name] = target
    return written


def server_credentials(tls: TlsMaterial) -> grpc.ServerCredentials:
    """A shard's: presents the server certificate, requires a client one from the CA."""
    return grpc.ssl_server_credentials(
        [(tls.server_key, tls.server_pem)], root_certificates=tls.ca_pem,
        require_client_auth=True,
    )


def channel_credentials(tls: TlsMaterial) -> grpc.ChannelCredentials:
    """A client's: trusts the job CA only, presents the client certificate."""
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca_pem, private_key=tls.client_key,
        certificate_chain=tls.client_pem,
    )
