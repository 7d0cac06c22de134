"""The evaluation rounds of a job's task manager: when they start, how their results add up.

A round is one pass over the validation split. One starts at every epoch end, in epoch
order (:meth:`epochs_ended`), and every ``evaluation_steps`` model versions (the task
manager decides when; no steps round starts while one is open). Round ``r``'s tasks have ids
``base + r * V + j``, with V the number of tasks of the validation split. Each task's result
is checked against its round (numeric states, of the round's shapes) and summed into an
:class:`EvaluationRound`; a round whose tasks are all done waits in ``completed`` until the
master takes it.

Order. While the model changes, only the oldest open round's tasks are handed out
(:meth:`pop`): a round's tasks go out after every task of the round before it is done, so
each of its tasks pulls a model no older than any the round before measured. A slow worker
holding the last task of a round delays the next round, not its order. Once training is
over the model no longer changes, and the rounds left go out together. Either way a round
whose tasks are all done waits, still open, for the rounds before it: rounds are completed
in the order they started. A steps round is named by the oldest epoch still training: that
epoch's end-of-epoch round follows.

Its state goes in the task manager's snapshot and journal; tested through the task manager,
in tests/unit/test_task_manager.py.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence

import numpy as np

from elastic_step.master.tasks.api import (
    EvaluationResult,
    EvaluationRound,
    ResultError,
    decode_states,
)
from elastic_step.master.tasks.task_groups import Group, Queue, Split, pack, unpack


class RoundGroup(Group):
    """The tasks of one open round, and what they reported so far."""

    def __init__(self, base: int, size: int, round_: EvaluationRound):
        super().__init__(base, size, None)
        self.round = round_


class EvaluationRounds:
    """The open rounds and their queue, the next steps boundary, and the finished rounds."""

    def __init__(
        self,
        shards: Sequence[tuple[str, int]],
        records_per_task: int,
        *,
        base: int,
        evaluation_steps: int,
        metric_shapes: tuple[tuple[int, ...], ...] | None,
    ):
        """``base``: the id of round 0's first task, above every training task id.
        ``metric_shapes``: the shape each result's metric states must have; None: those of
        the first result of a round."""
        self.split = Split(shards, records_per_task)
        self._base = base
        self._steps = evaluation_steps
        self._metric_shapes = metric_shapes
        #: Started rounds with tasks not done, by round id.
        self.open: dict[int, RoundGroup] = {}
        self.todo = Queue()
        self.next_round = 0
        #: The model version at which the next steps round is due.
        self.next_version = evaluation_steps
        #: Finished rounds, oldest first, until the master takes them.
        self.completed: list[EvaluationRound] = []
        #: The epoch whose end-of-epoch round starts next (see :meth:`epochs_ended`).
        self.next_epoch = 1

    def locate(self, task_id: int) -> tuple[int, int]:
        """The round of an evaluation task, and its position in the validation split."""
        return divmod(task_id - self._base, self.split.count)

    def is_open(self, task_id: int) -> bool:
        """Whether ``task_id`` is a task of a round not completed yet (see Order)."""
        return (
            task_id >= self._base
            and bool(self.split.count)
            and self.locate(task_id)[0] in self.open
        )

    def not_done(self, task_id: int) -> bool:
        """Whether an evaluation task is of an open round and not done (held or not)."""
        round_id, position = self.locate(task_id)
        state = self.open.get(round_id)
        return state is not None and not state.is_done(position)

    def pop(self, is_todo: Callable[[int], bool], *, in_order: bool) -> int | None:
        """The next task to hand out; with ``in_order`` (while the model changes), of the
        oldest unfinished round only (see Order): None when it has every task out or done."""
        task_id = self.todo.peek(is_todo)
        if task_id is None:
            return None
        if in_order:
            oldest = min((r for r, s in self.open.items() if not s.all_done), default=None)
            if self.locate(task_id)[0] != oldest:
                return None
        return self.todo.pop(is_todo)

    def step_passed(self, version: int) -> bool:
        """Whether ``version`` reached the next steps boundary; moves it past ``version``."""
        if self._steps <= 0 or version < self.next_version:
            return False
        self.next_version = (version // self._steps + 1) * self._steps
        return True

    def start(self, trigger: str, epoch: int) -> None:
        """Starts the next round, after ``epoch``; none without a validation split."""
        if not self.split.count:  # nothing to evaluate: no round to wait for
            return
        self.add(EvaluationRound(self.next_round, trigger, epoch))
        self.next_round += 1

    def epochs_ended(self, last: int, running: Container[int]) -> None:
        """Starts the end-of-epoch round of each epoch up to ``last`` not ``running`` any more,
        in epoch order: an epoch whose tasks all finished before an older epoch's (a slow
        worker held one) waits for it."""
        while self.next_epoch <= last and self.next_epoch not in running:
            self.start("epoch-end", self.next_epoch)
            self.next_epoch += 1

    def add(self, round_: EvaluationRound) -> RoundGroup:
        count = self.split.count
        state = RoundGroup(self._base + round_.id * count, count, round_)
        self.open[round_.id] = state
        self.todo.groups.append(state)
        return state

    def check(self, round_id: int, result: EvaluationResult) -> list[np.ndarray]:
        """The result's metric states as float64 arrays; raises ResultError."""
        if result.example_count < 0:
            raise ResultError(f"example_count is {result.example_count}; it must be at least 0")
        # A NaN or infinite loss is a diverged model's true measurement, not a broken report.
        try:
            states = [np.array(s, dtype=np.float64) for s in result.metric_states]
        except (TypeError, ValueError) as e:
            raise ResultError(f"metric states are not numeric arrays ({e})") from None
        expected = self._metric_shapes
        held = self.open[round_id].round.metric_states
        if expected is None and held is not None:
            expected = tuple(s.shape for s in held)
        if expected is not None:
            got = tuple(s.shape for s in states)
            if len(got) != len(expected):
                raise ResultError(f"{len(got)} metric states; the round has {len(expected)}")
            for i, (shape, want) in enumerate(zip(got, expected, strict=True)):
                if shape != want:
                    raise ResultError(f"metric state {i} has shape {shape}; the round has {want}")
        return states

    def mark_done(self, task_id: int, version: int, result: dict) -> None:
        """Adds a task's result (as journaled) to its round; finishes the round with it."""
        round_id, position = self.locate(task_id)
        state = self.open[round_id]
        state.mark_done(position)
        state.round.add(
            result["loss_sum"],
            result["example_count"],
            decode_states(result["metric_states"]),
            version,
        )
        while self.open:  # completed in the order they started (see Order)
            oldest = min(self.open)
            if not self.open[oldest].all_done:
                break
            self.completed.append(self.open.pop(oldest).round)

    def counts(self, doing: int) -> dict[str, int]:
        """Evaluation tasks to do, under way (``doing``, from the leases) and done."""
        per_round = self.split.count
        open_done = sum(r.done_count for r in self.open.values())
        return {
            "todo": len(self.open) * per_round - open_done - doing,
            "doing": doing,
            "done": (self.next_round - len(self.open)) * per_round + open_done,
        }

    def open_json(self) -> list[dict]:
        """The open rounds for a snapshot: each round's sums and its tasks' done bits."""
        return [{**r.round.to_json(), "done": pack(r.done)} for _, r in sorted(self.open.items())]

    def load(self, snapshot: dict, next_epoch: int) -> None:
        """Loads the rounds' part of a task manager's snapshot; ``next_epoch`` for one taken
        before it held the next end-of-epoch round's epoch (then every ended epoch had its
        round started)."""
        for entry in snapshot["rounds"]:
            self.add(EvaluationRound.from_json(entry)).load_done(unpack(entry["done"]))
        self.next_round = snapshot["next_round"]
        self.next_version = snapshot["next_evaluation_version"]
        self.completed = [EvaluationRound.from_json(r) for r in snapshot["completed_rounds"]]
        self.next_epoch = snapshot.get("next_round_epoch", next_epoch)
