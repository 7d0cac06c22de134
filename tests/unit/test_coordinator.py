"""The coordinator behind the master's real gRPC server and authentication, with a fake
backend and clock: who may call, fencing, malformed reports, progress timeouts, poisoned
tasks, and a master restart from the journal. No TensorFlow."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from fake_backend import FakeBackend, FakeClock

from elastic_step.backends.api import ExitReason, LaunchSpec, Role
from elastic_step.errors import InputError
from elastic_step.master.instances.api import MembershipSettings
from elastic_step.master.instances.job_keys import JobKeys
from elastic_step.master.job_state.api import CoordinatorParams, Phase
from elastic_step.master.job_state.coordinator import Coordinator, open_coordinator
from elastic_step.master.job_state.job_record import JobRecord
from elastic_step.master.job_state.persistence import SavedJob
from elastic_step.master.reporting import reports
from elastic_step.master.reporting.api import JobView
from elastic_step.master.servicer import start_master_server
from elastic_step.master.state_store import FileStateStore
from elastic_step.master.tasks.api import TaskSettings
from elastic_step.rpc import auth, master_pb2, master_pb2_grpc
from elastic_step.rpc.tensors import to_proto
from elastic_step.rpc.tokens import TOKEN_LIFETIME_S, TokenSigner

TIMEOUT_S = 10
TASK_TIMEOUT_S = 30.0


def params(standby: int = 0, local_steps: int = 1, **tasks) -> CoordinatorParams:
    return CoordinatorParams(
        tasks=TaskSettings(
            train_shards=[("/d/train/part-0", 40), ("/d/train/part-1", 40)],
            validation_shards=[("/d/validation/part-0", 20)],
            records_per_task=10,
            epochs=2,
            max_task_retries=2,
            task_timeout_s=TASK_TIMEOUT_S,
            metric_shapes=((), ()),
            **tasks,
        ),
        membership=MembershipSettings(
            workers=2,
            min_workers=1,
            max_workers=2,
            num_ps=1,
            max_restarts=10,
            backoff_s=0.0,
            standby=standby,
        ),
        job_settings=master_pb2.JobSettings(batch_size=8, num_ps=1, local_steps=local_steps),
        fixed_settings={"--epochs": 2},
        evaluate_round=lambda r: {"loss": r.loss_sum / r.example_count},
    )


def spec_for(role: Role, slot: int, name: str) -> LaunchSpec:
    return LaunchSpec(name, role, slot, ["true"])


class Master:
    """A coordinator served over gRPC with authentication, as the master runs it."""

    def __init__(
        self,
        tmp_path: Path,
        clock: FakeClock,
        backend: FakeBackend | None = None,
        *,
        standby: int = 0,
        token_lifetime_s: float = TOKEN_LIFETIME_S,
        local_steps: int = 1,
    ):
        self.store = FileStateStore(str(tmp_path / "state"))
        token = self.store.acquire("test-master", timeout_s=TIMEOUT_S)
        saved = SavedJob.of(self.store.load())
        record = None
        if saved.snapshot is not None:
            record = JobRecord.restore(saved.part("job"), saved.records["job"])
        self.backend = backend or FakeBackend()
        self.coordinator: Coordinator = open_coordinator(
            params(standby, local_steps),
            store=self.store,
            saved=saved,
            record=record,
            token=token,
            backend=self.backend,
            spec_for=spec_for,
            clock=clock,
        )
        self.secret = self.store.job_secret()
        self.keys = JobKeys(self.secret, "job", tls=False, lifetime_s=token_lifetime_s)
        self.server, port = start_master_server(self.coordinator, self.keys, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{port}"
        self.channels: list[grpc.Channel] = []

    def start_instances(self) -> None:
        self.coordinator.set_phase(Phase.RUNNING)
        self.coordinator.tick()  # launches ps-0, worker-0, worker-1
        self.pump()

    def pump(self) -> None:
        self.coordinator.apply_events(self.backend.next_events(0))

    def stub(self, name: str, secret: str | None = None) -> master_pb2_grpc.MasterStub:
        return self.stub_with(name, TokenSigner(secret or self.secret).token(name))

    def stub_with(self, name: str, token: str) -> master_pb2_grpc.MasterStub:
        credentials = auth.Credentials(name, token)
        channel = auth.authenticated_channel(self.address, credentials, server_role="master")
        self.channels.append(channel)
        return master_pb2_grpc.MasterStub(channel)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()
        self.server.stop(grace=0)
        self.store.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


@pytest.fixture
def master(tmp_path, clock):
    master = Master(tmp_path, clock)
    master.start_instances()
    yield master
    master.close()


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value.code()


def next_task(
    stub, worker: str, outcome: master_pb2.TaskReport | None = None, *, held=(), **flags
) -> master_pb2.Task:
    request = master_pb2.NextTaskRequest(worker=worker, held_leases=list(held), **flags)
    if outcome is not None:
        request.report.CopyFrom(outcome)
    return stub.NextTask(request, timeout=TIMEOUT_S)


def get_task(stub, worker: str) -> master_pb2.Task:
    """The next task of a worker that holds none."""
    return next_task(stub, worker)


def outcome_of(task: master_pb2.Task, **fields) -> master_pb2.TaskReport:
    return master_pb2.TaskReport(task_id=task.id, lease_id=task.lease_id, ok=True, **fields)


def report(stub, worker: str, task: master_pb2.Task, **fields) -> None:
    """Reports ``task`` and asks for nothing more."""
    next_task(stub, worker, outcome_of(task, **fields), report_only=True)


def evaluation_fields(metric_states: int = 2) -> dict:
    """An evaluation result: the job's metrics have two scalar states."""
    tensors = [to_proto(f"m/{i}", np.float64(1.0)) for i in range(metric_states)]
    return {"loss_sum": 2.0, "example_count": 10, "metric_states": tensors}


