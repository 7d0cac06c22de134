"""A compiled Sequential model of the digits, with a loss name and metric names. It has no
Input layer: it is built on the first batch, as fit() would build it."""

import keras
import tensorflow as tf

from elastic_step.data.feed import default_feed


def model():
    digits = keras.Sequential(
        [
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    digits.compile(
        optimizer="adam",
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy", "sparse_top_k_categorical_accuracy"],
    )
    return digits


def feed(dataset, mode, schema):
    """The default feed's standardized columns, stacked into one vector per example."""
    names = schema.feature_names
    return default_feed(dataset, mode, schema).map(
        lambda features, labels: (tf.stack([features[n] for n in names], axis=1), labels)
    )
