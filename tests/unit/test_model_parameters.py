"""A worker's side of the parameters: a Keras model's variables split into dense ones and
embedding tables, the rows a batch reads, its gradients as the PS takes them, and windows of
steps through real gRPC PS shards, asserted from the shards' side."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc
import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_step.model.outer_optimizer import build_outer_optimizer
from elastic_step.model.parameters import ModelParameters
from elastic_step.ps.server import ParameterServerServicer
from elastic_step.ps.shard import ParameterShard
from elastic_step.rpc import master_pb2, ps_pb2_grpc
from elastic_step.rpc.auth import Credentials
from elastic_step.rpc.ps_client import PSClient, TableSpec
from elastic_step.worker.steps import Steps, _row_gradient
from elastic_step.worker.windows import UserCodeError, WindowTrainer

LR = 0.1
TABLE, KERNEL, BIAS = "embedding/embeddings", "dense/kernel", "dense/bias"
ROWS, SEQ = 10, 3
# The shards here run without AuthInterceptor: the credentials travel but nobody checks them.
CREDENTIALS = Credentials.for_instance("test-secret", "worker-0")


def build_model(seed: int = 7) -> keras.Model:
    """As elastic_step.model.definition builds models: Keras's name counters reset first."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    ids = keras.Input(shape=(SEQ,), dtype="int32")
    x = keras.layers.Embedding(input_dim=ROWS, output_dim=3)(ids)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(1)(x)
    return keras.Model(ids, outputs)


def loss(labels, outputs):
    return tf.reduce_sum(tf.square(outputs - labels))


def initial_values(seed: int = 7) -> dict[str, np.ndarray]:
    return {v.path: v.numpy() for v in build_model(seed).trainable_variables}


@dataclass
class Connected:
    """The worker's side of a PS that never moves (WindowTrainer's PSConnection)."""

    ps: PSClient

    def connect_ps(self) -> None:
        raise AssertionError("the PS never moves in these tests")


StartPS = Callable[..., tuple[list[ParameterShard], PSClient]]


@pytest.fixture
def start_ps(tmp_path) -> Iterator[StartPS]:
    """``start_ps(optimizer, num_ps=2)``: real in-process gRPC PS shards whose tables start
    from build_model()'s initial rows (as a PS builds the model itself), and a client."""
    servers, clients = [], []

    def start(optimizer: Callable, num_ps: int = 2) -> tuple[list[ParameterShard], PSClient]:
        table = initial_values()[TABLE]
        shards, addresses = [], []
        for i in range(num_ps):
            servicer = ParameterServerServicer()
            servicer.settings = master_pb2.JobSettings(
                output_dir=str(tmp_path), checkpoint_steps=0, keep_checkpoints=1, num_ps=num_ps
            )
            servicer.shard = ParameterShard(
                i, num_ps, optimizer(), initial_table=lambda name, shape: table
            )
            shards.append(servicer.shard)
            server = grpc.server(futures.ThreadPoolExecutor(4))
            ps_pb2_grpc.add_ParameterServerServicer_to_server(servicer, server)
            addresses.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
            server.start()
            servers.append(server)
        clients.append(PSClient(addresses, CREDENTIALS, timeout_s=10))
        return shards, clients[-1]

    yield start
    for client in clients:
        client.close()
    for server in servers:
        server.stop(None).wait()


def connect(
    ps: PSClient, model: keras.Model, local_steps: int = 1, local_optimizer=None, metrics=None
):
    """A worker's parameters, steps and window trainer over ``ps``, as Worker.setup makes."""
    params = ModelParameters(model)
    ps.initialize(params.dense_values(), params.table_specs(), params.pulled_rows(), 0)
    steps = Steps(model, loss, params, local_optimizer, metrics=metrics)
    return params, WindowTrainer(params, steps, local_steps, Connected(ps))


