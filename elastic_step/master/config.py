"""The settings of a job, validated in one place: what every job runs with, and what a
training or a prediction job computes.

Each rule's error names the flag, the value and the rule it broke.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from elastic_step.data import storage
from elastic_step.errors import InputError
from elastic_step.master.saving.api import EarlyStopping, MetricGoal
from elastic_step.master.state_store import StateStore, create_state_store
from elastic_step.master.tasks.local_steps import CHOSEN_BY_MASTER
from elastic_step.model.outer_optimizer import OUTER_OPTIMIZERS

if TYPE_CHECKING:
    from elastic_step.backends.api import Backend

#: Pod names add up to 23 characters to the job name, within Kubernetes' 63.
MAX_JOB_NAME = 40
JOB_NAME = re.compile(rf"[a-z]([-a-z0-9]{{0,{MAX_JOB_NAME - 2}}}[a-z0-9])?")

#: 0: the master chooses, from the steps of an epoch and the workers (master/tasks/local_steps.py).
DEFAULT_LOCAL_STEPS = CHOSEN_BY_MASTER

#: The settings that define what a job computes, by field and flag.
FIXED_SETTINGS = {
    "data": "--data",
    "epochs": "--epochs",
    "batch_size": "--batch-size",
    "ps": "--ps",
    "seed": "--seed",
    "records_per_task": "--records-per-task",
    "local_steps": "--local-steps",
    "outer_optimizer": "--outer-optimizer",
    # They decide which epochs run and which model is saved.
    "early_stopping": "--early-stopping",
    "keep_best": "--keep-best",
}


TLS_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """What every job of the engine runs with: where it writes, its workers and their
    limits, its backend and its timeouts. :class:`TrainConfig` and :class:`PredictConfig` add
    what their kind of job computes."""

    output: str
    batch_size: int = 64
    workers: int = 2
    min_workers: int = 1
    #: None: the same as ``workers`` (no growth).
    max_workers: int | None = None
    seed: int = 0
    backend: str = "local"
    #: 0: chosen by the master (elastic_step/master/tasks/task_size.py).
    records_per_task: int = 0
    max_restarts: int = 3
    max_task_retries: int = 3
    #: Grow by one worker when every wanted worker has run this long (up to max_workers).
    grow_after_s: float = 10.0
    #: Size the job between workers and max_workers from its own examples/s.
    auto_workers: bool = False
    #: With auto_workers: the gain an added worker must bring, in one worker's share.
    auto_workers_gain: float = 0.5
    #: Worker processes kept ready, TensorFlow loaded, to replace a dead worker at once.
    standby: int = 0
    task_timeout_s: float = 120.0
    master_timeout_s: float = 300.0
    port: int = 0
    #: Names the job's objects and state on a cluster; None: derived from ``output``.
    job_name: str | None = None
    #: A local directory for the master's state and the local backend's logs; None: see
    #: :attr:`local_dir`.
    state_dir: str | None = None
    #: Serve Prometheus metrics on this port (0: any free one); None: no endpoint.
    metrics_port: int | None = None
    #: Mutual TLS between master, PS and workers: "on", "off", or "auto" (on with pods).
    tls: str = "auto"

    def __post_init__(self) -> None:
        _at_least(
            1,
            {
                "--batch-size": self.batch_size,
                "--workers": self.workers,
                "--min-workers": self.min_workers,
            },
        )
        _at_least(
            0,
            {
                "--records-per-task": self.records_per_task,
                "--max-restarts": self.max_restarts,
                "--max-task-retries": self.max_task_retries,
                "--standby": self.standby,
                "--port": self.port,
            },
        )
        if self.tls not in TLS_CHOICES:
            raise InputError(f"--tls must be one of {', '.join(TLS_CHOICES)}, got {self.tls!r}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise InputError(f"--metrics-port must be in 0..65535, got {self.metrics_port}")
        if self.job_name is not None and not JOB_NAME.fullmatch(self.job_name):
            raise InputError(
                f"--job-name must be a DNS-1123 label of at most {MAX_JOB_NAME} characters "
                "(lower-case letters, digits and '-', starting with a letter and ending with a "
                f"letter or digit), got '{self.job_name}'"
            )
        if self.state_dir is not None and not storage.is_local(self.state_dir):
            raise InputError(
                "--state-dir must be a local directory (the master's state needs flock, fsync "
                f"and atomic rename), got '{self.state_dir}'"
            )
        if self.state_dir is not None and self.backend == "kubernetes":
            raise InputError(
                "--state-dir applies to --backend local only (on Kubernetes the master keeps "
                f"its state on the cluster), got '{self.state_dir}'"
            )
        if self.min_workers > self.workers:
            raise InputError(
                f"--min-workers ({self.min_workers}) must be <= --workers ({self.workers})"
            )
        if self.max_workers is not None and self.max_workers < self.workers:
            raise InputError(
                f"--max-workers ({self.max_workers}) must be >= --workers ({self.workers})"
            )
        if self.auto_workers and self.worker_limit == self.workers:
            raise InputError(
                f"--auto-workers needs --max-workers above --workers ({self.workers}): it "
                "sizes the job between the two"
            )
        if not 0 < self.auto_workers_gain <= 1:
            raise InputError(f"--auto-workers-gain must be in (0, 1], got {self.auto_workers_gain}")
        for flag, seconds in (
            ("--grow-after", self.grow_after_s),
            ("--task-timeout", self.task_timeout_s),
            ("--master-timeout", self.master_timeout_s),
        ):
            if seconds <= 0:
                raise InputError(f"{flag} must be > 0 seconds, got {seconds}")

    @property
    def uses_tls(self) -> bool:
        """Whether the job's traffic is mutual TLS: ``--tls``, where "auto" is on for the
        kubernetes backend (pods talk over a network others share) and off for local."""
        return self.tls == "on" or (self.tls == "auto" and self.backend == "kubernetes")

    @property
    def resolved_job_name(self) -> str:
        """``job_name``, or one derived from the output path: the same output, the same job."""
        if self.job_name is not None:
            return self.job_name
        digest = hashlib.sha256(self.output.rstrip("/").encode()).hexdigest()[:10]
        return f"es-{digest}"

    @property
    def local_dir(self) -> str:
        """The local directory that holds the master's own state (``master-state/``) and the
        local backend's records and logs (``backend/``). The state needs a POSIX file system
        (flock, fsync, atomic rename), which an object store is not: ``--state-dir``, else
        ``--output`` when it is local, else ``$XDG_STATE_HOME/elastic-step/JOB_NAME``
        (``~/.local/state/...``), which the same ``--output`` finds again."""
        if self.state_dir is not None:
            return storage.local_path(self.state_dir)
        if storage.is_local(self.output):
            return self.output
        root = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
        return os.path.join(root, "elastic-step", self.resolved_job_name)

    @property
    def worker_limit(self) -> int:
        return self.max_workers if self.max_workers is not None else self.workers


@dataclass(frozen=True, kw_only=True)
class TrainConfig(EngineConfig):
    """A training job: the model definition, the data, the epochs and the PS."""

    model_def: str
    data: str
    epochs: int = 1
    ps: int = 1
    evaluation_steps: int = 0
    checkpoint_steps: int = 200
    keep_checkpoints: int = 3
    #: Divide the PS's learning rate by a gradient's staleness (with local_steps 1 and a
    #: constant rate; see elastic_step/ps/server.py's modulates_staleness).
    staleness_modulation: bool = True
    #: Steps a worker runs on its own copy between pushes; the PS applies the change with
    #: ``outer_optimizer`` (see elastic_step/model/outer_optimizer.py). 1: push every gradient;
    #: 0: chosen by the master when the job starts (elastic_step/master/tasks/local_steps.py).
    local_steps: int = DEFAULT_LOCAL_STEPS
    outer_optimizer: str = "average"
    #: ``METRIC[:PATIENCE[:min|max]]``; kept in its full form (see :attr:`stopping`).
    early_stopping: str | None = None
    #: ``METRIC[:min|max]``; kept in its full form (see :attr:`best_goal`).
    keep_best: str | None = None
    #: Log to this MLflow tracking server (see elastic_step/master/tracking/target.py for the
    #: environment's part); None: as the environment says, else no tracking.
    mlflow_tracking_uri: str | None = None
    #: The MLflow experiment of the job's run; None: the environment's, else "elastic-step".
    mlflow_experiment: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least(
            1,
            {
                "--epochs": self.epochs,
                "--ps": self.ps,
                "--keep-checkpoints": self.keep_checkpoints,
            },
        )
        _at_least(
            0,
            {
                "--evaluation-steps": self.evaluation_steps,
                "--checkpoint-steps": self.checkpoint_steps,
                "--local-steps": self.local_steps,
            },
        )
        if self.outer_optimizer not in OUTER_OPTIMIZERS:
            raise InputError(
                f"--outer-optimizer must be one of {', '.join(OUTER_OPTIMIZERS)}, "
                f"got '{self.outer_optimizer}'"
            )
        # The full form, so that "loss" and "loss:2:min" are the same fixed setting.
        if self.early_stopping is not None:
            object.__setattr__(
                self, "early_stopping", EarlyStopping.parse(self.early_stopping).text
            )
        if self.keep_best is not None:
            object.__setattr__(self, "keep_best", MetricGoal.parse(self.keep_best).text)

    @property
    def stopping(self) -> EarlyStopping | None:
        return None if self.early_stopping is None else EarlyStopping.parse(self.early_stopping)

    @property
    def best_goal(self) -> MetricGoal | None:
        return None if self.keep_best is None else MetricGoal.parse(self.keep_best)

    def fixed_settings(self) -> dict:
        """What a resumed or re-run job must share with the saved one, by flag; elasticity
        settings may differ."""
        return {flag: getattr(self, name) for name, flag in FIXED_SETTINGS.items()}


@dataclass(frozen=True, kw_only=True)
class PredictConfig(EngineConfig):
    """A prediction job: a trained model run on an input; no PS, no epochs."""

    #: The --output of a finished training.
    model_dir: str
    #: A CSV file, or a preprocessed data directory (its ``split``).
    input: str
    split: str = "validation"
    batch_size: int = 256


def _at_least(minimum: int, values: dict[str, int]) -> None:
    for flag, value in values.items():
        if value < minimum:
            raise InputError(f"{flag} must be >= {minimum}, got {value}")


def default_store(config: EngineConfig, backend: Backend, backend_options: object) -> StateStore:
    """Where a job keeps its state: on Kubernetes on the cluster (a Lease and ConfigMaps owned
    by the run's object), so a master pod on another node finds it; elsewhere in the local
    directory of ``config.local_dir`` (--output itself when it is local)."""
    if config.backend != "kubernetes":
        return create_state_store("file", config.local_dir)
    return create_state_store(
        "kubernetes",
        config.output,
        job_name=config.resolved_job_name,
        namespace=getattr(backend_options, "namespace", None),
        owner=backend.owner(),
        kubeconfig=getattr(backend_options, "kubeconfig", None),
    )
