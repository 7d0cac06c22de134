"""A click-through-rate model, wide and deep, for data such as Criteo's (bench/criteo_data.py):
numeric columns, categorical id columns and a 0/1 label.

It uses the default feed: numeric columns standardized, each categorical column as one id in
``0..num_ids-1`` (its vocabulary, out-of-vocabulary ids, or hash buckets: whatever
``preprocess`` was told). ``model(schema)`` shapes the model by the data:

- *wide*: a weight per id of each categorical column (an embedding of width 1), summed with
  a linear term of the numbers;
- *deep*: an embedding of :data:`EMBEDDING_DIM` per categorical column, beside the numbers,
  through two hidden layers.

The two logits add up to the click's. Each embedding is a table of the model; on the PS its
rows are updated as the batches use them (per-row Adam), as recommendation models need when
tables have millions of rows.
Tests: tests/e2e/test_ctr.py (preprocess from Parquet, training with a PS killed, serving).
"""

from __future__ import annotations

import keras

#: Width of each categorical column's embedding in the deep part.
EMBEDDING_DIM = 8
HIDDEN = (64, 32)


def model(schema) -> keras.Model:
    inputs, wide, deep, numbers = {}, [], [], []
    for column in schema.columns:
        name = column.input_name
        if column.kind == "categorical":
            ids = inputs[name] = keras.Input(shape=(), name=name, dtype="int64")
            wide.append(keras.layers.Embedding(column.num_ids, 1, name=f"wide_{name}")(ids))
            deep.append(
                keras.layers.Embedding(column.num_ids, EMBEDDING_DIM, name=f"deep_{name}")(ids)
            )
        else:
            number = inputs[name] = keras.Input(shape=(), name=name)
            numbers.append(keras.layers.Reshape((1,))(number))
    parts = [*numbers, *deep]
    x = keras.layers.Concatenate()(parts) if len(parts) > 1 else parts[0]
    for width in HIDDEN:
        x = keras.layers.Dense(width, activation="relu")(x)
    logits = [keras.layers.Dense(1, name="deep_logit")(x), *wide]
    if numbers:
        joined = keras.layers.Concatenate()(numbers) if len(numbers) > 1 else numbers[0]
        logits.append(keras.layers.Dense(1, name="wide_numbers")(joined))
    logit = keras.layers.Add(name="logit")(logits) if len(logits) > 1 else logits[0]
    return keras.Model(inputs, logit)


def loss(labels, outputs):
    return keras.losses.binary_crossentropy(labels, outputs, from_logits=True)


def optimizer():
    return keras.optimizers.Adam(0.001)


def metrics():
    return {"auc": keras.metrics.AUC(from_logits=True)}