def batches(count: int, seed: int = 3, high: int = ROWS) -> list[tuple[tf.Tensor, tf.Tensor]]:
    rng = np.random.default_rng(seed)
    return [
        (
            tf.constant(rng.integers(0, high, size=(4, SEQ)).astype(np.int32)),
            tf.constant(rng.normal(size=(4, 1)).astype(np.float32)),
        )
        for _ in range(count)
    ]


# -- the split --


def test_tables_and_dense_split_by_path() -> None:
    params = ModelParameters(build_model())
    assert list(params.tables) == [TABLE]
    assert set(params.dense) == {KERNEL, BIAS}
    assert params.table_specs() == {TABLE: TableSpec(ROWS, 3, "float32")}
    assert params.dense_values()[KERNEL].shape == (SEQ * 3, 1)
    assert [v.path for v in params.variables] == [TABLE, KERNEL, BIAS]
    assert params.pulled_rows() == {}  # a fresh worker has no rows to offer


def test_models_built_the_model_def_way_have_the_same_paths() -> None:
    first, second = ModelParameters(build_model()), ModelParameters(build_model())
    assert [v.path for v in first.variables] == [v.path for v in second.variables]
    # Without clear_session Keras numbers the layers on, and the paths would not match.
    third = ModelParameters(keras.Model(*_functional_parts()))
    assert [v.path for v in third.variables] != [v.path for v in first.variables]


def _functional_parts():
    ids = keras.Input(shape=(SEQ,), dtype="int32")
    x = keras.layers.Flatten()(keras.layers.Embedding(ROWS, 3)(ids))
    return ids, keras.layers.Dense(1)(x)


# -- which rows a batch reads --


def test_rows_of_many_tables_are_read_and_written_in_one_call_each() -> None:
    """gather_rows and scatter_rows touch exactly the rows named, in every table at once,
    whatever the number of rows (one trace serves calls of other lengths), tables of other
    widths and dtypes included (their rows travel packed: model/table_rows.py)."""
    keras.backend.clear_session()
    ids = keras.Input(shape=(1,), dtype="int32")
    tables = [keras.layers.Embedding(ROWS + i, 2, name=f"table_{i}") for i in range(3)]
    tables.append(keras.layers.Embedding(ROWS, 3, name="table_3", dtype="float64"))
    parts = [keras.layers.Flatten()(t(ids)) for t in tables]
    outputs = keras.layers.Add()([*parts[:3], keras.layers.Dense(2)(parts[3])])
    parameters = ModelParameters(keras.Model(ids, outputs))
    names = sorted(parameters.tables)
    before = {n: parameters.tables[n].numpy() for n in names}
    for picked in ([1, 4], [0, 2, 5, 9], []):
        wanted = {n: np.array(picked, np.int64) for n in names[:2]}
        read = parameters.gather_rows(wanted)
        assert set(read) == set(names[:2])
        for n in names[:2]:
            np.testing.assert_array_equal(read[n], before[n][picked])
    assert parameters.tables[names[3]].dtype == "float64"
    read = parameters.gather_rows({n: np.array([2, 6]) for n in names})
    for n in names:
        np.testing.assert_array_equal(read[n], before[n][[2, 6]])
        assert read[n].dtype == before[n].dtype and read[n].flags.writeable
    written = {
        n: (np.array([3, 7]), np.full((2, before[n].shape[1]), 10.0 + i + 1e-9))
        for i, n in enumerate(names)
    }
    parameters.scatter_rows(written)
    for i, n in enumerate(names):
        expected = before[n].copy()
        expected[[3, 7]] = 10.0 + i + 1e-9  # rounded to the table's own dtype
        np.testing.assert_array_equal(parameters.tables[n].numpy(), expected)


