"""The model definition contract: the user's Python file and how it is loaded and checked.

The file defines (a feed must map every record to exactly one example):

- ``model() -> keras.Model``
- ``loss(labels, outputs) -> scalar tensor``
- ``optimizer() -> keras.optimizers.Optimizer``
- optional ``feed(dataset, mode, schema) -> tf.data.Dataset``: ``dataset`` yields batches of
  serialized ``tf.train.Example`` (1-D string tensors); return batches of
  ``(features, labels)``. ``mode`` is "train", "evaluate" or "predict". Without it the
  default feed of :mod:`elastic_step.data.feed` is used.
- optional ``metrics() -> dict[str, keras.metrics.Metric]``. Their states must add up across
  batches (counts and sums, as Keras' accuracy, AUC, precision and recall do): evaluation
  sums them over the workers' tasks.
"""

from __future__ import annotations

import linecache
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elastic_step.data import storage
from elastic_step.errors import ModelDefinitionError

REQUIRED = ("model", "loss", "optimizer")
OPTIONAL = ("feed", "metrics")


def _short_error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip()


@dataclass
class ModelDefinition:
    path: str
    source: str
    module: types.ModuleType

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self.module, name)(*args)
        except Exception as e:
            where = traceback.extract_tb(e.__traceback__)[-1]
            raise ModelDefinitionError(
                self.path, f"{name}() raised {_short_error(e)} (line {where.lineno})"
            ) from e

    def build_model(self):
        """Builds the model. Keras's name counters are reset first, so that variable paths
        (``dense/kernel``) are the same in every process, however many models it built."""
        import keras

        keras.backend.clear_session()
        model = self._call("model")
        if not isinstance(model, keras.Model):
            raise ModelDefinitionError(
                self.path, f"model() returned {type(model).__name__}, expected a keras.Model"
            )
        return model

    def build_optimizer(self):
        import keras

        optimizer = self._call("optimizer")
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise ModelDefinitionError(
                self.path,
                f"optimizer() returned {type(optimizer).__name__}, "
                "expected a keras.optimizers.Optimizer",
            )
        return optimizer

    def build_metrics(self) -> dict:
        import keras

        if not hasattr(self.module, "metrics"):
            return {}
        metrics = self._call("metrics")
        if not isinstance(metrics, dict) or not all(
            isinstance(k, str) and isinstance(v, keras.metrics.Metric) for k, v in metrics.items()
        ):
            raise ModelDefinitionError(
                self.path, "metrics() must return a dict from names to keras.metrics.Metric"
            )
        return metrics

    @property
    def loss(self) -> Callable:
        return self.module.loss

    @property
    def feed(self) -> Callable | None:
        return getattr(self.module, "feed", None)


def load_model_definition(path: str) -> ModelDefinition:
    """Reads and runs the file at ``path`` (local path or URI) and checks its functions exist."""
    if not storage.exists(path):
        raise ModelDefinitionError(path, "file not found")
    try:
        source = storage.read_text(path)
    except (OSError, UnicodeDecodeError) as e:
        raise ModelDefinitionError(path, f"cannot read it: {e}") from e
    module = types.ModuleType("elastic_step_user_model")
    module.__file__ = path
    # The source as run, for inspect (AutoGraph converts functions from their source) and
    # tracebacks, also where ``path`` is not a local file (s3://).
    linecache.cache[path] = (len(source), None, source.splitlines(keepends=True), path)
    try:
        code = compile(source, path, "exec")
        exec(code, module.__dict__)
    except SyntaxError as e:
        raise ModelDefinitionError(path, f"syntax error on line {e.lineno}: {e.msg}") from e
    except Exception as e:
        raise ModelDefinitionError(path, f"importing it raised {_short_error(e)}") from e
    missing = [name for name in REQUIRED if not callable(getattr(module, name, None))]
    if missing:
        raise ModelDefinitionError(path, f"missing function(s): {', '.join(missing)}")
    for name in OPTIONAL:
        if hasattr(module, name) and not callable(getattr(module, name)):
            raise ModelDefinitionError(path, f"'{name}' must be a function")
    return ModelDefinition(path, source, module)


def check_model_definition(definition: ModelDefinition, schema, records: list[bytes]) -> None:
    """Builds everything once and runs one small batch through feed, model and loss.

    Catches, before any process starts, what would otherwise fail on every worker.
    """
    import tensorflow as tf

    from elastic_step.data.feed import make_dataset

    model = definition.build_model()
    from elastic_step.worker.parameters import table_optimizer_problem

    if problem := table_optimizer_problem(model, definition.build_optimizer()):
        raise ModelDefinitionError(definition.path, problem)
    definition.build_metrics()
    try:
        dataset = make_dataset(
            records, batch_size=len(records), mode="train", schema=schema, feed=definition.feed
        )
    except TypeError as e:
        raise ModelDefinitionError(definition.path, str(e)) from e
    try:
        features, labels = next(iter(dataset))
    except Exception as e:
        raise ModelDefinitionError(
            definition.path, f"the feed failed on the first batch: {_short_error(e)}"
        ) from e
    from elastic_step.worker.stream import batch_size_of

    produced = batch_size_of(labels, features)
    if produced != len(records):
        raise ModelDefinitionError(
            definition.path,
            f"the feed made {produced} examples of {len(records)} records; it must map every "
            "record to exactly one example",
        )
    try:
        outputs = model(features, training=False)
    except Exception as e:
        raise ModelDefinitionError(
            definition.path, f"the model failed on the first batch: {_short_error(e)}"
        ) from e
    loss = definition._call("loss", labels, outputs)
    if not isinstance(loss, tf.Tensor | float) or tf.convert_to_tensor(loss).shape.rank != 0:
        shape = getattr(loss, "shape", None)
        raise ModelDefinitionError(
            definition.path,
            f"loss() must return a scalar tensor, got {type(loss).__name__} with shape {shape}",
        )
