"""Model definitions written as Keras code: what training takes from them, and their errors.

Each definition is a real file, loaded and checked on real preprocessed records, as
`elastic-step train` does before it starts anything.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import keras
import numpy as np
import pytest

from elastic_step.cli import main
from elastic_step.data.feed import default_feed_for, make_dataset
from elastic_step.data.schema import Schema
from elastic_step.data.tfrecord import read_records
from elastic_step.errors import ModelDefinitionError
from elastic_step.model.definition import (
    ModelDefinition,
    check_model_definition,
    load_model_definition,
)

#: A functional model of the 3-class data below; each test adds what it is about.
FUNCTIONAL = """
import keras

def model():
    inputs = {n: keras.Input(shape=(), name=n) for n in ("x", "y")}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in ("x", "y")])
    return keras.Model(inputs, keras.layers.Dense(3)(x))
"""

#: The same model with one sigmoid output, for the 2-class label "binary".
BINARY = FUNCTIONAL.replace("Dense(3)(x)", 'Dense(1, activation="sigmoid")(x)')


def _write_data(root: Path, label: str) -> Path:
    rng = np.random.default_rng(3)
    rows = ["x,y,label"]
    for i in range(48):
        value = i % 3 if label == "class3" else i % 2
        rows.append(f"{rng.normal(value, 0.5):.4f},{rng.normal(-value, 0.5):.4f},{value}")
    (root / "data.csv").write_text("\n".join(rows) + "\n")
    out = root / "data"
    args = ["preprocess", "--input", str(root / "data.csv"), "--label", "label"]
    assert main([*args, "--output", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def class3_data(tmp_path_factory) -> Path:
    return _write_data(tmp_path_factory.mktemp("class3"), "class3")


@pytest.fixture(scope="module")
def binary_data(tmp_path_factory) -> Path:
    return _write_data(tmp_path_factory.mktemp("binary"), "binary")


def sample_records(data: Path) -> list[bytes]:
    shard, records = Schema.load(str(data)).shard_paths(str(data), "train")[0]
    return read_records(shard, 0, min(8, records))


def load(tmp_path: Path, data: Path, source: str) -> ModelDefinition:
    path = tmp_path / "model_def.py"
    path.write_text(textwrap.dedent(source))
    return load_model_definition(str(path), Schema.load(str(data)))


def checked(tmp_path: Path, data: Path, source: str) -> ModelDefinition:
    definition = load(tmp_path, data, source)
    check_model_definition(definition, sample_records(data))
    return definition


def first_batch(definition: ModelDefinition, data: Path):
    """A model built from the definition, and its labels and outputs on the sample records."""
    model = definition.build_model()
    records = sample_records(data)
    dataset = make_dataset(
        records, batch_size=len(records), mode="evaluate", schema=definition.schema,
        feed=definition.feed,
    )  # fmt: skip
    features, labels = next(iter(dataset))
    return model, labels, model(features, training=False)


def loss_and_crossentropies(definition: ModelDefinition, data: Path) -> tuple[float, np.ndarray]:
    """The definition's loss on the sample batch, and the per-example sparse categorical
    cross-entropy of the batch's logits: what a cross-entropy loss reduces."""
    _, labels, outputs = first_batch(definition, data)
    per_example = keras.losses.sparse_categorical_crossentropy(labels, outputs, True)
    return float(definition.loss(labels, outputs)), np.asarray(per_example)


def problem(tmp_path: Path, data: Path, source: str) -> str:
    with pytest.raises(ModelDefinitionError) as info:
        checked(tmp_path, data, source)
    message = str(info.value)
    assert "\n" not in message and "\x1b" not in message, "one plain line"
    return message.split(": ", 1)[1]


# -- the loss --


def test_a_per_example_loss_function_is_reduced_by_its_mean(tmp_path, class3_data):
    definition = checked(
        tmp_path,
        class3_data,
        FUNCTIONAL
        + "\ndef loss(labels, outputs):\n"
        + "    return keras.losses.sparse_categorical_crossentropy(labels, outputs, True)\n"
        + "\noptimizer = keras.optimizers.SGD(0.1)\n",
    )
    loss, per_example = loss_and_crossentropies(definition, class3_data)
    assert per_example.shape == (8,)
    assert loss == pytest.approx(float(np.mean(per_example)))