def _three_tables() -> keras.Model:
    """Tables of widths 2, 2 and 3 (two groups), all read by one id column."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(3)
    ids = keras.Input(shape=(2,), dtype="int32")
    widths = {"a": 2, "b": 2, "c": 3}
    parts = [
        keras.layers.Flatten()(keras.layers.Embedding(ROWS + 2 * i, w, name=n)(ids))
        for i, (n, w) in enumerate(widths.items())
    ]
    return keras.Model(ids, keras.layers.Dense(1)(keras.layers.Concatenate()(parts)))


def test_the_table_layout_joins_tables_of_one_width_and_splits_them_back() -> None:
    parameters = ModelParameters(_three_tables())
    layout = parameters.layout
    assert [(g.dim, g.names, g.offsets.tolist()) for g in layout.groups] == [
        (2, ("a/embeddings", "b/embeddings"), [0, ROWS, 2 * ROWS + 2]),
        (3, ("c/embeddings",), [0, ROWS + 4]),
    ]
    ids = {"a/embeddings": np.array([1, 9]), "b/embeddings": np.array([0, 11])}
    joined = layout.join_ids(ids)
    assert [j.tolist() for j in joined] == [[1, 9, ROWS, ROWS + 11], []]
    values = layout.join_values({n: np.full((2, 2), k) for k, n in enumerate(ids)})
    split = layout.split(joined, values)
    assert set(split) == set(ids)
    for k, (name, table_ids) in enumerate(ids.items()):
        np.testing.assert_array_equal(split[name][0], table_ids)
        np.testing.assert_array_equal(split[name][1], np.full((2, 2), k))


def test_a_window_s_rows_stay_the_model_s_through_its_local_steps() -> None:
    """WindowRows (worker/window_rows.py) holds a window's rows beside the model's tables:
    after each local step and the flush, the tables' rows are the window's; its change is the
    rows as pulled minus as left; a step on a row it did not pull is refused."""
    model = _three_tables()
    parameters = ModelParameters(model)
    steps = Steps(model, loss, parameters, keras.optimizers.Adam(0.05))
    ids = {n: np.arange(2, int(v.shape[0])) for n, v in parameters.tables.items()}
    pulled = parameters.gather_rows(ids)
    window = steps.window_rows(ids, pulled)
    rng = np.random.default_rng(2)

    def assert_tables_hold_the_window() -> None:
        held = window.layout.split(window.ids, window.values)
        now = parameters.gather_rows(ids)
        for name in ids:
            np.testing.assert_array_equal(held[name][0], ids[name])
            np.testing.assert_array_equal(held[name][1], now[name])

    for _ in range(3):
        batch = tf.constant(rng.integers(2, ROWS, size=(4, 2)).astype(np.int32))
        steps.local(batch, tf.constant(rng.normal(size=(4, 1)).astype(np.float32)), window)
        assert_tables_hold_the_window()
    steps.flush(window)
    assert_tables_hold_the_window()
    now = parameters.gather_rows(ids)
    change = window.change()
    for name in ids:
        np.testing.assert_array_equal(change[name][0], ids[name])
        np.testing.assert_allclose(change[name][1], pulled[name] - now[name])
        assert np.abs(change[name][1][: ROWS - 2]).sum() > 0  # rows the batches read moved
    outside = steps.window_rows(
        {"a/embeddings": np.array([2, 3])}, {"a/embeddings": np.zeros((2, 2))}
    )
    with pytest.raises(ValueError, match="did not pull"):
        outside.positions(0, np.array([4]))


def test_batch_ids_are_the_unique_ids_each_table_reads() -> None:
    keras.backend.clear_session()
    user = keras.Input(shape=(2,), dtype="int64", name="user")
    item = keras.Input(shape=(), dtype="int64", name="item")
    items = keras.layers.Embedding(50, 4, name="items")
    users = keras.layers.Embedding(20, 4, name="users")
    # The item table is read twice: directly and through a computed id.
    parts = [
        keras.layers.Flatten()(users(user)),
        items(item),
        items(keras.ops.mod(item + 7, 50)),
    ]
    model = keras.Model(
        {"user": user, "item": item}, keras.layers.Dense(1)(keras.ops.concatenate(parts, 1))
    )
    params = ModelParameters(model)
    features = {
        "user": tf.constant([[3, 3], [19, 0]], tf.int64),
        "item": tf.constant([45, 1], tf.int64),
    }
    ids = params.batch_ids(features)
    np.testing.assert_array_equal(ids["users/embeddings"], [0, 3, 19])
    np.testing.assert_array_equal(ids["items/embeddings"], [1, 2, 8, 45])
    # The model itself is untouched: its layers look up rows again afterwards.
    assert model(features).shape == (2, 1)
    assert ModelParameters(keras.Model(*_dense_only())).batch_ids(tf.zeros((1, 2))) == {}


def _dense_only():
    keras.backend.clear_session()
    inputs = keras.Input((2,))
    return inputs, keras.layers.Dense(1)(inputs)


# -- gradients as the PS takes them --


def _expected_row_grads(model: keras.Model, ids: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """d loss / d embedding, by hand: position j of example b adds dL/dout_b * kernel[j]."""
    kernel = model.get_layer(index=3).kernel.numpy().reshape(SEQ, 3)
    d_out = 2 * (model(ids).numpy() - labels)  # (batch, 1)
    table_grad = np.zeros((ROWS, 3), np.float32)
    for b in range(ids.shape[0]):
        for j in range(SEQ):
            table_grad[ids[b, j]] += d_out[b, 0] * kernel[j]
    return table_grad


def test_gradients_sum_duplicate_rows_over_a_batch() -> None:
    model = build_model()
    params = ModelParameters(model)
    ids = np.array([[7, 2, 7], [2, 9, 0]], np.int32)
    labels = np.array([[1.0], [-1.0]], np.float32)
    _, dense, rows = Steps(model, loss, params).gradients(tf.constant(ids), tf.constant(labels))
    row_ids, row_values = rows[TABLE]
    assert row_ids.dtype == np.int64
    assert sorted(row_ids.tolist()) == [0, 2, 7, 9]  # each row once
    expected = _expected_row_grads(model, ids, labels)
    np.testing.assert_allclose(row_values, expected[row_ids], rtol=1e-5, atol=1e-6)
    with tf.GradientTape() as tape:
        reference = loss(labels, model(ids))
    kernel_grad, bias_grad = tape.gradient(reference, [params.dense[KERNEL], params.dense[BIAS]])
    np.testing.assert_allclose(dense[KERNEL], kernel_grad.numpy(), rtol=1e-5)
    np.testing.assert_allclose(dense[BIAS], bias_grad.numpy(), rtol=1e-5)


def test_row_gradient_of_a_dense_table_gradient() -> None:
    grad = np.zeros((ROWS, 3), np.float32)
    grad[[4, 1]] = [[1, 2, 3], [0, 0, 5]]
    ids, values = _row_gradient(tf.constant(grad))
    assert sorted(ids.numpy().tolist()) == [1, 4]
    np.testing.assert_array_equal(values.numpy(), grad[ids.numpy()])


# -- windows of steps through the PS --


def training_metrics() -> dict[str, keras.metrics.Metric]:
    """A mean over examples and one that is not (the root of a mean)."""
    return {"mae": keras.metrics.MeanAbsoluteError(), "rmse": keras.metrics.RootMeanSquaredError()}


def assert_task_measured(measured, losses: list[float], metrics: dict) -> None:
    """A task's reported loss and metrics are those of the reference's steps."""
    assert measured.examples == 4 * len(losses)
    assert measured.mean == pytest.approx(np.mean(losses), rel=1e-5)
    assert measured.metrics == pytest.approx(
        {name: float(m.result()) for name, m in metrics.items()}, rel=1e-5
    )


def sgd_reference(data: list) -> tuple[keras.Model, list[float], dict]:
    """The model, per-step losses and metrics of plain SGD on ``data``, one step per batch,
    each batch's metrics measured on its outputs before its update."""
    reference = build_model()
    optimizer = keras.optimizers.SGD(LR)
    reference_metrics = training_metrics()
    losses = []
    for ids, labels in data:
        with tf.GradientTape() as tape:
            outputs = reference(ids)
            value = loss(labels, outputs)
        losses.append(float(value))
        for metric in reference_metrics.values():
            metric.update_state(labels, outputs)
        grads = tape.gradient(value, reference.trainable_variables)
        optimizer.apply_gradients(zip(grads, reference.trainable_variables, strict=True))
    return reference, losses, reference_metrics


