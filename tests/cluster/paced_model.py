"""A small classifier for any preprocessed numeric data (``model(schema)``), with a floor
under each training step's time.

A test that must do things while a job runs (stop it, replace its master, start a second
master and wait for it to give up, preempt a worker, delete the PS) cannot rely on how fast
the job happens to be: each training batch here sleeps PACE_S, so the job lasts at least
epochs x batches x PACE_S / workers, however fast the machine. Evaluation and prediction are
not paced. The file is self-contained: the Argo tests send its text as the model definition.
Tests: tests/k8s (scikit-learn's digits), tests/argo/test_argo_stop.py (its breast cancer).
"""

import time

import keras
import tensorflow as tf

# The digits example's: any class label's, from one logit per class.
from elastic_step.examples.digits import loss, metrics, optimizer

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


def model(schema) -> keras.Model:
    names = [column.input_name for column in schema.columns]
    inputs = {name: keras.Input(shape=(), name=name) for name in names}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in names])
    x = Pace()(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(schema.num_classes)(x))
