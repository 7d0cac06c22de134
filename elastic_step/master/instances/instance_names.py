"""Names for new instances: ``worker-N``, ``standby-N``, ``ps-S`` then ``ps-S-G``.

A name is never given out twice in a job's life, adopted instances included, so that a
report or an event from a dead instance is never taken for its successor's. The counters
are durable: the instance manager keeps them in its snapshot, and every instance it puts on
record (by a launch or a journal replay) is noted here.
Tests: tests/unit/test_instance_manager.py.
"""

from __future__ import annotations

from elastic_step.backends.api import Role


class InstanceNames:
    def __init__(self) -> None:
        #: The next worker and standby numbers, and each PS shard's next generation.
        self.next_worker = 0
        self.next_standby = 0
        self.ps_generations: dict[int, int] = {}

    def next(self, role: Role, slot: int) -> str:
        """A name no instance of this job ever had, for a new ``role`` in ``slot``."""
        if role is Role.WORKER:
            return f"worker-{self.next_worker}"
        if role is Role.STANDBY:
            return f"standby-{self.next_standby}"
        generation = self.ps_generations.get(slot, 0)
        return f"ps-{slot}" if generation == 0 else f"ps-{slot}-{generation}"

    def note(self, name: str, role: Role, slot: int) -> None:
        """``name`` is taken (launched, adopted or replayed): it is not given out again."""
        if name.startswith("standby-"):  # a standby, or a worker that was one
            self.next_standby = max(self.next_standby, int(name.rsplit("-", 1)[1]) + 1)
        elif role is Role.WORKER:
            self.next_worker = max(self.next_worker, int(name.rsplit("-", 1)[1]) + 1)
        else:
            prefix = f"ps-{slot}"
            generation = 0 if name == prefix else int(name[len(prefix) + 1 :])
            self.ps_generations[slot] = max(self.ps_generations.get(slot, 0), generation + 1)

    def snapshot(self) -> dict:
        return {
            "next_worker": self.next_worker,
            "next_standby": self.next_standby,
            "ps_generations": {str(k): v for k, v in self.ps_generations.items()},
        }

    def restore(self, state: dict) -> None:
        self.next_worker = state["next_worker"]
        self.next_standby = state.get("next_standby", 0)  # absent before standbys
        self.ps_generations = {int(k): v for k, v in state["ps_generations"].items()}
