"""The serving graph's preprocessing encodes raw values exactly as the default feed encodes the
records that preprocess wrote from the same CSV, in every input form."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from elastic_step.data.feed import DefaultFeed, InputForm, records_dataset
from elastic_step.data.schema import Schema
from elastic_step.data.tfrecord import read_records
from elastic_step.model.serving import RawFeatures, raw_examples


@pytest.mark.parametrize("one_hot", [False, True], ids=["ids", "one-hot"])
def test_raw_features_encode_as_the_feed_does(tmp_path, one_hot):
    rng = np.random.default_rng(1)
    rows = ["colour,fixed acidity,depth,kind"]
    for i in range(120):
        colour = ["red", "blue", "", "green"][i % 4]  # surrounding spaces: preprocess strips
        acidity = "" if i % 6 == 0 else f"{rng.normal(8, 2):.3f}"
        rows.append(f" {colour} ,{acidity},{rng.normal(100, 30):.2f},{['a', 'b'][i % 2]}")
    (tmp_path / "rows.csv").write_text("\n".join(rows) + "\n")
    data = tmp_path / "data"
    args = ["--fill-missing", "mean", "--one-hot"] if one_hot else ["--fill-missing", "mean"]
    result = subprocess.run(
        [sys.executable, "-m", "elastic_step", "preprocess", "--input", str(tmp_path / "rows.csv"),
         "--label", "kind", "--output", str(data), "--validation-fraction", "0.3", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    schema = Schema.load(str(data))
    records = [r for split in ("train", "validation")
               for path, n in schema.shard_paths(str(data), split)
               for r in read_records(path, 0, n)]  # fmt: skip
    raw = raw_examples(tf.constant(records), schema)
    assert np.isnan(raw["fixed_acidity"].numpy()).any()
    for vector in (False, True):
        feed = DefaultFeed(schema, InputForm(vector=vector))
        ((expected, _),) = list(feed(records_dataset(records, len(records)), "evaluate"))
        layer = RawFeatures(schema_json=schema.to_json(), vector=vector, schema=schema)
        got = layer(raw)
        tf.nest.map_structure(
            lambda a, b: np.testing.assert_array_equal(a.numpy(), b.numpy()), got, expected
        )
        # A value never seen gets the unknown id, the last one (colour is the first column).
        unseen = {**{k: v[:1] for k, v in raw.items()}, "colour": tf.constant(["mauve"])}
        encoded = layer(unseen)
        colour = (encoded if vector else encoded["colour"]).numpy()[0]
        unknown = schema.feature("colour").vocabulary_size
        want = np.eye(unknown + 1)[unknown] if one_hot else [unknown]
        assert list(np.atleast_1d(colour)[: len(want)]) == list(want)


def test_a_load_without_the_layer_registered_says_what_to_import(tmp_path):
    """keras.models.load_model of model.keras needs this module imported first; Keras's own
    error prints the layer's config, whose first entry says so."""
    import keras

    (tmp_path / "rows.csv").write_text("x,colour,y\n" + "".join(
        f"{i * 0.5},{['red', 'blue'][i % 2]},{i % 2}\n" for i in range(20)
    ))  # fmt: skip
    data = tmp_path / "data"
    result = subprocess.run(
        [sys.executable, "-m", "elastic_step", "preprocess", "--input", str(tmp_path / "rows.csv"),
         "--label", "y", "--output", str(data)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    schema = Schema.load(str(data))
    inputs = {
        "x": keras.Input(shape=(), name="x"),
        "colour": keras.Input(shape=(), dtype="string", name="colour"),
    }
    features = RawFeatures(schema_json=schema.to_json(), vector=True, schema=schema)(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(features))
    model.save(tmp_path / "model.keras")
    load = f"import keras; m = keras.models.load_model({str(tmp_path / 'model.keras')!r})"
    bare = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=120)
    assert bare.returncode != 0
    assert RawFeatures.LOAD_WITH in bare.stderr
    # Loaded elsewhere, with the data directory gone: the vocabulary came in the archive.
    rows = {"x": [0.5, 1.0, 2.0], "colour": ["blue", "mauve", "red"]}  # mauve: never seen
    shutil.rmtree(data)
    batch = f"{{k: np.array(v) for k, v in {rows!r}.items()}}"
    predict = f"import numpy as np; print(m({batch}).numpy().ravel().tolist())"
    registered = subprocess.run(
        [sys.executable, "-c", f"import elastic_step.model.serving; {load}; {predict}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert registered.returncode == 0, registered.stderr[-2000:]
    loaded = json.loads(registered.stdout.strip().splitlines()[-1])
    here = model({k: np.array(v) for k, v in rows.items()}).numpy().ravel()
    np.testing.assert_allclose(loaded, here, rtol=1e-6)


def test_one_logit_of_unknown_batch_is_the_second_class_s() -> None:
    """A binary classifier's one logit, traced as a signature traces it (batch unknown): the
    probabilities of both classes, not a softmax over one column."""
    from elastic_step.model.serving import OutputHead

    head = OutputHead(classes=["no", "yes"], logits=True)
    serve = tf.function(lambda x: head(x), input_signature=[tf.TensorSpec([None, 1], tf.float32)])
    result = serve(tf.constant([[0.0], [2.0]]))
    expected_yes = 1 / (1 + np.exp(-2.0))
    np.testing.assert_allclose(
        result["probabilities"].numpy(), [[0.5, 0.5], [1 - expected_yes, expected_yes]], rtol=1e-6
    )
    assert result["classes"].numpy().tolist() == [b"no", b"yes"]
