"""The saving room's interface: judging evaluation rounds by one metric, for
``--early-stopping`` and ``--keep-best``.

Both read the job record's evaluations (each ``{"round", "epoch", "model_version",
"metrics": {"loss": ..., NAME: ...}}``) in the order the rounds were started, so a decision is
a function of durable state and a restarted master reaches the same one.
Tests: tests/unit/test_model_selection.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from elastic_step.errors import InputError

MODES = ("min", "max")
#: Without ``:min`` or ``:max``, a metric whose name contains one of these is better higher,
#: any other (loss, error, crossentropy, mse, ...) lower: Keras' ``mode="auto"`` rule.
HIGHER_IS_BETTER = ("acc", "auc", "precision", "recall", "f1")


def default_mode(metric: str) -> str:
    name = metric.lower()
    return "max" if any(hint in name for hint in HIGHER_IS_BETTER) else "min"


@dataclass(frozen=True, kw_only=True)
class MetricGoal:
    """A scalar evaluation metric and which way is better."""

    metric: str
    mode: str

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InputError(
                f"the mode of metric '{self.metric}' must be min or max, got '{self.mode}'"
            )

    @classmethod
    def parse(cls, text: str, flag: str = "--keep-best") -> MetricGoal:
        """``METRIC[:min|max]``."""
        metric, _, mode = text.partition(":")
        if not metric or ":" in mode:
            raise InputError(f"{flag} must be METRIC[:min|max], got '{text}'")
        if mode and mode not in MODES:
            raise InputError(f"{flag}: the mode must be min or max, got '{mode}' in '{text}'")
        return cls(metric=metric, mode=mode or default_mode(metric))

    @property
    def text(self) -> str:
        return f"{self.metric}:{self.mode}"

    def value_of(self, evaluation: dict) -> float | None:
        """The round's value of the metric; None when it has none, or a NaN or infinity (a
        round that measured nothing usable never counts as an improvement)."""
        value = evaluation.get("metrics", {}).get(self.metric)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return float(value) if math.isfinite(value) else None

    def better(self, value: float, than: float) -> bool:
        return value < than if self.mode == "min" else value > than

    def best(self, evaluations: list[dict]) -> dict | None:
        """The best round, the earliest of equals; None when no round has a value."""
        best, best_value = None, None
        for entry in sorted(evaluations, key=lambda e: e["round"]):
            value = self.value_of(entry)
            if value is not None and (best_value is None or self.better(value, best_value)):
                best, best_value = entry, value
        return best

    def check_known(self, flag: str, names: set[str]) -> None:
        """Raises InputError when the model definition reports no metric of this name."""
        if self.metric not in names:
            raise InputError(
                f"{flag} names metric '{self.metric}', but the evaluation reports only "
                f"{', '.join(sorted(names))}"
            )


@dataclass(frozen=True, kw_only=True)
class EarlyStopping:
    """Stop once ``patience`` evaluation rounds in a row have not beaten the best one."""

    goal: MetricGoal
    patience: int = 2

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise InputError(f"--early-stopping: PATIENCE must be >= 1, got {self.patience}")

    @classmethod
    def parse(cls, text: str) -> EarlyStopping:
        """``METRIC[:PATIENCE[:min|max]]``."""
        parts = text.split(":")
        if not parts[0] or len(parts) > 3:
            raise InputError(f"--early-stopping must be METRIC[:PATIENCE[:min|max]], got '{text}'")
        patience = 2
        if len(parts) > 1:
            try:
                patience = int(parts[1])
            except ValueError:
                raise InputError(
                    f"--early-stopping: PATIENCE must be an integer, got '{parts[1]}' in '{text}'"
                ) from None
        mode = parts[2] if len(parts) > 2 else default_mode(parts[0])
        if mode not in MODES:
            raise InputError(
                f"--early-stopping: the mode must be min or max, got '{mode}' in '{text}'"
            )
        return cls(goal=MetricGoal(metric=parts[0], mode=mode), patience=patience)

    @property
    def text(self) -> str:
        return f"{self.goal.metric}:{self.patience}:{self.goal.mode}"

    def decide(self, evaluations: list[dict]) -> dict | None:
        """Why training stops now, or None while it goes on. Rounds count from the first one
        with a value; a round without one (its metric failed) is not an improvement."""
        best_value, best_round, since_best = None, None, 0
        last = None
        for entry in sorted(evaluations, key=lambda e: e["round"]):
            last = entry
            value = self.goal.value_of(entry)
            if value is not None and (best_value is None or self.goal.better(value, best_value)):
                best_value, best_round, since_best = value, entry, 0
            elif best_value is not None:
                since_best += 1
        if best_round is None or since_best < self.patience:
            return None
        metric = self.goal.metric
        return {
            "reason": f"early stopping: {metric} ({self.goal.mode}) did not improve on "
            f"{best_value:.6g} (round {best_round['round']}, epoch {best_round['epoch']}) "
            f"for {since_best} evaluation rounds (patience {self.patience})",
            "metric": metric,
            "mode": self.goal.mode,
            "patience": self.patience,
            "best_round": best_round["round"],
            "best_value": best_value,
            "round": last["round"],
            "epoch": last["epoch"],
        }
