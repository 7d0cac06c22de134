"""Cuts the data into tasks, hands them out under fenced leases and tracks them until done.

Tasks. The training tasks of every epoch are the split of the training shards, in shard
order, into ranges of ``records_per_task`` records; a shard with no records gives none. With
``permuted_training_tasks`` the training split is one run of positions, the shards joined,
cut the same way: a task's range is of the split's permutation for its epoch, which a worker
draws (task_size.py says why). Call their count T. Task ``i`` of that split in epoch ``e``
(1-based) has id ``(e - 1) * T + i``.
Evaluation round ``r`` has the V tasks of the validation split, ids ``epochs * T + r * V + j``.
A ``Task`` is built from its id on demand: per task, only what changed is stored (done bits,
failure causes, leases). A prediction job (``task_kind`` PREDICT) is the same with one epoch
and no validation split: its "training" tasks are prediction tasks, counted the same way.

Order. Epochs are created lazily, when the training todo runs dry; each is handed out in its
own seeded shuffle, or with permuted training tasks in position order (``_epoch_order``).
Evaluation rounds start at every epoch end, in epoch order (an epoch that ends before an
older one waits for it), and every ``evaluation_steps`` model versions (no steps round
while a round is open); their tasks go before any training task, the oldest open round's
only, so rounds finish in order and each measures a model no older than the
last one did. A task taken back goes to the front of its queue; a task that failed in user
code goes behind the other taken-back tasks, ahead of those never handed out. With
``pause_training_while_evaluating`` a round runs alone: its tasks wait until no training task
is out, and no training task goes out until it is done, so every task of the round measures
the same model. ``hold_training`` (not durable: the master sets it) keeps training tasks back.

Early stop. :meth:`stop_early` makes the last epoch with any training done or under way the
job's last: later epochs are dropped (they have no task done), the kept ones run to the end.

Leases. Every hand-out has a lease id, unique for the life of the job: ids count up from
``lease_base``, which the master derives from its fencing token. A report names the lease it
reports on; one from a worker that does not hold that lease (it ran out and the task went
elsewhere, or the task is done) changes nothing. A lease runs out ``task_timeout_s`` after
the hand-out or after the last progress (its batch count going up); heartbeats alone do not
renew it; a worker's progress renews every lease it holds (the task it prefetched waits on
the one in hand). A task taken back (lease ran out, worker lost, malformed report) is not a
failure, unless its worker died holding it: that counts as a failure of the task, as an
error in user code does, for the task it prefetched too (see ``recover_tasks``).
Past ``max_task_retries`` failures of one task the job fails with ``failure``.

Accounting. Each task is counted once per epoch however often it ran: ``records_trained`` of
an epoch ends at exactly the number of training records, for every epoch up to
``last_epoch`` (``epochs``, or fewer after an early stop).

Persistence. Every change of durable state is one small JSON-ready record passed to
``journal`` after it is applied; ``snapshot()`` is a compact JSON-ready state; ``restore()``
rebuilds a manager from a snapshot plus the records after it. Live methods and replay go
through the same transition (``_apply``), so they cannot drift. Deadlines are not durable:
restored leases get a full ``task_timeout_s``. Tasks taken back but not yet handed out again
are not durable either: after a restore, each epoch's todo is its order minus the
done and the leased tasks.

The manager is not thread-safe: the master serializes calls to it. ``clock`` must be
monotonic (lease deadlines are kept in the order they were set).

Parts. The manager keeps the epochs, the failures and the journal itself; the evaluation
rounds are in :mod:`~elastic_step.master.tasks.evaluation_rounds` (a round and its result are
:mod:`~elastic_step.master.tasks.api`'s, with the task and its settings), the leases in
:mod:`~elastic_step.master.tasks.task_leases`, and what epochs and rounds are made of (splits,
done bits, queues) in :mod:`~elastic_step.master.tasks.task_groups`. Tests:
tests/unit/test_task_manager.py.
"""

from __future__ import annotations

import random
import time
from array import array
from collections.abc import Callable, Iterable

import numpy as np

from elastic_step.master.tasks.api import (
    EvaluationResult,
    EvaluationRound,
    InvalidReportError,
    ResultError,
    Task,
    TaskKind,
    TaskSettings,
    encode_states,
)
from elastic_step.master.tasks.evaluation_rounds import EvaluationRounds
from elastic_step.master.tasks.task_groups import Group, Queue, Split, pack, unpack
from elastic_step.master.tasks.task_leases import Leases

