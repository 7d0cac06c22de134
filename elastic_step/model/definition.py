"""The model definition: the user's Python file, how it is loaded, and what training takes from it.

The file defines ``model`` and may define ``loss``, ``optimizer``, ``metrics`` and ``feed``.
``loss``, ``optimizer`` and ``metrics`` may each be a function or a module-level object, or come
from the model's ``compile()``; what the file defines takes precedence over ``compile()``.

- ``model() -> keras.Model``, or ``model(schema)`` to be given the data's schema (below), for
  a model shaped by the data, such as one embedding of ``num_ids`` rows per categorical
  column: functional, Sequential or subclassed, compiled or not. A model
  that has no variables yet (subclassed, or Sequential without an ``Input``) is built by calling
  it once on a batch of zeros shaped as the feed's features.
- ``loss``: a function ``loss(labels, outputs)`` giving per-example values or a scalar, a
  ``keras.losses.Loss``, or a loss name (``"mse"``). It is called as ``compile()`` calls a
  loss and reduced by its mean (:func:`elastic_step.model.keras_parts.loss_from`).
- ``optimizer``: a ``keras.optimizers.Optimizer`` or an optimizer name, or a function
  ``optimizer()`` returning one.
- ``metrics``: a list of metrics, metric names and metric functions as ``compile()`` takes
  them, or a dict from the names to report to such items, or a function ``metrics()``
  returning either. Their states must add up across batches (counts and sums, as Keras'
  accuracy, AUC, precision and recall do): evaluation sums them over the workers' tasks.
- ``feed(dataset, mode, schema) -> tf.data.Dataset`` (optional): ``dataset`` yields batches of
  serialized ``tf.train.Example`` (1-D string tensors); return batches of
  ``(features, labels)``, exactly one example per record. ``mode`` is "train", "evaluate" or
  "predict". Without it the default feed of :mod:`elastic_step.data.feed` is used.

The ``schema`` that ``feed`` receives is the data's :class:`elastic_step.data.schema.Schema`
(``schema.json``):

- ``schema.columns``: the feature columns in CSV order, the label left out. Each has a
  ``name`` and a ``kind``, ``"numeric"`` or ``"categorical"``. A numeric column has the
  ``mean`` and ``std`` of the train split; a categorical one has ``num_ids``, the rows an
  embedding over it needs: its ``vocabulary_size`` plus its ``oov_buckets`` (ids for values
  not in the vocabulary), or its ``hash_buckets``. ``schema.vocabulary(column)`` reads a
  vocabulary's entries, most frequent first, from its file.
- ``schema.feature_names`` and ``schema.feature(name)``: the column names, one column by name.
- ``schema.label``, ``schema.label_kind`` (``"class"`` or ``"numeric"``), and for a class label
  ``schema.label_vocabulary`` and ``schema.num_classes``.
- ``schema.records``: the record count of each split.

Each record holds the raw values under the CSV's column names: a numeric column as one float
(not standardized), a categorical column as one UTF-8 string, the label as its text (class
label) or one float (numeric label).
"""

from __future__ import annotations

import functools
import gc
import hashlib
import inspect
import linecache
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from elastic_step.data import storage
from elastic_step.data.schema import Schema
from elastic_step.errors import ModelDefinitionError
from elastic_step.model.api import ModelDefinition, PartError
from elastic_step.user_errors import describe_error

if TYPE_CHECKING:
    import keras

    from elastic_step.model.keras_parts import CompiledParts

#: The name the definition runs under; the latest one loaded in a process holds it.
MODULE_NAME = "elastic_step_user_model"

COMPILE_ORIGINS = {
    "loss": "model.compile(loss=...)",
    "optimizer": "model.compile(optimizer=...)",
    "metrics": "model.compile(metrics=...)",
}


