"""TLS for ``up --tls`` and between machines: the deployment's own CA (under ``<data-dir>/tls``), the server
certificate it signs for every broker and bridge, and client certificates for devices joining a hub."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from broker.lifecycle import write_whole

VALID_DAYS = 825


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def ensure_certificates(directory: Path, hosts: list[str], ca: Path | None = None,
                        ca_key: Path | None = None) -> TlsFiles:
    """The CA (unless given) and a server certificate for ``hosts``, reused while valid."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)   # also when it was made before (to put a CA of one's own in it)
    ca_path, ca_key_path = ca or directory / "ca.pem", ca_key or directory / "ca-key.pem"
    cert_path, key_path = directory / "server.pem", directory / "server-key.pem"
    now = datetime.datetime.now(datetime.timezone.utc)
    pem = serialization.Encoding.PEM
    private = dict(encoding=pem, format=serialization.PrivateFormat.PKCS8,
                   encryption_algorithm=serialization.NoEncryption())

    if not ca_path.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "p2pfaas deployment CA")])
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .sign(key, hashes.SHA256()))
        ca_path.write_bytes(cert.public_bytes(pem))
        write_whole(ca_key_path, key.private_bytes(**private))   # 0600 from its first byte
    ca_cert = x509.load_pem_x509_certificate(ca_path.read_bytes())
    ca_key_obj = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)

    names = []
    for host in dict.fromkeys(["localhost", "127.0.0.1", *hosts]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    if cert_path.exists():
        existing = x509.load_pem_x509_certificate(cert_path.read_bytes())
        san = existing.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        if set(names) <= set(san) and existing.not_valid_after_utc > now + datetime.timedelta(days=7):
            return TlsFiles(ca_path, cert_path, key_path)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "p2pfaas")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(ca_key_obj, hashes.SHA256()))
    cert_path.write_bytes(cert.public_bytes(pem))
    write_whole(key_path, key.private_bytes(**private))
    return TlsFiles(ca_path, cert_path, key_path)


def client_certificate(files: TlsFiles, name: str, ca_key: Path | None = None) -> tuple[bytes, bytes]:
    """A client certificate for device ``name`` signed by the CA: (certificate, key) in PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(files.ca.read_bytes())
    ca_key_obj = serialization.load_pem_private_key((ca_key or files.ca.parent / "ca-key.pem").read_bytes(),
                                                    password=None)
    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key_obj, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return cert.public_bytes(pem), key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption())
