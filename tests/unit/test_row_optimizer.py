"""Per-row ("lazy") optimizer steps on embedding rows against Keras's own dense steps, and
the outer optimizers of local steps."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from elastic_step.model import row_optimizer
from elastic_step.model.api import UnsupportedOptimizerError
from elastic_step.model.outer_optimizer import build_outer_optimizer
from elastic_step.model.row_optimizer import RowOptimizer
from elastic_step.ps.shard import ParameterShard, TableShape

ROWS, DIM = 6, 3
OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "nesterov": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.01, beta_1=0.8, beta_2=0.95, epsilon=1e-6),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.2),
}


def _grads(steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(ROWS, DIM)).astype(np.float32) for _ in range(steps)]


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_rows_updated_at_every_step_match_keras(kind: str) -> None:
    start = np.random.default_rng(1).normal(size=(ROWS, DIM)).astype(np.float32)
    variable = keras.Variable(start.copy())
    dense = OPTIMIZERS[kind]()
    rows = RowOptimizer(OPTIMIZERS[kind](), ROWS, DIM, "float32")
    values = start.copy()
    for step, grad in enumerate(_grads(4), start=1):
        dense.apply_gradients([(grad, variable)])
        rows.apply(values, np.arange(ROWS), grad, lr=float(dense.learning_rate), step=step)
    np.testing.assert_allclose(values, variable.numpy(), rtol=1e-5, atol=1e-6)


#: Steps at which each row has a gradient: row 0 every step, row 1 at 1 and 4, row 2 at 2
#: and after a gap longer than the exact tail, row 3 once, rows 4 and 5 never.
TOUCHED = {0: range(1, 81), 1: (1, 4), 2: (2, 75), 3: (3,)}
STEPS = 80


@pytest.mark.parametrize("kind", ["adam", "momentum", "nesterov", "sgd", "adagrad"])
def test_rows_catch_up_what_keras_dense_steps_do_between_their_gradients(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keras's dense step with the table's gradient zero outside a step's rows, against the
    per-row step that touches only them: read at every step, the rows agree (reads catch up,
    here in blocks of 4 rows); untouched rows and their state stay as they were."""
    monkeypatch.setattr(row_optimizer, "READ_BLOCK_ROWS", 4)
    start = np.random.default_rng(1).normal(size=(ROWS, DIM)).astype(np.float32)
    variable = keras.Variable(start.copy())
    dense = OPTIMIZERS[kind]()
    rows = RowOptimizer(OPTIMIZERS[kind](), ROWS, DIM, "float32")
    table = start.copy()
    rng = np.random.default_rng(2)
    for step in range(1, STEPS + 1):
        ids = np.array([r for r, steps in TOUCHED.items() if step in steps])
        grad = np.zeros((ROWS, DIM), np.float32)
        grad[ids] = rng.normal(size=(len(ids), DIM))
        lr = float(dense.learning_rate)
        dense.apply_gradients([(grad, variable)])
        part = table[ids]
        rows.apply(part, ids, grad[ids], lr=lr, step=step)
        table[ids] = part
        served = rows.caught_up(table, np.arange(ROWS), step, lr)
        np.testing.assert_allclose(served, variable.numpy(), rtol=2e-4, atol=1e-6)
    np.testing.assert_array_equal(table[[4, 5]], start[[4, 5]])
    fresh = RowOptimizer(OPTIMIZERS[kind](), ROWS, DIM, "float32").slots
    for name, slot in rows.slots.items():
        np.testing.assert_array_equal(slot[[4, 5]], fresh[name][[4, 5]])
    if rows.has_momentum:
        assert rows.slots["last"].tolist() == [80, 4, 75, 3, 0, 0]
        # The table itself moves only when a row is updated: reads do not change it.
        assert not np.allclose(table[3], variable.numpy()[3])