# -- who may call --


def test_calls_without_the_jobs_credentials_are_unauthenticated(master) -> None:
    strangers = [
        master_pb2_grpc.MasterStub(grpc.insecure_channel(master.address)),
        master.stub("worker-0", secret="not-the-job-secret"),
    ]
    calls = {
        "Register": master_pb2.RegisterRequest(name="worker-0"),
        "GetPSAddresses": master_pb2.GetPSAddressesRequest(),
        "NextTask": master_pb2.NextTaskRequest(worker="worker-0"),
        "Heartbeat": master_pb2.HeartbeatRequest(name="worker-0"),
    }
    for stub in strangers:
        codes = [
            code_of(lambda m=method, r=request, s=stub: getattr(s, m)(r, timeout=TIMEOUT_S))
            for method, request in calls.items()
        ]
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 4
    assert master.coordinator.tasks.doing_count() == 0  # nothing reached the coordinator
    assert get_task(master.stub("worker-0"), "worker-0").kind == master_pb2.Task.TRAIN


def test_register_must_match_the_slot_the_instance_was_launched_for(master) -> None:
    worker = master.stub("worker-0")
    as_ps = master_pb2.RegisterRequest(role=master_pb2.PS, name="worker-0", shard=0, address="x")
    assert code_of(lambda: worker.Register(as_ps, timeout=TIMEOUT_S)) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    ps = master.stub("ps-0")
    wrong_shard = master_pb2.RegisterRequest(role=master_pb2.PS, name="ps-0", shard=1, address="x")
    assert code_of(lambda: ps.Register(wrong_shard, timeout=TIMEOUT_S)) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    # One instance cannot act for another, nor can a name the job never launched.
    assert code_of(lambda: get_task(worker, "worker-1")) == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(lambda: get_task(master.stub("worker-9"), "worker-9")) == (
        grpc.StatusCode.PERMISSION_DENIED
    )

    right = master_pb2.RegisterRequest(role=master_pb2.PS, name="ps-0", shard=0, address="a:1")
    reply = ps.Register(right, timeout=TIMEOUT_S)
    assert reply.settings.batch_size == 8
    assert master.coordinator.ps_addresses() == ["a:1"]