#: Snapshot layout version; restore refuses others.
SNAPSHOT_FORMAT = 1
#: A failure cause longer than this keeps its end (where a traceback names the error).
MAX_CAUSE_CHARS = 1000


class TaskManager:
    """The tasks of one job: what to hand out next, who holds what, what is done."""

    def __init__(
        self,
        settings: TaskSettings,
        *,
        lease_base: int,
        clock: Callable[[], float] = time.monotonic,
        journal: Callable[[dict], None] | None = None,
    ):
        """``lease_base``: the first lease id; above every id an earlier master handed out.
        ``journal``: called with each record of a change, after it is applied."""
        if lease_base < 0:
            raise ValueError(f"lease_base is {lease_base}; it must be at least 0")
        self.settings = settings
        self._journal = journal
        self._train = _training_split(settings)
        #: Evaluation task ids start here.
        self._eval_base = settings.epochs * self._train.count
        self._evaluation = EvaluationRounds(
            settings.validation_shards,
            settings.records_per_task,
            base=self._eval_base,
            evaluation_steps=settings.evaluation_steps,
            metric_shapes=settings.metric_shapes,
        )
        #: The last epoch whose tasks were created (1-based; 0 before the first).
        self.epochs_created = 0
        #: Created epochs with tasks not done, by epoch.
        self._epochs: dict[int, _Epoch] = {}
        self._train_todo = Queue()
        self._leases = Leases(next_id=lease_base, timeout_s=settings.task_timeout_s, clock=clock)
        #: Failure causes of tasks not done, by task id.
        self._failures: dict[int, list[str]] = {}
        #: Set when a task failed past its retry limit: the job fails with this message.
        self.failure: str | None = None
        self.model_version = 0
        #: The job's last epoch: ``epochs`` until an early stop (see stop_early).
        self.last_epoch = settings.epochs
        #: The job's model version when each ended epoch's last task was done, by epoch.
        self.epoch_end_versions: dict[int, int] = {}
        #: Keeps training tasks back while set; not durable (see the module's Order).
        self.hold_training = False

    @property
    def completed_rounds(self) -> list[EvaluationRound]:
        """Finished evaluation rounds, oldest first; see take_completed_rounds."""
        return self._evaluation.completed

    # -- handing out --

    def get_task(self, worker: str) -> Task | None:
        """The next task for ``worker`` under a new lease; None when there is none now."""
        if self.failure is not None:
            return None
        if self._train_todo.peek(self._is_todo) is None and self.epochs_created < self.last_epoch:
            self._commit({"op": "epoch", "epoch": self.epochs_created + 1})
        alone = self.settings.pause_training_while_evaluating
        task_id = None
        if not (alone and self._training_out()):
            task_id = self._evaluation.pop(self._is_todo, in_order=not self.training_done)
        if task_id is None and not self.hold_training and not (alone and self._evaluation.open):
            task_id = self._train_todo.pop(self._is_todo)
        if task_id is None:
            return None
        self._commit(
            {"op": "lease", "task": task_id, "worker": worker, "lease": self._leases.next_id}
        )
        return self._build(task_id)

    def note_progress(self, worker: str, lease_id: int, batches_done: int) -> bool:
        """Renews a lease (now + task_timeout_s) when its batch count went up; says whether."""
        task_id = self._leases.task_of(lease_id)
        if task_id is None:
            return False
        lease = self._leases[task_id]
        if lease.worker != worker or batches_done <= lease.batches:
            return False
        self._commit({"op": "progress", "task": task_id, "batches": int(batches_done)})
        return True

    def new_lease_id(self) -> int:
        """A lease id that no hand-out of the job had, for a lease kept elsewhere (the model
        save's, :mod:`.model_save`)."""
        lease_id = self._leases.next_id
        self._leases.next_id += 1
        return lease_id

    def expire_leases(self) -> list[tuple[Task, str]]:
        """Takes back the tasks whose lease ran out (not a failure); returns them with their
        worker."""
        expired = []
        for task_id, worker in self._leases.expired():
            expired.append((self._build(task_id), worker))
            self._commit({"op": "release", "task": task_id})
        return expired

    # -- outcomes --

    def report_success(
        self,
        task_id: int,
        *,
        worker: str,
        lease_id: int,
        model_version: int = 0,
        evaluation: EvaluationResult | None = None,
    ) -> Task | None:
        """Marks a task done and returns it; None, changing nothing, when ``worker`` does not
        hold ``lease_id`` for it (stale). Raises InvalidReportError for a malformed report,
        after counting it as a failure of the task: a worker that keeps sending broken
        reports cannot loop the job past ``max_task_retries``."""
        if not self._leases.holds(task_id, worker, lease_id):
            return None
        task = self._build(task_id)
        try:
            states = check_report(task, evaluation, self._evaluation)
        except InvalidReportError as e:
            raise self.reject_report(
                task_id, worker=worker, lease_id=lease_id, problem=str(e)
            ) from None
        record: dict = {"op": "done", "task": task_id, "version": int(model_version)}
        if evaluation is not None:
            record["eval"] = {
                "loss_sum": float(evaluation.loss_sum),
                "example_count": int(evaluation.example_count),
                "metric_states": encode_states(states),
            }
        self._commit(record)
        return task

    def reject_report(
        self, task_id: int, *, worker: str, lease_id: int, problem: str
    ) -> InvalidReportError:
        """Counts a malformed report as a failure of its task (if ``worker`` still holds it)
        and returns the error for the caller to raise."""
        if self._leases.holds(task_id, worker, lease_id):
            self._commit({"op": "fail", "task": task_id, "cause": _cause(f"{worker}: {problem}")})
        return InvalidReportError(problem)

    def report_failure(
        self, task_id: int, *, worker: str, lease_id: int, error: str
    ) -> Task | None:
        """Records an error in user code: the task is retried, or the job fails past the
        limit. Returns the task with its failures; None, changing nothing, when stale."""
        if not self._leases.holds(task_id, worker, lease_id):
            return None
        self._commit({"op": "fail", "task": task_id, "cause": _cause(f"{worker}: {error}")})
        return self._build(task_id, lease_id)

    def recover_tasks(
        self, worker: str, death: str | None = None, *, keep: Iterable[int] = ()
    ) -> list[Task]:
        """Takes back the tasks ``worker`` holds, but for the leases in ``keep``, to the
        front of their queues (the one it was running, its oldest lease, first: a worker runs
        its tasks in the order it got them). With ``death`` (how the worker died) that is a
        failure of each: the task it prefetched, too, had its records in the worker's input
        pipeline, going through the model's code, so either may have killed it. The
        prefetched one is charged first: a record that kills every worker reading it is in
        every such death, so its task reaches ``max_task_retries`` first, and the job's
        failure names it rather than the task it was held with."""
        lost: list[Task] = []
        keep = set(keep)
        held = [t for t in self._leases.held_by(worker) if self._leases[t].lease_id not in keep]
        for task_id in reversed(held):
            lease_id = self._leases[task_id].lease_id
            if death is None:
                self._commit({"op": "release", "task": task_id})
            else:
                self._commit({"op": "fail", "task": task_id, "cause": _cause(death), "front": True})
            lost.insert(0, self._build(task_id, lease_id))
        return lost

    def observe_model_version(self, version: int) -> None:
        """Notes the model version; starts an evaluation round every ``evaluation_steps``."""
        if version > self.model_version:
            self._commit({"op": "version", "version": int(version)})

    def stop_early(self) -> int:
        """Ends training after the last epoch with any training task done or under way (the
        epochs before it are complete); returns that epoch. Idempotent."""
        if self.last_epoch < self.settings.epochs:
            return self.last_epoch
        started = {self._epoch_of(t) for t in self._leases if t < self._eval_base}
        started |= {e for e, s in self._epochs.items() if s.done_count}
        complete = [e for e in range(1, self.epochs_created + 1) if e not in self._epochs]
        last = max([1, *started, *complete])
        if last < self.settings.epochs:
            self._commit({"op": "stop", "epoch": last})
        return last

    def take_completed_rounds(self) -> list[EvaluationRound]:
        """Removes and returns the finished evaluation rounds, oldest first (journaled, so a
        restored manager does not return them again)."""
        rounds = list(self.completed_rounds)
        if rounds:
            self._commit({"op": "taken", "count": len(rounds)})
        return rounds

    # -- queries --

    def epoch_tasks(self, epoch: int) -> list[Task]:
        """The training (or prediction) tasks of ``epoch``, in id order: the split's order."""
        first = (epoch - 1) * self._train.count
        return [self._build(first + i) for i in range(self._train.count)]

    def task(self, task_id: int) -> Task | None:
        """The task with this id, with its lease and failures; None for an id that names no
        task, or a task of a finished evaluation round."""
        if 0 <= task_id < self._eval_base or self._evaluation.is_open(task_id):
            return self._build(task_id)
        return None

    @property
    def records_per_epoch(self) -> int:
        return self._train.records

    def records_trained(self, epoch: int) -> int:
        if not 1 <= epoch <= min(self.epochs_created, self.last_epoch):
            return 0
        state = self._epochs.get(epoch)
        return self.records_per_epoch if state is None else state.records_trained

    @property
    def current_epoch(self) -> int:
        """The oldest epoch whose training is not complete (the last one when all are)."""
        for epoch in range(1, self.last_epoch + 1):
            if self.records_trained(epoch) < self.records_per_epoch:
                return epoch
        return self.last_epoch

    @property
    def lowest_report_version(self) -> int | None:
        """The lowest version a training task out can report (Lease.version); None: none."""
        return self._leases.lowest_version(lambda t: t < self._eval_base)

    @property
    def training_done(self) -> bool:
        return self.epochs_created >= self.last_epoch and not self._epochs

    @property
    def finished(self) -> bool:
        """All epochs trained and every evaluation round finished."""
        return self.training_done and not self._evaluation.open

    def doing_count(self) -> int:
        return len(self._leases)

    def task_counts(self) -> dict[str, dict[str, int]]:
        """Tasks to do, under way and done, by kind: training tasks of the epochs the job
        runs, and evaluation tasks of the rounds started so far."""
        per_epoch = self._train.count
        train_doing = sum(1 for t in self._leases if t < self._eval_base)
        train_done = sum(
            self._epochs[e].done_count if e in self._epochs else per_epoch
            for e in range(1, min(self.epochs_created, self.last_epoch) + 1)
        )
        return {
            "train": {
                "todo": self.last_epoch * per_epoch - train_done - train_doing,
                "doing": train_doing,
                "done": train_done,
            },
            "evaluate": self._evaluation.counts(len(self._leases) - train_doing),
        }

    def tasks_of(self, worker: str) -> list[Task]:
        return [self._build(task_id) for task_id in self._leases.held_by(worker)]

    def epoch_accounting(self) -> list[dict]:
        return [
            {
                "epoch": e,
                "records_trained": self.records_trained(e),
                "records_expected": self.records_per_epoch,
                "ended_at_version": self.epoch_end_versions.get(e),
            }
            for e in range(1, self.last_epoch + 1)
        ]

    # -- persistence --

    def snapshot(self) -> dict:
        """The durable state, compact and JSON-ready: epochs fully done are one number, the
        others a bit per task; per task only failures and leases."""
        return {
            "format": SNAPSHOT_FORMAT,
            "split": [self._train.count, self._evaluation.split.count],
            "epochs_created": self.epochs_created,
            "epochs": [
                {"epoch": e, "records_trained": s.records_trained, "done": pack(s.done)}
                for e, s in sorted(self._epochs.items())
            ],
            "rounds": self._evaluation.open_json(),
            "failures": [[t, list(causes)] for t, causes in sorted(self._failures.items())],
            "leases": self._leases.to_json(),
            "next_lease_id": self._leases.next_id,
            "next_round": self._evaluation.next_round,
            "next_evaluation_version": self._evaluation.next_version,
            "completed_rounds": [r.to_json() for r in self._evaluation.completed],
            "model_version": self.model_version,
            "failure": self.failure,
            "last_epoch": self.last_epoch,
            "next_round_epoch": self._evaluation.next_epoch,
            "epoch_end_versions": {str(e): v for e, v in self.epoch_end_versions.items()},
        }

    @classmethod
    def restore(
        cls,
        settings: TaskSettings,
        snapshot: dict | None,
        records: Iterable[dict],
        *,
        lease_base: int,
        clock: Callable[[], float] = time.monotonic,
        journal: Callable[[dict], None] | None = None,
    ) -> TaskManager:
        """Rebuilds a manager from ``snapshot`` (None: an empty job) and the records journaled
        after it, in order. Leases keep their worker and get a fresh deadline; new lease ids
        start at the larger of ``lease_base`` and the next id the old manager would have used.
        """
        manager = cls(settings, lease_base=lease_base, clock=clock)
        if snapshot is not None:
            manager._load(snapshot)
        for record in records:
            manager._apply(record)
        manager._leases.next_id = max(manager._leases.next_id, lease_base)
        manager._leases.refresh()
        manager._journal = journal
        return manager

    def _load(self, snapshot: dict) -> None:
        if snapshot.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(
                f"task snapshot format is {snapshot.get('format')!r}; this version reads "
                f"{SNAPSHOT_FORMAT}"
            )
        split = [self._train.count, self._evaluation.split.count]
        if snapshot["split"] != split:
            raise ValueError(
                f"the task snapshot has {snapshot['split'][0]} training and "
                f"{snapshot['split'][1]} evaluation tasks a round, the data now {split[0]} and "
                f"{split[1]}: its task ids mean other records"
            )
        self.epochs_created = snapshot["epochs_created"]
        for entry in snapshot["epochs"]:
            state = self._new_epoch(entry["epoch"])
            state.load_done(unpack(entry["done"]))
            state.records_trained = entry["records_trained"]
        self._failures = {t: list(causes) for t, causes in snapshot["failures"]}
        self._leases.load(snapshot["leases"])
        self._leases.next_id = max(self._leases.next_id, snapshot["next_lease_id"])
        self._evaluation.load(snapshot, min(self._epochs, default=self.epochs_created + 1))
        self.model_version = snapshot["model_version"]
        self.failure = snapshot["failure"]
        # Absent from snapshots taken before early stopping existed.
        self.last_epoch = snapshot.get("last_epoch", self.settings.epochs)
        ends = snapshot.get("epoch_end_versions", {})  # absent from older snapshots
        self.epoch_end_versions = {int(e): v for e, v in ends.items()}

    # -- transitions: every change of durable state, live or replayed --

    def _commit(self, record: dict) -> None:
        self._apply(record)
        if self._journal is not None:
            self._journal(record)

    def _apply(self, record: dict) -> None:
        task_id = record.get("task")
        match record["op"]:
            case "epoch":
                self._create_epoch(record["epoch"])
            case "lease":
                self._leases.add(task_id, record["worker"], record["lease"], 0, self.model_version)
            case "progress":
                self._leases.renew(task_id, record["batches"])
            case "release":
                self._leases.drop(task_id)
                self._queue_of(task_id).requeued.appendleft(task_id)
            case "fail":
                self._fail(task_id, record["cause"], record.get("front", False))
            case "done":
                self._done(task_id, record["version"], record.get("eval"))
            case "version":
                self._observe(record["version"])
            case "taken":
                del self._evaluation.completed[: record["count"]]
            case "stop":
                self._stop_after(record["epoch"])
            case op:
                raise ValueError(f"unknown task record kind {op!r} in {record}")

    def _create_epoch(self, epoch: int) -> None:
        if epoch != self.epochs_created + 1:
            raise ValueError(f"record creates epoch {epoch}, but {self.epochs_created} exist")
        self.epochs_created = epoch
        self._new_epoch(epoch)

    def _stop_after(self, epoch: int) -> None:
        for later in [e for e in self._epochs if e > epoch]:
            if self._epochs[later].done_count:
                raise ValueError(
                    f"record stops after epoch {epoch}, but epoch {later} has tasks done"
                )
            del self._epochs[later]  # its queued tasks are skipped as not todo
        self.last_epoch = epoch

    def _new_epoch(self, epoch: int) -> _Epoch:
        count = self._train.count
        state = _Epoch((epoch - 1) * count, count, _epoch_order(self.settings, epoch, count))
        self._epochs[epoch] = state
        self._train_todo.groups.append(state)
        return state

    def _fail(self, task_id: int, cause: str, front: bool) -> None:
        self._leases.drop(task_id)
        causes = self._failures.setdefault(task_id, [])
        causes.append(cause)
        limit = self.settings.max_task_retries
        if len(causes) > limit:
            if self.failure is None:
                self.failure = (
                    f"{self._build(task_id).describe()} failed {len(causes)} times, more than "
                    f"--max-task-retries={limit}: {'; '.join(causes)}"
                )
        elif front:
            self._queue_of(task_id).requeued.appendleft(task_id)
        else:
            self._queue_of(task_id).requeued.append(task_id)

    def _done(self, task_id: int, version: int, evaluation: dict | None) -> None:
        self._leases.drop(task_id)
        self._failures.pop(task_id, None)
        self.model_version = max(self.model_version, version)
        if task_id < self._eval_base:
            epoch, position = divmod(task_id, self._train.count)
            epoch += 1
            state = self._epochs[epoch]
            state.mark_done(position)
            state.records_trained += self._train.records_of(position)
            if state.all_done:
                del self._epochs[epoch]
                self.epoch_end_versions[epoch] = self.model_version
                self._evaluation.epochs_ended(
                    min(self.epochs_created, self.last_epoch), self._epochs
                )
        else:
            self._evaluation.mark_done(task_id, version, evaluation)
        # After the epoch-end round, so a version crossing a step boundary adds no second round.
        self._observe(version)

    def _observe(self, version: int) -> None:
        self.model_version = max(self.model_version, version)
        if not self._evaluation.step_passed(self.model_version):
            return
        if not self.training_done and not self._evaluation.open:
            self._evaluation.start("steps", min(self._evaluation.next_epoch, self.last_epoch))

    # -- internals --

    def _epoch_of(self, task_id: int) -> int:
        return task_id // self._train.count + 1

    def _training_out(self) -> bool:
        return any(t < self._eval_base for t in self._leases)

    def _is_todo(self, task_id: int) -> bool:
        """Neither held nor done: a queue entry failing this is stale and skipped."""
        if task_id in self._leases:
            return False
        if task_id >= self._eval_base:
            return self._evaluation.not_done(task_id)
        epoch, position = divmod(task_id, self._train.count)
        state = self._epochs.get(epoch + 1)
        return state is not None and not state.is_done(position)

    def _queue_of(self, task_id: int) -> Queue:
        return self._train_todo if task_id < self._eval_base else self._evaluation.todo

    def _build(self, task_id: int, lease_id: int | None = None) -> Task:
        if lease_id is None and task_id in self._leases:
            lease_id = self._leases[task_id].lease_id
        failures = tuple(self._failures.get(task_id, ()))
        if task_id < self._eval_base:
            epoch, position = divmod(task_id, self._train.count)
            split, kind, epoch, round_id = self._train, self.settings.task_kind, epoch + 1, None
        else:
            round_id, position = self._evaluation.locate(task_id)
            split, kind = self._evaluation.split, TaskKind.EVALUATE
            epoch = self._evaluation.open[round_id].round.epoch
        shard, start, end = split.range_of(position)
        first = split.first_index(position)
        permuted = kind is TaskKind.TRAIN and self.settings.permuted_training_tasks
        return Task(
            task_id, kind, shard, start, end, epoch, round_id, lease_id, failures, first, permuted
        )


