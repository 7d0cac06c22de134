"""Preprocessing as a stream: output independent of the memory budget, compression and storage;
stratified splits; loud type inference; missing values; Keras input names; a CSV larger than
the memory the process may use."""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import resource
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from file_trees import tree
from written_records import example_values, split_rows

from elastic_step.data import storage
from elastic_step.data.input_names import input_names
from elastic_step.data.preprocess import MemoryBudget, preprocess
from elastic_step.data.schema import Schema
from elastic_step.data.tfrecord import read_records
from elastic_step.errors import InputError

# Small enough that a 600-row file takes many blocks, batches, spills and buckets.
TINY = MemoryBudget(block_bytes=512, batch_bytes=2048, spill_bytes=4096, bucket_bytes=4096)


@pytest.fixture
def wine_csv(tmp_path: Path) -> Path:
    """600 rows: names with '/' and spaces, empty numeric cells, a categorical column with
    an empty cell, and a 3-class label sorted in the file (a worst case for shuffling)."""
    rng = np.random.default_rng(5)
    lines = ["fixed acidity,od280/od315_of_diluted_wines,region,cultivar"]
    for i in range(600):
        acidity = "" if i % 37 == 0 else f"{rng.normal(8, 1.5):.3f}"
        region = "" if i == 10 else ["north", "south", "east"][i % 3]
        lines.append(f"{acidity},{rng.normal(2.5, 0.7):.4f},{region},{i * 3 // 600}")
    path = tmp_path / "wine.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_output_is_the_same_whatever_the_budget_compression_or_storage(
    wine_csv: Path, tmp_path: Path, s3_env
) -> None:
    """The in-memory path (one batch, one bucket per shard) and the streaming path (hundreds
    of batches and buckets), from a local file, a .csv.gz, and s3://, write the same bytes."""
    common = {"label": "cultivar", "fill_missing": "mean", "seed": 3}
    in_memory = tmp_path / "in-memory"
    schema = preprocess(input_path=str(wine_csv), output=str(in_memory), **common)
    assert schema.records == {"train": 480, "validation": 120}

    gz = tmp_path / "wine.csv.gz"
    gz.write_bytes(gzip.compress(wine_csv.read_bytes()))
    streamed = tmp_path / "streamed"
    preprocess(input_path=str(gz), output=str(streamed), memory=TINY, **common)
    assert tree(streamed) == tree(in_memory)

    bucket = s3_env.new_bucket()
    uri = f"s3://{bucket}/in/wine.csv"
    storage.write_bytes_atomic(uri, wine_csv.read_bytes())
    from_s3 = tmp_path / "from-s3"
    preprocess(input_path=uri, output=str(from_s3), memory=TINY, **common)
    assert tree(from_s3) == tree(in_memory)

    # A CSV sorted by label still gives shards in random order.
    first_shard = split_rows(Schema.load(str(in_memory)), str(in_memory), "train")[:120]
    assert len({r["cultivar"] for r in first_shard[:20]}) == 3


def test_gzip_is_told_by_its_first_bytes_not_its_name(
    wine_csv: Path, tmp_path: Path, s3_env
) -> None:
    """The Argo preprocess step saves every input as data.csv: gzip under that name, locally
    or on an object store, preprocesses as the plain file does; a plain file named .gz too."""
    common = {"label": "cultivar", "fill_missing": "mean", "seed": 3}
    plain = tmp_path / "plain"
    preprocess(input_path=str(wine_csv), output=str(plain), **common)
    compressed = gzip.compress(wine_csv.read_bytes())
    (tmp_path / "gz").mkdir()
    local = tmp_path / "gz" / "data.csv"
    local.write_bytes(compressed)
    uri = f"s3://{s3_env.new_bucket()}/in/data.csv"
    storage.write_bytes_atomic(uri, compressed)
    misnamed = tmp_path / "plain.csv.gz"
    misnamed.write_bytes(wine_csv.read_bytes())
    for i, source in enumerate([str(local), uri, str(misnamed)]):
        out = tmp_path / f"out-{i}"
        schema = preprocess(input_path=source, output=str(out), memory=TINY, **common)
        assert schema.records == {"train": 480, "validation": 120}, source
        assert tree(out) == tree(plain), source