@pytest.mark.parametrize("kind", ["adam", "momentum", "nesterov"])
def test_a_flush_moves_rows_by_all_their_momentum_would(kind: str) -> None:
    """After a window, a worker's rows take at once what Keras's dense steps with no more
    gradients would move them by (500 steps: the rest is nothing)."""
    variable = keras.Variable(np.zeros((2, DIM), np.float32))
    dense = OPTIMIZERS[kind]()
    rows = RowOptimizer(OPTIMIZERS[kind](), 2, DIM, "float32")
    values = np.zeros((2, DIM), np.float32)
    grads = _grads(3)
    for step, grad in enumerate(grads, start=1):
        dense.apply_gradients([(grad[:2], variable)])
        rows.apply(values, np.arange(2), grad[:2], lr=float(dense.learning_rate), step=step)
    for _ in range(500):
        dense.apply_gradients([(np.zeros((2, DIM), np.float32), variable)])
    rows.flush(values, np.arange(2), 3, float(dense.learning_rate))
    np.testing.assert_allclose(values, variable.numpy(), rtol=2e-4, atol=1e-6)
    momentum = rows.slots["m" if kind == "adam" else "momentum"]
    assert not momentum.any()  # spent: a later step starts without it
    np.testing.assert_array_equal(rows.caught_up(values, np.arange(2), 50, 0.1), values)


def test_the_ps_serves_rows_as_keras_dense_adam_leaves_them() -> None:
    """A PS shard with Adam: a dense variable and a table whose rows come in pushes now and
    then. Every pull, and the model saved at the end, reads the rows as Keras's dense Adam on
    the same gradients (zero where a push has no row) leaves them."""
    start = np.random.default_rng(3).normal(size=(ROWS, DIM)).astype(np.float32)
    shard = ParameterShard(0, 1, keras.optimizers.Adam(0.01), initial_table=lambda n, s: start)
    assert shard.initialize({"w": np.zeros(2, np.float32)}, {"t": TableShape(ROWS, DIM, "float32")},
                            {}, 0)  # fmt: skip
    table, dense = keras.Variable(start.copy()), keras.optimizers.Adam(0.01)
    rng = np.random.default_rng(4)
    for step in range(1, 30):
        ids = np.array([0] if step % 7 else [0, 2, 5])  # rows 2 and 5 now and then
        grads = rng.normal(size=(len(ids), DIM)).astype(np.float32)
        full = np.zeros((ROWS, DIM), np.float32)
        full[ids] = grads
        dense.apply_gradients([(full, table)])
        shard.push({"w": np.ones(2, np.float32)}, {"t": (ids, grads)}, shard.version)
        _, _, rows = shard.pull({"t": np.arange(ROWS)}, False)
        np.testing.assert_allclose(rows["t"], table.numpy(), rtol=2e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("optimizer", "message"),
    [
        (
            lambda: keras.optimizers.RMSprop(0.1),
            "SGD, Adam or Adagrad; the model's optimizer is RMSprop",
        ),
        (lambda: keras.optimizers.AdamW(0.1), "option weight_decay=0.004"),
        (lambda: keras.optimizers.Adam(0.1, clipnorm=1.0), "option clipnorm=1.0"),
        (lambda: keras.optimizers.Adam(0.1, amsgrad=True), "option amsgrad=True"),
    ],
)
def test_optimizers_without_a_per_row_form_are_refused(optimizer, message: str) -> None:
    with pytest.raises(UnsupportedOptimizerError, match=message):
        RowOptimizer(optimizer(), ROWS, DIM, "float32")


def test_outer_nesterov_is_diloco_s_on_dense_and_rows_alike() -> None:
    """Two pushes of pseudo-gradient g (a window's change, negated): with v = mu*v - lr*g,
    w += mu*v - lr*g (Keras's Nesterov SGD, DiLoCo's outer step with lr 0.7, mu 0.9)."""
    table = np.zeros((4, 2), np.float32)
    shard = ParameterShard(
        0, 1, build_outer_optimizer("nesterov"), initial_table=lambda n, s: table
    )
    assert shard.initialize(
        {"w": np.zeros(2, np.float32)}, {"t": TableShape(4, 2, "float32")}, {}, 0
    )
    g = np.array([1.0, -2.0], np.float32)
    expected, velocity = np.zeros(2), np.zeros(2)
    for _ in range(2):
        _, dense, rows = shard.push({"w": g}, {"t": (np.array([3]), g[None])}, shard.version,
                                    pull=({"t": np.array([3, 0])}, True))  # fmt: skip
        velocity = 0.9 * velocity - 0.7 * g
        expected = expected + 0.9 * velocity - 0.7 * g
        np.testing.assert_allclose(dense["w"], expected, rtol=1e-6)
        np.testing.assert_allclose(rows["t"], [expected, [0, 0]], rtol=1e-6)
    # The momentum is per row: row 3's; the others have none.
    np.testing.assert_allclose(
        shard.tables["t"].optimizer.slots["momentum"][3], velocity, rtol=1e-6
    )
    assert not shard.tables["t"].optimizer.slots["momentum"][[0, 1, 2]].any()


