"""The job-level part of the master's state: what is neither a task nor an instance.

It holds the settings a resumed job must share, the phase, the PS addresses, the
evaluations in epoch order, what each PS restart lost, the training loss by model-version
window, why training stopped early, and which round's model ``--keep-best`` keeps. Every
change is one small journal record. The job's secret is not here: the state store keeps it
apart (see ``StateStore.job_secret``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from elastic_step.errors import InputError
from elastic_step.master.job_state.api import Phase

if TYPE_CHECKING:
    from elastic_step.master.job_state.persistence import SavedJob


def command_of(settings: dict) -> str:
    """``train`` or ``predict``: the command whose job has these fixed settings. A training
    job's do not name it (they came first, and saved ones must still match)."""
    return settings.get("the command", "train")


#: A command's job, as a message names it.
_JOB_NAMES = {"train": "a training job", "predict": "a prediction"}


def check_same_command(output: str, saved: str, command: str) -> None:
    """A job resumes only one of its own command's: the settings of a training and of a
    prediction differ in ways that say nothing (--epochs against --input)."""
    if saved != command:
        raise InputError(
            f"{output} holds {_JOB_NAMES.get(saved, f'a {saved} job')}, not "
            f"{_JOB_NAMES.get(command, f'a {command} job')}: give {command} another --output"
        )