def test_a_live_ps_cannot_move_its_address_not_even_after_a_master_restart(tmp_path, clock) -> None:
    master = Master(tmp_path, clock)
    master.start_instances()
    ps = master.stub("ps-0")

    def register(address: str):
        request = master_pb2.RegisterRequest(role=master_pb2.PS, name="ps-0", address=address)
        return ps.Register(request, timeout=TIMEOUT_S)

    register("127.0.0.9:5000")
    register("127.0.0.9:5000")  # again, as after a lost answer: the same address is fine
    assert code_of(lambda: register("203.0.113.7:5000")) == grpc.StatusCode.PERMISSION_DENIED
    assert master.coordinator.ps_addresses() == ["127.0.0.9:5000"]
    master.close()

    again = Master(tmp_path, clock)  # the next master: the rule comes with the state
    try:
        ps = again.stub("ps-0")
        assert code_of(lambda: register("203.0.113.7:5000")) == (grpc.StatusCode.PERMISSION_DENIED)
        assert again.coordinator.ps_addresses() == ["127.0.0.9:5000"]
    finally:
        again.close()


# -- fencing, malformed reports, progress --


def test_a_stale_report_is_ignored(master, clock) -> None:
    first, second = master.stub("worker-0"), master.stub("worker-1")
    task = get_task(first, "worker-0")
    clock.now += TASK_TIMEOUT_S + 1
    master.coordinator.tick()  # no progress: the lease is taken back
    again = get_task(second, "worker-1")
    assert (again.id, again.lease_id != task.lease_id) == (task.id, True)

    report(first, "worker-0", task)  # too late: ignored, and no error for the worker
    assert master.coordinator.tasks.records_trained(1) == 0
    report(second, "worker-1", again)
    assert master.coordinator.tasks.records_trained(1) == 10


def test_progress_keeps_a_lease_and_heartbeats_alone_do_not(master, clock) -> None:
    stub = master.stub("worker-0")
    task = get_task(stub, "worker-0")
    for batches in (1, 2, 3):
        clock.now += TASK_TIMEOUT_S - 1
        beat = master_pb2.HeartbeatRequest(
            name="worker-0", lease_id=task.lease_id, batches_done=batches
        )
        stub.Heartbeat(beat, timeout=TIMEOUT_S)
        master.coordinator.tick()
    assert master.coordinator.tasks.doing_count() == 1

    for _ in range(2):  # a stuck worker: heartbeats go on, the batch count does not move
        clock.now += TASK_TIMEOUT_S / 2 + 1
        stub.Heartbeat(beat, timeout=TIMEOUT_S)
        master.coordinator.tick()
    assert master.coordinator.tasks.doing_count() == 0
    assert get_task(master.stub("worker-1"), "worker-1").id == task.id


def test_a_malformed_report_is_invalid_argument_its_task_requeued_and_counted(master) -> None:
    stub = master.stub("worker-0")
    for _ in range(8):  # the whole first epoch
        report(stub, "worker-0", get_task(stub, "worker-0"))
    task = get_task(stub, "worker-0")
    assert task.kind == master_pb2.Task.EVALUATE

    bad = [
        {},  # an evaluation task without a result
        evaluation_fields(metric_states=1),  # one metric state where the job has two
    ]
    for fields in bad:
        assert code_of(lambda f=fields, t=task: report(stub, "worker-0", t, **f)) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        again = get_task(stub, "worker-0")
        assert again.id == task.id and again.lease_id != task.lease_id
        task = again
    report(stub, "worker-0", task, **evaluation_fields())
    assert master.coordinator.tasks.doing_count() == 0
    assert master.coordinator.tasks.failure is None

    # Each malformed report is a failure of its task: past --max-task-retries=2 (these
    # settings) a worker that only sends broken reports ends the job instead of looping.
    task = get_task(stub, "worker-0")
    for _ in range(3):
        fields = {**evaluation_fields(), "example_count": -10}
        assert code_of(lambda f=fields, t=task: report(stub, "worker-0", t, **f)) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        task = get_task(stub, "worker-0") if master.coordinator.tasks.failure is None else task
    assert "failed 3 times, more than --max-task-retries=2" in master.coordinator.tasks.failure