def test_a_scalar_loss_function_keeps_its_value(tmp_path, class3_data):
    definition = checked(
        tmp_path,
        class3_data,
        FUNCTIONAL
        + "\ndef loss(labels, outputs):\n"
        + "    return keras.ops.sum(keras.ops.square(outputs)) + 7.0\n"
        + "\noptimizer = keras.optimizers.SGD(0.1)\n",
    )
    _, labels, outputs = first_batch(definition, class3_data)
    expected = float(np.sum(np.square(outputs))) + 7.0
    assert float(definition.loss(labels, outputs)) == pytest.approx(expected, rel=1e-5)


def test_a_loss_function_gets_labels_shaped_as_compile_gives_them(tmp_path, binary_data):
    """Labels [batch] against sigmoid outputs [batch, 1]: binary_crossentropy called as it is
    rejects the ranks; compile() matches them, and so does training."""
    definition = checked(
        tmp_path,
        binary_data,
        BINARY
        + "\ndef loss(labels, outputs):\n"
        + "    return keras.losses.binary_crossentropy(labels, outputs)\n"
        + "\noptimizer = keras.optimizers.SGD(0.1)\n",
    )
    _, labels, outputs = first_batch(definition, binary_data)
    assert outputs.shape == (8, 1)
    truth = np.asarray(labels, np.float32)[:, None]
    expected = np.mean(keras.losses.binary_crossentropy(truth, outputs))
    assert float(definition.loss(labels, outputs)) == pytest.approx(float(expected), rel=1e-5)
    with pytest.raises(ValueError, match="must have the same rank"):
        keras.losses.binary_crossentropy(np.asarray(labels, np.float32), outputs)


@pytest.mark.parametrize(
    ("reduction", "reduce"), [("sum", np.sum), ("sum_over_batch_size", np.mean), (None, np.mean)]
)
def test_a_loss_object_keeps_its_reduction(tmp_path, class3_data, reduction, reduce):
    definition = checked(
        tmp_path,
        class3_data,
        FUNCTIONAL
        + "\nloss = keras.losses.SparseCategoricalCrossentropy(\n"
        + f"    from_logits=True, reduction={reduction!r})\n"
        + "\noptimizer = keras.optimizers.SGD(0.1)\n",
    )
    loss, per_example = loss_and_crossentropies(definition, class3_data)
    assert loss == pytest.approx(float(reduce(per_example)), rel=1e-5)


def test_loss_names_resolve_as_compile_resolves_them(tmp_path, binary_data):
    """ "crossentropy" means binary crossentropy for one sigmoid output, as in compile()."""
    definition = checked(
        tmp_path, binary_data, BINARY + '\nloss = "crossentropy"\noptimizer = "sgd"\n'
    )
    _, labels, outputs = first_batch(definition, binary_data)
    truth = np.asarray(labels, np.float32)[:, None]
    expected = float(np.mean(keras.losses.binary_crossentropy(truth, outputs)))
    assert float(definition.loss(labels, outputs)) == pytest.approx(expected, rel=1e-5)
    assert isinstance(definition.build_optimizer(), keras.optimizers.SGD)


# -- a compiled model, and what the file defines instead --

COMPILED = FUNCTIONAL.replace(
    "    return keras.Model(inputs, keras.layers.Dense(3)(x))",
    """    model = keras.Model(inputs, keras.layers.Dense(3)(x))
    model.compile(
        optimizer=keras.optimizers.SGD(0.3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum"),
        metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")],
    )
    return model""",
)


def test_a_compiled_model_gives_loss_optimizer_and_metrics(tmp_path, class3_data):
    definition = checked(tmp_path, class3_data, COMPILED)
    optimizer = definition.build_optimizer()
    assert isinstance(optimizer, keras.optimizers.SGD)
    assert float(optimizer.learning_rate) == pytest.approx(0.3)
    metrics = definition.build_metrics()
    assert list(metrics) == ["accuracy", "top2"]
    assert isinstance(metrics["accuracy"], keras.metrics.SparseCategoricalAccuracy)
    loss, per_example = loss_and_crossentropies(definition, class3_data)
    assert loss == pytest.approx(float(np.sum(per_example)))