def train_as_sgd(trainer, data: list) -> keras.Model:
    """Trains ``data`` as one task, whose loss and metrics must be plain SGD's, each measured
    on its step's own outputs, before its update; SGD's trained model."""
    measured = trainer.train(data)
    reference, losses, reference_metrics = sgd_reference(data)
    assert_task_measured(measured, losses, reference_metrics)
    return reference


def assert_ps_holds(ps, reference: keras.Model) -> ModelParameters:
    """A fresh worker (other initial values) pulls every row and variable from ``ps``: they
    are ``reference``'s. The worker."""
    pulled = ModelParameters(build_model(seed=99))
    pulled.pull_all(ps)
    for variable in reference.trainable_variables:
        got = pulled.tables.get(variable.path, pulled.dense.get(variable.path)).numpy()
        np.testing.assert_allclose(got, variable.numpy(), rtol=1e-5, atol=1e-6)
    return pulled


def test_one_step_windows_train_exactly_as_sgd_does(start_ps: StartPS) -> None:
    _, ps = start_ps(lambda: keras.optimizers.SGD(LR))
    model = build_model()
    _, trainer = connect(ps, model, metrics=training_metrics())
    data = batches(5)
    reference = train_as_sgd(trainer, data)
    assert ps.versions == [5, 5]
    # The PS holds the model SGD trains, every row included.
    worker_b = assert_ps_holds(ps, reference)
    # A second worker's own initial values are refused: the shards are filled.
    assert ps.initialize(worker_b.dense_values(), worker_b.table_specs(), {}, 0) == [False, False]
    # The next task's metrics are its own: its one batch, at the model the PS holds now.
    ids, labels = data[0]
    expected = keras.metrics.MeanAbsoluteError()
    expected.update_state(labels, reference(ids))
    assert trainer.train(data[:1]).metrics["mae"] == pytest.approx(float(expected.result()))


