"""The benchmark's model: an MLP over the numeric columns ``f0..f{N-1}`` of the synthetic data.

It uses the default feed (one named input per column, standardized by the schema). The shape
comes from environment variables, which the benchmark sets and the training processes inherit:

- ``BENCH_FEATURES``: number of feature columns (default 32)
- ``BENCH_HIDDEN``: width of the two hidden layers (default 256)
- ``BENCH_CLASSES``: number of classes (default 10)
"""

import os

import keras

FEATURES = int(os.environ.get("BENCH_FEATURES", "32"))
HIDDEN = int(os.environ.get("BENCH_HIDDEN", "256"))
CLASSES = int(os.environ.get("BENCH_CLASSES", "10"))
COLUMNS = [f"f{i}" for i in range(FEATURES)]


def model() -> keras.Model:
    inputs = {name: keras.Input(shape=(), name=name) for name in COLUMNS}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in COLUMNS])
    x = keras.layers.Dense(HIDDEN, activation="relu")(x)
    x = keras.layers.Dense(HIDDEN, activation="relu")(x)
    outputs = keras.layers.Dense(CLASSES)(x)
    return keras.Model(inputs, outputs)


def loss(labels, outputs):
    return keras.ops.mean(
        keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)
    )


def optimizer():
    return keras.optimizers.Adam(0.001)


def metrics():
    return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}
