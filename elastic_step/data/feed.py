"""The default feed, and the dataset builder a worker uses for each task.

A *feed* is a function ``feed(dataset, mode, schema) -> tf.data.Dataset`` whose input yields
batches of serialized ``tf.train.Example`` records (1-D ``tf.string`` tensors) and whose output
yields what the model trains on. The default feed returns ``(features, labels)``:

- numeric columns standardized ``(x - mean) / std`` as float32, an absent value read as the
  column's ``fill`` first;
- categorical columns as int64 ids, ``0..num_ids-1`` (:mod:`elastic_step.data.schema`): looked
  up in a TF table loaded from the column's vocabulary file, unknown values hashed into its
  out-of-vocabulary ids; or, for a hashed column, its value hashed. With ``Schema.one_hot``,
  float32 one-hot vectors of ``num_ids``;
- labels: float32 ``[batch]`` for a numeric label, int64 class ids ``[batch]`` for a class
  label.

It gives the features in one of two forms (:class:`InputForm`), the one the model takes:

- *columns*: a dict from each column's input name to its ``[batch]`` tensor (``[batch, V+1]``
  one-hot), for a model with one named ``keras.Input`` per column;
- *vector*: one float32 ``[batch, width]`` tensor, the columns side by side in schema order
  (an id as one float, a one-hot vector as ``num_ids``), for a model with one
  ``keras.Input(shape=(width,))``, such as a plain ``keras.Sequential``.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import shutil
import threading
import weakref
from collections.abc import Callable

import tensorflow as tf

from elastic_step.data import storage
from elastic_step.data.schema import Column, Schema
from elastic_step.errors import InputError

MODES = ("train", "evaluate", "predict")
MISSING_CLASS_ID = -1  # class id of a record with no (or an unknown) label

Feed = Callable[[tf.data.Dataset, str, Schema], tf.data.Dataset]


@dataclasses.dataclass(frozen=True, kw_only=True)
class InputForm:
    """The form of the default feed's features: a dict of columns, or one ``vector`` whose
    ``width`` (when known) must match the schema's."""

    vector: bool = False
    width: int | None = None


COLUMNS = InputForm()


def input_form(model) -> InputForm:
    """The form that the Keras ``model`` takes: a vector when it has exactly one input of
    shape ``(batch, n)``, or is a ``Sequential`` not built yet; else columns."""
    import keras

    try:
        inputs = model.inputs
    except (AttributeError, ValueError):  # a subclassed model, or a Sequential without Input
        inputs = None
    if not inputs:
        return InputForm(vector=isinstance(model, keras.Sequential))
    if len(inputs) == 1 and len(inputs[0].shape) == 2:
        return InputForm(vector=True, width=inputs[0].shape[1])
    return COLUMNS


def vector_width(schema: Schema) -> int:
    """Floats per example in the vector form of ``schema``'s features."""
    return sum(
        c.num_ids if c.kind == "categorical" and schema.one_hot else 1 for c in schema.columns
    )


