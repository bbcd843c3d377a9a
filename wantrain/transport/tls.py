"""TLS for the parameter server: credentials from PEM files, and a development CA.

The PS serves TLS with a server certificate (`--tls-cert/--tls-key`) and, with `--tls-client-ca`,
also demands a client certificate signed by that CA (mutual TLS). Sites verify the PS against
a CA file (`--tls-ca`). For local runs, notebooks and demos, `make_dev_certs` creates a
throw-away CA with a server certificate for localhost and 127.0.0.1 and client certificates,
so TLS is on by default even where no real PKI exists. Keys are EC P-256, files are 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from ..errors import ConfigError

__all__ = ["TLSServer", "TLSClient", "make_dev_certs", "DevCerts"]


def _read(path: str | Path, what: str) -> bytes:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} file {p} does not exist")
    data = p.read_bytes()
    if b"-----BEGIN" not in data:
        raise ConfigError(f"{what} file {p} is not PEM")
    return data


@dataclass(frozen=True)
class TLSServer:
    """The PS's side: its certificate and key, and optionally the CA its clients must be signed by."""

    cert: str
    key: str
    client_ca: str | None = None

    def credentials(self) -> grpc.ServerCredentials:
        ca = _read(self.client_ca, "TLS client CA") if self.client_ca else None
        return grpc.ssl_server_credentials([(_read(self.key, "TLS key"), _read(self.cert, "TLS certificate"))],
                                           root_certificates=ca, require_client_auth=ca is not None)


@dataclass(frozen=True)
class TLSClient:
    """A site's side: the CA that signed the PS, and optionally its own certificate and key."""

    ca: str
    cert: str | None = None
    key: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        if bool(self.cert) != bool(self.key):
            raise ConfigError("a TLS client certificate needs both --tls-cert and --tls-key")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "TLS CA"),
            private_key=_read(self.key, "TLS key") if self.key else None,
            certificate_chain=_read(self.cert, "TLS certificate") if self.cert else None)


@dataclass(frozen=True)
class DevCerts:
    folder: Path
    ca: Path
    server_cert: Path
    server_key: Path
    clients: dict[str, tuple[Path, Path]]     # name -> (cert, key)

    def server(self, mutual: bool = False) -> TLSServer:
        return TLSServer(str(self.server_cert), str(self.server_key), str(self.ca) if mutual else None)

    def client(self, name: str | None = None) -> TLSClient:
        if name is None:
            return TLSClient(str(self.ca))
        cert, key = self.clients[name]
        return TLSClient(str(self.ca), str(cert), str(key))


def make_dev_certs(folder: str | Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
                   clients: tuple[str, ...] = (), days: int = 30) -> DevCerts:
    """A self-signed development CA, a server certificate for `hosts`, and client certificates.

    For development and tests only: the CA key sits next to the certificates."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "wantrain development"),
                          x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write(path: Path, data: bytes) -> Path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path

    def key_pem(k) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (x509.CertificateBuilder().subject_name(name("wantrain dev CA")).issuer_name(name("wantrain dev CA"))
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, sans: list, usage) -> tuple[bytes, bytes]:
        k = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca_cert.subject)
             .public_key(k.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return b.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM), key_pem(k)

    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    ca = write(folder / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM))
    write(folder / "ca.key", key_pem(ca_key))
    cert, key = leaf(hosts[0], sans, ExtendedKeyUsageOID.SERVER_AUTH)
    server_cert, server_key = write(folder / "server.pem", cert), write(folder / "server.key", key)
    out = {}
    for c in clients:
        cert, key = leaf(c, [], ExtendedKeyUsageOID.CLIENT_AUTH)
        out[c] = (write(folder / f"client-{c}.pem", cert), write(folder / f"client-{c}.key", key))
    return DevCerts(folder, ca, server_cert, server_key, out)
