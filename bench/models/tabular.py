"""The quality benchmark's model: an MLP over any preprocessed table, built from its schema.

Numeric columns go in standardized (the default feed); each categorical column goes through an
embedding of ``BENCH_EMBEDDING_DIM`` over its ``num_ids`` rows. A class label gets one logit
per class (sparse cross-entropy) and an accuracy metric; a numeric label one output and the
mean squared error. Environment variables, set by bench/quality.py and inherited by the
training processes:

- ``BENCH_DATA``: the preprocessed data directory, whose ``schema.json`` shapes the model
- ``BENCH_HIDDEN``: width of the hidden layers (default 64), ``BENCH_LAYERS`` their number (1)
- ``BENCH_LEARNING_RATE``: Adam's learning rate (default 0.003)
- ``BENCH_EMBEDDING_DIM``: width of each embedding (default 4)
"""

import os

import keras

from elastic_step.data.schema import Schema

SCHEMA = Schema.load(os.environ["BENCH_DATA"])
HIDDEN = int(os.environ.get("BENCH_HIDDEN", "64"))
LAYERS = int(os.environ.get("BENCH_LAYERS", "1"))
LEARNING_RATE = float(os.environ.get("BENCH_LEARNING_RATE", "0.003"))
EMBEDDING_DIM = int(os.environ.get("BENCH_EMBEDDING_DIM", "4"))
CLASSES = SCHEMA.num_classes


def model() -> keras.Model:
    inputs, parts = {}, []
    for column in SCHEMA.columns:
        if column.kind == "categorical":
            inputs[column.input_name] = keras.Input(shape=(), name=column.input_name, dtype="int64")
            parts.append(
                keras.layers.Embedding(column.num_ids, EMBEDDING_DIM)(inputs[column.input_name])
            )
        else:
            inputs[column.input_name] = keras.Input(shape=(), name=column.input_name)
            parts.append(keras.layers.Reshape((1,))(inputs[column.input_name]))
    x = keras.layers.Concatenate()(parts) if len(parts) > 1 else parts[0]
    for _ in range(LAYERS):
        x = keras.layers.Dense(HIDDEN, activation="relu")(x)
    outputs = keras.layers.Dense(CLASSES or 1)(x)
    return keras.Model(inputs, outputs)


def loss(labels, outputs):
    if CLASSES:
        return keras.ops.mean(
            keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)
        )
    # Both flat: Keras may hand the labels over as (batch, 1).
    errors = keras.ops.reshape(outputs, (-1,)) - keras.ops.reshape(labels, (-1,))
    return keras.ops.mean(keras.ops.square(errors))


def optimizer():
    return keras.optimizers.Adam(LEARNING_RATE)


def metrics():
    if CLASSES:
        return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}
    return {}