@dataclass
class PythonModelDefinition(ModelDefinition):
    """A model definition loaded from the user's Python file.

    ``schema``, the data's, lets it build models that have no variables yet and resolve the
    names whose meaning depends on shapes (``"accuracy"``). Without it (the PS, which takes
    only the optimizer) models must come built from ``model()``.
    """

    path: str
    source: str
    module: types.ModuleType
    schema: Schema | None = None
    #: What compile() set on the model that model() returned last (None: not compiled).
    _compiled: CompiledParts | None = field(default=None, init=False, repr=False)
    _model_called: bool = field(default=False, init=False, repr=False)
    _output_shape: Any = field(default=None, init=False, repr=False)
    #: The default feed in the input form of the model built last (a dict of columns, or one
    #: vector); None until a model is built.
    default_feed: Callable | None = field(default=None, init=False, repr=False)

    def with_schema(self, schema: Schema | None) -> PythonModelDefinition:
        return PythonModelDefinition(self.path, self.source, self.module, schema)

    def _run_user(self, what: str, fn: Callable, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:
            raise ModelDefinitionError(
                self.path, f"{what} raised {describe_error(e, self.path)}"
            ) from e

    def _new_model(self) -> keras.Model:
        import keras

        from elastic_step.data.feed import default_feed_for_model
        from elastic_step.model.keras_parts import compiled_parts

        if takes_schema(self.module.model):
            if self.schema is None:
                raise ModelDefinitionError(
                    self.path, "model(schema) needs the data's schema, which this process lacks"
                )
            model = self._run_user("model(schema)", self.module.model, self.schema)
        else:
            model = self._run_user("model()", self.module.model)
        if not isinstance(model, keras.Model):
            raise ModelDefinitionError(
                self.path, f"model() returned {type(model).__name__}, expected a keras.Model"
            )
        try:
            self._compiled = compiled_parts(model)
        except PartError as e:
            raise ModelDefinitionError(self.path, str(e)) from None
        self._model_called = True
        self.default_feed = default_feed_for_model(model)
        return model

    def build_model(self) -> keras.Model:
        """Builds the model, with its variables. Keras's name counters are reset first, so
        that variable paths (``dense/kernel``) are the same in every process, however many
        models it built."""
        import keras

        keras.backend.clear_session()
        _keep_tracebacks_whole()
        model = self._new_model()
        self._output_shape = self._ensure_built(model)
        return model

    def _ensure_built(self, model):
        """Builds ``model`` if it has no variables yet; returns the shape of its (first)
        output."""
        import tensorflow as tf

        try:
            outputs = model.outputs if model.built else None
        except (AttributeError, ValueError):  # subclassed models have no symbolic outputs
            outputs = None
        if outputs:
            return tf.nest.flatten(outputs)[0].shape
        if self.schema is None:
            raise RuntimeError("building a model that has no variables yet needs the schema")
        features_spec = self._feed_spec[0]
        sample = tf.nest.map_structure(self._zeros, features_spec)
        outputs = self._run_user(
            "calling the model on the feed's features", lambda: model(sample, training=False)
        )
        return tf.nest.flatten(outputs)[0].shape

    def _zeros(self, spec):
        import tensorflow as tf

        if not isinstance(spec, tf.TensorSpec) or spec.shape.rank is None:
            raise ModelDefinitionError(
                self.path,
                f"model() returned a model without variables, and the feed yields {spec}, "
                "not a dense tensor of known rank, to build it on; give the model a "
                "keras.Input in model()",
            )
        shape = [1 if size is None else size for size in spec.shape]
        return tf.fill(shape, "") if spec.dtype == tf.string else tf.zeros(shape, spec.dtype)

    @functools.cached_property
    def _feed_spec(self):
        """The ``(features, labels)`` specs of what the feed yields."""
        from elastic_step.data.feed import apply_feed, records_dataset

        try:
            dataset = apply_feed(self.feed, records_dataset([], 1), "train", self.schema)
        except Exception as e:
            raise ModelDefinitionError(
                self.path, f"the feed failed: {describe_error(e, self.path)}"
            ) from e
        spec = dataset.element_spec
        if not isinstance(spec, tuple) or len(spec) != 2:
            raise ModelDefinitionError(
                self.path, f"the feed must yield (features, labels) pairs, it yields {spec}"
            )
        return spec

    def _shapes(self):
        """``(labels, outputs)`` as objects with a ``shape``, for names like "accuracy"."""
        import tensorflow as tf

        if self.schema is None:
            raise RuntimeError("resolving a shape-dependent loss or metric name needs the schema")
        labels = tf.nest.flatten(self._feed_spec[1])[0]
        if self._output_shape is None:  # no model built yet in this process
            self.build_model()
        return labels, tf.TensorSpec(self._output_shape)

    def _given(self, name: str) -> tuple[Any, str] | None:
        """What the file defines for ``name``, with where it came from; a function (other than
        the loss, which is a function of labels and outputs) is called for it."""
        import keras

        value = getattr(self.module, name, None)
        if value is None:
            return None
        objects = (keras.optimizers.Optimizer, keras.metrics.Metric)
        if name != "loss" and callable(value) and not isinstance(value, objects):
            return self._run_user(f"{name}()", value), f"{name}()"
        return value, name

    def _given_or_compiled(self, name: str) -> tuple[Any, str]:
        given = self._given(name)
        if given is not None:
            return given
        if not self._model_called:
            self._new_model()
        value = getattr(self._compiled, name) if self._compiled is not None else None
        return value, COMPILE_ORIGINS[name]

    def _required(self, name: str, kinds: str) -> tuple[Any, str]:
        """What :meth:`_given_or_compiled` finds; a ModelDefinitionError naming the ``kinds``
        of value ``name`` may be when it finds none."""
        value, origin = self._given_or_compiled(name)
        if value is None:
            raise ModelDefinitionError(
                self.path, f"no {name}: define {name} ({kinds}) or return a model compiled with one"
            )
        return value, origin

    def _part(self, make: Callable, *args: Any) -> Any:
        try:
            return make(*args)
        except PartError as e:
            raise ModelDefinitionError(self.path, str(e)) from None

    def build_optimizer(self) -> keras.optimizers.Optimizer:
        """The optimizer: the file's, or else the one the model was compiled with."""
        from elastic_step.model.keras_parts import optimizer_from

        value, origin = self._required("optimizer", "a function or a keras.optimizers.Optimizer")
        return self._part(optimizer_from, value, origin)

    def build_metrics(self) -> dict[str, keras.metrics.Metric]:
        """The metrics by name: the file's, or else the model's compile() metrics, or none."""
        from elastic_step.model.keras_parts import metrics_from

        value, origin = self._given_or_compiled("metrics")
        if value is None:
            return {}
        return self._part(metrics_from, value, origin, self._shapes)

    @functools.cached_property
    def loss(self) -> Callable:
        """The loss as ``loss(labels, outputs) -> scalar tensor``: the file's, or else the one
        the model was compiled with."""
        from elastic_step.model.keras_parts import loss_from

        value, origin = self._required("loss", "a function, a keras.losses.Loss or a loss name")
        return self._part(loss_from, value, origin, self._shapes)

    @property
    def feed(self) -> Callable | None:
        return getattr(self.module, "feed", None) or self.default_feed


def _keep_tracebacks_whole() -> None:
    """Keras and TensorFlow trim their own frames from tracebacks, which makes an error raised
    inside Keras look raised by the user's line (and Keras colours its messages). Keras keeps
    the setting in its session state: set it again after each clear_session()."""
    import keras
    import tensorflow as tf

    keras.config.disable_traceback_filtering()
    tf.debugging.disable_traceback_filtering()


def batch_size_of(labels: Any, features: Any) -> int:
    """The examples in one batch of the feed: the first dimension of its labels (or, when
    predicting, of its first feature)."""
    import tensorflow as tf

    first = tf.nest.flatten(labels if labels is not None else features)[0]
    return int(first.shape[0])


def source_digest(source: str) -> str:
    """The hex SHA-256 of a model definition's text: what a job's processes check it by."""
    return hashlib.sha256(source.encode()).hexdigest()


def load_model_definition(
    path: str, schema: Schema | None = None, *, sha256: str = ""
) -> ModelDefinition:
    """Reads and runs the file at ``path`` (local path or URI) and checks what it defines.

    ``schema``: the data's, wherever models are built or metrics resolved (see
    :class:`ModelDefinition`). ``sha256``: the digest (:func:`source_digest`) the text must
    have; a file that differs is refused before any of it runs."""
    import keras

    if not storage.exists(path):
        raise ModelDefinitionError(path, "file not found")
    try:
        source = storage.read_text(path)
    except (OSError, UnicodeDecodeError) as e:
        raise ModelDefinitionError(path, f"cannot read it: {e}") from e
    if sha256 and source_digest(source) != sha256:
        raise ModelDefinitionError(path, changed_since(source_digest(source), sha256))
    _keep_tracebacks_whole()
    module = types.ModuleType(MODULE_NAME)
    module.__file__ = path
    # Importable, as a module of the user's would be: AutoGraph looks functions' modules up
    # there (a lambda in feed() would otherwise run unconverted, with a warning), and so does
    # keras.models.load_model for the classes a saved model names (a subclassed model).
    sys.modules[MODULE_NAME] = module
    # The source as run, for inspect (AutoGraph converts functions from their source) and
    # tracebacks, also where ``path`` is not a local file (s3://).
    linecache.cache[path] = (len(source), None, source.splitlines(keepends=True), path)
    try:
        code = compile(source, path, "exec")
        exec(code, module.__dict__)
    except SyntaxError as e:
        raise ModelDefinitionError(path, f"syntax error on line {e.lineno}: {e.msg}") from e
    except Exception as e:
        raise ModelDefinitionError(path, f"importing it raised {describe_error(e, path)}") from e
    model = getattr(module, "model", None)
    if model is None:
        raise ModelDefinitionError(path, "missing function: model (returning a keras.Model)")
    if isinstance(model, keras.Model) or not callable(model):
        raise ModelDefinitionError(
            path,
            f"'model' is {type(model).__name__}; it must be a function that returns a new "
            "keras.Model (def model(): ...)",
        )
    try:
        takes_schema(model)
    except ValueError as e:
        raise ModelDefinitionError(path, str(e)) from None
    feed = getattr(module, "feed", None)
    if feed is not None and not callable(feed):
        raise ModelDefinitionError(path, "'feed' must be a function")
    return PythonModelDefinition(path, source, module, schema)


def takes_schema(model: Callable) -> bool:
    """Whether ``model`` is ``model(schema)`` rather than ``model()``; a ValueError when it
    requires more arguments than the schema."""
    try:
        parameters = inspect.signature(model).parameters.values()
    except (TypeError, ValueError):  # a builtin or a callable without a signature: model()
        return False
    required = [
        p
        for p in parameters
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(required) > 1:
        names = ", ".join(p.name for p in required)
        raise ValueError(
            f"model({names}) takes {len(required)} arguments; it must be model() or model(schema)"
        )
    return bool(required)


def changed_since(actual: str, expected: str) -> str:
    """Why a model definition whose digest is ``actual`` is refused in a job that started
    with ``expected``."""
    return (
        f"its SHA-256 is {actual[:12]}..., not {expected[:12]}... as when the job started: "
        "it was changed since, and no process of the job runs it (put the original back, or "
        "start a new job with a new --output)"
    )


def check_model_definition(definition: ModelDefinition, records: list[bytes]) -> None:
    """Builds everything once and runs one small batch through feed, model, loss and metrics.

    Catches, before any process starts, what would otherwise fail on every worker. The
    default feed's lookup tables go afterwards: the master that checks does not train, and
    a job's vocabularies can hold millions of values.
    """
    from elastic_step.data.feed import release_feeds

    try:
        _check(definition, records)
    finally:
        if definition.schema is not None:
            release_feeds(definition.schema)
        gc.collect()  # the feed's traced functions refer back to it: a cycle


def _check(definition: ModelDefinition, records: list[bytes]) -> None:
    from elastic_step.data.feed import FeedReturnError, make_dataset

    model = definition.build_model()
    from elastic_step.model.parameters import table_optimizer_problem

    if problem := table_optimizer_problem(model, definition.build_optimizer()):
        raise ModelDefinitionError(definition.path, problem)
    metrics = definition.build_metrics()
    loss = definition.loss
    try:
        dataset = make_dataset(
            records,
            batch_size=len(records),
            mode="train",
            schema=definition.schema,
            feed=definition.feed,
        )
    except FeedReturnError as e:
        raise ModelDefinitionError(definition.path, str(e)) from e
    except Exception as e:
        raise ModelDefinitionError(
            definition.path, f"the feed failed: {describe_error(e, definition.path)}"
        ) from e
    try:
        features, labels = next(iter(dataset))
    except Exception as e:
        raise ModelDefinitionError(
            definition.path,
            f"the feed failed on the first batch: {describe_error(e, definition.path)}",
        ) from e
    produced = batch_size_of(labels, features)
    if produced != len(records):
        raise ModelDefinitionError(
            definition.path,
            f"the feed made {produced} examples of {len(records)} records; it must map every "
            "record to exactly one example",
        )
    outputs = _on_first_batch(definition, "the model", lambda: model(features, training=False))
    _on_first_batch(definition, "the loss", lambda: loss(labels, outputs))
    for name, metric in metrics.items():
        update = functools.partial(metric.update_state, labels, outputs)
        _on_first_batch(definition, f"the metric '{name}'", update)
        _on_first_batch(definition, f"the result of the metric '{name}'", metric.result)
        metric.reset_state()


def _on_first_batch(definition: ModelDefinition, what: str, run: Callable[[], Any]) -> Any:
    try:
        return run()
    except Exception as e:
        raise ModelDefinitionError(
            definition.path,
            f"{what} failed on the first batch: {describe_error(e, definition.path)}",
        ) from e
