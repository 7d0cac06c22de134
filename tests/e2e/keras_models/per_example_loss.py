"""A functional model of scikit-learn's breast cancer data (30 columns, two classes) whose
loss function returns per-example values, as the Keras functions do."""

import keras

COLUMNS = [f"c{i}" for i in range(30)]


def model():
    inputs = {name: keras.Input(shape=(), name=name) for name in COLUMNS}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in COLUMNS])
    x = keras.layers.Dense(16, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))


def loss(labels, outputs):
    return keras.losses.binary_crossentropy(labels, outputs)


def optimizer():
    return keras.optimizers.Adam(0.01)


def metrics():
    return ["accuracy", keras.metrics.AUC(name="auc")]
