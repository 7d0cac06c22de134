"""The Kubernetes state store's lease: a coordination.k8s.io/v1 Lease with a fencing token.

The Lease ``<job>-master`` names its holder (``holderIdentity``), how long a renewal holds
(``leaseDurationSeconds``) and when it was renewed (``renewTime``); ``leaseTransitions`` is
the fencing token, one more at every acquisition (and never below the token the state's head
last recorded, so deleting the Lease does not reset it).

It is free when it has no holder or has run out: its renewTime plus its duration is past (by
this process's clock), or this process has watched it stay unchanged for longer than its
duration (which covers a holder whose clock runs ahead). Taking it is an update conditional on
the resourceVersion read, so of two contenders one wins and the other re-reads.

The holder renews every duration/3 in a background thread. A renewal that finds another holder
or another token fences the owner: :attr:`KubeLease.fenced` is set and ``on_fenced`` is called.
The lease alone is not what keeps an old owner's writes out, though: see kubernetes_store.py,
whose every write is conditional on objects a new owner changes when it takes over.
Tests: against an API server, tests/k8s/test_k8s_state_store.py (the lease).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from elastic_step.kube.calls import KubeError
from elastic_step.kube.objects import KubeObjects
from elastic_step.master.state_store.api import (
    StateStoreError,
    StateStoreFencedError,
    StateStoreLockedError,
)

log = logging.getLogger("elastic_step.master.state_store")

_POLL_FIRST_S = 0.05
_POLL_MAX_S = 0.5


def micro_time(moment: datetime | None = None) -> str:
    """A MicroTime as the API writes it: ``2024-05-01T12:00:00.123456Z``."""
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class KubeLease:
    def __init__(
        self,
        api: KubeObjects,
        name: str,
        duration_s: int,
        labels: dict[str, str],
        owner_references: list[dict],
    ) -> None:
        self._api = api
        self.name = name
        self._duration_s = duration_s
        self._labels = labels
        self._owner_references = owner_references
        self._lock = threading.RLock()
        self.owner: str | None = None
        self.token = 0
        self._rv: str | None = None
        #: time.monotonic() before which no successor can have taken the lease from us.
        self._valid_until = 0.0
        self.fenced: StateStoreFencedError | None = None
        self._on_fenced: Callable[[StateStoreFencedError], None] | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def where(self) -> str:
        return f"lease {self._api.namespace}/{self.name}"

    # -- taking it --

    def acquire(self, owner: str, timeout_s: float, token_floor: Callable[[], int]) -> int:
        """Takes the lease for ``owner``; the token is above ``token_floor()`` and every token
        the Lease gave before."""
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
        if not owner:
            raise ValueError("the owner must be a non-empty string")
        with self._lock:
            if self.owner is not None:
                raise StateStoreError(f"{self.where}: the lease is already held by this store")
            deadline = time.monotonic() + timeout_s
            pause = _POLL_FIRST_S
            seen_rv, seen_since = None, 0.0
            while True:
                lease = self._api.get_lease(self.name)
                floor = token_floor()
                started = time.monotonic()
                if lease is None:
                    token = floor + 1
                    try:
                        created = self._api.create_lease(self._new_lease(owner, token))
                    except KubeError as err:
                        if not err.already_exists:
                            raise
                        continue  # another contender created it first: read it
                    return self._took(owner, token, created, started)
                rv = lease["metadata"]["resourceVersion"]
                now = time.monotonic()
                if rv != seen_rv:
                    seen_rv, seen_since = rv, now
                spec = lease.get("spec") or {}
                if self._is_free(spec, now - seen_since):
                    token = max(_int(spec.get("leaseTransitions")), floor) + 1
                    try:
                        taken = self._api.patch_lease(self.name, self._take_over(owner, token, rv))
                    except KubeError as err:
                        if not err.conflict:
                            raise
                        continue  # another contender took it first: read it
                    return self._took(owner, token, taken, started)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StateStoreLockedError(
                        f"{self.where} is held by {describe_holder(spec)}; "
                        f"waited {timeout_s:g} s for it"
                    )
                time.sleep(min(pause, left))
                pause = min(pause * 2, _POLL_MAX_S)

    def _is_free(self, spec: dict, unchanged_for_s: float) -> bool:
        if not spec.get("holderIdentity"):
            return True  # released
        duration = _int(spec.get("leaseDurationSeconds")) or self._duration_s
        renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
        if renewed is None:
            return True
        expired = renewed + timedelta(seconds=duration) < datetime.now(UTC)
        return expired or unchanged_for_s > duration

    def _new_lease(self, owner: str, token: int) -> dict:
        metadata: dict = {"name": self.name, "labels": dict(self._labels)}
        if self._owner_references:
            metadata["ownerReferences"] = self._owner_references
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": self._holder_spec(owner, token),
        }

    def _take_over(self, owner: str, token: int, rv: str) -> dict:
        return {"metadata": {"resourceVersion": rv}, "spec": self._holder_spec(owner, token)}

    def _holder_spec(self, owner: str, token: int) -> dict:
        now = micro_time()
        return {
            "holderIdentity": owner,
            "leaseDurationSeconds": self._duration_s,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": token,
        }

    def _took(self, owner: str, token: int, lease: dict, started: float) -> int:
        self.owner, self.token = owner, token
        self._rv = lease["metadata"]["resourceVersion"]
        # Counted from before the request that took it (its renewTime is no earlier).
        self._valid_until = started + self._duration_s
        self.fenced = None
        self._stop.clear()
        return token

    # -- keeping it --

    def start_renewing(self, on_fenced: Callable[[StateStoreFencedError], None]) -> None:
        self._on_fenced = on_fenced
        self._renewer = threading.Thread(
            target=self._renew_loop, name=f"{self.where} renewal", daemon=True
        )
        self._renewer.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        renewer = self._renewer
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join(self._api.retry_for_s + 1)

    def _renew_loop(self) -> None:
        interval = self._duration_s / 3
        failing_since: float | None = None
        while not self._stop.wait(interval):
            try:
                self.renew(retry_for_s=interval)
            except StateStoreFencedError:
                return  # renew() called on_fenced
            except Exception as e:  # keep renewing: writes check the lease themselves
                if failing_since is None:
                    failing_since = time.monotonic()
                log.warning(
                    "%s: renewal failed for %.1f s: %s",
                    self.where,
                    time.monotonic() - failing_since,
                    e,
                )
                continue
            failing_since = None

    def renew(self, retry_for_s: float | None = None) -> None:
        """Renews now; raises StateStoreFencedError when another owner took the lease."""
        with self._lock:
            self._raise_if_fenced()
            for _ in range(3):
                started = time.monotonic()
                body = {
                    "metadata": {"resourceVersion": self._rv},
                    "spec": {"holderIdentity": self.owner, "renewTime": micro_time()},
                }
                try:
                    lease = self._api.patch_lease(self.name, body, retry_for_s=retry_for_s)
                except KubeError as err:
                    if not (err.conflict or err.not_found):
                        raise
                    lease = self._read_ours(retry_for_s)  # fences unless still ours
                    self._rv = lease["metadata"]["resourceVersion"]
                    continue  # changed by someone else but still ours (an annotation): again
                self._rv = lease["metadata"]["resourceVersion"]
                self._valid_until = started + self._duration_s
                return
            raise StateStoreError(f"{self.where}: kept changing under its renewal")

    def ensure_valid(self) -> None:
        """Before a write: raises if fenced; renews first unless a renewal is recent."""
        with self._lock:
            self._raise_if_fenced()
            if time.monotonic() > self._valid_until - self._duration_s / 3:
                self.renew()

    def check(self) -> None:
        """Reads the Lease: raises StateStoreFencedError unless it is still this owner's."""
        with self._lock:
            self._raise_if_fenced()
            self._read_ours(None)

    def _read_ours(self, retry_for_s: float | None) -> dict:
        lease = self._api.get_lease(self.name, retry_for_s=retry_for_s)
        spec = (lease or {}).get("spec") or {}
        if lease is None:
            self.fence(
                StateStoreFencedError(
                    f"{self.where} was deleted under owner {self.owner} (token {self.token}); "
                    "it must stop writing"
                )
            )
        elif (
            spec.get("holderIdentity") != self.owner
            or _int(spec.get("leaseTransitions")) != self.token
        ):
            self.fence(
                StateStoreFencedError(
                    f"{self.where}: owner {self.owner} lost the lease: its token is "
                    f"{self.token}, the job's is now {_int(spec.get('leaseTransitions'))} "
                    f"(held by {spec.get('holderIdentity') or 'nobody'}); it must stop writing"
                )
            )
        self._raise_if_fenced()
        return lease

    def fence(self, error: StateStoreFencedError) -> None:
        """Marks the lease lost (the first error given stays) and stops the renewals."""
        with self._lock:
            if self.fenced is None:
                self.fenced = error
                self._stop.set()
                callback = self._on_fenced
            else:
                callback = None
        if callback is not None:
            callback(error)

    def _raise_if_fenced(self) -> None:
        if self.fenced is not None:
            raise StateStoreFencedError(str(self.fenced)) from self.fenced
        if self.owner is None:
            raise StateStoreError(f"{self.where}: the lease is not held")

    # -- giving it back --

    def release(self) -> None:
        """Gives the lease back if it is still this owner's, so a successor need not wait for
        it to run out. Best effort: if this fails, the lease runs out."""
        self.stop_renewing()
        with self._lock:
            if self.owner is None or self.fenced is not None:
                return
            try:
                for _ in range(3):
                    body = {
                        "metadata": {"resourceVersion": self._rv},
                        "spec": {"holderIdentity": None, "renewTime": micro_time()},
                    }
                    try:
                        self._api.patch_lease(self.name, body)
                        return
                    except KubeError as err:
                        if not err.conflict:
                            raise
                        self._rv = self._read_ours(None)["metadata"]["resourceVersion"]
            except StateStoreError as e:  # fenced included: then it is not ours to release
                log.info("%s: not released (%s); it runs out by itself", self.where, e)
            finally:
                self.owner = None


def describe_holder(spec: dict) -> str:
    """The holder as the Lease names it, for messages."""
    renewed = parse_time(spec.get("renewTime"))
    ago = f", renewed {(datetime.now(UTC) - renewed).total_seconds():.1f} s ago" if renewed else ""
    return (
        f"{spec.get('holderIdentity') or 'nobody'} (token {_int(spec.get('leaseTransitions'))}"
        f"{ago}, lease {_int(spec.get('leaseDurationSeconds'))} s)"
    )


def _int(value: object) -> int:
    return value if type(value) is int else 0