def test_outer_average_adds_the_change() -> None:
    shard = ParameterShard(0, 1, build_outer_optimizer("average"))
    assert shard.initialize({"w": np.ones(2, np.float32)}, {}, {}, 0)
    change = np.array([0.5, -0.25], np.float32)
    _, dense, _ = shard.push({"w": -change}, {}, 0, pull=({}, True))
    np.testing.assert_allclose(dense["w"], 1 + change, rtol=1e-6)
    with pytest.raises(ValueError, match="one of average, nesterov, got 'adam'"):
        build_outer_optimizer("adam")


def test_the_model_check_names_an_optimizer_tables_cannot_use() -> None:
    from elastic_step.model.parameters import table_optimizer_problem

    keras.backend.clear_session()
    ids = keras.Input(shape=(), dtype="int64")
    with_table = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Embedding(5, 2)(ids)))
    inputs = keras.Input((2,))
    without = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    problem = table_optimizer_problem(with_table, keras.optimizers.Nadam())
    assert problem == (
        "embedding tables are updated row by row with SGD, Adam or Adagrad; the model's "
        "optimizer is Nadam"
    )
    assert table_optimizer_problem(with_table, keras.optimizers.Adam()) is None
    assert table_optimizer_problem(without, keras.optimizers.Nadam()) is None


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_windows_on_joined_tables_and_their_rows_state_step_as_each_table_s_own(
    kind: str,
) -> None:
    """What a worker does (worker/window_rows.py): two tables joined into one group (the
    second's row r is the group's 50 + r), and each window's steps on the state of its rows
    taken out (take_rows), flushed and put back (put_rows). Rows and state end, to the bit,
    as under a RowOptimizer per table over its whole state."""
    rng = np.random.default_rng(4)
    sizes, lr = (50, 30), 0.05
    tables = [rng.normal(size=(n, DIM)).astype(np.float32) for n in sizes]
    per_table = [RowOptimizer(OPTIMIZERS[kind](), n, DIM, "float32") for n in sizes]
    joined = RowOptimizer(OPTIMIZERS[kind](), sum(sizes), DIM, "float32")
    joined_values = np.concatenate(tables)
    step = 0
    for _ in range(4):
        window = [np.sort(rng.choice(n, size=12, replace=False)) for n in sizes]
        window_ids = np.concatenate([window[0], window[1] + sizes[0]])
        part, rows = joined.take_rows(window_ids), joined_values[window_ids]
        for _ in range(5):
            step += 1
            picked = [np.sort(rng.choice(ids, size=6, replace=False)) for ids in window]
            grads = [rng.normal(size=(6, DIM)).astype(np.float32) for _ in sizes]
            for table, optimizer, ids, grad in zip(tables, per_table, picked, grads, strict=True):
                values = table[ids]
                optimizer.apply(values, ids, grad, lr, step)
                table[ids] = values
            at = np.searchsorted(window_ids, np.concatenate([picked[0], picked[1] + sizes[0]]))
            values = rows[at]
            part.apply(values, at, np.concatenate(grads), lr, step)
            rows[at] = values
        for table, optimizer, ids in zip(tables, per_table, window, strict=True):
            values = table[ids]
            optimizer.flush(values, ids, step, lr)
            table[ids] = values
        part.flush(rows, slice(None), step, lr)
        joined.put_rows(window_ids, part)
        joined_values[window_ids] = rows
    np.testing.assert_array_equal(joined_values, np.concatenate(tables))
    for name, slot in joined.slots.items():
        np.testing.assert_array_equal(slot, np.concatenate([o.slots[name] for o in per_table]))
