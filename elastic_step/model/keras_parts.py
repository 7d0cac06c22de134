"""Turns what a model definition gives into the loss, optimizer and metrics that training uses.

A definition may give each part as ``model.compile()`` accepts it: a Keras object, a name, or
for the loss a function. This module resolves them as ``compile()`` does, with Keras's own
resolvers: names, ``"accuracy"`` and ``"crossentropy"`` mean here what they mean to
``compile()``. Each problem raises :class:`PartError` with a message naming the part, the value
and the rule; :mod:`elastic_step.model.definition` adds the file.
Tests: tests/unit/test_model_definition.py (the parts it resolves, and bad parts).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import keras

# Keras's compile() resolvers; Keras does not export them.
from keras.src.trainers.compile_utils import get_loss, get_metric

from elastic_step.model.api import PartError

#: Names that compile() resolves by the shapes of the labels and the model's outputs.
SHAPE_DEPENDENT_NAMES = frozenset({"accuracy", "acc", "crossentropy", "ce"})

#: Gives ``(labels, outputs)``, two objects with a ``shape``: the feed's labels and the model's
#: outputs. Called only for the names above.
ShapesOf = Callable[[], tuple[Any, Any]]


@dataclass(frozen=True, kw_only=True)
class CompiledParts:
    """What ``model.compile()`` was given: ``loss`` and ``metrics`` as given (None where not
    given), ``optimizer`` as the model holds it (an instance; ``"rmsprop"`` by default)."""

    loss: Any
    optimizer: keras.optimizers.Optimizer | None
    metrics: Any


def compiled_parts(model: keras.Model) -> CompiledParts | None:
    """The compile() settings of ``model``, or None if it was not compiled."""
    if not model.compiled:
        return None
    # compile()'s arguments as given; Keras keeps no public copy of them.
    given = model._compile_config.config
    for name, why in (
        ("loss_weights", "training has one loss"),
        ("weighted_metrics", "records carry no sample weights"),
    ):
        if given.get(name) is not None:
            raise PartError(f"model.compile({name}=...) is not supported: {why}")
    if isinstance(given["loss"], dict) or _is_nested(given["loss"]):
        raise PartError("model.compile(loss=...) must be one loss, not one per output")
    loss = given["loss"]
    if isinstance(loss, list | tuple):
        if len(loss) != 1:
            raise PartError(f"model.compile(loss=...) must be one loss, got a list of {len(loss)}")
        loss = loss[0]
    if isinstance(given["metrics"], dict) or _is_nested(given["metrics"]):
        raise PartError(
            "model.compile(metrics=...) must be a list of metrics, not metrics per output"
        )
    return CompiledParts(loss=loss, optimizer=model.optimizer, metrics=given["metrics"])


def build_compiled_optimizer(model: keras.Model) -> None:
    """Builds the optimizer of a compiled model (fresh: training's optimizer state is the
    PS's). model.keras then holds its variables, as keras.models.load_model builds them, and
    neither loading nor load_weights() warns of a mismatch."""
    if model.compiled and model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)


def _is_nested(value: Any) -> bool:
    return isinstance(value, list | tuple) and any(isinstance(v, list | tuple) for v in value)


def optimizer_from(value: Any, origin: str) -> keras.optimizers.Optimizer:
    """An optimizer from an instance or a name (``"adam"``); ``origin`` names where it came from
    (``optimizer()``, ``model.compile(optimizer=...)``)."""
    if isinstance(value, keras.optimizers.Optimizer):
        return value
    if isinstance(value, str):
        try:
            return keras.optimizers.get(value)
        except ValueError:
            raise PartError(f"{origin}: '{value}' is not a Keras optimizer name") from None
    raise PartError(
        f"{origin}: got {type(value).__name__}, expected a keras.optimizers.Optimizer "
        "or an optimizer name"
    )


def loss_from(value: Any, origin: str, shapes: ShapesOf) -> Callable:
    """The loss as ``fn(labels, outputs) -> scalar tensor``, called as compile() calls it.

    - a ``keras.losses.Loss`` is called as it is: its reduction is honoured;
    - a name (``"mse"``) is the Keras loss of that name;
    - a function ``f(labels, outputs)`` is called as Keras calls one: labels as float32, the
      ranks of labels and outputs matched (``[batch]`` against ``[batch, 1]``), and the values
      it returns (per example, or already a scalar) reduced by their mean.

    A loss that still gives per-example values (``reduction=None``) is reduced by its mean too.
    """
    if isinstance(value, str | keras.losses.Loss | type):  # a class: Keras makes one
        identifier = value
    elif callable(value):
        identifier = _tensor_checked(value)
    else:
        raise PartError(
            f"{origin}: got {type(value).__name__}, expected a function, a keras.losses.Loss "
            "or a loss name"
        )
    try:
        loss = get_loss(identifier, *_shapes_for(identifier, shapes))
    except ValueError as e:
        if isinstance(value, str):
            raise PartError(f"{origin}: '{value}' is not a Keras loss name") from None
        raise PartError(f"{origin}: {e}") from None

    def scalar_loss(labels, outputs):
        return keras.ops.mean(loss(labels, outputs))

    return scalar_loss


def _tensor_checked(fn: Callable) -> Callable:
    """``fn``, raising a clear TypeError when it returns something that is not a tensor."""

    @functools.wraps(fn)
    def checked(labels, outputs):
        value = fn(labels, outputs)
        if getattr(value, "shape", None) is None and not isinstance(value, float | int):
            name = getattr(fn, "__name__", "the loss")
            raise TypeError(
                f"{name}() returned {type(value).__name__}, expected a tensor of per-example "
                "losses or a scalar"
            )
        return value

    return checked


def metrics_from(value: Any, origin: str, shapes: ShapesOf) -> dict[str, keras.metrics.Metric]:
    """Metrics by name, from what compile() accepts or a dict.

    A list (or one item) holds ``keras.metrics.Metric`` objects, metric names (``"auc"``,
    ``"accuracy"``) and metric functions; each is named as compile() names it. A dict maps the
    names to use to such items.
    """
    if isinstance(value, dict):
        named = list(value.items())
        if not all(isinstance(name, str) for name, _ in named):
            raise PartError(f"{origin}: a dict of metrics must have names (str) as keys")
    else:
        items = list(value) if isinstance(value, list | tuple) else [value]
        named = [(None, item) for item in items]
    metrics: dict[str, keras.metrics.Metric] = {}
    for name, item in named:
        metric = _metric(item, origin, shapes)
        name = name or metric.name
        if name in metrics:
            raise PartError(
                f"{origin}: two metrics are named '{name}'; give one another name (name=...)"
            )
        metrics[name] = metric
    return metrics


def _metric(item: Any, origin: str, shapes: ShapesOf) -> keras.metrics.Metric:
    if not (isinstance(item, str | keras.metrics.Metric) or callable(item)):
        raise PartError(
            f"{origin}: got {type(item).__name__} in the metrics, expected a "
            "keras.metrics.Metric, a metric name or a metric function"
        )
    try:
        return get_metric(item, *_shapes_for(item, shapes))
    except ValueError as e:
        if isinstance(item, str):
            raise PartError(f"{origin}: '{item}' is not a Keras metric name") from None
        raise PartError(f"{origin}: {e}") from None


def _shapes_for(identifier: Any, shapes: ShapesOf) -> tuple[Any, Any]:
    if isinstance(identifier, str) and identifier.lower() in SHAPE_DEPENDENT_NAMES:
        return shapes()
    return None, None