@pytest.mark.parametrize("local_steps", [1, 3])
def test_sparse_pulls_touch_only_the_batches_rows(start_ps: StartPS, local_steps: int) -> None:
    """Asserted from the PS side: how often each row was sent, and Adam's per-row steps."""
    shards, ps = start_ps(lambda: keras.optimizers.Adam(0.01))
    model = build_model()
    local = keras.optimizers.Adam(0.01) if local_steps > 1 else None
    params, trainer = connect(ps, model, local_steps, local)
    # Ids 0..5 only: rows 6..9 are never read.
    data = batches(6, seed=5, high=6)
    trainer.train(data)

    windows = [data[i : i + local_steps] for i in range(0, len(data), local_steps)]
    in_windows = np.zeros(ROWS, int)
    for window in windows:
        in_windows[np.unique(np.concatenate([ids.numpy().ravel() for ids, _ in window]))] += 1
    assert in_windows[:6].all() and not in_windows[6:].any()
    initial = initial_values()[TABLE]
    for shard in shards:
        owned = np.arange(shard.shard, ROWS, 2)
        table = shard.tables[TABLE]
        # Each window's rows are pulled once (with the first window, or with the previous push)
        np.testing.assert_array_equal(table.reads, in_windows[owned])
        # ... and pushed: the rows of a window the PS's Adam updated, and only those.
        np.testing.assert_array_equal(table.optimizer.slots["last"] > 0, in_windows[owned] > 0)
        untouched = in_windows[owned] == 0
        assert not table.optimizer.slots["m"][untouched].any()
        np.testing.assert_array_equal(table.values[untouched], initial[owned][untouched])
        assert not np.allclose(table.values[~untouched], initial[owned][~untouched])
    assert ps.versions == [len(windows)] * 2
    # What the worker could offer a relaunched PS: the rows it pulled, no others.
    assert params.pulled_rows()[TABLE][0].tolist() == list(range(6))


