"""The embedding benchmark's model: wide and deep over an id column with a large table.

Columns: ``item`` (an id in ``0..BENCH_TABLE_ROWS-1``, stored as a number) and numeric
``f0..f{N-1}``; a binary label. Deep: the item's ``BENCH_TABLE_DIM``-wide embedding with the
numeric columns through two dense layers. Wide: a linear term on the numeric columns.

The feed is the default one, except that ``item`` goes back from its standardized value to
the integer id (float32 holds ids below 2**24 exactly). Environment variables, set by
bench/embedding.py and inherited by the training processes: ``BENCH_TABLE_ROWS`` (1,000,000),
``BENCH_TABLE_DIM`` (16), ``BENCH_FEATURES`` (8), ``BENCH_OPTIMIZER`` (adam or sgd).
"""

import os

import keras
import tensorflow as tf

ROWS = int(os.environ.get("BENCH_TABLE_ROWS", "1000000"))
DIM = int(os.environ.get("BENCH_TABLE_DIM", "16"))
FEATURES = [f"f{i}" for i in range(int(os.environ.get("BENCH_FEATURES", "8")))]
OPTIMIZER = os.environ.get("BENCH_OPTIMIZER", "adam")


def model() -> keras.Model:
    item = keras.Input(shape=(), name="item", dtype="int64")
    numeric = {name: keras.Input(shape=(), name=name) for name in FEATURES}
    dense = keras.layers.Concatenate()([keras.layers.Reshape((1,))(numeric[n]) for n in FEATURES])
    embedded = keras.layers.Embedding(ROWS, DIM, name="item_embedding")(item)
    deep = keras.layers.Concatenate()([embedded, dense])
    deep = keras.layers.Dense(64, activation="relu")(deep)
    deep = keras.layers.Dense(1)(deep)
    wide = keras.layers.Dense(1)(dense)
    return keras.Model({"item": item, **numeric}, keras.layers.Add()([deep, wide]))


def loss(labels, outputs):
    labels = keras.ops.cast(keras.ops.reshape(labels, (-1, 1)), "float32")
    return keras.ops.mean(keras.losses.binary_crossentropy(labels, outputs, from_logits=True))


def optimizer():
    if OPTIMIZER == "sgd":
        return keras.optimizers.SGD(0.05)
    return keras.optimizers.Adam(0.001)


def metrics():
    return {"accuracy": keras.metrics.BinaryAccuracy(threshold=0.0)}


def feed(dataset, mode, schema):
    from elastic_step.data.feed import default_feed

    column = next(c for c in schema.columns if c.name == "item")

    def item_ids(features, labels):
        raw = tf.round(features["item"] * column.std + column.mean)
        return {**features, "item": tf.cast(raw, tf.int64)}, labels

    return default_feed(dataset, mode, schema).map(item_ids)
