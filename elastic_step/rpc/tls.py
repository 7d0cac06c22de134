"""Mutual TLS between the master, the PS and the workers, under a CA of the job's own.

The master derives the CA's key from the job's secret (so a restarted master signs with the
same CA, and the pods it adopts still trust it) and issues one certificate per role:
``master``, ``ps`` and ``worker``. Each instance gets the CA's certificate and its role's
key and certificate, never the CA's key. A server asks every client for a certificate of
the job's CA; a client checks that the server holds the role it called (the name
``<role>.elastic-step`` in the certificate), so a worker cannot pose as a PS or the master.
Tests: tests/unit/test_tls.py.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from elastic_step.rpc.tokens import derived_bytes

#: The roles a certificate is issued for.
ROLES = ("master", "ps", "worker")
_VALIDITY = datetime.timedelta(days=3650)
# Clocks of pods on different nodes disagree a little.
_SKEW = datetime.timedelta(hours=1)


def server_name(role: str) -> str:
    """The name a ``role``'s certificate is issued for, and that its clients check."""
    return f"{role}.elastic-step"


@dataclass(frozen=True)
class TlsFiles:
    """What one instance holds: the job CA's certificate, and its role's key and
    certificate (PEM). The key is left out of ``repr``."""

    ca_cert: bytes
    cert: bytes
    key: bytes = field(repr=False)

    def server_credentials(self) -> grpc.ServerCredentials:
        """Serves with this role's certificate, and admits only clients with one of the
        job's CA."""
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca_cert, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_cert, private_key=self.key, certificate_chain=self.cert
        )


def _key(secret: str, label: str) -> ec.EllipticCurvePrivateKey:
    curve = ec.SECP256R1()
    # The order of P-256 is just below 2**256: reduce into [1, n-1].
    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
    value = int.from_bytes(derived_bytes(secret, label), "big") % (order - 1) + 1
    return ec.derive_private_key(value, curve)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class JobCA:
    """The master's side: the job's CA, and a certificate for each role."""

    def __init__(self, secret: str, job_name: str) -> None:
        if not secret:
            raise ValueError("JobCA needs the job's secret; got an empty one")
        self._secret = secret
        self._key = _key(secret, "ca key")
        now = datetime.datetime.now(datetime.UTC)
        self._name = _name(f"elastic-step CA of job {job_name}"[:64])
        public = self._key.public_key()
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_CA_USAGE, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self._files = {role: self._issue(role, now) for role in ROLES}

    def files(self, role: str) -> TlsFiles:
        """What an instance of ``role`` holds."""
        if role not in self._files:
            raise ValueError(f"a certificate's role is one of {', '.join(ROLES)}; got {role!r}")
        return self._files[role]

    def _issue(self, role: str, now: datetime.datetime) -> TlsFiles:
        key = _key(self._secret, f"tls key {role}")
        ca_public = self._key.public_key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(server_name(role)))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_LEAF_USAGE, critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.SubjectAlternativeName([x509.DNSName(server_name(role))]), critical=False
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        return TlsFiles(self.cert.public_bytes(pem), cert.public_bytes(pem), _pem(key))


def _key_usage(*granted: str) -> x509.KeyUsage:
    names = (
        "digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
        "key_agreement", "key_cert_sign", "crl_sign", "encipher_only", "decipher_only",
    )  # fmt: skip
    return x509.KeyUsage(**{name: name in granted for name in names})


_CA_USAGE = _key_usage("key_cert_sign", "crl_sign")
_LEAF_USAGE = _key_usage("digital_signature")