def _training_split(settings: TaskSettings) -> Split:
    """The training shards cut into tasks; with permuted training tasks, one run of
    positions, the shards joined (the worker draws the epoch's permutation of it)."""
    shards = settings.train_shards
    if settings.permuted_training_tasks:
        shards = [("", sum(records for _, records in shards))]
    return Split(shards, settings.records_per_task)


def _epoch_order(settings: TaskSettings, epoch: int, count: int) -> array:
    """The order an epoch's training tasks go out in: a seeded shuffle of ranges of shards;
    permuted tasks in position order, since their records are already the epoch's
    permutation, and so the short task at the split's end goes last, as fit's short batch
    does (on diabetes, 40 seeds of fit's own batches with that batch anywhere in the epoch
    gave a 1.3 % worse MSE: bench/README.md, "Permuted tasks on small splits")."""
    order = list(range(count))
    if not settings.permuted_training_tasks:
        random.Random(settings.seed * 1_000_003 + epoch).shuffle(order)
    return array("l", order)


class _Epoch(Group):
    """The training tasks of one epoch, in the order they go out, and the records trained."""

    def __init__(self, base: int, size: int, order: array):
        super().__init__(base, size, order)
        self.records_trained = 0


def _cause(text: str) -> str:
    return text if len(text) <= MAX_CAUSE_CHARS else "..." + text[-(MAX_CAUSE_CHARS - 3) :]


def check_report(
    task: Task, evaluation: EvaluationResult | None, rounds: EvaluationRounds
) -> list[np.ndarray]:
    """A report's metric states as float64 arrays; raises InvalidReportError."""

    def invalid(problem: str) -> InvalidReportError:
        return InvalidReportError(f"invalid report for {task.describe()}: {problem}")

    if task.kind is not TaskKind.EVALUATE:
        if evaluation is not None:
            what = "training" if task.kind is TaskKind.TRAIN else "prediction"
            raise invalid(f"a {what} task was reported with an evaluation result")
        return []
    if evaluation is None:
        raise invalid("an evaluation task was reported without an evaluation result")
    try:
        return rounds.check(task.round, evaluation)
    except ResultError as e:
        raise invalid(str(e)) from None
