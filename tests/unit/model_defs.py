"""Model definition files that the unit tests write for real workers and PS: their text."""

from __future__ import annotations


def linear_regression(inputs: int) -> str:
    """A model definition of one Dense unit over a vector of ``inputs`` numbers, with the mean
    squared error as its loss and SGD(0.1) as its optimizer."""
    return f"""
import keras

def model():
    return keras.Sequential([keras.Input(({inputs},)), keras.layers.Dense(1)])

def loss(labels, outputs):
    return keras.losses.mean_squared_error(labels, outputs)

def optimizer():
    return keras.optimizers.SGD(0.1)
"""