def test_three_class_split_is_stratified(tmp_path: Path) -> None:
    counts = {"a": 30, "b": 60, "c": 90}
    lines = ["x,y"] + [f"{i},{label}" for label, n in counts.items() for i in range(n)]
    path = tmp_path / "three.csv"
    path.write_text("\n".join(lines) + "\n")
    for seed in (0, 1):
        out = str(tmp_path / f"out{seed}")
        schema = preprocess(input_path=str(path), label="y", output=out, seed=seed)
        validation = Counter(r["y"] for r in split_rows(schema, out, "validation"))
        train = Counter(r["y"] for r in split_rows(schema, out, "train"))
        assert validation == {"a": 6, "b": 12, "c": 18}
        assert train == {"a": 24, "b": 48, "c": 72}
    picked = [
        sorted(
            r["x"]
            for r in split_rows(
                Schema.load(str(tmp_path / f"out{s}")), str(tmp_path / f"out{s}"), "validation"
            )
        )
        for s in (0, 1)
    ]
    assert picked[0] != picked[1]  # the seed picks the rows


def _stray_text_csv(tmp_path: Path) -> Path:
    """The issue's file: 50 rows, column b integers, but 'seven' on line 27."""
    lines = ["a,b,label"] + [f"{i * 0.5},{'seven' if i == 25 else i},{i % 2}" for i in range(50)]
    path = tmp_path / "stray.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_stray_text_in_a_numeric_column_is_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    path = _stray_text_csv(tmp_path)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "elastic_step", "preprocess", "--input", str(path),
         "--label", "label", "--output", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    message = result.stderr.strip()
    assert message == (
        f"elastic-step: error: {path}: line 27: column 'b' has non-numeric value 'seven', but "
        "49 of its first 50 values are numbers (pass --categorical b to treat it as categorical)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stray.csv"]

    schema = preprocess(input_path=str(path), label="label", output=str(out), categorical=["b"])
    assert schema.feature("b").kind == "categorical"


def test_type_inference_rules(tmp_path: Path) -> None:
    # Mostly text with a few numbers is categorical; numbers after the sample must stay numbers.
    lines = ["size,n,label"] + [
        f"{['S', 'M', 'XL', '40'][i % 4]},{'oops' if i == 150 else i},{i % 2}" for i in range(200)
    ]
    path = tmp_path / "kinds.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        InputError,
        match=r"line 152: column 'n' has non-numeric value 'oops', "
        r"but was inferred numeric from its first 100 values \(pass --categorical n",
    ):
        preprocess(input_path=str(path), label="label", output=str(tmp_path / "o"))
    schema = preprocess(
        input_path=str(path), label="label", output=str(tmp_path / "o"), categorical=["n"]
    )
    assert schema.feature("size").kind == "categorical"
    assert schema.vocabulary(schema.feature("size")) == ["40", "M", "S", "XL"]


def test_id_column_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lines = ["id,x,label"] + [f"u{i:04d},{i % 7},{i % 2}" for i in range(100)]
    path = tmp_path / "ids.csv"
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING):
        preprocess(input_path=str(path), label="label", output=str(tmp_path / "o"))
    assert [r.getMessage() for r in caplog.records] == [
        "column 'id' has 100 distinct values in 100 rows: probably an id column, which a model "
        "cannot learn from; drop it, or, if its values recur in new data, give it --hash-buckets "
        "id=200 (about 2 ids per value), or --min-frequency 2 (0 of its values are seen twice or "
        "more)"
    ]


