"""The life of one job in the master's process, whatever its kind (:mod:`.job_kind`).

It takes the job's lease in the state store, creates the job or resumes it (checking that
the settings are the same), starts the gRPC server, and runs the loop that feeds backend
events and ticks to the :class:`Coordinator`. At the end its kind saves what the job made
(the model, the predictions) and the job writes the summary. SIGTERM or SIGINT, or a stop
of the run that the backend reads from the platform, stops every instance and exits
non-zero, keeping the state: the same command resumes. When the platform moves the master
instead (an eviction, a retried step), the instances stay for the next master to adopt.
Tests: every end-to-end run (tests/e2e/, tests/k8s/).
"""

from __future__ import annotations

import logging
import os
import signal
import socket

import grpc

from elastic_step.backends import BackendParams, Role, create_backend
from elastic_step.backends.api import Backend, LaunchSpec, StopKind, StopRequest
from elastic_step.data import storage
from elastic_step.errors import InputError, JobFailedError
from elastic_step.master.config import default_store
from elastic_step.master.instances.job_keys import JobKeys
from elastic_step.master.instances.launch import launch_spec
from elastic_step.master.job_kind import JobKind, RunContext
from elastic_step.master.job_reporter import JobReporter
from elastic_step.master.job_state.api import Phase
from elastic_step.master.job_state.coordinator import Coordinator, open_coordinator
from elastic_step.master.job_state.job_record import JobRecord, resumable_record
from elastic_step.master.job_state.persistence import (
    FLUSH_TIMEOUT_S,
    SavedJob,
    close_store,
)
from elastic_step.master.reporting import reports
from elastic_step.master.saving.output_owner import refuse_legacy_output
from elastic_step.master.servicer import start_master_server
from elastic_step.master.state_store import (
    StateStore,
    StateStoreError,
    StateStoreFencedError,
    StateStoreLockedError,
)
from elastic_step.master.teardown import STOP_GRACE_S, TICK_S, stop_all, wait_until_gone
from elastic_step.output_layout import OutputLayout

log = logging.getLogger("elastic_step.master")


