"""When the training master saves a model.

At the end of a job it asks for the model save, a task that a worker runs
(:mod:`.tasks.model_save`): the PS's model, or with ``--keep-best`` the best round's. During
the job, with ``--keep-best``, the master itself pulls each better round's weights while
training waits (:mod:`.saving.best_model`); a PS that is away (being relaunched) is waited for
up to ``--master-timeout``, and then that round is given up. Tests:
tests/e2e/test_watching.py (--keep-best) and tests/e2e/test_fault_tolerance.py (a PS killed
and relaunched).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from elastic_step.data import storage
from elastic_step.master.job_state.persistence import FLUSH_TIMEOUT_S
from elastic_step.master.saving.best_model import RoundModelGoneError, save_round_model
from elastic_step.rpc.ps_client import PSUnavailableError

if TYPE_CHECKING:
    from elastic_step.master.config import TrainConfig
    from elastic_step.master.job_kind import RunContext
    from elastic_step.model.api import ModelDefinition

log = logging.getLogger("elastic_step.master")

#: Seconds between two "waiting for the PS" lines.
WAIT_LOG_EVERY_S = 5.0


class ModelSaver:
    def __init__(self, definition: ModelDefinition, config: TrainConfig) -> None:
        self.definition = definition
        self.config = config
        self._best_deadline: float | None = None
        self._next_wait_log = 0.0

    def _ps_addresses(self, run: RunContext) -> list[str]:
        addresses = run.coordinator.ps_addresses()
        if not all(addresses):
            raise PSUnavailableError(addresses.index(""), "is being relaunched")
        return addresses

    def _log_wait(self, what: str, error: PSUnavailableError, now: float) -> None:
        if now >= self._next_wait_log:
            log.warning("cannot save %s yet (%s); waiting for the PS", what, error)
            self._next_wait_log = now + WAIT_LOG_EVERY_S

    def save_final(self, run: RunContext) -> bool:
        """Asks for the model save, the job's last task, which a worker runs
        (:mod:`.tasks.model_save`); True once the model is saved. With --keep-best the
        worker writes the best round's model, else the PS's."""
        coordinator = run.coordinator
        with coordinator.lock:
            asked = coordinator.model_save is not None
            best, last_epoch = coordinator.record.best_model, coordinator.tasks.last_epoch
        if not asked:
            if best is not None:
                log.info(
                    "all %d epochs trained and evaluated; a worker saves the model of round %d "
                    "(epoch %d, model v%d), the best by --keep-best %s",
                    last_epoch,
                    best["round"],
                    best["epoch"],
                    best["model_version"],
                    self.config.keep_best,
                )
            else:
                log.info(
                    "all %d epochs trained and evaluated; a worker saves the model", last_epoch
                )
        return coordinator.save_model(best["weights"] if best is not None else "")

    def save_best(self, run: RunContext, entry: dict) -> None:
        """Saves the model of ``entry``'s round (--keep-best) while training waits; gives up
        on that round after --master-timeout without every PS, or at once when the PS no
        longer hold its version."""
        coordinator, timeout_s = run.coordinator, self.config.master_timeout_s
        now = time.monotonic()
        if self._best_deadline is None:
            self._best_deadline = now + timeout_s
        path = run.paths.best_model_weights(entry["round"])
        try:
            addresses = self._ps_addresses(run)
            save_round_model(
                self.definition, addresses, run.credentials, entry, path, self.config.seed
            )
        except PSUnavailableError as e:
            if now > self._best_deadline:
                self._best_deadline = None
                coordinator.note_best_model(entry, None, f"{e} for {timeout_s:.0f} s")
            else:
                self._log_wait("the best model", e, now)
            return
        except RoundModelGoneError as e:
            self._best_deadline = None
            coordinator.note_best_model(entry, None, str(e))
            return
        self._best_deadline = None
        with coordinator.lock:
            previous = coordinator.record.best_model
        coordinator.note_best_model(entry, path)
        if previous is not None and previous["weights"] != path:
            # Only once the record names the new file durably.
            run.store.flush(FLUSH_TIMEOUT_S)
            storage.remove(previous["weights"])