def check_mode(mode: str) -> None:
    """A ValueError unless ``mode`` is ``train``, ``evaluate`` or ``predict``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def vocabulary_table(path: str, size: int, oov_buckets: int) -> tf.lookup.StaticVocabularyTable:
    """The ids of a vocabulary file (:mod:`elastic_step.data.vocabulary`) at the local
    ``path``: its ``size`` entries ``0..size-1`` by line, other values hashed into
    ``oov_buckets`` ids after them. TF reads the file itself, and checks its size.

    One table per file while any user holds it (a feed, the serving layer): the table is
    anonymous, so it is freed with its last reference. A named one would stay in TF's
    resource manager for the life of the process, and a vocabulary of millions of values
    is hundreds of MB."""
    if not tf.executing_eagerly():  # a graph's table belongs to that graph
        return _new_vocabulary_table(path, size, oov_buckets)
    try:  # a file written again since (a preprocess run again in place) is another table
        written = os.stat(path).st_mtime_ns
    except OSError:
        written = None
    key = (path, written, size, oov_buckets)
    with _tables_lock:
        table = _tables.get(key)
        if table is None:
            table = _tables[key] = _new_vocabulary_table(path, size, oov_buckets)
        return table


_tables: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_tables_lock = threading.Lock()


def _new_vocabulary_table(
    path: str, size: int, oov_buckets: int
) -> tf.lookup.StaticVocabularyTable:
    if size == 0:  # TF's reader refuses a file without lines
        initializer = tf.lookup.KeyValueTensorInitializer(
            tf.constant([], tf.string), tf.constant([], tf.int64)
        )
    else:
        initializer = tf.lookup.TextFileInitializer(
            path,
            key_dtype=tf.string,
            key_index=0,
            value_dtype=tf.int64,
            value_index=tf.lookup.TextFileIndex.LINE_NUMBER,
            vocab_size=size,
            delimiter="\t",
        )
    return tf.lookup.StaticVocabularyTable(
        initializer, num_oov_buckets=oov_buckets, experimental_is_anonymous=True
    )


_local_copies: dict[str, str] = {}
_local_copies_lock = threading.Lock()


def local_vocabulary(schema: Schema, column: Column) -> str:
    """A local path of ``column``'s vocabulary file: where it is, or a copy of it for the
    life of the process when it is in object storage (TF reads local files only)."""
    path = schema.vocabulary_path(column)
    if storage.is_local(path):
        return storage.local_path(path)
    with _local_copies_lock:
        if path not in _local_copies:
            directory = storage.local_temp_dir("elastic-step-vocabulary-")
            atexit.register(shutil.rmtree, directory, True)
            _local_copies[path] = storage.fetch(path, directory)
        return _local_copies[path]


def _lookup_table(keys: list[str], default: int) -> tf.lookup.StaticHashTable:
    init = tf.lookup.KeyValueTensorInitializer(
        keys=tf.constant(keys, dtype=tf.string),
        values=tf.range(len(keys), dtype=tf.int64),
    )
    return tf.lookup.StaticHashTable(init, default_value=tf.constant(default, dtype=tf.int64))


def _check_width(schema: Schema, form: InputForm) -> None:
    width = vector_width(schema)
    if form.width is None or form.width == width:
        return
    categorical = sum(c.kind == "categorical" for c in schema.columns)
    each = "num_ids floats (--one-hot)" if schema.one_hot else "one id"
    raise InputError(
        f"the model's input takes vectors of {form.width} values, but the default feed makes "
        f"{width} per record: {len(schema.columns) - categorical} numeric columns and "
        f"{categorical} categorical ones ({each} each); give keras.Input(shape=({width},))"
    )


class DefaultFeed:
    """The default feed for one schema and input form; it builds its lookup tables once.

    In ``predict`` mode the label may be absent from the records; it is still returned, as
    class id -1 (class label) or NaN (numeric label) for records without one, so the element
    structure is ``(features, labels)`` in every mode (Keras ``predict`` ignores the labels).
    """

    def __init__(self, schema: Schema, form: InputForm = COLUMNS) -> None:
        if form.vector:
            _check_width(schema, form)
        # Copies, not the schema itself: the cache below must not keep a schema alive.
        self.columns = [dataclasses.replace(c) for c in schema.columns]
        self.label = schema.label
        self.label_kind = schema.label_kind
        self.one_hot = schema.one_hot
        self.form = form
        self._tables: dict[str, tf.lookup.StaticVocabularyTable] = {}
        for column in self.columns:
            if column.kind == "categorical" and not column.hashed:
                self._tables[column.name] = vocabulary_table(
                    local_vocabulary(schema, column),
                    column.vocabulary_size or 0,
                    column.oov_buckets or 1,
                )
        self._label_table = None
        self._parsers: dict[str, object] = {}
        if schema.label_kind == "class":
            self._label_table = _lookup_table(
                schema.label_vocabulary or [], default=MISSING_CLASS_ID
            )

    def _spec(self, mode: str) -> dict[str, tf.io.FixedLenFeature]:
        spec = {}
        for column in self.columns:
            if column.kind == "numeric":
                spec[column.name] = tf.io.FixedLenFeature([], tf.float32, column.fill)
            else:
                spec[column.name] = tf.io.FixedLenFeature([], tf.string)
        # Only predict tolerates records without a label; elsewhere a missing one is an error.
        if self.label_kind == "class":
            default = "" if mode == "predict" else None
            spec[self.label] = tf.io.FixedLenFeature([], tf.string, default)
        else:
            default = float("nan") if mode == "predict" else None
            spec[self.label] = tf.io.FixedLenFeature([], tf.float32, default)
        return spec

    def _categorical(self, column: Column, parsed: dict[str, tf.Tensor]) -> tf.Tensor:
        if column.hashed:
            ids = tf.strings.to_hash_bucket_fast(parsed[column.name], column.num_ids)
        else:
            ids = self._tables[column.name].lookup(parsed[column.name])
        if self.one_hot:
            return tf.one_hot(ids, column.num_ids, dtype=tf.float32)
        return ids

    def features(self, parsed: dict[str, tf.Tensor]) -> dict[str, tf.Tensor] | tf.Tensor:
        """The features of ``parsed``: raw values keyed by the CSV's column names (numeric
        ones float32 ``[batch]`` with no value absent, categorical ones strings). The serving
        model (:mod:`elastic_step.model.serving`) calls it too, so serving encodes as training."""
        numeric = [c for c in self.columns if c.kind == "numeric"]
        standardized = None
        if numeric:
            # One stacked op instead of two per column keeps tracing cheap for wide data; a
            # dataset is built per task.
            means = tf.constant([c.mean or 0.0 for c in numeric], tf.float32)
            stds = tf.constant([c.std or 1.0 for c in numeric], tf.float32)
            stacked = tf.stack([parsed[c.name] for c in numeric], axis=1)
            standardized = (stacked - means) / stds
            if self.form.vector and len(numeric) == len(self.columns):
                return standardized
        if self.form.vector:
            parts, position = [], 0
            for column in self.columns:
                if column.kind == "numeric":
                    parts.append(standardized[:, position : position + 1])
                    position += 1
                else:
                    value = self._categorical(column, parsed)
                    parts.append(value if self.one_hot else tf.cast(value, tf.float32)[:, None])
            return tf.concat(parts, axis=1)
        features = {}
        if numeric:
            unstacked = tf.unstack(standardized, num=len(numeric), axis=1)
            features.update({c.name: t for c, t in zip(numeric, unstacked, strict=True)})
        for column in self.columns:
            if column.kind == "categorical":
                features[column.name] = self._categorical(column, parsed)
        return {c.input_name: features[c.name] for c in self.columns}  # in CSV order

    def __call__(self, dataset: tf.data.Dataset, mode: str) -> tf.data.Dataset:
        """Maps batches of serialized records to batches of ``(features, labels)``."""
        check_mode(mode)
        parse = self._parsers.get(mode)
        if parse is None:
            parse = self._parsers[mode] = self._parser(mode)
        return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def _parser(self, mode: str):
        """The parse function of ``mode``, traced once: a worker builds a dataset per task."""
        spec = self._spec(mode)
        label = self.label

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def parse(serialized: tf.Tensor) -> tuple[dict[str, tf.Tensor] | tf.Tensor, tf.Tensor]:
            parsed = tf.io.parse_example(serialized, spec)
            features = self.features(parsed)
            labels = parsed[label]
            if self._label_table is not None:
                labels = self._label_table.lookup(labels)
            return features, labels

        return parse


_CACHE_LOCK = threading.Lock()
_CACHE: dict[int, tuple[weakref.ref, dict[InputForm, DefaultFeed]]] = {}


def default_feed_for(schema: Schema, form: InputForm = COLUMNS) -> DefaultFeed:
    """The cached :class:`DefaultFeed` of ``schema`` and ``form`` (per live schema object)."""
    key = id(schema)
    with _CACHE_LOCK:
        entry = _CACHE.get(key)
        # The weak reference guards against a dead schema's id being reused.
        if entry is None or entry[0]() is not schema:
            entry = (weakref.ref(schema, functools.partial(_forget, key)), {})
            _CACHE[key] = entry
        feeds = entry[1]
        if form not in feeds:
            feeds[form] = DefaultFeed(schema, form)
        return feeds[form]


def release_feeds(schema: Schema) -> None:
    """Drops ``schema``'s cached feeds, and with them their lookup tables (anonymous: freed
    with their last reference), for a process done with them while the schema lives on."""
    with _CACHE_LOCK:
        entry = _CACHE.get(id(schema))
        if entry is not None and entry[0]() is schema:
            del _CACHE[id(schema)]


def _forget(key: int, ref: weakref.ref) -> None:
    """Drops a dead schema's feeds. No lock: a collection may run this while the lock is held;
    single dict operations are atomic."""
    entry = _CACHE.get(key)
    if entry is not None and entry[0] is ref:
        _CACHE.pop(key, None)


def default_feed(
    dataset: tf.data.Dataset, mode: str, schema: Schema, *, form: InputForm = COLUMNS
) -> tf.data.Dataset:
    """The default feed (see the module docstring); ``mode`` is train, evaluate or predict."""
    check_mode(mode)
    return default_feed_for(schema, form)(dataset, mode)


def default_feed_for_model(model) -> Feed:
    """The default feed, giving features in the form that the Keras ``model`` takes."""
    form = input_form(model)

    def feed(dataset: tf.data.Dataset, mode: str, schema: Schema) -> tf.data.Dataset:
        return default_feed(dataset, mode, schema, form=form)

    feed.__qualname__ = default_feed.__qualname__
    return feed


def records_dataset(records: list[bytes], batch_size: int) -> tf.data.Dataset:
    """Batches (1-D ``tf.string``) of the serialized records ``records``, in order; the last
    batch may be smaller."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    tensor = tf.constant(list(records), dtype=tf.string, shape=[len(records)])
    return tf.data.Dataset.from_tensor_slices(tensor).batch(batch_size)


