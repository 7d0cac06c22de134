"""The model as it is served: the schema's preprocessing and the trained model in one graph.

A trained model takes what the feed makes of the records (standardized numbers, vocabulary
ids), not the CSV's values. With the default feed the saved model puts that encoding in front
of it, so that it takes raw values:

- :func:`raw_input_model`: a Keras model with one input per CSV column, named by its input
  name: float32 for a numeric column (NaN where the cell is empty), strings for a categorical
  one. Its :class:`RawFeatures` layer fills empty cells with the schema's fill value and then
  encodes as the default feed does, by calling the feed's own code
  (:meth:`elastic_step.data.feed.DefaultFeed.features`); the trained model follows.
  ``model.keras`` holds it, the vocabulary files among its assets.
- :func:`export_saved_model`: ``saved_model/`` with two signatures that call that model:
  ``serving_default`` on serialized ``tf.train.Example`` records of raw values (the records'
  own format; an absent feature is an empty cell), and ``predict_raw`` on one raw tensor per
  column, keyed by the CSV's column names; the vocabulary files are its assets. Both return
  named outputs: ``probabilities``,
  ``class_ids`` and ``classes`` (the label's class names) for a class label, ``predictions``
  for a numeric one.

A feed() of the definition's own maps datasets of records, which a serving graph cannot take
in general; with one, both files hold the trained model, taking the feed's features.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from elastic_step.data import storage
from elastic_step.data.feed import DefaultFeed, InputForm, input_form, vector_width
from elastic_step.data.schema import Schema
from elastic_step.model.api import ModelDefinition

log = logging.getLogger("elastic_step")

RAW_FEATURES_LAYER = "raw_features"
#: The input of ``serving_default``, as TFX names it: serialized ``tf.train.Example``s.
EXAMPLES_INPUT = "examples"
#: Raw rows the output probe runs; enough that logits fall outside [0, 1] somewhere.
PROBE_ROWS = 256


@keras.saving.register_keras_serializable(package="elastic_step")
class RawFeatures(keras.layers.Layer):
    """Raw column values (a dict keyed by input name) to the default feed's features.

    ``schema_json``: the data's schema (``Schema.to_json``); ``vector``: whether the model
    takes the feed's vector form. An empty numeric cell (NaN) reads as the column's fill
    value; categorical values are stripped of surrounding whitespace, as ``preprocess``
    strips them, and an unseen one gets an out-of-vocabulary id.

    Its lookup tables are loaded from the vocabulary files of ``schema`` (the loaded schema,
    which knows where they are), or, in a layer that Keras loads from ``model.keras``, from
    the files it saved among the archive's assets (:meth:`save_assets`, :meth:`load_assets`).
    """

    #: First in the layer's saved config, so that Keras's error on a load without this
    #: module imported (it prints the config) says what to do.
    LOAD_WITH = "import elastic_step.model.serving before keras.models.load_model"

    def __init__(
        self,
        *,
        schema_json: str,
        vector: bool,
        load_with: str | None = None,
        schema: Schema | None = None,
        **kwargs,
    ) -> None:
        kwargs.setdefault("trainable", False)  # it has no weights; a loaded config sets it
        super().__init__(**kwargs)
        self.schema_json = schema_json
        self.vector = vector
        self._schema = Schema.from_json(schema_json)
        self._schema.directory = None if schema is None else schema.directory
        self._columns = self._schema.columns
        self._files = [c for c in self._columns if c.vocabulary_file is not None]
        self._feed: DefaultFeed | None = None
        if schema is not None or not self._files:
            self._feed = DefaultFeed(self._schema, InputForm(vector=vector))

    @property
    def tables(self) -> list[tf.lookup.StaticVocabularyTable]:
        """The vocabulary tables, which a SavedModel must track."""
        return list(self._built_feed()._tables.values())

    def _built_feed(self) -> DefaultFeed:
        if self._feed is None:
            raise ValueError(
                "the raw_features layer has no vocabularies: load model.keras with "
                "keras.models.load_model, which reads them from its assets"
            )
        return self._feed

    def save_assets(self, dir_path: str) -> None:
        """Copies the vocabulary files into ``dir_path`` (Keras's assets of the layer)."""
        from elastic_step.data.feed import local_vocabulary

        for column in self._files:
            target = os.path.join(dir_path, column.vocabulary_file)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(local_vocabulary(self._schema, column), target)

    def load_assets(self, dir_path: str) -> None:
        """Builds the lookup tables from the vocabulary files that :meth:`save_assets` wrote
        into ``dir_path``; keeps a copy for the life of the process (a SavedModel exported
        from the loaded model takes the files along)."""
        if not self._files:
            return
        directory = storage.local_temp_dir("elastic-step-assets-")
        atexit.register(shutil.rmtree, directory, True)
        shutil.copytree(dir_path, directory, dirs_exist_ok=True)
        self._schema.directory = directory
        self._feed = DefaultFeed(self._schema, InputForm(vector=self.vector))

    def compute_output_spec(self, raw: dict) -> dict[str, keras.KerasTensor] | keras.KerasTensor:
        """The features' shapes and types, known without the tables (a model loaded from
        ``model.keras`` is rebuilt before its assets are read)."""
        first = next(iter(raw.values()))
        batch = first.shape[0]
        if self.vector:
            return keras.KerasTensor((batch, vector_width(self._schema)), dtype="float32")
        features = {}
        for column in self._columns:
            if column.kind == "numeric":
                features[column.input_name] = keras.KerasTensor((batch,), dtype="float32")
            elif self._schema.one_hot:
                shape = (batch, column.num_ids)
                features[column.input_name] = keras.KerasTensor(shape, dtype="float32")
            else:
                features[column.input_name] = keras.KerasTensor((batch,), dtype="int64")
        return features

    def call(self, raw: dict[str, tf.Tensor]) -> dict[str, tf.Tensor] | tf.Tensor:
        parsed = {}
        for column in self._columns:
            value = raw[column.input_name]
            if column.kind == "numeric":
                value = tf.cast(value, tf.float32)
                if column.fill is not None:
                    value = tf.where(tf.math.is_nan(value), tf.constant(column.fill), value)
            else:
                value = tf.strings.strip(value)
            parsed[column.name] = value
        return self._built_feed().features(parsed)

    def get_config(self) -> dict:
        return {
            "load_with": self.LOAD_WITH,
            **super().get_config(),
            "schema_json": self.schema_json,
            "vector": self.vector,
        }


def serves_raw_inputs(definition: ModelDefinition) -> bool:
    """Whether the saved model takes raw values: it does with the default feed."""
    return getattr(definition.module, "feed", None) is None


def _feature_schema(schema: Schema) -> Schema:
    """``schema`` without its shards and record counts, which serving does not need."""
    return dataclasses.replace(schema, splits={}, records={})


def raw_input_model(model: keras.Model, schema: Schema) -> keras.Model:
    """``model`` behind the schema's preprocessing: a model of the CSV's raw values."""
    inputs = {
        c.input_name: keras.Input(
            shape=(), dtype="float32" if c.kind == "numeric" else "string", name=c.input_name
        )
        for c in schema.columns
    }
    features = RawFeatures(
        schema_json=_feature_schema(schema).to_json(),
        vector=input_form(model).vector,
        schema=schema,
        name=RAW_FEATURES_LAYER,
    )(inputs)
    raw = keras.Model(inputs, model(features), name="raw_input_model")
    if model.compiled:  # so that the loaded model evaluates at once, as model() compiled it
        # An optimizer of its own: saving writes a shared one once, for the inner model.
        optimizer = keras.optimizers.deserialize(keras.optimizers.serialize(model.optimizer))
        raw.compile(**{**model._compile_config.config, "optimizer": optimizer})
    return raw


def servable_model(model: keras.Model, definition: ModelDefinition) -> keras.Model:
    """What ``model.keras`` holds for ``model``, trained from ``definition``: the raw-input
    model with the default feed, else ``model`` itself."""
    if serves_raw_inputs(definition):
        return raw_input_model(model, definition.schema)
    return model


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputHead:
    """Turns the model's outputs into the signatures' named outputs.

    For a class label, ``logits`` says whether the outputs are logits (else probabilities);
    one output column is the probability (or logit) of the label vocabulary's second class.
    """

    classes: list[str] | None  # None: a numeric label
    logits: bool = False

    def __call__(self, outputs: tf.Tensor) -> dict[str, tf.Tensor]:
        outputs = tf.cast(outputs, tf.float32)
        if self.classes is None:
            if outputs.shape.rank == 2 and outputs.shape[1] == 1:
                outputs = outputs[:, 0]
            return {"predictions": outputs}
        # One row per example, the width known statically where the model's is: a reshape to
        # [batch, -1] would lose it, and read one logit as one class of a softmax.
        per_example = outputs.shape[1:]
        width = per_example.num_elements() if per_example.is_fully_defined() else -1
        outputs = tf.reshape(outputs, [-1, width])
        if outputs.shape[1] == 1:
            positive = tf.sigmoid(outputs) if self.logits else outputs
            probabilities = tf.concat([1.0 - positive, positive], axis=1)
        else:
            probabilities = tf.nn.softmax(outputs) if self.logits else outputs
        class_ids = tf.argmax(probabilities, axis=1)
        classes = tf.gather(tf.constant(self.classes, tf.string), class_ids)
        return {"probabilities": probabilities, "class_ids": class_ids, "classes": classes}


def probe_rows(schema: Schema, rows: int = PROBE_ROWS) -> dict[str, np.ndarray]:
    """Raw rows drawn from the schema's statistics (seeded): each column's values around its
    mean, or its vocabulary with an unseen value; keyed by input name."""
    rng = np.random.default_rng(0)
    batch = {}
    for column in schema.columns:
        if column.kind == "numeric":
            values = column.mean + column.std * rng.standard_normal(rows)
            batch[column.input_name] = values.astype(np.float32)
        else:
            known = [] if column.hashed else schema.vocabulary(column, limit=rows - 1)
            choices = [*known, "a value not in the vocabulary"]
            batch[column.input_name] = np.array([choices[i % len(choices)] for i in range(rows)])
    return batch


def output_head(raw_model: keras.Model, schema: Schema) -> OutputHead:
    """The head for ``raw_model``'s outputs. A classifier's outputs are probabilities when,
    over :func:`probe_rows`, all lie in [0, 1] and (two or more columns) each row sums to 1;
    otherwise they are logits."""
    if schema.label_kind != "class":
        return OutputHead(classes=None)
    outputs = np.asarray(raw_model(probe_rows(schema), training=False), dtype=np.float64)
    outputs = outputs.reshape(len(outputs), -1)
    in_unit = outputs.min() >= 0.0 and outputs.max() <= 1.0
    sums_to_one = outputs.shape[1] == 1 or np.allclose(outputs.sum(axis=1), 1.0, atol=1e-3)
    return OutputHead(classes=schema.label_vocabulary, logits=not (in_unit and sums_to_one))


def _raw_spec(schema: Schema) -> dict[str, tf.TensorSpec]:
    """``predict_raw``'s input: one ``[batch]`` tensor per column, keyed by its input name
    (a signature's keys must be valid op names; the CSV's name where it is one)."""
    return {
        c.input_name: tf.TensorSpec(
            [None], tf.float32 if c.kind == "numeric" else tf.string, name=c.input_name
        )
        for c in schema.columns
    }


def raw_examples(examples: tf.Tensor, schema: Schema) -> dict[str, tf.Tensor]:
    """The raw values of serialized records ``examples``, keyed by input name, as the
    raw-input model takes them: an absent feature is an empty cell (NaN for a number, ``""``
    for a category); the label, if present, is left out."""
    spec = {
        c.name: tf.io.FixedLenFeature([], tf.float32, float("nan"))
        if c.kind == "numeric"
        else tf.io.FixedLenFeature([], tf.string, "")
        for c in schema.columns
    }
    parsed = tf.io.parse_example(examples, spec)
    return {c.input_name: parsed[c.name] for c in schema.columns}


def export_saved_model(raw_model: keras.Model, schema: Schema, path: str) -> None:
    """Writes ``raw_model`` (from :func:`raw_input_model`) as a SavedModel at the local
    ``path``, with the signatures ``serving_default`` and ``predict_raw``."""
    head = output_head(raw_model, schema)

    def serve_examples(examples: tf.Tensor) -> dict[str, tf.Tensor]:
        return head(raw_model(raw_examples(examples, schema), training=False))

    def predict_raw(features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return head(raw_model(features, training=False))

    archive = keras.export.ExportArchive()
    archive.track(raw_model)
    for table in raw_model.get_layer(RAW_FEATURES_LAYER).tables:
        archive.track(table)
    archive.add_endpoint(
        "serving_default",
        serve_examples,
        input_signature=[tf.TensorSpec([None], tf.string, name=EXAMPLES_INPUT)],
    )
    archive.add_endpoint("predict_raw", predict_raw, input_signature=[_raw_spec(schema)])
    archive.write_out(path, verbose=False)


def load_trained_model(definition: ModelDefinition, model_file: str) -> keras.Model:
    """The trained model (taking the feed's features) of the local ``model_file`` that
    :func:`save_servable` wrote for ``definition``.

    The file holds the raw-input model, so one is built around the model to read it. Its
    serving layer has no weights, only lookup tables, which reading does not use: it is
    built over the schema with each column cut to one id (but for one-hot columns, whose
    width is the model's input), not with tables as large as the model's own."""
    from elastic_step.model.keras_parts import build_compiled_optimizer

    model = definition.build_model()
    build_compiled_optimizer(model)  # as saved
    scratch = storage.local_temp_dir()
    try:
        reader = definition
        if definition.schema is not None and not definition.schema.one_hot:
            reader = definition.with_schema(definition.schema.with_ids_cut(1, scratch))
        servable = servable_model(model, reader)
        build_compiled_optimizer(servable)
        servable.load_weights(model_file)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return model


def save_servable(model: keras.Model, definition: ModelDefinition, directory: str) -> None:
    """Writes ``model.keras`` and ``saved_model/`` for ``model`` into the local
    ``directory``: the raw-input model and its signatures, or, with a feed() of the
    definition's own, the trained model as Keras exports it."""
    from elastic_step.model.keras_parts import build_compiled_optimizer
    from elastic_step.output_layout import MODEL_FILE, SAVED_MODEL_DIR

    servable = servable_model(model, definition)
    build_compiled_optimizer(servable)
    servable.save(os.path.join(directory, MODEL_FILE))
    saved_model = os.path.join(directory, SAVED_MODEL_DIR)
    if servable is model:
        log.info(
            "the model definition has a feed() of its own: model.keras and saved_model/ take "
            "the feed's features, not the CSV's values"
        )
        model.export(saved_model, format="tf_saved_model", verbose=False)
    else:
        export_saved_model(servable, definition.schema, saved_model)


def save_trained_model(
    model: keras.Model,
    definition: ModelDefinition,
    output: str,
    on_written: Callable[[], None] = lambda: None,
) -> None:
    """Writes ``model.keras`` and ``saved_model/`` (:func:`save_servable`) into the job's
    ``output`` through the storage layer, each by an atomic rename: a save run twice, or
    after one that died midway, leaves the same files. ``on_written`` is called when both are
    written locally and when both are in ``output`` (the save's progress)."""
    from elastic_step.model.keras_parts import build_compiled_optimizer
    from elastic_step.output_layout import MODEL_FILE, SAVED_MODEL_DIR, OutputLayout

    # A compiled model is saved with its compile() settings: keras.models.load_model gives a
    # model that evaluates at once.
    build_compiled_optimizer(model)
    scratch = storage.local_temp_dir()
    try:
        # The export logs "Assets written to <scratch dir>" twice, naming a directory about
        # to be removed.
        tf_log = logging.getLogger("tensorflow")
        level = tf_log.level
        tf_log.setLevel(logging.WARNING)
        try:
            save_servable(model, definition, scratch)
        finally:
            tf_log.setLevel(level)
        on_written()
        paths = OutputLayout(output)
        # Streamed: the file holds every table of the model.
        with (
            open(os.path.join(scratch, MODEL_FILE), "rb") as source,
            storage.open_atomic(paths.model_file) as target,
        ):
            shutil.copyfileobj(source, target, 1 << 20)
        with storage.atomic_directory(paths.saved_model) as target:
            storage.copy_tree(os.path.join(scratch, SAVED_MODEL_DIR), target)
        on_written()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def trained_model_of(model_dir: str, definition: ModelDefinition) -> keras.Model:
    """The model that training wrote to ``model_dir`` (taking the feed's features): built by
    ``definition`` (its copy of the model definition), with the weights of its
    ``model.keras``."""
    from elastic_step.output_layout import MODEL_FILE, OutputLayout

    scratch = storage.local_temp_dir()
    try:
        local_model = f"{scratch}/{MODEL_FILE}"
        with (
            storage.open_file(OutputLayout(model_dir).model_file) as source,
            open(local_model, "wb") as f,
        ):
            shutil.copyfileobj(source, f, 1 << 20)
        return load_trained_model(definition, local_model)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
