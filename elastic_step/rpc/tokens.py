"""Instance tokens: signed by the master, checked by anyone, minted by no one else.

A token proves one name until it expires: ``<expires_at>.<signature>``, where the signature
is Ed25519 over the name and the expiry. Only the master holds the signing key (derived from
the job's secret, which never leaves it); the PS and the workers get the public key, which
checks tokens and cannot make one. So the user's code, which runs in the PS and the workers,
cannot act as the master or as another instance (issue 21, item 2).

A token lives :data:`TOKEN_LIFETIME_S`; the master hands a fresh one to an instance whose
token is past half its life, in the answer to its heartbeat.
Tests: tests/unit/test_auth.py.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
import time
from collections.abc import Callable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

#: How long a token proves its name. A pod that waits Pending longer than this starts with
#: an expired token and is refused; the master replaces it.
TOKEN_LIFETIME_S = 24 * 3600
#: Good tokens remembered by a verifier: more than a job's instances, and their renewals.
_VERIFIED_MAX = 8192


def derived_bytes(secret: str, label: str) -> bytes:
    """32 bytes for ``label``, derived from the job's secret (HMAC-SHA256): the master
    re-derives the same keys after a restart, and nothing but the secret is stored."""
    return hmac.new(secret.encode(), f"elastic-step {label}".encode(), hashlib.sha256).digest()


def _signed(name: str, expires_at: int) -> bytes:
    return f"elastic-step token\0{name}\0{expires_at}".encode()


class TokenSigner:
    """The master's side: makes tokens. Built from the job's secret."""

    def __init__(
        self,
        secret: str,
        *,
        lifetime_s: float = TOKEN_LIFETIME_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not secret:
            raise ValueError("TokenSigner needs the job's secret; got an empty one")
        self._key = Ed25519PrivateKey.from_private_bytes(derived_bytes(secret, "token key"))
        self.lifetime_s = lifetime_s
        self._clock = clock

    @property
    def verify_key(self) -> str:
        """The public key that checks this signer's tokens, hex."""
        return self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()

    def token(self, name: str) -> str:
        """A token for ``name``, valid for :attr:`lifetime_s` from now."""
        expires_at = int(self._clock() + self.lifetime_s)
        return f"{expires_at}.{self._key.sign(_signed(name, expires_at)).hex()}"

    def renewal(self, name: str, token: str) -> str:
        """A fresh token for ``name`` when ``token`` is past half its life; "" otherwise."""
        left = expires_at(token) - self._clock()
        return self.token(name) if left < self.lifetime_s / 2 else ""


#: A token's one form: the expiry in decimal, no leading zero, and 64 signature bytes in hex.
_FORM = re.compile(r"[1-9][0-9]{0,11}\.[0-9a-f]{128}")


def expires_at(token: str) -> int:
    """When ``token`` expires (Unix seconds); 0 for a token of no known form."""
    return int(token.partition(".")[0]) if _FORM.fullmatch(token) else 0


class TokenVerifier:
    """Anyone's side: checks tokens with the master's public key, and cannot make one."""

    def __init__(self, verify_key: str, *, clock: Callable[[], float] = time.time) -> None:
        try:
            raw = bytes.fromhex(verify_key)
            self._key = Ed25519PublicKey.from_public_bytes(raw)
        except ValueError as e:
            raise ValueError(
                f"a verify key is 64 hex digits (an Ed25519 public key); got {verify_key[:80]!r}"
            ) from e
        self._clock = clock
        self._verified: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def problem(self, name: str, token: str) -> str | None:
        """Why ``token`` does not prove ``name`` now, or None when it does."""
        expiry = expires_at(token)
        if not expiry or not self._signature_holds(name, token):
            return "a wrong token"
        if expiry <= self._clock():
            return "an expired token"
        return None

    def _signature_holds(self, name: str, token: str) -> bool:
        # Every call of an instance carries the same token, and the check is the costly part:
        # a good one is remembered (the expiry is compared at every call). A bad one is not,
        # so that strangers cannot fill the memory with made-up names.
        if (name, token) in self._verified:
            return True
        signature = bytes.fromhex(token.partition(".")[2])
        try:
            self._key.verify(signature, _signed(name, expires_at(token)))
        except InvalidSignature:
            return False
        with self._lock:
            if len(self._verified) >= _VERIFIED_MAX:
                self._verified.clear()  # the live instances' tokens come back at once
            self._verified.add((name, token))
        return True
