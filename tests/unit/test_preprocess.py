"""CSV preprocessing into shards and a schema."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from written_records import split_rows

from elastic_step.data import storage
from elastic_step.data.preprocess import preprocess
from elastic_step.data.schema import Column, Schema
from elastic_step.data.tfrecord import count_records
from elastic_step.errors import InputError


def test_schema_and_records(small_csv: str, tmp_path: Path) -> None:
    out = str(tmp_path / "data")
    lines: list[str] = []
    schema = preprocess(
        input_path=small_csv, label="digit", output=out, shards=4, progress=lines.append
    )
    assert schema.label == "digit"
    assert schema.label_kind == "class"
    assert schema.label_vocabulary == ["0", "1", "2"]
    assert schema.num_classes == 3
    assert [(c.name, c.kind) for c in schema.columns] == [
        ("x", "numeric"),
        ("y", "numeric"),
        ("color", "categorical"),
    ]
    color = schema.feature("color")
    # By frequency, then value, in its own file.
    assert schema.vocabulary(color) == ["red", "blue", "green"]
    assert color.vocabulary_file == "vocabularies/002-color.txt"
    assert color.num_ids == 4
    assert schema.records == {"train": 48, "validation": 12}
    assert [s.records for s in schema.splits["train"]] == [12, 12, 12, 12]
    assert [s.path for s in schema.splits["validation"]] == [
        f"validation/part-0000{i}.tfrecord" for i in range(4)
    ]
    for split in ("train", "validation"):
        for path, n in schema.shard_paths(out, split):
            assert count_records(path) == n
    assert Schema.load(out) == schema
    assert lines[0].startswith("read 60 rows, 4 columns")
    assert "wrote train: 48 records in 4 shards" in lines

    # Raw values in records; statistics from the train split only.
    train = split_rows(schema, out, "train")
    valid = split_rows(schema, out, "validation")
    assert sorted(r["y"] for r in train + valid) == list(range(60))
    ys = np.array([r["y"] for r in train])
    assert schema.feature("y").mean == pytest.approx(ys.mean())
    assert schema.feature("y").std == pytest.approx(ys.std())
    xs = np.array([r["x"] for r in train], dtype=np.float64)
    assert schema.feature("x").mean == pytest.approx(xs.mean(), rel=1e-5)
    for r in train + valid:
        assert r["digit"] == str(int(r["y"]) % 3)
        assert r["color"] in schema.vocabulary(color)


def test_split_is_deterministic_by_seed(small_csv: str, tmp_path: Path) -> None:
    def validation_ys(seed: int, name: str) -> list[float]:
        out = str(tmp_path / name)
        schema = preprocess(input_path=small_csv, label="digit", output=out, seed=seed)
        return [r["y"] for r in split_rows(schema, out, "validation")]

    assert validation_ys(3, "a") == validation_ys(3, "b")
    assert validation_ys(3, "a") != validation_ys(4, "c")


def test_no_validation_and_few_records(small_csv: str, tmp_path: Path) -> None:
    out = str(tmp_path / "data")
    schema = preprocess(
        input_path=small_csv, label="digit", output=out, validation_fraction=0, shards=100
    )
    assert schema.records == {"train": 60, "validation": 0}
    assert schema.splits["validation"] == []
    assert len(schema.splits["train"]) == 60  # fewer shards than asked: one per record
    assert not storage.exists(storage.join(out, "validation"))


def test_numeric_and_string_labels(tmp_path: Path, write_csv: Callable[..., str]) -> None:
    rows = [[i, f"{i * 0.37:.3f}", ["b", "a", "c"][i % 3]] for i in range(20)]
    path = write_csv(tmp_path / "in.csv", ["f", "target", "name"], rows)
    schema = preprocess(input_path=path, label="target", output=str(tmp_path / "n"))
    assert schema.label_kind == "numeric"
    assert schema.label_vocabulary is None and schema.num_classes is None

    schema = preprocess(input_path=path, label="name", output=str(tmp_path / "s"))
    assert schema.label_kind == "class"
    assert schema.label_vocabulary == ["a", "b", "c"]
    assert [c.name for c in schema.columns] == ["f", "target"]


def test_integer_labels_sort_numerically(tmp_path: Path, write_csv: Callable[..., str]) -> None:
    rows = [[i, [10, 9, 2, 1.0][i % 4]] for i in range(12)]
    path = write_csv(tmp_path / "in.csv", ["f", "label"], rows)
    schema = preprocess(input_path=path, label="label", output=str(tmp_path / "o"))
    assert schema.label_vocabulary == ["1", "2", "9", "10"]


def test_forced_kinds(tmp_path: Path, write_csv: Callable[..., str]) -> None:
    rows = [[i % 5, i % 2] for i in range(30)]
    path = write_csv(tmp_path / "in.csv", ["code", "label"], rows)
    schema = preprocess(
        input_path=path,
        label="label",
        output=str(tmp_path / "o"),
        categorical=["code"],
        label_kind="numeric",
    )
    assert schema.columns == [
        Column(
            name="code",
            kind="categorical",
            vocabulary_file="vocabularies/000-code.txt",
            vocabulary_size=5,
            oov_buckets=1,
        )
    ]
    assert schema.vocabulary(schema.columns[0]) == ["0", "1", "2", "3", "4"]
    assert schema.label_kind == "numeric"


def test_constant_column_gets_unit_std(tmp_path: Path, write_csv: Callable[..., str]) -> None:
    path = write_csv(tmp_path / "in.csv", ["c", "label"], [[7, i % 2] for i in range(10)])
    schema = preprocess(input_path=path, label="label", output=str(tmp_path / "o"))
    assert schema.feature("c").mean == 7 and schema.feature("c").std == 1.0


# --- bad input: one clear InputError, and the output directory is left as it was ---------


def _bad(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    return str(path)


def _numeric_rows(n: int, width: int = 3) -> str:
    return "".join(",".join(str(i + j) for j in range(width)) + "\n" for i in range(n))


BAD_INPUTS = {
    "empty file": ("", None, r"bad\.csv: the file is empty"),
    "no label": (
        "a,b\n1,2\n3,4\n",
        None,
        r"bad\.csv: no label column 'label' in the header \(columns: a, b\)",
    ),
    "ragged": (
        "a,b,label\n1,2,0\n1,2\n",
        None,
        r"bad\.csv: line 3: expected 3 fields, got 2",
    ),
    "non-numeric": (
        "a,b,label\n" + _numeric_rows(120) + "1,oops,0\n",
        None,
        r"bad\.csv: line 122: column 'b' has non-numeric value 'oops', but was inferred "
        r"numeric from its first 100 values \(pass --categorical b",
    ),
    "empty numeric": (
        "a,b,label\n1,2,0\n3,,1\n",
        None,
        r"bad\.csv: line 3: empty value in numeric column 'b'",
    ),
    "one row": ("a,b,label\n1,2,0\n", None, r"bad\.csv: has 1 data rows, need at least 2"),
    "header only": ("a,b,label\n", None, r"bad\.csv: has 0 data rows, need at least 2"),
    "numeric label": (
        "a,label\n1,2\n2,x\n",
        {"label_kind": "numeric"},
        r"bad\.csv: line 3: label column 'label' has non-numeric value 'x'",
    ),
    "empty label": ("a,label\n1,2\n2,\n", None, r"bad\.csv: line 3: empty value in label"),
    "unknown categorical": (
        "a,label\n1,2\n2,3\n",
        {"categorical": ["zz"]},
        r"--categorical zz: no such column in .*bad\.csv \(columns: a, label\)",
    ),
    "duplicate header": ("a,a,label\n1,2,3\n", None, r"line 1: duplicate column names: a"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
@pytest.mark.parametrize("existing", [False, True])
def test_bad_input(case: str, existing: bool, tmp_path: Path) -> None:
    text, kwargs, message = BAD_INPUTS[case]
    out = tmp_path / "out"
    if existing:
        out.mkdir()
        (out / "keep.txt").write_text("old")
    with pytest.raises(InputError, match=message) as info:
        preprocess(
            input_path=_bad(tmp_path, text), label="label", output=str(out), **(kwargs or {})
        )
    assert "\n" not in str(info.value)
    if existing:
        assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == (
        ["bad.csv", "out"] if existing else ["bad.csv"]
    )


def test_missing_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.csv")
    with pytest.raises(InputError, match=r"nope\.csv: file not found"):
        preprocess(input_path=missing, label="y", output=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_failure_while_writing_leaves_old_output(
    small_csv: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    preprocess(input_path=small_csv, label="digit", output=str(out))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))

    def broken(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(Schema, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        preprocess(input_path=small_csv, label="digit", output=str(out), seed=5)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "small.csv"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shards": 0}, r"--shards must be an integer >= 1, got 0"),
        ({"validation_fraction": 1.0}, r"--validation-fraction must be >= 0 and < 1, got 1\.0"),
        ({"validation_fraction": -0.1}, r"--validation-fraction must be >= 0 and < 1, got -0\.1"),
        ({"label_kind": "weird"}, r"--label-kind must be one of auto, class, numeric"),
    ],
)
def test_argument_validation(
    kwargs: dict[str, object], message: str, small_csv: str, tmp_path: Path
) -> None:
    with pytest.raises(InputError, match=message):
        preprocess(input_path=small_csv, label="digit", output=str(tmp_path / "o"), **kwargs)
    assert not (tmp_path / "o").exists()


def test_schema_load_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"schema\.json: schema file not found"):
        Schema.load(str(tmp_path))
    (tmp_path / "schema.json").write_text("{not json")
    with pytest.raises(InputError, match=r"schema\.json: malformed schema"):
        Schema.load(str(tmp_path))
    (tmp_path / "schema.json").write_text('{"label": "y"}')
    with pytest.raises(InputError, match=r"schema\.json: malformed schema"):
        Schema.load(str(tmp_path))


@pytest.mark.parametrize(
    ("shard", "problem"),
    [
        ({"path": "../../etc/passwd", "records": 3}, "must be a relative path inside"),
        ({"path": "/etc/passwd", "records": 3}, "must be a relative path inside"),
        ({"path": "s3://other/x", "records": 3}, "must be a relative path inside"),
        ({"path": "train/part-0", "records": -1}, "records must be an integer >= 0, got -1"),
        ({"path": "train/part-0", "records": "12"}, "records must be an integer >= 0, got '12'"),
    ],
)
def test_a_schema_s_shards_stay_inside_the_data_directory(
    tmp_path: Path, shard: dict, problem: str
) -> None:
    schema = {
        "label": "y",
        "label_kind": "numeric",
        "columns": [],
        "splits": {"train": [{"path": "train/part-1", "records": 2}, shard]},
    }
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    with pytest.raises(InputError, match=r"schema\.json: malformed schema") as raised:
        Schema.load(str(tmp_path))
    assert problem in str(raised.value) and "\n" not in str(raised.value)