def test_what_the_file_defines_takes_precedence_over_compile(tmp_path, class3_data):
    definition = checked(
        tmp_path,
        class3_data,
        COMPILED
        + "\ndef optimizer():\n    return keras.optimizers.Adam(0.01)\n"
        + '\nloss = "sparse_categorical_crossentropy"\n'
        + '\nmetrics = {"acc": "sparse_categorical_accuracy"}\n',
    )
    assert isinstance(definition.build_optimizer(), keras.optimizers.Adam)
    assert list(definition.build_metrics()) == ["acc"]
    _, labels, outputs = first_batch(definition, class3_data)
    expected = np.mean(keras.losses.sparse_categorical_crossentropy(labels, outputs))
    assert float(definition.loss(labels, outputs)) == pytest.approx(float(expected), rel=1e-5)


def test_module_level_objects_are_accepted(tmp_path, binary_data):
    definition = checked(
        tmp_path,
        binary_data,
        BINARY
        + '\noptimizer = keras.optimizers.Adam(0.01)\nloss = "mse"\n'
        + "metrics = keras.metrics.AUC()\n",
    )
    assert isinstance(definition.build_optimizer(), keras.optimizers.Adam)
    assert list(definition.build_metrics()) == ["auc"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (FUNCTIONAL, keras.metrics.SparseCategoricalAccuracy),
        (BINARY, keras.metrics.BinaryAccuracy),
    ],
    ids=["3-class", "binary"],
)
def test_accuracy_is_chosen_by_the_shapes_of_labels_and_outputs(
    tmp_path, class3_data, binary_data, source, expected
):
    data = class3_data if source is FUNCTIONAL else binary_data
    source += '\nloss = "crossentropy"\noptimizer = "sgd"\nmetrics = ["accuracy"]\n'
    definition = checked(tmp_path, data, source)
    assert type(definition.build_metrics()["accuracy"]) is expected


# -- models that are not functional --


@pytest.mark.parametrize(
    "source",
    [
        """
        import keras

        def model():
            return keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(3)])

        def feed(dataset, mode, schema):
            from elastic_step.data.feed import default_feed
            import tensorflow as tf
            return default_feed(dataset, mode, schema).map(
                lambda f, y: (tf.stack([f["x"], f["y"]], axis=1), y))
        """,
        """
        import keras

        class Classifier(keras.Model):
            def __init__(self):
                super().__init__()
                self.hidden = keras.layers.Dense(4)
                self.scores = keras.layers.Dense(3)

            def call(self, inputs):
                return self.scores(self.hidden(keras.ops.stack([inputs["x"], inputs["y"]], 1)))

        def model():
            return Classifier()
        """,
    ],
    ids=["sequential-without-input", "subclassed"],
)
def test_models_without_variables_are_built_the_same_way_every_time(tmp_path, class3_data, source):
    source = textwrap.dedent(source)
    source += '\nloss = keras.losses.SparseCategoricalCrossentropy(True)\noptimizer = "sgd"\n'
    definition = checked(tmp_path, class3_data, source)
    first, second = definition.build_model(), definition.build_model()
    paths = [v.path for v in first.trainable_variables]
    assert len(paths) == 4
    assert paths == [v.path for v in second.trainable_variables]


# -- errors --


def test_an_error_in_the_users_code_names_the_line(tmp_path, class3_data):
    source = FUNCTIONAL.replace(
        '    inputs = {n: keras.Input(shape=(), name=n) for n in ("x", "y")}',
        '    raise ValueError("no such layer size")',
    )
    line = source.splitlines().index('    raise ValueError("no such layer size")') + 1
    assert problem(tmp_path, class3_data, source) == (
        f"model() raised ValueError at line {line}: no such layer size"
    )


def test_an_error_inside_keras_says_so_and_names_the_calling_line(tmp_path, class3_data):
    source = FUNCTIONAL.replace(
        "keras.layers.Dense(3)(x)", "keras.layers.Reshape((5,))(keras.layers.Dense(3)(x))"
    )
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "Reshape((5,))" in text)
    message = problem(tmp_path, class3_data, source)
    assert message.startswith(f"model() raised ValueError inside Keras (called from line {line}): ")


