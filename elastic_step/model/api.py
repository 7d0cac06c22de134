"""The model layer's interface: what the processes above it (worker, PS, master, the jobs)
may ask of a model.

The layer defines, builds, places, optimizes and serves a model. Its modules:

- :mod:`~elastic_step.model.definition`: the user's Python file, loaded as a
  :class:`ModelDefinition` (its docstring states the file's contract);
- :mod:`~elastic_step.model.keras_parts`: the loss, optimizer and metrics, resolved as
  ``compile()`` resolves them;
- :mod:`~elastic_step.model.parameters`: a model's variables as the PS shards hold them;
- :mod:`~elastic_step.model.row_optimizer` and :mod:`~elastic_step.model.outer_optimizer`: the
  PS's per-row optimizer steps and the outer step of ``--local-steps``;
- :mod:`~elastic_step.model.serving`: the saved model, which takes raw CSV values;
- :mod:`~elastic_step.model.summaries`: TensorBoard's event files;
- :mod:`~elastic_step.model.tf_runtime`: TensorFlow's start-up, threads and seed.

Below it are only ``data/``, ``rpc/``, ``errors.py``, ``user_errors.py`` and
``output_layout.py``. The master imports TensorFlow through this layer alone: where it saves
models, measures evaluation rounds, seeds the generators and writes TensorBoard's events
(tests/unit/test_import_graph.py checks both). Tests: tests/unit/test_model_*.py,
test_row_optimizer.py, test_serving_layer.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

from elastic_step.errors import ModelDefinitionError

if TYPE_CHECKING:
    import keras

    from elastic_step.data.schema import Schema

__all__ = [
    "ModelDefinition",
    "ModelDefinitionError",
    "PartError",
    "UnsupportedOptimizerError",
]


class PartError(ValueError):
    """A loss, optimizer or metric that cannot be used; the message says which and why.
    :class:`ModelDefinition` turns it into a :class:`ModelDefinitionError` naming the file."""


class UnsupportedOptimizerError(ValueError):
    """The model's optimizer has no per-row form for its embedding tables; the message says
    what to change."""


class ModelDefinition(ABC):
    """A loaded model definition: what training, evaluation and serving take from it.

    Every process builds its models from the same definition, so that variable paths
    (``dense/kernel``) agree between workers, PS shards and the master. Each method raises
    :class:`ModelDefinitionError` (one line naming the file and the problem) when what the
    user's file gives cannot be used.
    """

    #: Where the definition was read from (a local path or a URI).
    path: str
    #: Its source text, as run.
    source: str
    #: The data's schema; None where no model is built (the PS takes only the optimizer).
    schema: Schema | None

    @abstractmethod
    def with_schema(self, schema: Schema | None) -> ModelDefinition:
        """The same definition (its file already loaded) over another schema; nothing of
        this one's is built or shared."""

    @abstractmethod
    def build_model(self) -> keras.Model:
        """A new model with its variables; the same variable paths on every call, in every
        process."""

    @abstractmethod
    def build_optimizer(self) -> keras.optimizers.Optimizer:
        """A new optimizer: the file's, or else the one the model was compiled with."""

    @abstractmethod
    def build_metrics(self) -> dict[str, keras.metrics.Metric]:
        """New metrics by the name to report them under; empty when none are defined. Their
        states add up across batches, so the master can sum the workers' states."""

    @property
    @abstractmethod
    def loss(self) -> Callable:
        """``loss(labels, outputs) -> scalar tensor``, the mean over the batch."""

    @property
    @abstractmethod
    def feed(self) -> Callable | None:
        """``feed(dataset, mode, schema)``: batches of serialized examples to batches of
        ``(features, labels)``, one example per record; None before a model is built and when
        the file gives none."""