# -- poisoned tasks --


def test_workers_that_die_holding_a_task_fail_it_then_the_job(master) -> None:
    coordinator, backend = master.coordinator, master.backend
    task_id = None
    for _ in range(3):
        worker = next(i.name for i in coordinator.instances.live(Role.WORKER))
        task = get_task(master.stub(worker), worker)
        task_id = task_id if task_id is not None else task.id
        assert task.id == task_id  # a task taken back by a death is next in line
        backend.end(worker, ExitReason.CRASHED, -9, "killed by SIGKILL")
        master.pump()
        coordinator.tick()
        master.pump()

    error = coordinator.record.error
    assert error is not None
    assert f"task {task_id}" in error and "failed 3 times, more than --max-task-retries=2" in error
    assert error.count("killed by SIGKILL") == 3


def test_a_deleted_or_preempted_worker_does_not_fail_its_task(master) -> None:
    coordinator, backend = master.coordinator, master.backend
    for reason in [ExitReason.PREEMPTED, ExitReason.DELETED, ExitReason.EVICTED] * 2:
        worker = next(i.name for i in coordinator.instances.live(Role.WORKER))
        get_task(master.stub(worker), worker)
        backend.end(worker, reason, None, reason.value)
        master.pump()
        coordinator.tick()
        master.pump()
    assert coordinator.record.error is None
    assert coordinator.instances.restarts_by_reason == {
        "preempted": 2,
        "deleted": 2,
        "evicted": 2,
    }


# -- the model save --


def run_every_task(master) -> None:
    """Trains and evaluates the whole job through worker-0."""
    stub = master.stub("worker-0")
    while (task := get_task(stub, "worker-0")).kind != master_pb2.Task.WAIT:
        fields = evaluation_fields() if task.kind == master_pb2.Task.EVALUATE else {}
        report(stub, "worker-0", task, **fields)
    assert master.coordinator.tasks.finished


def save_beat(stub, worker: str, task: master_pb2.Task, steps: int) -> None:
    beat = master_pb2.HeartbeatRequest(name=worker, lease_id=task.lease_id, batches_done=steps)
    stub.Heartbeat(beat, timeout=TIMEOUT_S)


def test_the_model_save_goes_to_one_worker_once_every_task_is_done(master, clock) -> None:
    coordinator = master.coordinator
    first, second = master.stub("worker-0"), master.stub("worker-1")
    assert get_task(first, "worker-0").kind == master_pb2.Task.TRAIN
    run_every_task(master)
    assert get_task(second, "worker-1").kind == master_pb2.Task.WAIT  # not asked for yet

    assert coordinator.save_model("") is False
    save = get_task(first, "worker-0")
    assert (save.kind, save.id, save.weights) == (master_pb2.Task.SAVE_MODEL, -1, "")
    assert get_task(second, "worker-1").kind == master_pb2.Task.WAIT  # one worker saves
    # Asking again while it saves (holding the save's lease) keeps it.
    assert next_task(first, "worker-0", held=[save.lease_id]).kind == master_pb2.Task.WAIT
    assert coordinator.model_save.holder() == "worker-0"

    for steps in (1, 2):  # progress keeps the lease past the task timeout
        clock.now += TASK_TIMEOUT_S - 1
        save_beat(first, "worker-0", save, steps)
        coordinator.tick()
    assert coordinator.model_save.holder() == "worker-0"
    clock.now += TASK_TIMEOUT_S + 1  # then none: the save goes to the next worker that asks
    coordinator.tick()
    again = get_task(second, "worker-1")
    assert again.kind == master_pb2.Task.SAVE_MODEL and again.lease_id != save.lease_id

    report(first, "worker-0", save)  # too late: ignored
    assert coordinator.save_model("") is False
    report(second, "worker-1", again)
    assert coordinator.save_model("") is True
    assert coordinator.model_save.failures == [] and coordinator.record.error is None
    assert get_task(first, "worker-0").kind == master_pb2.Task.WAIT  # saved: nothing more