class Job:
    """One job's life; what it computes is its ``kind``'s."""

    def __init__(
        self,
        kind: JobKind,
        *,
        backend_options: object = None,
        store: StateStore | None = None,
    ) -> None:
        self.kind = kind
        self.config = kind.config
        #: The chosen backend's own options (see ``BackendParams.options``).
        self.backend_options = backend_options
        self.output = kind.config.output
        self.paths = OutputLayout(self.output)
        #: None until run(): the default depends on the backend (see default_store).
        self.store = store
        self._stop_signal: int | None = None
        self.reporter: JobReporter | None = None  # once the coordinator exists
        self.backend: Backend | None = None
        self.coordinator: Coordinator | None = None
        self._master_address = ""
        self._keys: JobKeys | None = None  # from the job's secret, once the lease is held
        self._holder = f"{socket.gethostname()}:{os.getpid()}"  # of the lease and the output

    def _launch_spec(self, role: Role, slot: int, name: str) -> LaunchSpec:
        return launch_spec(role, slot, name, self._master_address, self._keys.instance_env(name))

    # -- the run --

    def run(self) -> int:
        """Runs the job to its end; returns the exit status (raises JobFailedError on failure)."""
        self.kind.check()  # before anything is written or started
        refuse_legacy_output(self.paths)
        storage.makedirs(self.output)
        # The backend's records and logs, like the master's state, stay on local disk.
        work_dir = storage.local_path(OutputLayout(self.config.local_dir).backend_dir)
        self.backend = create_backend(
            self.config.backend,
            BackendParams(self.config.resolved_job_name, work_dir, self.backend_options),
        )
        try:
            if self.store is None:
                self.store = default_store(self.config, self.backend, self.backend_options)
            return self._run_with_lease()
        finally:
            self.backend.close()

    def _run_with_lease(self) -> int:
        try:
            token = self.store.acquire(self._holder, timeout_s=self.store.takeover_wait_s)
        except StateStoreLockedError as e:
            raise InputError(f"another master is running the job in {self.output}: {e}") from e
        # From here to the end a signal is only noted: the loop acts on it, and one that
        # comes while the job closes down cannot cut that short.
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            status = self._run(token)
        except BaseException:
            close_store(self.store, quietly=True)  # the first error is the one to report
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        # A stopped run may have been deleted, and its state with it.
        stopped = self.coordinator is not None and self.coordinator.phase is Phase.INTERRUPTED
        close_store(self.store, quietly=stopped)
        return status

    def _run(self, token: int) -> int:
        self._keys = JobKeys(
            self.store.job_secret(), self.config.resolved_job_name, tls=self.config.uses_tls
        )
        saved = SavedJob.of(self.store.load())
        record = resumable_record(saved, self.output, self.kind.fixed_settings())
        if record is not None and record.phase is Phase.SUCCEEDED:
            log.info("the job in %s has already finished; nothing to do", self.output)
            return 0
        self.kind.claim_output(self.store.describe(), token, self._holder)
        self._build(saved, record, token)
        if record is not None:
            # Before serving: a call from an instance that is not adopted yet would be
            # refused, and the refusal would end it.
            with self.coordinator.lock:
                self.coordinator.record.count_master_restart()
                self.coordinator.adopt(self.backend.list_instances())
                place = self.kind.place(self.coordinator)
                log.info("%s", reports.resume_line(self.coordinator, self.output, place))
        self.reporter = JobReporter(
            self.coordinator,
            self.kind,
            output=self.output,
            local_dir=self.config.local_dir,
            resumed=record is not None,
        )
        server = self._serve()
        try:
            return self._supervise(resumed=record is not None)
        finally:
            server.stop(grace=1)
            self.reporter.close()

    def _build(self, saved: SavedJob, record: JobRecord | None, token: int) -> None:
        try:
            self.coordinator = open_coordinator(
                self.kind.coordinator_params(),
                store=self.store,
                saved=saved,
                record=record,
                token=token,
                backend=self.backend,
                spec_for=self._launch_spec,
            )
        except ValueError as e:  # the saved state does not fit the data as it is now
            raise InputError(f"cannot resume the job in {self.output}: {e}") from e
        self._context = RunContext(
            coordinator=self.coordinator,
            store=self.store,
            credentials=self._keys.master_credentials(),
            paths=self.paths,
        )
        self.kind.prepare_output(new=record is None)
        if record is None:
            self.store.flush(FLUSH_TIMEOUT_S)

    def _serve(self) -> grpc.Server:
        """Starts the gRPC server (and the metrics endpoint) where instances reach it."""
        host = self.backend.listen_host()  # loopback for local processes
        server, port = start_master_server(
            self.coordinator, self._keys, host, self.coordinator.record.port or self.config.port
        )
        self._master_address = self.reporter.master_address = self.backend.advertise_master(port)
        if self.config.metrics_port is not None:
            self.reporter.serve_metrics(host, self.config.metrics_port)
        return server

    def _supervise(self, resumed: bool) -> int:
        coordinator = self.coordinator
        try:
            with coordinator.lock:
                if not resumed:
                    port, backend = coordinator.record.port, self.config.backend
                    members = self.kind.members_text()
                    log.info("starting %s (master on port %d, backend %s)", members, port, backend)
                coordinator.set_phase(Phase.RUNNING)
            return self._loop()
        except StateStoreFencedError as e:
            # Another master owns the job now: it adopts the instances; touch nothing.
            log.error("%s; this master stops and leaves the job to the new one", e)
            return 1
        except StateStoreError as e:
            # Without its state the master cannot go on; a new master resumes from what was
            # saved and adopts the instances, so they are left running.
            log.error(
                "cannot keep the job's state (%s); leaving %s to the next master",
                e,
                self.kind.members,
            )
            return 1

    def _on_signal(self, signum, frame) -> None:
        self._stop_signal = signum

    def _loop(self) -> int:
        coordinator = self.coordinator
        while True:
            coordinator.apply_events(self.backend.next_events(TICK_S))
            coordinator.tick()
            if coordinator.store_failure is not None:
                raise coordinator.store_failure
            request = self.backend.stop_request()
            if self._stop_signal is not None or request is not None:
                return self._interrupt(request)
            problem = coordinator.take_refusals() and self.kind.input_problem()
            if problem:  # a worker or PS refused its input: the master says what is wrong
                coordinator.set_phase(coordinator.phase, problem)
            if coordinator.record.error:
                self._fail()
            busy = self.kind.work_due(self._context)
            if not busy and coordinator.tasks.finished and self.kind.complete(self._context):
                return self._finish()
            self.reporter.tick()

    def _interrupt(self, request: StopRequest | None) -> int:
        """Stops the run, or hands it over to the next master, as the platform asks; returns
        the exit status (128 + SIGTERM when no signal came)."""
        status = 128 + (self._stop_signal or signal.SIGTERM)
        if self._stop_signal is not None:
            name = signal.Signals(self._stop_signal).name
            request = self.backend.stop_request(signalled=True) or StopRequest(
                StopKind.STOP, f"{name} received"
            )
        if request.kind is StopKind.HANDOVER:
            # The platform moves the master: the next master adopts the instances.
            log.warning(
                "%s: leaving %s running for the next master", request.reason, self.kind.members
            )
            self.store.flush(FLUSH_TIMEOUT_S)
            self.reporter.write_status()
            return status
        log.warning(
            "the run is stopped (%s): stopping all %s; the job's state stays, "
            "and the same command resumes it",
            request.reason,
            self.kind.members,
        )
        self._end(Phase.INTERRUPTED)
        return status

    def _end(self, phase: Phase) -> None:
        """Ends the job in ``phase`` (stopped or failed): every instance deleted, the state
        flushed, the job's objects removed."""
        self.coordinator.set_phase(phase)
        stop_all(self.coordinator, self.backend, wait_s=STOP_GRACE_S + 4)
        self.store.flush(FLUSH_TIMEOUT_S)
        self.backend.remove_job_objects()
        self.reporter.write_status()

    def _fail(self) -> None:
        error = self.coordinator.record.error
        log.error("the job failed: %s", error)
        self._end(Phase.FAILED)
        self._write_summary()
        raise JobFailedError(error)

    def _finish(self) -> int:
        self.coordinator.set_phase(Phase.SUCCEEDED)
        self.store.flush(FLUSH_TIMEOUT_S)
        self._write_summary()
        # Workers and PS see the job is over at their next call and exit by themselves.
        wait_until_gone(self.coordinator, self.backend, 10)
        stop_all(self.coordinator, self.backend, wait_s=STOP_GRACE_S + 2)
        self.backend.remove_job_objects()
        self.kind.after_finish()
        self.reporter.finish()
        log.info("done: %s are in %s", self.kind.results, self.output)
        return 0

    def _write_summary(self) -> None:
        with self.coordinator.lock:
            document = self.kind.summary(self.coordinator)
        document["job_name"] = self.config.resolved_job_name  # where its state and pods are
        reports.write_json(self.paths.summary, document)
