"""A subclassed model of the digits, with module-level loss, optimizer and metrics."""

import keras


class DigitsModel(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(64, activation="relu")
        self.scores = keras.layers.Dense(10)

    def call(self, inputs):
        pixels = keras.ops.stack([inputs[f"pixel_{i}"] for i in range(64)], axis=1)
        return self.scores(self.hidden(pixels))


def model():
    return DigitsModel()


loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = keras.optimizers.Adam(0.01)
metrics = ["accuracy"]
