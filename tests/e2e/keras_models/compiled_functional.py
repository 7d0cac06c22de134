"""A compiled functional model of the digits: loss, optimizer and metrics all come from
compile(); the loss is a keras.losses.Loss with its own reduction."""

import keras

PIXELS = [f"pixel_{i}" for i in range(64)]


def model():
    inputs = {name: keras.Input(shape=(), name=name) for name in PIXELS}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in PIXELS])
    x = keras.layers.Dense(64, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    digits = keras.Model(inputs, outputs)
    digits.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    return digits