@dataclass
class JobRecord:
    #: The settings a resumed or re-run job must share with this one (name -> value).
    settings: dict
    num_ps: int
    phase: Phase = Phase.STARTING
    error: str | None = None
    ps_addresses: list[str] = field(default_factory=list)
    #: The instance that gave each shard's address ("" when none did, or the record is
    #: older): its address cannot be changed (see Coordinator.register).
    ps_servers: list[str] = field(default_factory=list)
    #: Evaluation rounds, by round id, which is epoch order: see :meth:`add_evaluation`.
    evaluations: list[dict] = field(default_factory=list)
    #: One entry per PS restart: its shard, the job's model version when it was lost, the
    #: version it came back with, and the difference.
    ps_restores: list[dict] = field(default_factory=list)
    #: Per PS shard (as a string, for JSON): the job's model version when its instance was
    #: lost, until the replacement reports the version it came back with.
    ps_lost_at: dict[str, int] = field(default_factory=dict)
    master_restarts: int = 0
    #: The master's port, kept so that a restarted master is found where instances look.
    port: int = 0
    #: Training loss and metrics summed per window of model versions (see add_train_loss),
    #: by window index as a string (for JSON). Each metric also counts the examples it was
    #: measured on (``metric_examples``): a report without metrics (a worker or journal from
    #: before workers measured them) does not dilute the window's mean.
    train_loss: dict[str, dict] = field(default_factory=dict)
    #: Why training stopped before its last epoch (see model_selection.EarlyStopping).
    early_stop: dict | None = None
    #: The round whose model --keep-best saved: its evaluation entry, plus ``weights``.
    best_model: dict | None = None
    #: A better round whose model is still to be saved; training waits for it.
    best_pending: dict | None = None
    #: Better rounds whose model could not be saved, with why.
    best_skipped: list[dict] = field(default_factory=list)
    #: The MLflow run the job made, which a resumed job goes on logging to.
    tracking_run_id: str | None = None
    #: The local steps the job's workers run, fixed when it started: the PS's optimizer
    #: depends on them (0: a prediction, or a record from before they were kept).
    local_steps: int = 0

    def __post_init__(self) -> None:
        if not self.ps_addresses:
            self.ps_addresses = [""] * self.num_ps
        if not self.ps_servers:
            self.ps_servers = [""] * self.num_ps
        self._journal: Callable[[dict], None] = lambda record: None

    def attach(self, journal: Callable[[dict], None]) -> None:
        self._journal = journal

    # -- changes (each applies one record, live or replayed) --

    def set_phase(self, phase: Phase, error: str | None = None) -> None:
        self._change({"op": "phase", "phase": phase.value, "error": error})

    def set_ps_address(self, shard: int, address: str, instance: str = "") -> None:
        """The shard's address, given by PS ``instance`` ("" when the shard has none)."""
        if (self.ps_addresses[shard], self.ps_servers[shard]) != (address, instance):
            self._change(
                {"op": "ps_address", "shard": shard, "address": address, "instance": instance}
            )

    def add_evaluation(self, entry: dict) -> None:
        self._change({"op": "evaluation", "entry": entry})

    def note_ps_lost(self, shard: int, model_version: int) -> None:
        if str(shard) not in self.ps_lost_at:
            self._change({"op": "ps_lost", "shard": shard, "version": model_version})

    def add_ps_restore(self, entry: dict) -> None:
        self._change({"op": "ps_restore", "entry": entry})

    def set_tracking_run(self, run_id: str) -> None:
        if run_id != self.tracking_run_id:
            self._change({"op": "tracking_run", "run_id": run_id})

    def set_port(self, port: int) -> None:
        if port != self.port:
            self._change({"op": "port", "port": port})

    def count_master_restart(self) -> None:
        self._change({"op": "master_restart"})

    def add_train_loss(
        self, window: int, model_version: int, examples: int, loss_sum: float, metric_sums: dict
    ) -> None:
        """Adds one report's summed loss and metrics (each weighted by its examples).

        A window's metric is thus the example-weighted mean of its tasks' values: exactly the
        metric over the window's examples for a metric that is a mean over examples
        (accuracy, cross-entropy, MAE), an approximation of it for one that is a ratio of
        counts or a curve (precision, recall, AUC), each task's value being over its own
        examples only.
        """
        self._change(
            {
                "op": "train_loss",
                "window": window,
                "version": model_version,
                "examples": examples,
                "loss_sum": loss_sum,
                "metric_sums": metric_sums,
            }
        )

    def set_early_stop(self, entry: dict) -> None:
        self._change({"op": "early_stop", "entry": entry})

    def set_best_pending(self, entry: dict | None) -> None:
        self._change({"op": "best_pending", "entry": entry})

    def set_best_model(self, entry: dict) -> None:
        self._change({"op": "best_model", "entry": entry})

    def skip_best(self, entry: dict) -> None:
        self._change({"op": "best_skipped", "entry": entry})

    def _change(self, record: dict) -> None:
        self.apply(record)
        self._journal(record)

    def apply(self, record: dict) -> None:
        op = record["op"]
        if op == "phase":
            self.phase, self.error = Phase(record["phase"]), record["error"]
        elif op == "ps_address":
            self.ps_addresses[record["shard"]] = record["address"]
            self.ps_servers[record["shard"]] = record.get("instance", "")
        elif op == "evaluation":
            if any(e["round"] == record["entry"]["round"] for e in self.evaluations):
                return
            self.evaluations.append(record["entry"])
            # Rounds finish in the order they start (the task manager's Order), which is
            # epoch order; sorted all the same, for journals of versions where they did not.
            self.evaluations.sort(key=lambda e: e["round"])
        elif op == "ps_lost":
            self.ps_lost_at[str(record["shard"])] = record["version"]
        elif op == "ps_restore":
            self.ps_restores.append(record["entry"])
            self.ps_lost_at.pop(str(record["entry"]["shard"]), None)
        elif op == "master_restart":
            self.master_restarts += 1
        elif op == "port":
            self.port = record["port"]
        elif op == "train_loss":
            self._add_train_loss(record)
        elif op == "early_stop":
            self.early_stop = record["entry"]
        elif op == "best_pending":
            self.best_pending = record["entry"]
        elif op == "best_model":
            self.best_model, self.best_pending = record["entry"], None
        elif op == "tracking_run":
            self.tracking_run_id = record["run_id"]
        elif op == "best_skipped":
            self.best_skipped.append(record["entry"])
            self.best_pending = None
        else:
            raise ValueError(f"unknown job record op {op!r}")

    def _add_train_loss(self, record: dict) -> None:
        window = self.train_loss.setdefault(
            str(record["window"]),
            {
                "min_model_version": record["version"],
                "max_model_version": record["version"],
                "examples": 0,
                "loss_sum": 0.0,
                "metric_sums": {},
                "metric_examples": {},
            },
        )
        window["min_model_version"] = min(window["min_model_version"], record["version"])
        window["max_model_version"] = max(window["max_model_version"], record["version"])
        window["examples"] += record["examples"]
        window["loss_sum"] += record["loss_sum"]
        sums = window["metric_sums"]
        # A window restored from a snapshot taken before metrics were counted apart.
        counts = window.setdefault("metric_examples", {})
        for name, value in record["metric_sums"].items():
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + record["examples"]

    def train_loss_windows(self) -> list[dict]:
        """The mean training loss and metrics of each window, oldest first."""
        windows = []
        for key in sorted(self.train_loss, key=int):
            w = self.train_loss[key]
            n = w["examples"] or 1
            counts = w.get("metric_examples", {})
            windows.append(
                {
                    "window": int(key),
                    "min_model_version": w["min_model_version"],
                    "max_model_version": w["max_model_version"],
                    "examples": w["examples"],
                    "loss": w["loss_sum"] / n,
                    "metrics": {
                        k: v / (counts.get(k) or n) for k, v in sorted(w["metric_sums"].items())
                    },
                }
            )
        return windows

    def final_metrics(self) -> dict:
        """The metrics of the saved model: the round --keep-best kept, or else those of the
        end-of-epoch round started last, the last epoch's, which measured the final model."""
        if self.best_model is not None:
            return self.best_model["metrics"]
        ends = [e for e in self.evaluations if e["trigger"] == "epoch-end"]
        return max(ends, key=lambda e: e["round"])["metrics"] if ends else {}

    # -- persistence --

    def snapshot(self) -> dict:
        return {**asdict(self), "phase": self.phase.value}

    @classmethod
    def restore(cls, snapshot: dict, records: list[dict]) -> JobRecord:
        record = cls(**{**snapshot, "phase": Phase(snapshot["phase"])})
        for entry in records:
            record.apply(entry)
        return record

    def differing_settings(self, settings: dict) -> list[str]:
        """The names of the settings whose values differ from ``settings``."""
        keys = sorted(set(self.settings) | set(settings))
        return [k for k in keys if self.settings.get(k) != settings.get(k)]


def resumable_record(saved: SavedJob, output: str, settings: dict) -> JobRecord | None:
    """The saved job's record, after checking that a job with ``settings`` may go on with
    it; None for a new job. InputError when it is another command's, has other fixed
    settings, or failed."""
    if saved.snapshot is None:
        return None
    record = JobRecord.restore(saved.part("job"), saved.records["job"])
    check_same_command(output, command_of(record.settings), command_of(settings))
    differ = record.differing_settings(settings)
    if differ:
        state = "finished" if record.phase is Phase.SUCCEEDED else "saved"
        raise InputError(
            f"{output} holds a {state} job with other settings ({', '.join(differ)} "
            "differ); use a new --output to start a new job"
        )
    if record.phase is Phase.FAILED:
        raise InputError(
            f"{output} holds a job that failed ({record.error}); use a new --output to run it again"
        )
    return record
