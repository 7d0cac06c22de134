"""The master's side of watching and ending training, on a real coordinator, journal and
TensorBoard writer with a fake backend and clock: training-loss windows, early stopping,
--keep-best's paused rounds, the Prometheus endpoint and the status text."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest
from fake_backend import FakeBackend, FakeClock
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing import event_accumulator

from elastic_step.backends.api import ExitReason, LaunchSpec
from elastic_step.master.instances.api import MembershipSettings
from elastic_step.master.job_state.api import CoordinatorParams, Phase
from elastic_step.master.job_state.coordinator import Coordinator, open_coordinator
from elastic_step.master.job_state.job_record import JobRecord
from elastic_step.master.job_state.persistence import SavedJob
from elastic_step.master.reporting import reports
from elastic_step.master.reporting.api import JobView
from elastic_step.master.reporting.metrics_endpoint import MetricsEndpoint
from elastic_step.master.reporting.tensorboard_events import TrainingEvents
from elastic_step.master.saving.api import EarlyStopping, MetricGoal
from elastic_step.master.state_store import FileStateStore
from elastic_step.master.tasks.api import TaskSettings
from elastic_step.rpc import master_pb2

EPOCHS = 5
#: 40 training records in tasks of 10: 4 tasks an epoch; 20 validation records: 2 a round.
TRAIN_TASKS, EVAL_TASKS = 4, 2


class Master:
    """A coordinator on a file journal, opened fresh or from what an earlier one saved."""

    def __init__(self, root: Path, clock: FakeClock, backend: FakeBackend | None = None, **judge):
        self.store = FileStateStore(str(root / "state"))
        token = self.store.acquire("test-master", timeout_s=10)
        saved = SavedJob.of(self.store.load())
        record = None
        if saved.snapshot is not None:
            record = JobRecord.restore(saved.part("job"), saved.records["job"])
        self.backend = backend or FakeBackend()
        keep_best = judge.get("keep_best")
        self.coordinator: Coordinator = open_coordinator(
            CoordinatorParams(
                tasks=TaskSettings(
                    train_shards=[("/d/train/part-0", 40)],
                    validation_shards=[("/d/validation/part-0", 20)],
                    records_per_task=10,
                    epochs=EPOCHS,
                    metric_shapes=(),
                    pause_training_while_evaluating=keep_best is not None,
                ),
                membership=MembershipSettings(
                    workers=2, min_workers=1, max_workers=2, num_ps=1, max_restarts=10
                ),
                job_settings=master_pb2.JobSettings(batch_size=8, num_ps=1),
                fixed_settings={"--epochs": EPOCHS},
                evaluate_round=lambda r: {"loss": r.loss_sum / r.example_count},
                train_loss_window=10,
                **judge,
            ),
            store=self.store,
            saved=saved,
            record=record,
            token=token,
            backend=self.backend,
            spec_for=lambda role, slot, name: LaunchSpec(name, role, slot, ["true"]),
            clock=clock,
        )
        if record is None:
            self.coordinator.set_phase(Phase.RUNNING)
            self.coordinator.tick()  # launches ps-0, worker-0 and worker-1
        else:
            self.coordinator.adopt(self.backend.list_instances())
        self.coordinator.apply_events(self.backend.next_events(0))

    def get(self, worker: str) -> master_pb2.Task:
        return self.coordinator.next_task(worker, master_pb2.NextTaskRequest(worker=worker))

    def report(
        self,
        worker: str,
        task: master_pb2.Task,
        version: int,
        loss: float = 0,
        train_metrics: dict[str, float] | None = None,
    ) -> None:
        """Reports ``task`` done; a training task measured its loss and ``train_metrics``
        when those are given."""
        request = master_pb2.TaskReport(
            task_id=task.id, lease_id=task.lease_id, ok=True, model_version=version
        )
        if task.kind == master_pb2.Task.EVALUATE:
            request.loss_sum, request.example_count = loss * 10, 10
        elif train_metrics is not None:
            request.train_loss, request.train_examples = loss, 10
            request.train_metrics.update(train_metrics)
        self.coordinator.report_task(worker, request)

    def run_epoch(self, worker: str, version: int, round_loss: float) -> int:
        """One worker trains an epoch (a version a task), then runs the epoch-end round."""
        for _ in range(TRAIN_TASKS):
            version += 1
            task = self.get(worker)
            assert task.kind == master_pb2.Task.TRAIN
            self.report(worker, task, version)
        for _ in range(EVAL_TASKS):
            task = self.get(worker)
            assert task.kind == master_pb2.Task.EVALUATE
            self.report(worker, task, version, round_loss)
        return version

    def close(self) -> None:
        self.store.flush(10)
        self.store.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


def _tensorboard(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    accumulator = event_accumulator.EventAccumulator(
        str(logdir), size_guidance={event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()
    return {
        tag: [
            (e.step, float(np.asarray(_value(e.tensor_proto)).reshape(-1)[0]))
            for e in accumulator.Tensors(tag)
        ]
        for tag in accumulator.Tags()["tensors"]
    }


def _value(proto) -> np.ndarray:
    import tensorflow as tf

    return tf.make_ndarray(proto)


def test_train_loss_windows_reach_status_summary_and_tensorboard(tmp_path, clock) -> None:
    master = Master(tmp_path, clock)
    coordinator = master.coordinator
    # Windows of 10 model versions; each report weighted by its examples.
    coordinator.note_train_loss(5, 2.0, {"accuracy": 0.5}, examples=10)
    coordinator.note_train_loss(8, 1.0, {"accuracy": 1.0}, examples=30)
    coordinator.note_train_loss(15, 0.5, {"accuracy": 0.75}, examples=10)
    expected = [
        {
            "window": 0,
            "min_model_version": 5,
            "max_model_version": 8,
            "examples": 40,
            "loss": 1.25,
            "metrics": {"accuracy": 0.875},
        },
        {
            "window": 1,
            "min_model_version": 15,
            "max_model_version": 15,
            "examples": 10,
            "loss": 0.5,
            "metrics": {"accuracy": 0.75},
        },
    ]
    with coordinator.lock:
        assert reports.training_progress(coordinator)["train_loss"] == expected
    with pytest.raises(ValueError, match="examples is 0"):
        coordinator.note_train_loss(16, 1.0, {}, examples=0)
    master.close()

    # A restarted master has the same windows (the summary reads them from the record).
    again = Master(tmp_path, clock, master.backend)
    assert again.coordinator.record.train_loss_windows() == expected
    events = TrainingEvents(str(tmp_path / "out"), str(tmp_path / "local"))
    events.write(JobView.of(again.coordinator))
    # Window 1 is still open: it is written once a later one begins, or at the end.
    assert _tensorboard(tmp_path / "out" / "tensorboard")["train/loss"] == [(8, 1.25)]
    again.run_epoch("worker-0", 15, round_loss=0.8)  # an evaluation round at v19
    events.write(JobView.of(again.coordinator), final=True)
    events.close()
    series = _tensorboard(tmp_path / "out" / "tensorboard")
    assert series["train/loss"] == [(8, 1.25), (15, 0.5)]
    assert series["train/accuracy"] == [(8, 0.875), (15, 0.75)]
    assert series["eval/loss"] == [(19, pytest.approx(0.8))]
    assert series["job/live_workers"][-1][1] == 2
    again.close()


def test_a_window_that_a_task_still_out_can_report_into_is_not_written_yet(tmp_path, clock) -> None:
    # Reports come out of version order: a task handed out at v0 can still report into
    # window 0 after window 2 has begun. TensorBoard (and MLflow) must not show window 0
    # before it, or they would show another value than summary.json.
    master = Master(tmp_path, clock)
    coordinator = master.coordinator
    slow = master.get("worker-1")
    for version in (3, 12, 25):  # windows 0, 1 and 2
        task = master.get("worker-0")
        master.report("worker-0", task, version, loss=1.0, train_metrics={})
    events = TrainingEvents(str(tmp_path / "out"), str(tmp_path / "local"))
    with coordinator.lock:
        events.write(JobView.of(coordinator))
    assert "train/loss" not in _tensorboard(tmp_path / "out" / "tensorboard")

    master.report("worker-1", slow, 9, loss=3.0, train_metrics={})  # late, into window 0
    with coordinator.lock:
        events.write(JobView.of(coordinator))
    events.close()
    # Window 0 once, with both reports; window 1; window 2, the newest, not yet.
    assert _tensorboard(tmp_path / "out" / "tensorboard")["train/loss"] == [(9, 2.0), (12, 1.0)]
    master.close()


def test_events_for_an_object_store_output_are_copied_there(tmp_path, clock, s3_env) -> None:
    from elastic_step.data import storage

    bucket = s3_env.new_bucket()
    master = Master(tmp_path, clock)
    master.run_epoch("worker-0", 0, round_loss=0.5)
    events = TrainingEvents(f"s3://{bucket}/run", str(tmp_path / "local"))
    events.write(JobView.of(master.coordinator))
    events.close()
    [key] = s3_env.keys(bucket, "run/tensorboard/")
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / key.rsplit("/", 1)[1]).write_bytes(storage.read_bytes(f"s3://{bucket}/{key}"))
    assert _tensorboard(copy)["eval/loss"] == [(TRAIN_TASKS, 0.5)]
    master.close()


def test_early_stopping_ends_after_the_epoch_under_way_and_survives_a_restart(
    tmp_path, clock
) -> None:
    stopping = EarlyStopping(goal=MetricGoal(metric="loss", mode="min"), patience=1)
    master = Master(tmp_path, clock, early_stopping=stopping)
    version = master.run_epoch("worker-0", 0, round_loss=1.0)  # round 0: the best
    version = master.run_epoch("worker-0", version, round_loss=1.5)  # round 1: worse
    tasks, record = master.coordinator.tasks, master.coordinator.record
    # Epoch 3 was created when epoch 2 ran dry, but nothing of it ran: it is dropped.
    assert tasks.epochs_created == 3 and tasks.last_epoch == 2
    assert record.early_stop["best_round"] == 0 and record.early_stop["last_epoch"] == 2
    assert "loss (min) did not improve on 1 (round 0, epoch 1)" in record.early_stop["reason"]
    assert tasks.finished
    assert [
        {k: v for k, v in e.items() if k != "ended_at_version"} for e in tasks.epoch_accounting()
    ] == [{"epoch": e, "records_trained": 40, "records_expected": 40} for e in (1, 2)]
    assert master.get("worker-1").kind == master_pb2.Task.WAIT
    master.close()

    again = Master(tmp_path, clock, master.backend, early_stopping=stopping)
    assert again.coordinator.tasks.last_epoch == 2 and again.coordinator.tasks.finished
    assert again.coordinator.record.early_stop == record.early_stop
    again.close()


def test_an_early_stop_keeps_an_epoch_already_under_way(tmp_path, clock) -> None:
    stopping = EarlyStopping(goal=MetricGoal(metric="loss", mode="min"), patience=1)
    master = Master(tmp_path, clock, early_stopping=stopping)
    version = master.run_epoch("worker-0", 0, round_loss=1.0)
    for _ in range(TRAIN_TASKS):
        version += 1
        master.report("worker-0", master.get("worker-0"), version)
    # Round 1 is open; worker-0 takes a task of epoch 3 before worker-1 finishes the round.
    first, second = master.get("worker-0"), master.get("worker-1")
    master.report("worker-0", first, version, loss=2.0)
    early = master.get("worker-0")
    assert early.kind == master_pb2.Task.TRAIN and early.epoch == 3
    master.report("worker-1", second, version, loss=2.0)  # round 1 is worse: stop
    tasks = master.coordinator.tasks
    assert tasks.last_epoch == 3 and not tasks.finished
    master.report("worker-0", early, version + 1)
    while not tasks.finished:
        master.report("worker-0", master.get("worker-0"), version + 1, loss=3.0)
    assert [e["records_trained"] for e in tasks.epoch_accounting()] == [40, 40, 40]
    master.close()


def test_keep_best_runs_each_round_alone_and_holds_training_for_the_save(tmp_path, clock) -> None:
    goal = MetricGoal(metric="loss", mode="min")
    master = Master(tmp_path, clock, keep_best=goal)
    coordinator = master.coordinator
    version = 0
    for _ in range(TRAIN_TASKS - 1):
        version += 1
        master.report("worker-0", master.get("worker-0"), version)
    last = master.get("worker-0")
    straggler = master.get("worker-1")  # a task of epoch 2, taken before epoch 1 is done
    assert straggler.epoch == 2
    master.report("worker-0", last, version + 1)  # epoch 1 done: round 0 opens
    # No evaluation task while a training task is out; no training task while the round is.
    assert master.get("worker-0").kind == master_pb2.Task.WAIT
    master.report("worker-1", straggler, version + 2)
    version += 2
    first, second = master.get("worker-0"), master.get("worker-1")
    assert [t.kind for t in (first, second)] == [master_pb2.Task.EVALUATE] * 2
    master.report("worker-0", first, version, loss=1.0)
    assert master.get("worker-0").kind == master_pb2.Task.WAIT  # the round is still open
    master.report("worker-1", second, version, loss=1.0)
    # A better round (the first): training waits until the run loop has saved its model.
    due = coordinator.best_model_due()
    assert due["round"] == 0 and due["model_version"] == due["min_model_version"] == version
    assert master.get("worker-0").kind == master_pb2.Task.WAIT
    master.close()

    # The pending save is durable: a restarted master holds training for it too.
    again = Master(tmp_path, clock, master.backend, keep_best=goal)
    coordinator = again.coordinator
    assert coordinator.best_model_due() == due
    assert again.get("worker-0").kind == master_pb2.Task.WAIT
    coordinator.note_best_model(due, "/out/checkpoints/best-model/round-000000.npz")
    assert coordinator.best_model_due() is None
    assert again.get("worker-0").kind == master_pb2.Task.TRAIN
    with coordinator.lock:
        kept = reports.kept_model(coordinator.record)
        assert coordinator.record.final_metrics() == {"loss": 1.0}
    assert (kept["round"], kept["model_version"]) == (0, version)
    again.close()


def test_a_worse_round_is_not_saved_and_a_lost_model_is_skipped(tmp_path, clock) -> None:
    master = Master(tmp_path, clock, keep_best=MetricGoal(metric="loss", mode="min"))
    coordinator = master.coordinator
    version = master.run_epoch("worker-0", 0, round_loss=1.0)
    first = coordinator.best_model_due()
    coordinator.note_best_model(first, "/w/round-0.npz")
    version = master.run_epoch("worker-0", version, round_loss=2.0)  # worse: nothing due
    assert coordinator.best_model_due() is None
    master.run_epoch("worker-0", version, round_loss=0.5)  # better, but its model is gone
    coordinator.note_best_model(coordinator.best_model_due(), None, "the PS are at v7")
    record = coordinator.record
    assert record.best_model["round"] == 0 and record.best_skipped == [
        {"round": 2, "why": "the PS are at v7"}
    ]
    assert master.get("worker-0").kind == master_pb2.Task.TRAIN
    master.close()


def test_the_metrics_endpoint_serves_the_jobs_state(tmp_path, clock) -> None:
    master = Master(tmp_path, clock)
    coordinator = master.coordinator
    master.run_epoch("worker-0", 0, round_loss=0.25)
    # Two training tasks that measured their loss and metrics, in the window of v0-v9.
    for version, loss, accuracy in ((5, 0.5, 0.75), (6, 0.3, 0.25)):
        trained = master.get("worker-1")
        master.report("worker-1", trained, version, loss, {"accuracy": accuracy})
    task = master.get("worker-1")  # one training task under way
    master.backend.end("worker-0", ExitReason.CRASHED, code=1)
    coordinator.apply_events(master.backend.next_events(0))
    coordinator.tick()  # relaunches worker-0's slot

    def view() -> JobView:
        with coordinator.lock:
            return JobView.of(coordinator)

    endpoint = MetricsEndpoint(view, "127.0.0.1", 0)
    try:
        url = f"http://{endpoint.address}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    finally:
        endpoint.close()
    samples = {
        (s.name, tuple(sorted(s.labels.values()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("elastic_step_tasks", ("done", "train"))] == TRAIN_TASKS + 2
    assert samples[("elastic_step_tasks", ("doing", "train"))] == 1
    assert samples[("elastic_step_tasks", ("todo", "train"))] == (EPOCHS - 1) * TRAIN_TASKS - 3
    assert samples[("elastic_step_tasks", ("done", "evaluate"))] == EVAL_TASKS
    assert samples[("elastic_step_instances", ("running", "worker"))] == 1
    assert samples[("elastic_step_instances", ("pending", "worker"))] == 1
    assert samples[("elastic_step_instances", ("ps", "running"))] == 1
    assert samples[("elastic_step_restarts_total", ("crashed",))] == 1
    assert samples[("elastic_step_evaluation", ("loss",))] == 0.25
    assert samples[("elastic_step_evaluation_model_version", ())] == TRAIN_TASKS
    # The tasks without a measured loss (run_epoch's) are in no window.
    assert samples[("elastic_step_train", ("loss",))] == pytest.approx(0.4)
    assert samples[("elastic_step_train", ("accuracy",))] == pytest.approx(0.5)
    assert samples[("elastic_step_train_model_version", ())] == 6
    assert task.kind == master_pb2.Task.TRAIN
    master.close()


def test_status_text_shows_elapsed_eta_and_the_latest_evaluation() -> None:
    document = {
        "phase": "running",
        "epoch": 2,
        "epochs": 5,
        "progress": {"records_trained": 20, "records_per_epoch": 40},
        "model_version": 12,
        "elapsed_s": 75.4,
        "eta_s": 3725.0,
        "latest_evaluation": {
            "round": 0,
            "epoch": 1,
            "model_version": 8,
            "metrics": {"loss": 0.5, "accuracy": 0.875},
        },
        "train_loss": [
            {
                "window": 1,
                "min_model_version": 10,
                "max_model_version": 12,
                "examples": 30,
                "loss": 0.25,
                "metrics": {"accuracy": 0.9},
            }
        ],
        "workers": [{"id": "worker-0", "pid": 11, "state": "running"}],
        "ps": [],
    }
    text = reports.format_status(document)
    assert "training: model v10-v12, 30 examples: loss=0.2500, accuracy=0.9000" in text
    assert "elapsed: 1m 15s" in text
    assert "eta:     1h 02m 05s of training" in text
    assert "latest evaluation: round 0 (epoch 1, model v8): loss=0.5000, accuracy=0.8750" in text
    before = reports.format_status(
        {**document, "eta_s": None, "latest_evaluation": None, "train_loss": []}
    )
    assert "eta:     unknown" in before and "latest evaluation: none yet" in before
    assert "training: none yet" in before