def test_fill_missing(wine_csv: Path, tmp_path: Path) -> None:
    with pytest.raises(
        InputError,
        match=r"wine\.csv: line 2: empty value in numeric column 'fixed acidity' "
        r"\(pass --fill-missing mean\|zero\|VALUE, or --categorical fixed acidity\)",
    ):
        preprocess(input_path=str(wine_csv), label="cultivar", output=str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()

    out = str(tmp_path / "mean")
    schema = preprocess(input_path=str(wine_csv), label="cultivar", output=out, fill_missing="mean")
    acidity = schema.feature("fixed acidity")
    train = split_rows(schema, out, "train")
    present = [r["fixed acidity"] for r in train if "fixed acidity" in r]
    assert len(present) < len(train)  # the empty cells stay empty in the records
    assert acidity.mean == pytest.approx(np.mean(present), rel=1e-6)
    assert acidity.fill == acidity.mean
    assert schema.feature("od280/od315_of_diluted_wines").fill is not None
    assert "" in schema.vocabulary(schema.feature("region"))  # an empty categorical cell is a value
    assert json.loads((Path(out) / "schema.json").read_text())["columns"][0]["fill"] == acidity.mean

    for text, value in (("zero", 0.0), ("-1.5", -1.5)):
        schema = preprocess(
            input_path=str(wine_csv),
            label="cultivar",
            output=str(tmp_path / text),
            fill_missing=text,
        )
        assert {c.fill for c in schema.columns if c.kind == "numeric"} == {value}
    with pytest.raises(
        InputError, match=r"--fill-missing must be mean, zero or a number, got 'nan'"
    ):
        preprocess(input_path=str(wine_csv), label="cultivar", output=out, fill_missing="nan")


def test_keras_input_names(wine_csv: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    schema = preprocess(
        input_path=str(wine_csv),
        label="cultivar",
        output=str(tmp_path / "o"),
        fill_missing="zero",
        progress=lines.append,
        progress_every_s=0,
    )
    assert [(c.name, c.input_name) for c in schema.columns] == [
        ("fixed acidity", "fixed_acidity"),
        ("od280/od315_of_diluted_wines", "od280_od315_of_diluted_wines"),
        ("region", "region"),
    ]
    assert (
        "Keras input names: 'fixed acidity' -> 'fixed_acidity', "
        "'od280/od315_of_diluted_wines' -> 'od280_od315_of_diluted_wines'"
    ) in lines
    assert any(line.startswith("reading: 600 rows, ") for line in lines)  # progress
    assert schema.feature("fixed_acidity") is schema.feature("fixed acidity")
    assert input_names(["a b", "a_b", "a/b", "ok-1.x", "2019", "%", "é"]) == [
        "a_b_2", "a_b", "a_b_3", "ok-1.x", "2019", "column_6", "column_7",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # An unclosed quote runs to the end of the file: the row ends on its last line.
        ('a,label\n1,0\n"2,1\n3,0\n', r"bad\.csv: line 4: expected 2 fields, got 1"),
        (
            "a,label\n1,0\n2,\xff1\n",
            r"bad\.csv: line 3: not UTF-8 text \(invalid start byte at byte 14\)",
        ),
    ],
)
def test_malformed_files_name_the_line(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(InputError, match=message):
        preprocess(input_path=str(path), label="label", output=str(tmp_path / "o"))


# --- a CSV larger than the memory the process may use ---------------------------------------

LIMIT_BYTES = 384 << 20  # address space of the child: Python, Arrow and numpy take ~280 MB
ROWS = 110_000
TEXTS = 4


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))
    # Thread stacks count against the address space: 1 MB each, not 8 MB.
    resource.setrlimit(resource.RLIMIT_STACK, (1 << 20, resource.RLIM_INFINITY))


def test_csv_larger_than_the_memory_limit(tmp_path: Path) -> None:
    """A 450 MB CSV whose records alone exceed the child's 384 MB address space: holding them,
    as preprocessing once did, fails; streaming them succeeds."""
    rng = random.Random(0)
    texts = ["".join(rng.choices("abcdefgh", k=4096)) + str(k) for k in range(TEXTS)]
    path = tmp_path / "wide.csv"
    with open(path, "w") as f:
        f.write("text,x,label\n")
        for start in range(0, ROWS, 1000):
            f.write(
                "".join(f"{texts[i % TEXTS]},{i / 8},{i % 3}\n" for i in range(start, start + 1000))
            )
    assert path.stat().st_size > LIMIT_BYTES

    out = tmp_path / "out"
    budget = (
        "MemoryBudget(block_bytes=1 << 18, batch_bytes=2 << 20, spill_bytes=8 << 20, "
        "bucket_bytes=8 << 20)"
    )
    code = (
        "import sys\n"
        "from elastic_step.data.preprocess import MemoryBudget, preprocess\n"
        f"preprocess(input_path=sys.argv[1], label='label', output=sys.argv[2], memory={budget})\n"
    )
    env = {
        **os.environ,
        # Arrow's default allocator reserves address space it never touches; the system's
        # reserves what it uses, so the limit measures use.
        "ARROW_DEFAULT_MEMORY_POOL": "system",
        "MALLOC_ARENA_MAX": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }
    result = subprocess.run(
        [sys.executable, "-c", code, str(path), str(out)],
        preexec_fn=_limit_memory, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]

    schema = Schema.load(str(out))
    # Stratified: round(0.2 * n) of each class of 36,667, 36,667 and 36,666 rows.
    assert schema.records == {"train": 88_001, "validation": 3 * 7_333}
    assert schema.vocabulary(schema.feature("text")) == sorted(texts)
    assert schema.feature("x").kind == "numeric"
    assert schema.label_vocabulary == ["0", "1", "2"]
    written = sum(p.stat().st_size for p in out.rglob("*.tfrecord"))
    assert written > LIMIT_BYTES
    (shard, _), *_ = schema.shard_paths(str(out), "validation")
    for values in map(example_values, read_records(shard, 0, 50)):
        i = round(values["x"] * 8)
        assert values["text"] == texts[i % TEXTS]
        assert values["label"] == str(i % 3)
