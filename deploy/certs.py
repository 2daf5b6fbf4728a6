"""A local certificate authority for test clusters: `raftmq cluster up --tls` and the TLS tests.

`make_test_pki(directory, node_hosts, clients)` writes, with the `cryptography` package: a self-signed CA
(ca.pem, ca.key), one server certificate per node (<name>.pem/<name>.key; subjectAltName localhost, 127.0.0.1, ::1
and the node's host) and client certificates (<name>.pem/<name>.key, CN = the name, usable for EXTERNAL login).
Keys are EC P-256, unencrypted, readable by the owner only. Good for tests and local clusters, not for production:
a real deployment uses certificates from its own CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365
ORGANIZATION = "raftmq test cluster"


@dataclass(frozen=True, slots=True)
class CertPaths:
    """A certificate and its key on disk."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class TestPki:
    """What `make_test_pki` wrote."""

    __test__ = False  # (not a pytest test class)

    ca: CertPaths
    nodes: dict[str, CertPaths]
    clients: dict[str, CertPaths]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> CertPaths:
    paths = CertPaths(directory / f"{stem}.pem", directory / f"{stem}.key")
    paths.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_bytes = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    fd = os.open(paths.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key_bytes)
    return paths


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS)))


def _alt_names(host: str) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                     x509.IPAddress(ipaddress.ip_address("::1"))]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if host and host != "localhost":
            names.append(x509.DNSName(host))
    else:
        if x509.IPAddress(address) not in names:
            names.append(x509.IPAddress(address))
    return names


def make_test_pki(directory: Path, node_hosts: Mapping[str, str], clients: Iterable[str] = (),
                  ca_name: str = "raftmq test CA") -> TestPki:
    """Write a CA, a server certificate per node (name -> host) and client certificates into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_subject = _name(ca_name)
    ca_cert = (_builder(ca_subject, ca_subject, ca_key.public_key())
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
               .sign(ca_key, hashes.SHA256()))
    ca = _write(directory, "ca", ca_cert, ca_key)

    def issue(common_name: str, usage: x509.ObjectIdentifier, alt: list[x509.GeneralName] | None) -> tuple[
            x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (_builder(_name(common_name), ca_subject, key.public_key())
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                  critical=False))
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    nodes = {}
    for name, host in node_hosts.items():
        cert, key = issue(name, ExtendedKeyUsageOID.SERVER_AUTH, _alt_names(host))
        nodes[name] = _write(directory, name, cert, key)
    client_paths = {}
    for name in clients:
        cert, key = issue(name, ExtendedKeyUsageOID.CLIENT_AUTH, None)
        client_paths[name] = _write(directory, name, cert, key)
    return TestPki(ca, nodes, client_paths)
