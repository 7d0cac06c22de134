"""A binary classifier for scikit-learn's breast cancer data: 30 numeric columns named as
scikit-learn names them with ``_`` for spaces (``mean_radius`` ... ``worst_fractal_dimension``),
and the label ``benign`` (1 benign, 0 malignant).

It uses the default feed: one named input per column, standardized by the schema. The model
outputs one logit; evaluate turns it into a probability for the ROC curve.
Tests: tests/unit/test_job_kinds.py (loads it), tests/e2e/test_kfp_pipeline_local.py (trains it).
"""

import keras

STATISTICS = [
    "radius",
    "texture",
    "perimeter",
    "area",
    "smoothness",
    "compactness",
    "concavity",
    "concave_points",
    "symmetry",
    "fractal_dimension",
]
FEATURES = (
    [f"mean_{s}" for s in STATISTICS]
    + [f"{s}_error" for s in STATISTICS]
    + [f"worst_{s}" for s in STATISTICS]
)


def model() -> keras.Model:
    inputs = {name: keras.Input(shape=(), name=name) for name in FEATURES}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in FEATURES])
    x = keras.layers.Dense(16, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def loss(labels, outputs):
    labels = keras.ops.cast(keras.ops.reshape(labels, (-1, 1)), "float32")
    return keras.ops.mean(keras.losses.binary_crossentropy(labels, outputs, from_logits=True))


def optimizer():
    return keras.optimizers.Adam(0.01)


def metrics():
    return {
        "accuracy": keras.metrics.BinaryAccuracy(threshold=0.0),
        "auc": keras.metrics.AUC(from_logits=True),
    }