def test_failed_saves_go_to_the_next_worker_then_fail_the_job(master) -> None:
    coordinator, backend = master.coordinator, master.backend
    run_every_task(master)
    coordinator.save_model("/out/checkpoints/best-model/round-000002.npz")
    # A worker that dies holding the save fails it; so does an error it reports.
    save = get_task(master.stub("worker-1"), "worker-1")
    assert save.weights == "/out/checkpoints/best-model/round-000002.npz"
    backend.end("worker-1", ExitReason.CRASHED, -9, "killed by SIGKILL")
    master.pump()
    for _ in range(2):
        save = get_task(master.stub("worker-0"), "worker-0")
        assert save.kind == master_pb2.Task.SAVE_MODEL
        failed = master_pb2.TaskReport(
            task_id=save.id,
            lease_id=save.lease_id,
            error="saving the model failed: OSError: disk full",
        )
        next_task(master.stub("worker-0"), "worker-0", failed, report_only=True)
        coordinator.tick()
    error = coordinator.record.error
    assert error is not None and "cannot save the model: 3 tries failed" in error, error
    assert "OSError: disk full" in error
    assert "killed by SIGKILL" in coordinator.model_save.failures[0]
    assert coordinator.save_model("") is False


# -- a master restart --


def test_a_restarted_master_resumes_from_the_journal(tmp_path, clock) -> None:
    first = Master(tmp_path, clock)
    first.start_instances()
    stub = first.stub("worker-0")
    for _ in range(5):
        report(stub, "worker-0", get_task(stub, "worker-0"))
    held = get_task(stub, "worker-0")  # worker-0 is adopted with this task in hand
    prefetched = next_task(stub, "worker-0", held=[held.lease_id])  # and the next one
    other = get_task(first.stub("worker-1"), "worker-1")
    before = first.coordinator.tasks.snapshot()
    first.store.flush(TIMEOUT_S)
    first.server.stop(grace=0)
    first.store.close()  # the first master is gone; the live instances stay

    backend = first.backend
    backend.live.pop("worker-1")  # died while no master watched, its task in hand
    second = Master(tmp_path, clock, backend)
    try:
        coordinator = second.coordinator
        assert second.secret == first.secret
        assert coordinator.tasks.records_trained(1) == 50
        assert coordinator.tasks.snapshot()["leases"] == before["leases"]
        coordinator.adopt(backend.list_instances())
        # worker-1 was not adopted: its task is back in the queue at once.
        assert [t.id for t in coordinator.tasks.tasks_of("worker-1")] == []
        assert [t.id for t in coordinator.tasks.tasks_of("worker-0")] == [held.id, prefetched.id]
        # The adopted worker's report counts, and its prefetched task stays its own.
        stub = second.stub("worker-0")
        after = next_task(stub, "worker-0", outcome_of(held), held=[prefetched.lease_id])
        assert coordinator.tasks.records_trained(1) == 60
        assert after.id == other.id
        next_task(stub, "worker-0", outcome_of(prefetched), held=[after.lease_id])
        report(stub, "worker-0", after)
        assert coordinator.tasks.records_trained(1) == 80
    finally:
        second.close()


