"""How workers and PS call the master.

A master that died comes back (the same ``train`` command, run again) on the same address:
while it is away (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, or ``CANCELLED``: a master that
stops, handing the job over, cancels the calls in flight) a call is retried with capped
exponential backoff until ``timeout_s`` has passed without an answer
(:class:`MasterUnreachableError`). Any other status is the master's answer, and retrying
would not change it: :class:`MasterRejectedError` carries its message, and the caller exits.
Tests: tests/unit/test_rpc_errors.py, tests/unit/test_auth.py.
"""

from __future__ import annotations

import logging
import time

import grpc

from elastic_step.rpc import master_pb2_grpc
from elastic_step.rpc.auth import Credentials, authenticated_channel

log = logging.getLogger(__name__)

# CANCELLED: only a server that stops cancels a call here (no client cancels its own), and
# an answer lost that way is a case the master handles: the report again is ignored as stale,
# the task in the lost answer goes back to the queue (see NextTaskRequest.held_leases).
_RETRIED = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
}
CALL_TIMEOUT_S = 10.0
#: How often workers and PS heartbeat the master (its liveness deadlines count in these).
HEARTBEAT_S = 2.0
FIRST_RETRY_S = 0.2
MAX_RETRY_S = 2.0


class MasterUnreachableError(Exception):
    """The master did not answer for the whole master timeout."""


class MasterRejectedError(Exception):
    """The master answered a call with an error status; retrying would not help."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"master rejected {method}: {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details


class MasterClient:
    def __init__(self, address: str, credentials: Credentials, timeout_s: float = 300.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = authenticated_channel(address, credentials, server_role="master")
        self._stub = master_pb2_grpc.MasterStub(self._channel)

    def call(self, method: str, request):
        """Calls ``method`` (e.g. "NextTask"), retrying while the master is unreachable.

        Raises :class:`MasterUnreachableError` after ``timeout_s`` without an answer, and
        :class:`MasterRejectedError` at once for any other error status.
        """
        give_up_at = None
        delay = FIRST_RETRY_S
        while True:
            try:
                return getattr(self._stub, method)(request, timeout=CALL_TIMEOUT_S)
            except grpc.RpcError as e:
                if e.code() not in _RETRIED:
                    raise MasterRejectedError(method, e.code(), e.details() or "") from e
                now = time.monotonic()
                if give_up_at is None:
                    give_up_at = now + self.timeout_s
                    log.warning("master %s unreachable (%s); retrying", self.address, e.code().name)
                if now >= give_up_at:
                    raise MasterUnreachableError(
                        f"master {self.address} unreachable for {self.timeout_s:.0f} s"
                    ) from e
                time.sleep(min(delay, max(give_up_at - now, 0.0)))
                delay = min(delay * 2, MAX_RETRY_S)

    def close(self) -> None:
        self._channel.close()
