"""The default feed and the per-task dataset builder."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from vocabulary_files import categorical, schema_with

from elastic_step.data import feed as feed_module
from elastic_step.data.feed import (
    DefaultFeed,
    default_feed,
    default_feed_for,
    make_dataset,
    records_dataset,
)
from elastic_step.data.preprocess import preprocess
from elastic_step.data.schema import Column, Schema
from elastic_step.data.tfrecord import read_records
from elastic_step.errors import InputError


def _example(**values: float | str) -> bytes:  # keys may be any CSV column name
    feature = {}
    for name, value in values.items():
        if isinstance(value, str):
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
        else:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _schema(label_kind: str = "class") -> Schema:
    return schema_with(
        lambda directory: [
            Column(name="x", kind="numeric", mean=10.0, std=4.0),
            categorical(directory, "color", ["red", "blue"]),
        ],
        label="y",
        label_kind=label_kind,  # type: ignore[arg-type]
        label_vocabulary=["cat", "dog"] if label_kind == "class" else None,
    )


def test_standardization_ids_and_class_labels() -> None:
    schema = _schema("class")
    records = [
        _example(x=14.0, color="red", y="dog"),
        _example(x=2.0, color="blue", y="cat"),
        _example(x=10.0, color="purple", y="dog"),  # purple is out of vocabulary
    ]
    ((features, labels),) = list(make_dataset(records, batch_size=8, mode="train", schema=schema))
    assert features["x"].dtype == tf.float32
    np.testing.assert_allclose(features["x"].numpy(), [1.0, -2.0, 0.0])
    assert features["color"].dtype == tf.int64
    assert features["color"].numpy().tolist() == [0, 1, 2]  # OOV id = V = 2
    assert labels.dtype == tf.int64
    assert labels.numpy().tolist() == [1, 0, 1]


def test_numeric_label_and_batching() -> None:
    schema = _schema("numeric")
    records = [_example(x=float(i), color="red", y=i * 0.5) for i in range(5)]
    batches = list(make_dataset(records, batch_size=2, mode="evaluate", schema=schema))
    assert [b[1].shape[0] for b in batches] == [2, 2, 1]
    labels = np.concatenate([b[1].numpy() for b in batches])
    assert batches[0][1].dtype == tf.float32
    np.testing.assert_allclose(labels, [0, 0.5, 1, 1.5, 2])
    assert batches[0][0]["x"].shape == (2,)


def test_predict_without_labels() -> None:
    records = [_example(x=1.0, color="red")]
    ((_, labels),) = list(make_dataset(records, batch_size=4, mode="predict", schema=_schema()))
    assert labels.numpy().tolist() == [-1]
    ((_, labels),) = list(
        make_dataset(records, batch_size=4, mode="predict", schema=_schema("numeric"))
    )
    assert np.isnan(labels.numpy()[0])
    with pytest.raises(tf.errors.InvalidArgumentError):
        list(make_dataset(records, batch_size=4, mode="train", schema=_schema()))


def test_bad_mode_and_batch_size() -> None:
    ds = records_dataset([b""], 1)
    with pytest.raises(ValueError, match="mode must be one of train, evaluate, predict"):
        default_feed(ds, "fit", _schema())
    with pytest.raises(ValueError, match="mode must be one of"):
        make_dataset([], batch_size=1, mode="test", schema=_schema())
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        records_dataset([], 0)


def test_records_dataset() -> None:
    batches = [b.numpy().tolist() for b in records_dataset([b"a", b"b", b"c"], 2)]
    assert batches == [[b"a", b"b"], [b"c"]]
    assert list(records_dataset([], 3)) == []


def test_custom_feed_and_its_type_check() -> None:
    def feed(dataset: tf.data.Dataset, mode: str, schema: Schema) -> tf.data.Dataset:
        return dataset.map(lambda batch: tf.strings.length(batch))

    ds = make_dataset([b"ab", b"c"], batch_size=2, mode="train", schema=_schema(), feed=feed)
    assert [b.numpy().tolist() for b in ds] == [[2, 1]]

    def broken(dataset: tf.data.Dataset, mode: str, schema: Schema) -> list[int]:
        return [1]

    with pytest.raises(TypeError, match=r"the feed .*broken returned list, expected a tf\.data"):
        make_dataset([b"x"], batch_size=1, mode="train", schema=_schema(), feed=broken)


def test_feed_is_cached_per_schema() -> None:
    schema = _schema()
    first = default_feed_for(schema)
    assert default_feed_for(schema) is first
    other = _schema()
    assert default_feed_for(other) is not first
    key = id(other)
    del other
    assert key not in feed_module._CACHE  # dropped with its schema
    assert isinstance(first, DefaultFeed)


def test_keras_model_fits_on_preprocessed_data(small_csv: str, tmp_path: Path) -> None:
    """A functional model with one named shape=() input per column trains on the default
    feed's output, end to end from a CSV."""
    out = str(tmp_path / "data")
    schema = preprocess(input_path=small_csv, label="digit", output=out, shards=2)
    (path, n), _ = schema.shard_paths(out, "train")
    records = read_records(path, 0, n)

    inputs, parts = {}, []
    for column in schema.columns:
        if column.kind == "numeric":
            inputs[column.name] = keras.Input(shape=(), name=column.name, dtype="float32")
            parts.append(keras.ops.expand_dims(inputs[column.name], -1))
        else:
            inputs[column.name] = keras.Input(shape=(), name=column.name, dtype="int64")
            parts.append(keras.layers.Embedding(column.num_ids, 3)(inputs[column.name]))
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()(parts))
    outputs = keras.layers.Dense(schema.num_classes)(hidden)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )

    dataset = make_dataset(records, batch_size=n, mode="train", schema=schema)
    history = model.fit(dataset, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][0])
    predictions = model.predict(
        make_dataset(records, batch_size=8, mode="predict", schema=schema), verbose=0
    )
    assert predictions.shape == (n, 3)


