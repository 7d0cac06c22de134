"""Batch encoding of tf.train.Example records: TensorFlow's own parser reads what it wrote."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import tensorflow as tf
from written_records import example_values

from elastic_step.data.example_encoding import BytesColumn, FloatColumn, encode_examples


def test_records_parse_back_to_the_values() -> None:
    rng = np.random.default_rng(3)
    n = 300
    floats = rng.normal(scale=1e6, size=n)
    missing = rng.random(n) < 0.3
    # Values and keys long enough for 1-, 2- and 3-byte varint lengths, and non-ASCII text.
    texts = ["", "a", "é" * 70, "x" * 20000] * (n // 4)
    long_key = "k" * 200
    records = encode_examples(
        [
            FloatColumn(key="od280/od315 ratio", values=pa.array(floats, mask=missing)),
            BytesColumn(key="city name", values=pa.array(texts, pa.string())),
            FloatColumn(key=long_key, values=pa.array(np.arange(n, dtype=np.float64))),
        ]
    )
    assert len(records) == n
    for i, record in enumerate(records.to_pylist()):
        values = example_values(record, text=False)
        if missing[i]:
            assert "od280/od315 ratio" not in values
        else:
            assert values["od280/od315 ratio"] == np.float32(floats[i])
        assert values["city name"] == texts[i].encode()
        assert values[long_key] == i
        assert len(values) == 3 - missing[i]


def test_tensorflow_parses_a_batch() -> None:
    records = encode_examples(
        [
            FloatColumn(key="x", values=pa.array([1.5, None, -2.0])),
            BytesColumn(key="c", values=pa.array(["red", "", "blue"])),
        ]
    )
    spec = {
        "x": tf.io.FixedLenFeature([], tf.float32, default_value=9.0),
        "c": tf.io.FixedLenFeature([], tf.string),
    }
    parsed = tf.io.parse_example(tf.constant(records.to_pylist()), spec)
    assert parsed["x"].numpy().tolist() == [1.5, 9.0, -2.0]
    assert parsed["c"].numpy().tolist() == [b"red", b"", b"blue"]
