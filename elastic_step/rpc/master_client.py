"""How workers and PS call the master: every call retries while the master is away.

A master that died comes back (the same ``train`` command, run again) on the same address;
until ``timeout_s`` has passed without an answer, calls keep retrying with backoff.
"""

from __future__ import annotations

import logging
import time

import grpc

from elastic_step.rpc import master_pb2_grpc

log = logging.getLogger(__name__)

_RETRIED = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class MasterUnreachableError(Exception):
    pass


class MasterClient:
    def __init__(self, address: str, timeout_s: float = 300.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address)
        self._stub = master_pb2_grpc.MasterStub(self._channel)

    def call(self, method: str, request):
        """Calls ``method`` (e.g. "GetTask"), retrying while the master is unreachable."""
        give_up_at = None
        delay = 0.2
        while True:
            try:
                return getattr(self._stub, method)(request, timeout=10)
            except grpc.RpcError as e:
                if e.code() not in _RETRIED:
                    raise
                now = time.monotonic()
                if give_up_at is None:
                    give_up_at = now + self.timeout_s
                    log.warning("master %s unreachable (%s); retrying", self.address, e.code().name)
                if now >= give_up_at:
                    raise MasterUnreachableError(
                        f"master {self.address} unreachable for {self.timeout_s:.0f} s"
                    ) from e
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def close(self) -> None:
        self._channel.close()
