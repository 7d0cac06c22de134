"""Optimizer steps on the rows of an embedding table, with per-row state ("lazy" updates).

Keras's optimizers update a table's slots densely: one Adam step on a sparse gradient decays
the moments of every row, which costs the whole table per step. Here each row carries its own
slots, and a step reads and writes only the rows it updates, so an untouched row costs
nothing. For a row that is updated at every step the result equals Keras's dense step; a
row's Adam bias correction counts that row's own updates.

Supported: ``keras.optimizers.SGD`` (with momentum and Nesterov), ``Adam`` and ``Adagrad``,
with their hyperparameters read from the user's optimizer. Options that couple rows or
variables (weight decay, clipping, EMA, ...) are refused with the option named.
"""

from __future__ import annotations

import numpy as np

from elastic_step.model.api import UnsupportedOptimizerError

#: Options of keras.optimizers.Optimizer that a per-row step cannot honour, and their defaults.
_UNSUPPORTED_OPTIONS = {
    "weight_decay": None,
    "clipnorm": None,
    "clipvalue": None,
    "global_clipnorm": None,
    "use_ema": False,
    "gradient_accumulation_steps": None,
    "amsgrad": False,
}


def _rule_of(optimizer) -> tuple[str, dict]:
    import keras

    kind = type(optimizer)
    for name, value in _UNSUPPORTED_OPTIONS.items():
        if getattr(optimizer, name, value) not in (value, 0):
            raise UnsupportedOptimizerError(
                f"embedding tables are updated row by row, which does not support the "
                f"optimizer option {name}={getattr(optimizer, name)!r}; leave it unset"
            )
    if kind is keras.optimizers.SGD:
        return "sgd", {"momentum": float(optimizer.momentum), "nesterov": bool(optimizer.nesterov)}
    if kind is keras.optimizers.Adam:
        return "adam", {
            "beta_1": float(optimizer.beta_1),
            "beta_2": float(optimizer.beta_2),
            "epsilon": float(optimizer.epsilon),
        }
    if kind is keras.optimizers.Adagrad:
        return "adagrad", {
            "initial": float(optimizer.initial_accumulator_value),
            "epsilon": float(optimizer.epsilon),
        }
    raise UnsupportedOptimizerError(
        f"embedding tables are updated row by row with SGD, Adam or Adagrad; the model's "
        f"optimizer is {kind.__name__}"
    )


def check_optimizer(optimizer) -> None:
    """Raises :class:`UnsupportedOptimizerError` when ``optimizer`` has no per-row form."""
    _rule_of(optimizer)


class RowOptimizer:
    """The per-row form of a Keras optimizer for one table of ``rows`` x ``dim`` values.

    ``slots`` holds the state by name (``m``, ``v``, ``count`` for Adam; ``momentum`` for SGD
    with momentum; ``accumulator`` for Adagrad), one row per table row.
    """

    def __init__(self, optimizer, rows: int, dim: int, dtype: str) -> None:
        self.rule, self.params = _rule_of(optimizer)
        self.slots: dict[str, np.ndarray] = {}
        shape = (rows, dim)
        if self.rule == "adam":
            self.slots = {
                "m": np.zeros(shape, dtype),
                "v": np.zeros(shape, dtype),
                "count": np.zeros(rows, np.int64),
            }
        elif self.rule == "sgd" and self.params["momentum"]:
            self.slots = {"momentum": np.zeros(shape, dtype)}
        elif self.rule == "adagrad":
            self.slots = {"accumulator": np.full(shape, self.params["initial"], dtype)}

    def apply(self, values: np.ndarray, rows: np.ndarray, grads: np.ndarray, lr: float) -> None:
        """One step: ``values`` (the current values of table rows ``rows``, unique) are
        updated in place with their gradient rows ``grads``, and so are the rows' slots."""
        p, s = self.params, self.slots
        if self.rule == "sgd" and not p["momentum"]:
            values -= lr * grads
        elif self.rule == "sgd":
            velocity = p["momentum"] * s["momentum"][rows] - lr * grads
            s["momentum"][rows] = velocity
            values += p["momentum"] * velocity - lr * grads if p["nesterov"] else velocity
        elif self.rule == "adam":
            count = s["count"][rows] + 1
            s["count"][rows] = count
            m = s["m"][rows]
            m += (grads - m) * (1 - p["beta_1"])
            v = s["v"][rows]
            v += (np.square(grads) - v) * (1 - p["beta_2"])
            s["m"][rows], s["v"][rows] = m, v
            alpha = lr * np.sqrt(1 - p["beta_2"] ** count) / (1 - p["beta_1"] ** count)
            values -= (alpha[:, None] * m / (np.sqrt(v) + p["epsilon"])).astype(values.dtype)
        else:
            accumulator = s["accumulator"][rows] + np.square(grads)
            s["accumulator"][rows] = accumulator
            values -= lr * grads / np.sqrt(accumulator + p["epsilon"])
