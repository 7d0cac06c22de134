"""A small classifier for scikit-learn's 8x8 digits (64 pixel columns, label ``digit``).

It uses the default feed: one named input per column, standardized by the schema.
Tests: the model of most end-to-end runs (TrainRun in tests/e2e/conftest.py) and of tests/k8s/.
"""

import keras

PIXELS = [f"pixel_{i}" for i in range(64)]


def model() -> keras.Model:
    inputs = {name: keras.Input(shape=(), name=name) for name in PIXELS}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in PIXELS])
    x = keras.layers.Dense(64, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    return keras.Model(inputs, outputs)


def loss(labels, outputs):
    return keras.ops.mean(
        keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)
    )


def optimizer():
    return keras.optimizers.Adam(0.01)


def metrics():
    return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}