def make_dataset(
    records: list[bytes],
    *,
    batch_size: int,
    mode: str,
    schema: Schema,
    feed: Feed | None = None,
) -> tf.data.Dataset:
    """``feed`` (default: :func:`default_feed`) applied to batches of ``records``, prefetched.

    A TypeError with a clear message if the feed does not return a ``tf.data.Dataset``.
    """
    return apply_feed(feed, records_dataset(records, batch_size), mode, schema)


class FeedReturnError(TypeError):
    """A feed returned something other than a ``tf.data.Dataset``; the message says what."""


def apply_feed(
    feed: Feed | None, batches: tf.data.Dataset, mode: str, schema: Schema
) -> tf.data.Dataset:
    """``feed`` (default: :func:`default_feed`) applied to ``batches`` of serialized records,
    prefetched. A :class:`FeedReturnError` if it does not return a ``tf.data.Dataset``.
    """
    check_mode(mode)
    fn = feed or default_feed
    result = fn(batches, mode, schema)
    if not isinstance(result, tf.data.Dataset):
        name = getattr(fn, "__qualname__", None) or type(fn).__name__
        raise FeedReturnError(
            f"the feed {name} returned {type(result).__name__}, expected a tf.data.Dataset "
            "(a feed maps a dataset of serialized record batches to model inputs)"
        )
    return result.prefetch(tf.data.AUTOTUNE)