def test_a_restarted_master_keeps_the_local_steps_the_job_started_with(tmp_path, clock) -> None:
    """The master chooses the local steps from the workers it starts with; a master restarted
    with other --workers would choose others, but the PS's optimizer depends on them."""
    first = Master(tmp_path, clock, local_steps=4)
    first.start_instances()
    first.store.flush(TIMEOUT_S)
    first.close()
    second = Master(tmp_path, clock, first.backend, local_steps=1)
    try:
        second.coordinator.adopt(first.backend.list_instances())
        assert second.coordinator.record.local_steps == 4
        request = master_pb2.RegisterRequest(role=master_pb2.PS, name="ps-0", address="x:1")
        registered = second.stub("ps-0").Register(request, timeout=TIMEOUT_S)
        assert registered.settings.local_steps == 4
    finally:
        second.close()


def test_a_heartbeat_renews_a_token_past_half_its_life(tmp_path, clock) -> None:
    """Over the real server: the answer to a heartbeat carries a fresh token once the caller's
    is past half its life; the caller goes on with it after the first has expired."""
    master = Master(tmp_path, clock, token_lifetime_s=4)
    try:
        master.start_instances()
        credentials = auth.Credentials("worker-0", master.keys.signer.token("worker-0"))
        first = credentials.token
        channel = auth.authenticated_channel(master.address, credentials, server_role="master")
        master.channels.append(channel)
        stub = master_pb2_grpc.MasterStub(channel)
        request = master_pb2.HeartbeatRequest(name="worker-0")
        assert stub.Heartbeat(request, timeout=TIMEOUT_S).token == ""  # young: kept
        time.sleep(2.2)
        fresh = stub.Heartbeat(request, timeout=TIMEOUT_S).token
        assert fresh and fresh != first
        credentials.renew(fresh)
        time.sleep(2.0)  # the first token has expired now
        stub.Heartbeat(request, timeout=TIMEOUT_S)  # served, with the fresh one
        expired = master.stub_with("worker-0", first)
        assert code_of(lambda: expired.Heartbeat(request, timeout=5)) == (
            grpc.StatusCode.UNAUTHENTICATED
        )
    finally:
        master.close()


# -- a PS lost before its first checkpoint --


def beat(master: Master, name: str, version: int) -> None:
    request = master_pb2.HeartbeatRequest(name=name, model_version=version)
    master.stub(name).Heartbeat(request, timeout=TIMEOUT_S)


def lose(master: Master, name: str) -> None:
    master.backend.end(name, ExitReason.CRASHED, -9, "killed by SIGKILL")
    master.pump()
    master.coordinator.tick()  # relaunches it
    master.pump()


def live_name(master: Master, role: Role) -> str:
    [name] = [i.name for i in master.coordinator.instances.live(role)]
    return name


def test_a_ps_lost_before_a_checkpoint_fails_the_job_once_no_worker_holds_a_copy(
    master, clock
) -> None:
    coordinator = master.coordinator
    clock.now += 5  # the master has heard from everyone
    for name in ("ps-0", "worker-0", "worker-1"):
        beat(master, name, 7)
    lose(master, "ps-0")
    lose(master, "worker-0")
    ps = live_name(master, Role.PS)
    beat(master, ps, 0)  # it restored no checkpoint
    coordinator.tick()
    assert coordinator.record.error is None  # worker-1 holds a copy and will refill it

    lose(master, "worker-1")
    assert coordinator.record.error is None  # the PS's report may predate a refill
    clock.now += 2
    beat(master, ps, 0)
    coordinator.tick()
    error = coordinator.record.error
    assert error is not None
    assert "PS shard 0 was lost at model v7 before it wrote a checkpoint" in error
    assert "no live worker holds a copy" in error


