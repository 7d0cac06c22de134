"""Optimizer steps on the rows of an embedding table, with per-row state ("lazy" updates) that
catch up with what Keras's dense step would have done.

Keras's optimizers update a table's slots densely: one Adam step on a sparse gradient decays
the moments of every row and moves every row that still has momentum, which costs the whole
table per step. Here each row carries its own slots and the step of its last update, and a
step reads and writes only the rows it updates, so an untouched row costs nothing.

What the dense step does to a row between two of its gradients is known in closed form: its
momentum decays, and it keeps moving by that momentum (Adam: about ten steps' worth after one
gradient; a rare row moves ~30x further on its momentum than on the step itself). Skipping
that made a lazy Adam 2 points worse than ``model.fit`` on bench/quality.py's wide-and-deep
data. So a row catches up the steps it missed:

- when it is updated (:meth:`RowOptimizer.apply`), before its new gradient, as the dense steps
  with a zero gradient would have moved it; Adam's bias correction counts the table's steps,
  as Keras's does;
- when it is read (:meth:`RowOptimizer.caught_up`), without changing the state: the PS serves
  every row as the dense steps so far would have left it;
- when a worker's window of local steps ends (:meth:`RowOptimizer.flush`): the momentum the
  window's rows still hold is applied to them at once, as all the dense steps to come would
  (the worker's copy is replaced by the PS's after the window, and its momentum with it).

So a row behaves as under Keras's dense step, to float rounding: exactly for SGD with
momentum, and for Adam up to the last 0.1 % of a tail of over :data:`EXACT_TAIL` missed steps,
which takes the learning rate's bias correction of the current step.

Supported: ``keras.optimizers.SGD`` (with momentum and Nesterov), ``Adam`` and ``Adagrad``,
with their hyperparameters read from the user's optimizer. Options that couple rows or
variables (weight decay, clipping, EMA, ...) are refused with the option named.
Tests: tests/unit/test_row_optimizer.py.
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


#: Missed steps whose Adam tail is summed term by term; beyond, in closed form (the terms left
#: are below 0.1 % of the first, for Keras's default betas).
EXACT_TAIL = 64
#: Rows caught up at a time when read (the whole table, for a saved model): 8 MB of terms.
READ_BLOCK_ROWS = 16_384


class RowOptimizer:
    """The per-row form of a Keras optimizer for one table of ``rows`` x ``dim`` values.

    ``slots`` holds the state by name (``m``, ``v`` for Adam; ``momentum`` for SGD with
    momentum; ``accumulator`` for Adagrad), one row per table row, and for Adam and momentum
    ``last``: the step of the row's last update (0: never). ``step`` is the optimizer's step
    count, which the caller keeps (the PS: its pushes; a worker: its local steps).
    """

    def __init__(self, optimizer, rows: int, dim: int, dtype: str) -> None:
        self.rule, self.params = _rule_of(optimizer)
        self.slots: dict[str, np.ndarray] = {}
        shape = (rows, dim)
        if self.rule == "adam":
            self.slots = {
                "m": np.zeros(shape, dtype),
                "v": np.zeros(shape, dtype),
                "last": np.zeros(rows, np.int64),
            }
        elif self.rule == "sgd" and self.params["momentum"]:
            self.slots = {"momentum": np.zeros(shape, dtype), "last": np.zeros(rows, np.int64)}
        elif self.rule == "adagrad":
            self.slots = {"accumulator": np.full(shape, self.params["initial"], dtype)}

    def take_rows(self, rows: np.ndarray) -> RowOptimizer:
        """A RowOptimizer whose row ``i`` starts as this one's row ``rows[i]`` (its state
        copied): a worker's window steps on few rows of large tables, and a compact state
        keeps the per-step reads and writes of slots in cache."""
        part = object.__new__(RowOptimizer)
        part.rule, part.params = self.rule, self.params
        part.slots = {name: slot[rows] for name, slot in self.slots.items()}
        return part

    def put_rows(self, rows: np.ndarray, part: RowOptimizer) -> None:
        """Rows ``rows`` take the state of ``part`` (as made by :meth:`take_rows`)."""
        for name, slot in self.slots.items():
            slot[rows] = part.slots[name]

    @property
    def has_momentum(self) -> bool:
        """Whether rows keep moving after their gradient (what catching up is for)."""
        return "last" in self.slots

    def apply(
        self, values: np.ndarray, rows: np.ndarray, grads: np.ndarray, lr: float, step: int
    ) -> None:
        """Step ``step``: ``values`` (the current values of table rows ``rows``, unique) catch
        up the steps they missed, then are updated in place with their gradient rows
        ``grads``, and so are the rows' slots."""
        p, s = self.params, self.slots
        if self.has_momentum:
            self._catch_up(values, rows, step - 1, lr)
            s["last"][rows] = step
        if self.rule == "sgd" and not p["momentum"]:
            values -= lr * grads
        elif self.rule == "sgd":
            velocity = p["momentum"] * s["momentum"][rows] - lr * grads
            s["momentum"][rows] = velocity
            values += p["momentum"] * velocity - lr * grads if p["nesterov"] else velocity
        elif self.rule == "adam":
            m = s["m"][rows]
            m += (grads - m) * (1 - p["beta_1"])
            v = s["v"][rows]
            v += (np.square(grads) - v) * (1 - p["beta_2"])
            s["m"][rows], s["v"][rows] = m, v
            values -= (self._alpha(lr, step) * m / (np.sqrt(v) + p["epsilon"])).astype(values.dtype)
        else:
            accumulator = s["accumulator"][rows] + np.square(grads)
            s["accumulator"][rows] = accumulator
            values -= lr * grads / np.sqrt(accumulator + p["epsilon"])

    def caught_up(self, values: np.ndarray, rows: np.ndarray, step: int, lr: float) -> np.ndarray:
        """``values`` of rows ``rows`` as the dense steps up to ``step`` would have left them
        (a new array; the state is unchanged)."""
        if not self.has_momentum:
            return values
        missed = self._missed(rows, step)
        if not missed.any():
            return values
        moved = np.array(values)
        # In blocks: Adam's tail takes EXACT_TAIL floats a row, and a saved model reads all.
        for start in range(0, len(rows), READ_BLOCK_ROWS):
            block = slice(start, start + READ_BLOCK_ROWS)
            tail = self._tail(rows[block], step - missed[block], missed[block], lr)
            moved[block] += tail.astype(values.dtype)
        return moved

    def flush(self, values: np.ndarray, rows: np.ndarray | slice, step: int, lr: float) -> None:
        """After step ``step``: ``values`` of rows ``rows`` (updated in place) move at once by
        all their momentum would still move them, and the momentum is spent. ``rows`` may be
        ``slice(None)``, every row: a worker's window state (:meth:`take_rows`) is flushed
        whole, and a slice reads and writes the slots in place."""
        if not self.has_momentum:
            return
        self._catch_up(values, rows, step, lr)
        values += self._tail(rows, np.full(len(values), step), None, lr).astype(values.dtype)
        self.slots["m" if self.rule == "adam" else "momentum"][rows] = 0

    # -- catching up --

    def _missed(self, rows: np.ndarray, step: int) -> np.ndarray:
        """Steps after each row's last update up to ``step`` (0 for a row never updated: it
        has no momentum)."""
        last = self.slots["last"][rows]
        return np.where(last > 0, np.maximum(step - last, 0), 0)

    def _catch_up(self, values: np.ndarray, rows: np.ndarray, step: int, lr: float) -> None:
        """Moves ``values`` and decays the rows' slots through the steps they missed up to
        ``step``; their ``last`` becomes ``step``."""
        missed = self._missed(rows, step)
        if not missed.any():
            return
        values += self._tail(rows, step - missed, missed, lr).astype(values.dtype)
        p, s = self.params, self.slots
        if self.rule == "adam":
            s["m"][rows] *= (p["beta_1"] ** missed)[:, None].astype(s["m"].dtype)
            s["v"][rows] *= (p["beta_2"] ** missed)[:, None].astype(s["v"].dtype)
        else:
            s["momentum"][rows] *= (p["momentum"] ** missed)[:, None].astype(s["momentum"].dtype)
        s["last"][rows] = np.where(s["last"][rows] > 0, step, 0)

    def _tail(
        self, rows: np.ndarray, last: np.ndarray, missed: np.ndarray | None, lr: float
    ) -> np.ndarray:
        """How far the dense steps with a zero gradient move each row over the ``missed``
        steps after its step ``last`` (None: all the steps to come), from its slots now."""
        s = self.slots
        if self.rule == "adam":
            return self._adam_tail(s["m"][rows], s["v"][rows], last, missed, lr)
        return self._momentum_sum(s["momentum"][rows], missed)

    def _momentum_sum(self, velocity: np.ndarray, missed: np.ndarray | None) -> np.ndarray:
        """SGD's move over ``missed`` steps with no gradient (None: all to come): the velocity
        decays by mu a step and is added (Nesterov: mu times the new velocity)."""
        mu = self.params["momentum"]
        power = 0.0 if missed is None else (mu**missed)[:, None]
        total = mu * (1 - power) / (1 - mu)
        if self.params["nesterov"]:
            total = total * mu
        return velocity * total

    def _adam_tail(
        self, m: np.ndarray, v: np.ndarray, last: np.ndarray, missed: np.ndarray | None, lr: float
    ) -> np.ndarray:
        """Adam's move over the ``missed`` steps after step ``last`` (per row) with no gradient
        (None: all to come): at step last + k the moments are m * b1**k and v * b2**k, and the
        row moves by -alpha(last + k) * m * b1**k / (sqrt(v * b2**k) + eps). The first
        :data:`EXACT_TAIL` terms are summed as they are, the rest in closed form; eps is taken
        out of the decay (sqrt(v) * b2**(k/2) + eps becomes b2**(k/2) * (sqrt(v) + eps)),
        which changes nothing next to sqrt(v) unless a row's gradients are as small as eps."""
        tail = np.zeros(m.shape, np.float64)
        # A row without momentum does not move: one never updated, and on a worker every row
        # its last window flushed.
        moving = np.flatnonzero(m.any(axis=1))
        if not len(moving):
            return tail
        m, v, last = m[moving], v[moving], last[moving]
        # The factor depends on a row's (last, missed) alone, which rows share (all of them
        # in a flush): it is computed once per distinct pair.
        if missed is None:
            distinct, where = np.unique(last, return_inverse=True)
            factor = self._adam_factor(distinct, None, lr)[where]
        else:
            missed = missed[moving]
            span = int(missed.max()) + 1
            keys, where = np.unique(last * span + missed, return_inverse=True)
            factor = self._adam_factor(keys // span, keys % span, lr)[where]
        eps = self.params["epsilon"]
        tail[moving] = -m * (factor[:, None] / (np.sqrt(v.astype(np.float64)) + eps))
        return tail

    def _adam_factor(self, last: np.ndarray, missed: np.ndarray | None, lr: float) -> np.ndarray:
        """Sum over k of alpha(last + k) * (b1 / sqrt(b2))**k for k = 1..missed (None: all
        steps to come), per entry of ``last``: Adam's tail per unit of m / (sqrt(v) + eps)."""
        p = self.params
        b1, b2 = p["beta_1"], p["beta_2"]
        limit = EXACT_TAIL if missed is None else int(min(missed.max(), EXACT_TAIL))
        k = np.arange(1, limit + 1)
        counted = k[None, :] <= (limit if missed is None else missed[:, None])
        alpha = np.where(counted, self._alpha(lr, last[:, None] + k[None, :]), 0.0)
        ratio = b1 / np.sqrt(b2)
        factor = (alpha * ratio**k).sum(axis=1)
        rest = None if missed is None else missed - limit
        if missed is None or rest.max() > 0:
            # Past the exact terms: the last term's alpha, a geometric series.
            remaining = 1.0 if missed is None else 1 - ratio ** np.maximum(rest, 0)
            first = self._alpha(lr, last + limit)
            factor = factor + first * ratio ** (limit + 1) * remaining / (1 - ratio)
        return factor

    def _alpha(self, lr: float, step):
        """Adam's step size with Keras's bias correction at ``step`` (1-based)."""
        p = self.params
        return lr * np.sqrt(1 - p["beta_2"] ** step) / (1 - p["beta_1"] ** step)