def test_a_model_that_rejects_the_feed_says_where_on_one_line(tmp_path, class3_data):
    source = FUNCTIONAL.replace('("x", "y")', '("x", "z")')
    message = problem(tmp_path, class3_data, source + '\nloss = "mse"\noptimizer = "sgd"\n')
    assert message.startswith("the model failed on the first batch: ")
    assert "inside Keras" in message


def test_an_error_in_a_traced_feed_gives_its_cause_and_the_users_line(tmp_path, class3_data):
    """TensorFlow puts a traced function's frames before the cause in its message: the one
    line keeps the cause (the newcomer's stack of float32 and int64 columns)."""
    source = FUNCTIONAL + textwrap.dedent(
        """
        import tensorflow as tf

        loss = "mse"
        optimizer = "sgd"

        def feed(dataset, mode, schema):
            return dataset.map(
                lambda records: (tf.stack([tf.zeros([1]), tf.zeros([1], tf.int64)]), records)
            )
        """
    )
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "tf.stack(" in text)
    message = problem(tmp_path, class3_data, source)
    assert message.startswith(
        f"the feed failed: TypeError inside TensorFlow (called from line {line}): "
    )
    assert message.endswith("have types [float32, int64] that don't all match."), message
    assert "in user code" not in message


def test_a_metric_whose_result_fails_is_named_before_launch(tmp_path, class3_data):
    # Workers read each metric's result after every training task: a broken result() must
    # fail the check, not every task.
    source = (
        FUNCTIONAL
        + """
class Broken(keras.metrics.SparseCategoricalAccuracy):
    def result(self):
        raise ValueError("no result yet")

loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = "sgd"
metrics = [Broken(name="broken")]
"""
    )
    message = problem(tmp_path, class3_data, source)
    assert message.startswith("the result of the metric 'broken' failed on the first batch: ")
    assert "no result yet" in message


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ('\noptimizer = "sgd"\n', "no loss: define loss (a function, a keras.losses.Loss or a "),
        ('\nloss = "mse"\n', "no optimizer: define optimizer"),
        ('\nloss = "mse2"\noptimizer = "sgd"\n', "loss: 'mse2' is not a Keras loss name"),
        ('\nloss = "mse"\noptimizer = "adamm"\n', "optimizer: 'adamm' is not a Keras optimizer"),
        (
            '\nloss = "mse"\noptimizer = "sgd"\nmetrics = ["auc", keras.metrics.AUC()]\n',
            "metrics: two metrics are named 'auc'; give one another name (name=...)",
        ),
        (
            '\nloss = "mse"\noptimizer = "sgd"\nmetrics = [3]\n',
            "metrics: got int in the metrics, expected a keras.metrics.Metric, a metric name or",
        ),
        ('\nloss = 3\noptimizer = "sgd"\n', "loss: got int, expected a function, a keras.losses"),
    ],
    ids=["no-loss", "no-optimizer", "loss-name", "optimizer-name", "same-name", "metric", "loss"],
)
def test_bad_parts_name_the_part_the_value_and_the_rule(tmp_path, class3_data, extra, expected):
    assert problem(tmp_path, class3_data, FUNCTIONAL + extra).startswith(expected)


def test_unsupported_compile_settings_are_named(tmp_path, class3_data):
    source = COMPILED.replace("optimizer=keras", "loss_weights=[0.5],\n        optimizer=keras")
    assert problem(tmp_path, class3_data, source) == (
        "model.compile(loss_weights=...) is not supported: training has one loss"
    )


def test_model_must_be_a_function(tmp_path, class3_data):
    source = "import keras\nmodel = keras.Sequential([keras.layers.Dense(1)])\n"
    assert problem(tmp_path, class3_data, source).startswith(
        "'model' is Sequential; it must be a function that returns a new keras.Model"
    )