def test_a_failure_a_ps_reports_ends_the_job_with_its_reason_once(master, clock) -> None:
    coordinator = master.coordinator
    beat(master, "ps-0", 3)
    assert coordinator.record.error is None
    failure = "cannot write a checkpoint in /out/checkpoints/ps-0-of-1: no space left on device"
    request = master_pb2.HeartbeatRequest(name="ps-0", model_version=4, failure=failure)
    master.stub("ps-0").Heartbeat(request, timeout=TIMEOUT_S)
    assert coordinator.record.error == f"ps-0: {failure}"
    request.failure = "something later"  # the first reason is the one the job ends with
    master.stub("ps-0").Heartbeat(request, timeout=TIMEOUT_S)
    assert coordinator.record.error == f"ps-0: {failure}"


def test_a_ps_refilled_by_a_worker_holding_a_copy_is_restored(master, clock) -> None:
    coordinator = master.coordinator
    clock.now += 5
    for name in ("ps-0", "worker-0", "worker-1"):
        beat(master, name, 7)
    lose(master, "ps-0")
    ps = live_name(master, Role.PS)
    beat(master, ps, 0)
    beat(master, ps, 7)  # worker-0 or worker-1 filled it
    lose(master, "worker-0")
    lose(master, "worker-1")
    beat(master, ps, 7)
    coordinator.tick()
    assert coordinator.record.error is None
    assert coordinator.record.ps_restores[0]["versions_lost"] == 0


def test_a_restarted_master_waits_to_hear_from_the_workers_before_judging(master, clock) -> None:
    coordinator = master.coordinator  # started at this clock: it has heard from no one
    lose(master, "ps-0")
    coordinator.tasks.observe_model_version(7)
    coordinator.record.ps_lost_at["0"] = 7
    ps = live_name(master, Role.PS)
    beat(master, ps, 0)
    coordinator.tick()
    assert coordinator.record.error is None  # too soon: a worker may hold a copy
    beat(master, "worker-1", 7)
    clock.now += 5
    beat(master, ps, 0)
    coordinator.tick()
    assert coordinator.record.error is None  # worker-1 holds one


# -- one call per task, the next one prefetched --


def test_a_worker_reports_and_gets_its_next_task_in_one_call_while_it_trains(master) -> None:
    tasks, stub = master.coordinator.tasks, master.stub("worker-0")
    first = get_task(stub, "worker-0")
    second = next_task(stub, "worker-0", held=[first.lease_id])  # asked while first trains
    third = next_task(stub, "worker-0", outcome_of(first), held=[second.lease_id])
    assert [t.id for t in tasks.tasks_of("worker-0")] == [second.id, third.id]
    assert tasks.records_trained(1) == 10

    # An answer lost on the way: the worker asks again holding only what it trains, and the
    # lost hand-out goes back to the queue, to be handed out again under a new lease.
    again = next_task(stub, "worker-0", outcome_of(second), held=[third.lease_id])
    assert again.id != third.id
    retry = next_task(stub, "worker-0", held=[third.lease_id])
    assert (retry.id, retry.lease_id != again.lease_id) == (again.id, True)
    next_task(stub, "worker-0", outcome_of(third), held=[retry.lease_id], report_only=True)
    assert tasks.records_trained(1) == 30
    # The lost hand-out's lease is fenced off: a report on it is ignored.
    next_task(stub, "worker-0", outcome_of(again), held=[retry.lease_id], report_only=True)
    assert tasks.records_trained(1) == 30
    report(stub, "worker-0", retry)
    assert tasks.records_trained(1) == 40 and tasks.doing_count() == 0

    too_many = master_pb2.NextTaskRequest(worker="worker-0", held_leases=[1, 2])
    assert code_of(lambda: stub.NextTask(too_many, timeout=TIMEOUT_S)) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )


