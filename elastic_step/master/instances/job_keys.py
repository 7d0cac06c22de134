"""The keys only the master holds, and what it hands each instance.

From the job's secret the master derives the key that signs tokens and, with TLS, the job's
CA (see :mod:`elastic_step.rpc.auth`). It gives each instance its own token, the public key
that checks tokens, and its role's certificate; never the secret or a signing key.
Tests: tests/unit/test_auth.py.
"""

from __future__ import annotations

from elastic_step.rpc import auth
from elastic_step.rpc.tls import JobCA, TlsFiles
from elastic_step.rpc.tokens import TOKEN_LIFETIME_S, TokenSigner


class JobKeys:
    """The master's keys for one job: the token signer and, with ``tls``, the job's CA."""

    def __init__(
        self, secret: str, job_name: str, *, tls: bool, lifetime_s: float = TOKEN_LIFETIME_S
    ) -> None:
        self.signer = TokenSigner(secret, lifetime_s=lifetime_s)
        self.ca = JobCA(secret, job_name) if tls else None

    @property
    def verify_key(self) -> str:
        return self.signer.verify_key

    def tls(self, role: str) -> TlsFiles | None:
        """``role``'s certificate, or None without TLS."""
        return None if self.ca is None else self.ca.files(role)

    def master_credentials(self) -> auth.MintedCredentials:
        """The master's own credentials, which renew themselves."""
        return auth.MintedCredentials(self.signer, auth.MASTER_NAME, self.tls("master"))

    def instance_env(self, name: str) -> dict[str, str]:
        """The secret environment of instance ``name``: its token, the verify key, and with
        TLS its role's certificate and the CA's."""
        env = {auth.TOKEN_ENV: self.signer.token(name), auth.VERIFY_KEY_ENV: self.verify_key}
        files = self.tls(auth.role_of(name))
        if files is not None:
            env[auth.TLS_CA_ENV] = files.ca_cert.decode()
            env[auth.TLS_CERT_ENV] = files.cert.decode()
            env[auth.TLS_KEY_ENV] = files.key.decode()
        return env
