"""The default feed, and the dataset builder a worker uses for each task.

A *feed* is a function ``feed(dataset, mode, schema) -> tf.data.Dataset`` whose input yields
batches of serialized ``tf.train.Example`` records (1-D ``tf.string`` tensors) and whose output
yields what the model trains on. The default feed returns ``(features, labels)`` where
``features`` maps each column name to a ``[batch]`` tensor: numeric columns standardized
``(x - mean) / std`` as float32, categorical columns as int64 vocabulary ids (unknown values
map to the out-of-vocabulary id ``V``). Labels are float32 ``[batch]`` for a numeric label and
int64 class ids ``[batch]`` for a class label.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref
from collections.abc import Callable

import tensorflow as tf

from elastic_step.data.schema import Schema

MODES = ("train", "evaluate", "predict")
MISSING_CLASS_ID = -1  # class id of a record with no (or an unknown) label

Feed = Callable[[tf.data.Dataset, str, Schema], tf.data.Dataset]


def check_mode(mode: str) -> None:
    """A ValueError unless ``mode`` is ``train``, ``evaluate`` or ``predict``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def _lookup_table(keys: list[str], default: int) -> tf.lookup.StaticHashTable:
    init = tf.lookup.KeyValueTensorInitializer(
        keys=tf.constant(keys, dtype=tf.string),
        values=tf.range(len(keys), dtype=tf.int64),
    )
    return tf.lookup.StaticHashTable(init, default_value=tf.constant(default, dtype=tf.int64))


class DefaultFeed:
    """The default feed for one schema; it builds its lookup tables once.

    In ``predict`` mode the label may be absent from the records; it is still returned, as
    class id -1 (class label) or NaN (numeric label) for records without one, so the element
    structure is ``(features, labels)`` in every mode (Keras ``predict`` ignores the labels).
    """

    def __init__(self, schema: Schema) -> None:
        # Copies, not the schema itself: the cache below must not keep a schema alive.
        self.columns = [dataclasses.replace(c) for c in schema.columns]
        self.label = schema.label
        self.label_kind = schema.label_kind
        self._tables: dict[str, tf.lookup.StaticHashTable] = {}
        for column in self.columns:
            if column.kind == "categorical":
                vocab = column.vocabulary or []
                self._tables[column.name] = _lookup_table(vocab, default=len(vocab))
        self._label_table = None
        self._parsers: dict[str, object] = {}
        if schema.label_kind == "class":
            self._label_table = _lookup_table(
                schema.label_vocabulary or [], default=MISSING_CLASS_ID
            )

    def _spec(self, mode: str) -> dict[str, tf.io.FixedLenFeature]:
        spec = {}
        for column in self.columns:
            dtype = tf.float32 if column.kind == "numeric" else tf.string
            spec[column.name] = tf.io.FixedLenFeature([], dtype)
        # Only predict tolerates records without a label; elsewhere a missing one is an error.
        if self.label_kind == "class":
            default = "" if mode == "predict" else None
            spec[self.label] = tf.io.FixedLenFeature([], tf.string, default)
        else:
            default = float("nan") if mode == "predict" else None
            spec[self.label] = tf.io.FixedLenFeature([], tf.float32, default)
        return spec

    def _features(self, parsed: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        features = {}
        numeric = [c for c in self.columns if c.kind == "numeric"]
        if numeric:
            # One stacked op instead of two per column keeps tracing cheap for wide data; a
            # dataset is built per task.
            means = tf.constant([c.mean or 0.0 for c in numeric], tf.float32)
            stds = tf.constant([c.std or 1.0 for c in numeric], tf.float32)
            stacked = tf.stack([parsed[c.name] for c in numeric], axis=1)
            standardized = tf.unstack((stacked - means) / stds, num=len(numeric), axis=1)
            features.update({c.name: t for c, t in zip(numeric, standardized, strict=True)})
        for column in self.columns:
            if column.kind == "categorical":
                features[column.name] = self._tables[column.name].lookup(parsed[column.name])
        return {c.name: features[c.name] for c in self.columns}  # in CSV order

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
        def parse(serialized: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
            parsed = tf.io.parse_example(serialized, spec)
            features = self._features(parsed)
            labels = parsed[label]
            if self._label_table is not None:
                labels = self._label_table.lookup(labels)
            return features, labels

        return parse


_CACHE_LOCK = threading.Lock()
_CACHE: dict[int, tuple[weakref.ref, DefaultFeed]] = {}


def default_feed_for(schema: Schema) -> DefaultFeed:
    """The cached :class:`DefaultFeed` of ``schema`` (one per live schema object)."""
    key = id(schema)
    with _CACHE_LOCK:
        entry = _CACHE.get(key)
        # The weak reference guards against a dead schema's id being reused.
        if entry is not None and entry[0]() is schema:
            return entry[1]
        feed = DefaultFeed(schema)
        _CACHE[key] = (weakref.ref(schema, functools.partial(_forget, key)), feed)
        return feed


def _forget(key: int, ref: weakref.ref) -> None:
    """Drops a dead schema's feed. No lock: a collection may run this while the lock is held;
    single dict operations are atomic."""
    entry = _CACHE.get(key)
    if entry is not None and entry[0] is ref:
        _CACHE.pop(key, None)


def default_feed(dataset: tf.data.Dataset, mode: str, schema: Schema) -> tf.data.Dataset:
    """The default feed (see the module docstring); ``mode`` is train, evaluate or predict."""
    check_mode(mode)
    return default_feed_for(schema)(dataset, mode)


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


def apply_feed(
    feed: Feed | None, batches: tf.data.Dataset, mode: str, schema: Schema
) -> tf.data.Dataset:
    """``feed`` (default: :func:`default_feed`) applied to ``batches`` of serialized records,
    prefetched. A TypeError with a clear message if it does not return a ``tf.data.Dataset``.
    """
    check_mode(mode)
    fn = feed or default_feed
    result = fn(batches, mode, schema)
    if not isinstance(result, tf.data.Dataset):
        name = getattr(fn, "__qualname__", None) or type(fn).__name__
        raise TypeError(
            f"the feed {name} returned {type(result).__name__}, expected a tf.data.Dataset "
            "(a feed maps a dataset of serialized record batches to model inputs)"
        )
    return result.prefetch(tf.data.AUTOTUNE)
