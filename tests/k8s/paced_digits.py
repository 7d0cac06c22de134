"""The digits classifier, with a floor under each training step's time.

A test that must do things while a job runs (start a second master and wait for it to give
up, preempt a worker, delete the PS) cannot rely on how fast the job happens to be: each
training batch here sleeps PACE_S, so the job lasts at least epochs x batches x PACE_S /
workers, however fast the machine. Evaluation and prediction are not paced.
"""

import time

import keras
import tensorflow as tf

from elastic_step.examples.digits import PIXELS, loss, metrics, optimizer

__all__ = ["PACE_S", "loss", "metrics", "model", "optimizer"]

#: Each training batch's least time.
PACE_S = 0.025


@keras.saving.register_keras_serializable(package="tests")
class Pace(keras.layers.Layer):
    """Passes its input through; in training, not before PACE_S has passed."""

    def call(self, x, training=False):
        if not training:
            return x
        slept = tf.py_function(lambda: time.sleep(PACE_S) or True, [], tf.bool)
        with tf.control_dependencies([slept]):
            return tf.identity(x)


def model() -> keras.Model:
    inputs = {name: keras.Input(shape=(), name=name) for name in PIXELS}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in PIXELS])
    x = Pace()(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    return keras.Model(inputs, outputs)
