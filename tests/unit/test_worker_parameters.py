"""ModelParameters: a Keras model's variables split into dense ones and embedding tables, its
gradients split for the PS, and a round trip through two real gRPC PS shards."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_step.ps.server import ParameterServerServicer
from elastic_step.ps.shard import ParameterShard
from elastic_step.rpc import master_pb2, ps_pb2_grpc
from elastic_step.rpc.auth import Credentials
from elastic_step.rpc.ps_client import PSClient, TableSpec
from elastic_step.worker.parameters import ModelParameters

LR = 0.1
TABLE, KERNEL, BIAS = "embedding/embeddings", "dense/kernel", "dense/bias"
SEQ = 3
# The shards here run without AuthInterceptor: the credentials travel but nobody checks them.
CREDENTIALS = Credentials.for_instance("test-secret", "worker-0")


def build_model(seed: int = 7) -> keras.Model:
    """As elastic_step.model_def builds models: Keras's name counters reset first."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    ids = keras.Input(shape=(SEQ,), dtype="int32")
    x = keras.layers.Embedding(input_dim=10, output_dim=3)(ids)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(1)(x)
    return keras.Model(ids, outputs)


def loss_fn(model: keras.Model, ids, labels):
    return tf.reduce_sum(tf.square(model(ids) - labels))


def gradients(model: keras.Model, ids, labels) -> list:
    with tf.GradientTape() as tape:
        loss = loss_fn(model, ids, labels)
    return tape.gradient(loss, model.trainable_variables)


@pytest.fixture
def ps(tmp_path) -> Iterator[PSClient]:
    """Two real in-process gRPC PS shards with SGD, and a client over them."""
    servers, addresses = [], []
    for i in range(2):
        servicer = ParameterServerServicer()
        servicer.settings = master_pb2.JobSettings(
            output_dir=str(tmp_path), checkpoint_steps=0, keep_checkpoints=1, num_ps=2
        )
        servicer.shard = ParameterShard(i, 2, keras.optimizers.SGD(LR))
        server = grpc.server(futures.ThreadPoolExecutor(4))
        ps_pb2_grpc.add_ParameterServerServicer_to_server(servicer, server)
        addresses.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
        server.start()
        servers.append(server)
    client = PSClient(addresses, CREDENTIALS, timeout_s=10)
    yield client
    client.close()
    for server in servers:
        server.stop(None).wait()


def test_tables_and_dense_split_by_path() -> None:
    params = ModelParameters(build_model())
    assert list(params.tables) == [TABLE]
    assert set(params.dense) == {KERNEL, BIAS}
    assert params.table_specs() == {TABLE: TableSpec(10, 3, "float32")}
    assert params.table_values()[TABLE].shape == (10, 3)
    assert params.dense_values()[KERNEL].shape == (SEQ * 3, 1)
    assert [v.path for v in params.variables] == [TABLE, KERNEL, BIAS]


def test_models_built_the_model_def_way_have_the_same_paths() -> None:
    first, second = ModelParameters(build_model()), ModelParameters(build_model())
    assert [v.path for v in first.variables] == [v.path for v in second.variables]
    # Without clear_session Keras numbers the layers on, and the paths would not match.
    third = ModelParameters(keras.Model(*_functional_parts()))
    assert [v.path for v in third.variables] != [v.path for v in first.variables]


def _functional_parts():
    ids = keras.Input(shape=(SEQ,), dtype="int32")
    x = keras.layers.Flatten()(keras.layers.Embedding(10, 3)(ids))
    return ids, keras.layers.Dense(1)(x)