def test_a_worker_that_dies_fails_the_task_it_ran_and_the_one_it_prefetched(master) -> None:
    """The prefetched task's records were already in the worker's pipeline, going through the
    model's code: either task may have killed it. Both are next out again, in their order."""
    coordinator, stub = master.coordinator, master.stub("worker-0")
    running = get_task(stub, "worker-0")
    prefetched = next_task(stub, "worker-0", held=[running.lease_id])
    master.backend.end("worker-0", ExitReason.CRASHED, -9, "killed by SIGKILL")
    master.pump()
    assert coordinator.tasks.task(running.id).failures != ()
    assert coordinator.tasks.task(prefetched.id).failures != ()
    assert coordinator.tasks.doing_count() == 0
    again = get_task(master.stub("worker-1"), "worker-1")
    assert again.id == running.id


def test_progress_on_the_task_in_hand_keeps_the_prefetched_lease(master, clock) -> None:
    coordinator, stub = master.coordinator, master.stub("worker-0")
    running = get_task(stub, "worker-0")
    prefetched = next_task(stub, "worker-0", held=[running.lease_id])
    for batches in (1, 2, 3):
        clock.now += TASK_TIMEOUT_S - 1
        beat = master_pb2.HeartbeatRequest(
            name="worker-0", lease_id=running.lease_id, batches_done=batches
        )
        stub.Heartbeat(beat, timeout=TIMEOUT_S)
        coordinator.tick()
    assert [t.id for t in coordinator.tasks.tasks_of("worker-0")] == [running.id, prefetched.id]


# -- standbys --


def status_of(coordinator: Coordinator) -> dict:
    return reports.status(coordinator, "master:1", None, kind="train", progress={})


def test_a_standby_waits_until_a_worker_dies_then_trains_in_its_slot(tmp_path, clock) -> None:
    master = Master(tmp_path, clock, standby=1)
    try:
        master.start_instances()
        coordinator, stub = master.coordinator, master.stub("standby-0")

        def register(waiting: bool) -> master_pb2.RegisterResponse:
            request = master_pb2.RegisterRequest(
                role=master_pb2.WORKER, name="standby-0", waiting_for_slot=waiting
            )
            return stub.Register(request, timeout=TIMEOUT_S)

        with coordinator.lock:  # as the metrics endpoint and status.json show it
            assert JobView.of(coordinator).instances["standby"] == {"pending": 0, "running": 1}
            assert [m["id"] for m in status_of(coordinator)["standby"]] == ["standby-0"]
        assert register(waiting=False).standby  # still loading: not to be given a slot
        assert get_task(stub, "standby-0").kind == master_pb2.Task.WAIT
        lose(master, "worker-0")
        assert "worker-2" in master.backend.names()  # a new launch: no standby was ready

        assert register(waiting=True).standby
        lose(master, "worker-1")
        assert not register(waiting=True).standby  # promoted: now a worker
        assert "worker-3" not in master.backend.names()
        task = get_task(stub, "standby-0")
        assert task.kind == master_pb2.Task.TRAIN
        master.coordinator.tick()
        assert master.backend.names()[-1] == "standby-1"
        assert coordinator.instances.promotions == 1
    finally:
        master.close()


# -- a damaged saved state --


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"c": "tasks", "r": {"op": "lease", "task": 0}}, "its saved state is damaged"),
        ({"c": "tasks", "r": {"op": "done", "task": "x", "version": None}}, "is damaged"),
        (
            {"c": "chef", "r": {}},
            "after the snapshot is not a record of job, tasks, instances (KeyError: 'chef')",
        ),
        ({"r": {}}, "is not a record of job, tasks, instances"),
    ],
    ids=["a field missing", "fields mistyped", "no such component", "no component"],
)
def test_a_journal_record_that_does_not_read_is_one_clear_error(
    tmp_path, clock, bad: dict, says: str
) -> None:
    first = Master(tmp_path, clock)
    first.start_instances()
    first.store.append(bad)
    first.close()
    with pytest.raises((InputError, ValueError)) as raised:
        Master(tmp_path, clock)
    message = str(raised.value)
    assert says in message and "\n" not in message
    assert "move the state aside to start the job anew" in message