def test_verbose_logs_the_full_traceback(tmp_path, class3_data):
    source = FUNCTIONAL.replace("Dense(3)(x)", "Reshape((5,))(keras.layers.Dense(3)(x))")
    (tmp_path / "model_def.py").write_text(source)
    argv = [sys.executable, "-m", "elastic_step", "-v", "train", "--model-def",
            str(tmp_path / "model_def.py"), "--data", str(class3_data),
            "--output", str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith(
        f"elastic-step: error: model definition {tmp_path / 'model_def.py'}: model() raised "
        "ValueError inside Keras (called from line "
    )
    assert "Traceback (most recent call last)" in result.stderr
    assert f'File "{tmp_path / "model_def.py"}", line ' in result.stderr
    assert "keras/src/layers/reshaping/reshape.py" in result.stderr, "Keras's frames too"
    assert not (tmp_path / "run").exists()


def test_the_guides_example_is_the_tested_model_definition():
    """The model definition guide's existing-script example is the code that the e2e tests
    train."""
    root = Path(__file__).resolve().parents[2]
    guide = (root / "docs/guides/model-definition.md").read_text()
    after = guide.split("As a model definition (the code of", 1)[1]
    example = after.split("```python\n", 1)[1].split("```", 1)[0]
    tested = (root / "tests/e2e/keras_models/compiled_sequential.py").read_text()
    assert tested.split('"""\n', 1)[1].lstrip("\n") == example


def test_a_definition_whose_text_changed_since_the_job_started_is_refused_unrun(tmp_path):
    from elastic_step.errors import ModelDefinitionError
    from elastic_step.model.definition import load_model_definition, source_digest

    path = tmp_path / "model_def.py"
    path.write_text("import keras\n\ndef model():\n    return keras.Sequential()\n")
    digest = source_digest(path.read_text())
    assert load_model_definition(str(path), sha256=digest).source == path.read_text()
    marker = tmp_path / "ran"
    path.write_text(f"open({str(marker)!r}, 'w').close()\n" + path.read_text())
    with pytest.raises(ModelDefinitionError) as raised:
        load_model_definition(str(path), sha256=digest)
    assert f"its SHA-256 is {source_digest(path.read_text())[:12]}..." in str(raised.value)
    assert f"not {digest[:12]}... as when the job started" in str(raised.value)
    assert not marker.exists()  # refused before any of it ran


# -- model(schema) --


def test_model_of_the_schema_is_given_it(tmp_path, class3_data):
    """``model(schema)``: a model shaped by the data (here: one input per feature column)."""
    definition = checked(
        tmp_path,
        class3_data,
        """
        import keras

        def model(schema):
            inputs = {c.input_name: keras.Input(shape=(), name=c.input_name)
                      for c in schema.columns}
            x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(v)
                                            for v in inputs.values()])
            return keras.Model(inputs, keras.layers.Dense(schema.num_classes)(x))

        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        optimizer = "adam"
        """,
    )
    model, _, outputs = first_batch(definition, class3_data)
    assert sorted(model.input) and outputs.shape[-1] == 3


def test_a_model_with_two_parameters_is_refused_at_load(tmp_path, class3_data):
    with pytest.raises(ModelDefinitionError, match=r"model\(schema, size\) takes 2 arguments; "
                       r"it must be model\(\) or model\(schema\)"):  # fmt: skip
        load(tmp_path, class3_data, "def model(schema, size):\n    pass\n")


def test_the_check_lets_go_of_the_feeds_lookup_tables(tmp_path):
    """The master checks the definition, then trains nothing: the default feed the check
    used, with a lookup table per categorical column (a vocabulary can hold millions of
    values), is freed afterwards."""
    rows = ["x,color,label"] + [f"{i % 3 + 0.5},{'rgb'[i % 3]},{i % 3}" for i in range(30)]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    data = tmp_path / "data"
    args = ["preprocess", "--input", str(tmp_path / "data.csv"), "--label", "label"]
    assert main([*args, "--output", str(data)]) == 0
    definition = load(
        tmp_path,
        data,
        """
        import keras

        def model(schema):
            inputs, parts = {}, []
            for c in schema.columns:
                if c.kind == "categorical":
                    ids = inputs[c.input_name] = keras.Input((), name=c.input_name, dtype="int64")
                    parts.append(keras.layers.Embedding(c.num_ids, 2)(ids))
                else:
                    x = inputs[c.input_name] = keras.Input((), name=c.input_name)
                    parts.append(keras.layers.Reshape((1,))(x))
            return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Concatenate()(parts)))

        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        optimizer = "adam"
        """,
    )
    table = weakref.ref(default_feed_for(definition.schema)._tables["color"])
    check_model_definition(definition, sample_records(data))
    assert table() is None, "the check's feed keeps its lookup table"