# --- the two input forms, one-hot, fill values and input names ------------------------------


def _wide_schema(one_hot: bool = False) -> Schema:
    return schema_with(
        lambda directory: [
            Column(
                name="od/280", kind="numeric", mean=10.0, std=4.0, input_name="od_280", fill=10.0
            ),
            categorical(directory, "color", ["red", "blue"]),
            Column(
                name="fixed acidity",
                kind="numeric",
                mean=1.0,
                std=2.0,
                input_name="fixed_acidity",
                fill=0.0,
            ),
        ],
        label="y",
        label_kind="class",
        label_vocabulary=["cat", "dog"],
        one_hot=one_hot,
    )


WIDE_RECORDS = [
    _example(**{"od/280": 14.0, "color": "blue", "fixed acidity": 5.0, "y": "dog"}),
    _example(**{"color": "green", "y": "cat"}),  # both numbers missing: their fill values
]


def test_columns_form_keys_by_input_name_and_fills_missing_values() -> None:
    ((features, _),) = list(
        make_dataset(WIDE_RECORDS, batch_size=2, mode="evaluate", schema=_wide_schema())
    )
    assert list(features) == ["od_280", "color", "fixed_acidity"]
    np.testing.assert_allclose(features["od_280"].numpy(), [1.0, 0.0])  # fill 10 = the mean
    np.testing.assert_allclose(features["fixed_acidity"].numpy(), [2.0, -0.5])  # fill 0
    assert features["color"].numpy().tolist() == [1, 2]

    ((features, _),) = list(
        make_dataset(WIDE_RECORDS, batch_size=2, mode="evaluate", schema=_wide_schema(True))
    )
    assert features["color"].numpy().tolist() == [[0, 1, 0], [0, 0, 1]]  # one-hot of V + 1


def test_vector_form_stacks_columns_in_schema_order() -> None:
    for one_hot, expected in (
        (False, [[1.0, 1.0, 2.0], [0.0, 2.0, -0.5]]),
        (True, [[1.0, 0, 1, 0, 2.0], [0.0, 0, 0, 1, -0.5]]),
    ):
        schema = _wide_schema(one_hot)
        assert feed_module.vector_width(schema) == len(expected[0])
        form = feed_module.InputForm(vector=True, width=len(expected[0]))
        batches = feed_module.default_feed(
            records_dataset(WIDE_RECORDS, 2), "train", schema, form=form
        )
        ((vector, labels),) = list(batches)
        assert vector.dtype == tf.float32
        np.testing.assert_allclose(vector.numpy(), expected)
        assert labels.numpy().tolist() == [1, 0]


def test_input_form_of_models_and_width_check() -> None:
    sequential = keras.Sequential([keras.Input(shape=(3,)), keras.layers.Dense(2)])
    assert feed_module.input_form(sequential) == feed_module.InputForm(vector=True, width=3)
    assert feed_module.input_form(keras.Sequential([keras.layers.Dense(2)])).vector
    named = {"od_280": keras.Input(shape=(), name="od_280"), "c": keras.Input(shape=(), name="c")}
    joined = keras.layers.Concatenate()([keras.layers.Reshape((1,))(t) for t in named.values()])
    functional = keras.Model(named, keras.layers.Dense(1)(joined))
    assert feed_module.input_form(functional) == feed_module.COLUMNS

    class Subclassed(keras.Model):
        def call(self, inputs):
            return inputs["od_280"]

    assert feed_module.input_form(Subclassed()) == feed_module.COLUMNS

    feed = feed_module.default_feed_for_model(sequential)
    with pytest.raises(
        InputError,
        match=r"the model's input takes vectors of 3 values, but the default feed makes 5 per "
        r"record: 2 numeric columns and 1 categorical ones \(num_ids floats "
        r"\(--one-hot\) each\); give keras.Input\(shape=\(5,\)\)",
    ):
        feed(records_dataset(WIDE_RECORDS, 2), "train", _wide_schema(one_hot=True))
    ((vector, _),) = list(feed(records_dataset(WIDE_RECORDS, 2), "train", _wide_schema()))
    assert sequential(vector).shape == (2, 2)
