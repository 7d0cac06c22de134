"""Whether an empty PS shard can still be refilled: who holds a copy of the model.

A PS shard lost before it wrote a checkpoint comes back empty (it heartbeats version 0). By
the PS's restore rules (``RestorePolicy`` in :mod:`elastic_step.ps.server`, rule b) only a
worker that has pulled a model version may refill it; a fresh worker's values are initial
ones. When no live worker holds such a copy, none ever will: waiting would only cost
``--master-timeout`` per worker attempt. :meth:`ModelCopies.unrecoverable` says so as soon as
it is sure, which is within one PS heartbeat (``HEARTBEAT_S``) of the empty shard's
registration, or ``GRACE_S`` after a master (re)start, which has not yet heard from every
worker.
Tests: tests/unit/test_coordinator.py; the whole job in tests/e2e/test_fault_tolerance.py.
"""

from __future__ import annotations

from collections.abc import Callable

from elastic_step.rpc.master_client import HEARTBEAT_S

#: A master (re)started this long ago has heard from every live worker.
GRACE_S = 2 * HEARTBEAT_S


class ModelCopies:
    """The model versions workers hold and the PS shards that came back empty.

    Kept in memory only: after a master restart every live worker and PS tells it again
    within a heartbeat, and no decision is taken before ``GRACE_S`` has passed.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._started = clock()
        #: Live worker -> the newest model version it has pulled (0: none yet).
        self._copies: dict[str, int] = {}
        #: PS slot -> when it last said it is empty.
        self._empty_at: dict[int, float] = {}
        #: When the last worker holding a copy ended.
        self._copy_lost_at = float("-inf")

    def note_worker(self, name: str, version: int) -> None:
        self._copies[name] = max(version, self._copies.get(name, 0))

    def worker_ended(self, name: str) -> None:
        if self._copies.pop(name, 0) > 0:
            self._copy_lost_at = self._clock()

    def note_ps(self, slot: int, version: int) -> None:
        if version > 0:
            self._empty_at.pop(slot, None)
        else:
            self._empty_at[slot] = self._clock()

    def ps_ended(self, slot: int) -> None:
        self._empty_at.pop(slot, None)  # its replacement says afresh

    @property
    def holders(self) -> list[str]:
        """The live workers that hold a pulled version of the model."""
        return sorted(name for name, version in self._copies.items() if version > 0)

    def unrecoverable(self, lost_at: dict[int, int]) -> str | None:
        """Why the job cannot go on, or None. ``lost_at`` maps each PS slot lost and not yet
        restored to the model version the job was at when it was lost.

        A slot is beyond repair when it was lost past version 0, has said it is empty since
        the last copy of the model ended (a report from before then may predate its refill),
        and no live worker holds a copy.
        """
        now = self._clock()
        if now - self._started < GRACE_S or self.holders:
            return None
        for slot, version in sorted(lost_at.items()):
            empty_at = self._empty_at.get(slot)
            if version > 0 and empty_at is not None and empty_at > self._copy_lost_at:
                return (
                    f"PS shard {slot} was lost at model v{version} before it wrote a "
                    "checkpoint, and no live worker holds a copy of the model to refill it: "
                    "the training so far cannot be recovered (a lower --checkpoint-steps "
                    "bounds what such a loss costs)"
                )
        return None
