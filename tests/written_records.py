"""What preprocess wrote, read back with TensorFlow's own parser: a record's values, and a
split's records, as the tests compare them."""

from __future__ import annotations

import tensorflow as tf

from elastic_step.data.schema import Schema
from elastic_step.data.tfrecord import read_records


def example_values(record: bytes, *, text: bool = True) -> dict[str, object]:
    """A tf.train.Example of one value per feature as {name: value}; with ``text``, bytes are
    decoded."""
    values = {}
    for name, feature in tf.train.Example.FromString(record).features.feature.items():
        kind = feature.WhichOneof("kind")
        (value,) = getattr(feature, kind).value
        values[name] = value.decode() if text and kind == "bytes_list" else value
    return values


def split_rows(schema: Schema, out: str, split: str) -> list[dict[str, object]]:
    """Every record of ``split`` under ``out``, in shard order, as :func:`example_values`."""
    return [
        example_values(record)
        for path, n in schema.shard_paths(out, split)
        for record in read_records(path, 0, n)
    ]
