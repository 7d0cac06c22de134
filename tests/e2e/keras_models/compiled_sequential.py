"""A compiled Sequential model of the digits, with a loss name and metric names. It has no
Input layer: it is built on the first batch, as fit() would build it, and takes the default
feed's vector."""

import keras


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