def test_local_steps_with_one_worker_are_its_steps(start_ps: StartPS) -> None:
    """K = 3 with the default outer optimizer (add the change): the PS ends where a model
    trained locally with the same optimizer does."""
    _, ps = start_ps(lambda: build_outer_optimizer("average"))
    model = build_model()
    _, trainer = connect(ps, model, 3, keras.optimizers.SGD(LR), training_metrics())
    data = batches(7)  # windows of 3, 3 and 1
    reference = train_as_sgd(trainer, data)
    assert ps.versions == [3, 3]
    assert_ps_holds(ps, reference)


class ResultFails(keras.metrics.Mean):
    def result(self):
        raise ValueError("no result")


def test_a_metric_that_fails_fails_the_task_as_user_code(start_ps: StartPS) -> None:
    _, ps = start_ps(lambda: keras.optimizers.SGD(LR))
    _, trainer = connect(ps, build_model(), metrics={"broken": ResultFails()})
    with pytest.raises(UserCodeError, match="a metric failed: ValueError: no result"):
        trainer.train(batches(1))


# -- BatchNorm statistics --


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


def test_batchnorm_statistics_travel_through_the_ps(start_ps: StartPS) -> None:
    """The PS keeps the statistics a worker pushed; a pull (the saved model's) gets them."""
    _, ps = start_ps(lambda: keras.optimizers.SGD(LR))
    model_a = build_batchnorm_model()
    a = ModelParameters(model_a)
    assert ps.initialize(a.dense_values(), {}, {}, 0, a.state_values()) == [True, True]
    trainer = WindowTrainer(a, Steps(model_a, loss, a), 1, Connected(ps))
    features = np.random.default_rng(0).normal(5.0, 2.0, size=(64, 4)).astype("float32")
    labels = features.sum(axis=1, keepdims=True)
    trainer.train([(tf.constant(features), tf.constant(labels))] * 3)
    moved = a.state_values()
    assert not np.allclose(moved[BN_MEAN], 0.0), "training moved the moving mean"

    b = ModelParameters(build_batchnorm_model(seed=99))
    b.pull_all(ps)
    for name in (BN_MEAN, BN_VARIANCE):
        np.testing.assert_array_equal(b.state_values()[name], moved[name])


# -- the compiled window --


def build_dense_model(seed: int = 7) -> keras.Model:
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    features = keras.Input(shape=(4,))
    return keras.Model(features, keras.layers.Dense(1)(features))