def _expected_row_grads(model: keras.Model, ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """d loss / d embedding, by hand: position j of example b adds dL/dout_b * kernel[j]."""
    kernel = model.get_layer(index=3).kernel.numpy().reshape(SEQ, 3)
    d_out = 2 * (model(ids).numpy() - labels)  # (batch, 1)
    table_grad = np.zeros((10, 3), np.float32)
    for b in range(ids.shape[0]):
        for j in range(SEQ):
            table_grad[ids[b, j]] += d_out[b, 0] * kernel[j]
    return table_grad


@pytest.mark.parametrize("in_function", [False, True])
def test_split_gradients_sums_duplicate_rows(in_function: bool) -> None:
    model = build_model()
    params = ModelParameters(model)
    ids = np.array([[1, 1, 4]], np.int32)
    labels = np.array([[0.5]], np.float32)
    step = tf.function(gradients) if in_function else gradients
    grads = step(model, tf.constant(ids), tf.constant(labels))
    assert isinstance(grads[0], tf.IndexedSlices)
    assert len(grads[0].indices) == 3  # the raw gradient repeats row 1

    dense, rows = params.split_gradients(grads)

    row_ids, row_values = rows[TABLE]
    assert row_ids.dtype == np.int64
    np.testing.assert_array_equal(row_ids, [1, 4])
    expected = _expected_row_grads(model, ids, labels)
    np.testing.assert_allclose(row_values, expected[[1, 4]], rtol=1e-5, atol=1e-6)
    # Row 1's gradient is the sum of its two occurrences' (positions 0 and 1).
    raw = grads[0].values.numpy()
    np.testing.assert_allclose(row_values[0], raw[0] + raw[1], rtol=1e-6)
    np.testing.assert_allclose(row_values[1], raw[2], rtol=1e-6)
    assert set(dense) == {KERNEL, BIAS}
    np.testing.assert_allclose(dense[KERNEL], grads[1].numpy(), rtol=1e-6)
    np.testing.assert_allclose(dense[BIAS], grads[2].numpy(), rtol=1e-6)
    assert isinstance(dense[KERNEL], np.ndarray)


def test_split_gradients_unique_sorted_over_a_batch() -> None:
    model = build_model()
    params = ModelParameters(model)
    ids = np.array([[7, 2, 7], [2, 9, 0]], np.int32)
    labels = np.array([[1.0], [-1.0]], np.float32)
    _, rows = params.split_gradients(gradients(model, ids, labels))
    row_ids, row_values = rows[TABLE]
    np.testing.assert_array_equal(row_ids, [0, 2, 7, 9])
    expected = _expected_row_grads(model, ids, labels)
    np.testing.assert_allclose(row_values, expected[[0, 2, 7, 9]], rtol=1e-5, atol=1e-6)


def test_split_gradients_dense_table_gradient() -> None:
    model = build_model()
    params = ModelParameters(model)
    ids = np.array([[1, 1, 4]], np.int32)
    labels = np.array([[0.5]], np.float32)
    grads = gradients(model, ids, labels)
    grads[0] = tf.convert_to_tensor(grads[0])  # a (10, 3) dense gradient
    _, rows = params.split_gradients(grads)
    np.testing.assert_array_equal(rows[TABLE][0], [1, 4])
    expected = _expected_row_grads(model, ids, labels)
    np.testing.assert_allclose(rows[TABLE][1], expected[[1, 4]], rtol=1e-5, atol=1e-6)


def test_split_gradients_skips_none() -> None:
    model = build_model()
    params = ModelParameters(model)
    grads = gradients(model, np.array([[1, 2, 3]], np.int32), np.zeros((1, 1), np.float32))
    dense, rows = params.split_gradients([None, grads[1], None])
    assert rows == {}
    assert set(dense) == {KERNEL}
    dense, rows = params.split_gradients([grads[0], None, None])
    assert dense == {}
    assert list(rows) == [TABLE]


def _batches(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [
        (
            rng.integers(0, 10, size=(4, SEQ)).astype(np.int32),
            rng.normal(size=(4, 1)).astype(np.float32),
        )
        for _ in range(steps)
    ]


def test_round_trip_through_the_ps(ps: PSClient) -> None:
    model_a = build_model()
    a = ModelParameters(model_a)
    initial = {v.path: v.numpy() for v in a.variables}
    assert ps.initialize(a.dense_values(), a.table_specs(), a.table_values(), 0) == [True, True]

    # A reference model trained locally with plain SGD on the same batches.
    model_ref = build_model()
    for variable in model_ref.trainable_variables:
        variable.assign(initial[variable.path])
    reference = keras.optimizers.SGD(LR)

    step = tf.function(gradients)
    for ids, labels in _batches(4):
        dense, rows = a.split_gradients(step(model_a, tf.constant(ids), tf.constant(labels)))
        new_dense, new_rows = ps.push(dense, rows)
        assert set(new_dense) == {KERNEL, BIAS}
        np.testing.assert_array_equal(np.sort(new_rows[TABLE][0]), rows[TABLE][0])
        a.assign_dense(new_dense)
        a.assign_rows(new_rows)
        ref_grads = gradients(model_ref, ids, labels)
        reference.apply_gradients(zip(ref_grads, model_ref.trainable_variables, strict=True))
    assert ps.versions == [4, 4]

    trained = {v.path: v.numpy() for v in a.variables}
    for variable in model_ref.trainable_variables:
        np.testing.assert_allclose(trained[variable.path], variable.numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(trained[TABLE], initial[TABLE])
    assert not np.allclose(trained[KERNEL], initial[KERNEL])

    # Worker B: a separately built model, with its own (different) initial values.
    model_b = build_model(seed=99)
    b = ModelParameters(model_b)
    assert [v.path for v in b.variables] == [v.path for v in a.variables]
    assert not np.allclose(b.table_values()[TABLE], trained[TABLE])
    client_b = PSClient(ps.addresses, CREDENTIALS, timeout_s=10)
    try:
        accepted = client_b.initialize(b.dense_values(), b.table_specs(), b.table_values(), 0)
        assert accepted == [False, False]
        b.pull(client_b)
        assert client_b.versions == [4, 4]
    finally:
        client_b.close()
    for variable in b.variables:
        np.testing.assert_array_equal(variable.numpy(), trained[variable.path])


def build_batchnorm_model(seed: int = 7) -> keras.Model:
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    x = keras.layers.BatchNormalization()(inputs)
    x = keras.layers.Dropout(0.5)(x)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


BN_MEAN = "batch_normalization/moving_mean"
BN_VARIANCE = "batch_normalization/moving_variance"


def test_floating_point_non_trainable_variables_are_state() -> None:
    params = ModelParameters(build_batchnorm_model())
    # Dropout's integer seed-generator state stays with each worker.
    assert set(params.state) == {BN_MEAN, BN_VARIANCE}
    assert not set(params.state) & set(params.dense)


def test_batchnorm_statistics_travel_through_the_ps(ps: PSClient) -> None:
    """The PS keeps the statistics a worker pushed; a pull (the saved model's) gets them."""
    model_a = build_batchnorm_model()
    a = ModelParameters(model_a)
    assert ps.initialize(a.dense_values(), {}, {}, 0, a.state_values()) == [True, True]
    features = np.random.default_rng(0).normal(5.0, 2.0, size=(64, 4)).astype("float32")
    labels = features.sum(axis=1, keepdims=True)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean((model_a(features, training=True) - labels) ** 2)
        grads = tape.gradient(loss, a.variables)
        dense, rows = a.split_gradients(grads)
        new_dense, _ = ps.push(dense, rows, state=a.state_values())
        # A push answers with trainable values only: the worker's statistics are newer.
        assert set(new_dense) == set(a.dense)
        a.assign_dense(new_dense)
    moved = a.state_values()
    assert not np.allclose(moved[BN_MEAN], 0.0), "training moved the moving mean"

    b = ModelParameters(build_batchnorm_model(seed=99))
    b.pull(ps)
    for name in (BN_MEAN, BN_VARIANCE):
        np.testing.assert_array_equal(b.state_values()[name], moved[name])
    for name, value in a.dense_values().items():
        np.testing.assert_array_equal(b.dense_values()[name], value)
