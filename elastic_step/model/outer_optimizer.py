"""The PS's optimizer with local steps (``--local-steps K > 1``): the outer optimizer.

A worker pushes the negated change of its copy over a window (a pseudo-gradient, as in
DiLoCo), and the PS applies it as a gradient:

- ``average`` (the default): SGD with learning rate 1, i.e. the PS adds each worker's change
  as it arrives. With one worker this is exactly its K local steps; it is the asynchronous
  form of averaging the workers' models (each change counts once, as each gradient does
  with K = 1).
- ``nesterov``: SGD with Nesterov momentum, DiLoCo's outer optimizer (learning rate 0.7,
  momentum 0.9). Its momentum is optimizer state: per row for embedding tables, and
  checkpointed like any other.

Tests: tests/unit/test_row_optimizer.py, tests/unit/test_model_parameters.py.
"""

from __future__ import annotations

OUTER_OPTIMIZERS = ("average", "nesterov")


def build_outer_optimizer(name: str):
    import keras

    if name == "average":
        return keras.optimizers.SGD(learning_rate=1.0)
    if name == "nesterov":
        return keras.optimizers.SGD(learning_rate=0.7, momentum=0.9, nesterov=True)
    raise ValueError(f"outer optimizer must be one of {', '.join(OUTER_OPTIMIZERS)}, got {name!r}")