def summed_batches(examples: int, seed: int) -> Callable[[], Iterator]:
    """``examples`` random 4-vectors, each labelled with its sum, in batches of 4 (for
    build_dense_model): a new iterator over the same batches at each call."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(examples, 4)).astype("float32")
    labels = features.sum(axis=1, keepdims=True)
    return lambda: iter(tf.data.Dataset.from_tensor_slices((features, labels)).batch(4))


def test_a_warm_up_trains_nothing_and_one_trace_serves_every_window() -> None:
    """A standby compiles its window on zero steps: no batch taken, no variable moved, and
    windows of 3 and then 2 steps run on that one trace, training as 5 SGD steps do."""
    iterator = summed_batches(20, seed=0)
    model = build_dense_model()
    optimizer = keras.optimizers.SGD(LR)
    steps = Steps(model, loss, ModelParameters(model), optimizer)
    initial = [v.numpy() for v in model.trainable_variables]
    batches = iterator()
    assert steps.warm_up(batches) == ["training"]
    assert steps.local_window.experimental_get_tracing_count() == 1
    assert int(optimizer.iterations) == 0
    for before, variable in zip(initial, model.trainable_variables, strict=True):
        np.testing.assert_array_equal(variable.numpy(), before)

    assert steps.run_window(batches, 3).examples == 12  # the warm-up took no batch
    last = steps.run_window(batches, 2)
    assert last.examples == 8
    # The values it answers are the model's after the window.
    assert list(last.dense) == list(ModelParameters(model).dense)
    for value, variable in zip(last.dense.values(), model.trainable_variables, strict=True):
        np.testing.assert_array_equal(value, variable.numpy())
    assert steps.local_window.experimental_get_tracing_count() == 1

    reference = build_dense_model()
    reference_optimizer = keras.optimizers.SGD(LR)
    for x, y in iterator():
        with tf.GradientTape() as tape:
            value = loss(y, reference(x))
        grads = tape.gradient(value, reference.trainable_variables)
        reference_optimizer.apply(grads, reference.trainable_variables)
    for got, want in zip(model.trainable_variables, reference.trainable_variables, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_a_training_window_resets_its_metrics_when_asked_and_answers_them() -> None:
    """A task's first window resets the model's metrics and the later ones add to them; each
    answers the metrics over the task so far, as the metric objects themselves hold them."""
    iterator = summed_batches(20, seed=1)
    model = build_dense_model()
    metric = keras.metrics.MeanAbsoluteError()
    steps = Steps(
        model, loss, ModelParameters(model), keras.optimizers.SGD(LR), metrics={"mae": metric}
    )
    batches = iterator()
    steps.run_window(batches, 2)  # a task before: 8 examples in the metric
    first = steps.run_window(batches, 2, reset_metrics=True)
    assert float(metric.count.numpy()) == 8  # the earlier task's 8 are gone
    second = steps.run_window(batches, 1)
    assert float(metric.count.numpy()) == 12
    assert second.metrics == {"mae": pytest.approx(float(metric.result()))}
    assert first.metrics["mae"] != second.metrics["mae"]


def test_an_error_in_a_compiled_window_fails_the_task_in_one_line(start_ps: StartPS) -> None:
    """TensorFlow's message for an error raised in a traced function runs over many lines
    (the frames of the trace); the task's error, which the master shows, is its last line,
    and the cause keeps the rest for the worker's log."""
    _, ps = start_ps(lambda: keras.optimizers.SGD(LR))
    model = build_dense_model()
    parameters = ModelParameters(model)
    assert ps.initialize(parameters.dense_values(), {}, {}, 0, {}) == [True] * 2

    def broken_loss(labels, outputs):
        raise ValueError("labels and outputs disagree")

    steps = Steps(model, broken_loss, parameters, keras.optimizers.SGD(LR))
    trainer = WindowTrainer(parameters, steps, 4, Connected(ps))
    data = tf.data.Dataset.from_tensor_slices((np.zeros((8, 4), "float32"), np.zeros((8, 1))))
    with pytest.raises(UserCodeError) as failed:
        trainer.train_queued(iter(data.batch(4)), 2)
    assert str(failed.value) == "the training step failed: ValueError: labels and outputs disagree"
    assert "in user code" in str(failed.value.__cause__)  # what the worker logs


def test_a_model_with_tables_has_no_window_to_warm_up() -> None:
    model = build_model()
    steps = Steps(model, loss, ModelParameters(model), keras.optimizers.SGD(LR))
    assert steps.local_window is None and steps.evaluation_window is None
    assert steps.warm_up(iter(batches(1)), iter(batches(1))) == []


