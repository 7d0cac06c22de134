"""What a job (training or prediction) writes under its ``--output``: the one place that
names those paths.
Tests: none direct; the files it names are checked by tests/e2e/test_fault_tolerance.py
(test_undisturbed_run_outputs) and tests/unit/test_ps.py (checkpoints)."""

from __future__ import annotations

from dataclasses import dataclass

from elastic_step.data import storage

MODEL_FILE = "model.keras"
SAVED_MODEL_DIR = "saved_model"


@dataclass(frozen=True)
class OutputLayout:
    """The paths (local or URIs) under one job's output directory."""

    root: str

    def _join(self, *parts: str) -> str:
        return storage.join(self.root, *parts)

    @property
    def model_file(self) -> str:
        """The trained model, ``model.keras``."""
        return self._join(MODEL_FILE)

    @property
    def saved_model(self) -> str:
        """The TF Serving export, ``saved_model/``."""
        return self._join(SAVED_MODEL_DIR)

    @property
    def model_def(self) -> str:
        """The copy of the model definition that workers, PS and ``evaluate`` load."""
        return self._join("model_def.py")

    @property
    def schema(self) -> str:
        """A copy of the training data's ``schema.json``: how ``predict`` encodes a CSV and
        the default feed reads it."""
        return self._join("schema.json")

    @property
    def predictions(self) -> str:
        """``predict``'s output: one row per input row, in input order."""
        return self._join("predictions.csv")

    @property
    def prediction_parts(self) -> str:
        """``predict``'s part of each task, merged into :attr:`predictions` at the end."""
        return self._join("prediction-parts")

    @property
    def prediction_input(self) -> str:
        """``predict``'s CSV input encoded as TFRecords with the model's schema."""
        return self._join("input")

    @property
    def status(self) -> str:
        return self._join("status.json")

    @property
    def summary(self) -> str:
        return self._join("summary.json")

    @property
    def report(self) -> str:
        """The training's HTML report (loss, metrics and workers over the run)."""
        return self._join("report.html")

    @property
    def state_dir(self) -> str:
        """The master's state store: snapshot, journal and lease."""
        return self._join("master-state")

    @property
    def legacy_state_file(self) -> str:
        """The state file of versions before the journal, which cannot be resumed."""
        return self._join("master-state.json")

    @property
    def backend_dir(self) -> str:
        """The backend's own records and the instances' logs."""
        return self._join("backend")

    @property
    def tensorboard_dir(self) -> str:
        """The master's TensorBoard event files."""
        return self._join("tensorboard")

    def best_model_weights(self, round_id: int) -> str:
        """The weights of evaluation round ``round_id``'s model, kept by ``--keep-best``."""
        return self._join("checkpoints", "best-model", f"round-{round_id:06d}.npz")

    def checkpoint_dir(self, shard: int, num_ps: int) -> str:
        """PS shard ``shard``'s checkpoints."""
        return self._join("checkpoints", f"ps-{shard}-of-{num_ps}")