def test_the_evaluation_window_measures_as_batch_by_batch_evaluation_on_one_trace() -> None:
    """Warmed up on zero steps, the evaluation window took no batch and moved no metric;
    then batches of 4, 4 and 2 examples run on that one trace and give the summed loss and
    the metric states of evaluating them one by one."""
    iterator = summed_batches(10, seed=1)
    model = build_dense_model()
    mae = keras.metrics.MeanAbsoluteError()
    steps = Steps(model, loss, ModelParameters(model), metrics={"mae": mae})
    assert steps.local_window is None  # K = 1: no training window, but evaluation has one
    batches = iterator()
    assert steps.warm_up(iter(()), batches) == ["evaluation"]
    assert [float(v.numpy()) for v in mae.variables] == [0.0, 0.0]

    loss_sum, examples = steps.run_evaluation(batches, 3)
    assert examples == 10  # the warm-up took no batch
    assert steps.evaluation_window.experimental_get_tracing_count() == 1
    window_states = [v.numpy() for v in mae.variables]

    steps.reset_metrics()
    expected = sum(float(steps.evaluate(x, y)) * len(y) for x, y in iterator())
    np.testing.assert_allclose(loss_sum, expected, rtol=1e-6)
    for got, want in zip(window_states, mae.variables, strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
    assert float(mae.variables[1].numpy()) == 10  # every example counted once


def test_evaluate_queued_pulls_the_ps_values_and_reports_progress(start_ps: StartPS) -> None:
    """A task evaluated in the graph uses the PS's values, not the worker's stale copy, and
    tells the worker its progress after each compiled call."""
    from elastic_step.worker import windows

    _, ps = start_ps(lambda: keras.optimizers.SGD(LR))
    trained = build_dense_model()
    values = ModelParameters(trained)
    for variable in trained.trainable_variables:
        variable.assign(variable + 0.5)
    assert ps.initialize(values.dense_values(), {}, {}, 0, values.state_values()) == [True] * 2
    model = build_dense_model()  # the initial values: what a stale copy holds
    parameters = ModelParameters(model)
    trainer = WindowTrainer(parameters, Steps(model, loss, parameters), 1, Connected(ps))
    rng = np.random.default_rng(2)
    features = rng.normal(size=(70, 4)).astype("float32")
    labels = features.sum(axis=1, keepdims=True)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(2)  # 35 batches
    progress: list[int] = []
    measured = trainer.evaluate_queued(iter(dataset), 35, progress.append)

    assert progress == [windows.EVALUATION_STEPS_PER_CALL, 35 - windows.EVALUATION_STEPS_PER_CALL]
    assert measured.examples == 70
    expected = sum(float(loss(y, trained(x))) * len(y) for x, y in dataset)
    np.testing.assert_allclose(measured.loss_sum, expected, rtol=1e-5)


def test_an_evaluation_feed_that_drops_records_fails_its_task_and_is_rebuilt(
    start_ps: StartPS,
) -> None:
    """Evaluated in the graph, a task's examples must add up to its records, as in training:
    a feed that drops half of them fails the task with a line that says so, and its input
    pipeline is marked broken, to be built anew for the next task."""
    from elastic_step.worker.stream import BatchStream
    from elastic_step.worker.worker import Worker

    _, ps = start_ps(lambda: keras.optimizers.SGD(LR))
    model = build_dense_model()
    parameters = ModelParameters(model)
    assert ps.initialize(parameters.dense_values(), {}, {}, 0, {}) == [True] * 2

    def halving_feed(batches, mode, schema):
        def examples(records):
            kept = tf.shape(records)[0] // 2
            return tf.zeros([kept, 4]), tf.zeros([kept, 1])

        return batches.map(examples)

    worker = Worker(master=None, name="worker-0", credentials=None)
    worker.trainer = WindowTrainer(parameters, Steps(model, loss, parameters), 1, Connected(ps))
    stream = BatchStream(halving_feed, "evaluate", schema=None, batch_size=4)
    batches = stream.put([b"record"] * 8)
    report = master_pb2.TaskReport()
    with pytest.raises(UserCodeError, match="the feed gave 4 examples for 8 records in 2 batches"):
        worker.evaluate(stream, 8, batches, report)
    assert stream.broken
