"""Parquet input (data/parquet_source.py): preprocess on both runners and predict read a
file, a directory or a glob of Parquet files, take column kinds from Parquet's schema, and
refuse what they cannot read in one line, writing nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from file_trees import tree

from elastic_step.cli import main
from elastic_step.data.schema import Schema
from elastic_step.data.tfrecord import read_records

ROWS = 2_400


def _table(rows: int = ROWS, seed: int = 0) -> pa.Table:
    """Numbers of three types (a few empty, one NaN), a string with nulls, a dictionary
    column, a boolean and an integer class label."""
    rng = np.random.default_rng(seed)
    count = rng.integers(0, 1000, rows)
    price = rng.lognormal(2, 1, rows)
    price[::97] = np.nan
    city = rng.choice(["lyon", "oslo", "kyiv", "lima"], rows).astype(object)
    city[::50] = None
    return pa.table(
        {
            "count": pa.array(count, pa.int32()),
            "price": pa.array(price),
            "ratio": pa.array(rng.random(rows).astype(np.float32)),
            "city": pa.array(city, pa.string()),
            "device": pa.array(rng.choice(["ios", "android", "web"], rows)).dictionary_encode(),
            "member": pa.array(rng.random(rows) < 0.3),
            "label": pa.array((count > 500).astype(np.int64) + (price > 8)),
        }
    )


def _as_csv_values(table: pa.Table) -> pa.Table:
    """The same rows as a CSV would hold them: empty cells for nulls and NaN."""
    columns = {}
    for name in table.column_names:
        column = table[name]
        if pa.types.is_dictionary(column.type):
            column = column.cast(pa.string())
        if pa.types.is_floating(column.type):
            column = pa.chunked_array(
                [pa.array(np.where(np.isnan(c.to_numpy(zero_copy_only=False)), None, c))
                 for c in column.chunks], pa.float64()
            )  # fmt: skip
        columns[name] = column
    return pa.table(columns)


def _records(data: Path) -> dict[str, list[bytes]]:
    schema = Schema.load(str(data))
    return {
        split: [
            r for path, n in schema.shard_paths(str(data), split) for r in read_records(path, 0, n)
        ]
        for split in ("train", "validation")
    }


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The table in three files, of several row groups each."""
    root = tmp_path_factory.mktemp("parquet")
    table = _table()
    for k, start in enumerate(range(0, ROWS, 800)):
        pq.write_table(table.slice(start, 800), root / f"part-{k}.parquet", row_group_size=300)
    return root


def _preprocess(source: str, out: Path, *flags: str) -> None:
    argv = ["preprocess", "--input", source, "--label", "label", "--output", str(out)]
    assert main([*argv, "--fill-missing", "mean", *flags]) == 0


def test_a_directory_a_glob_and_both_runners_write_the_same_data(
    parquet_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("apache_beam")
    _preprocess(str(parquet_dir), tmp_path / "dir")
    _preprocess(f"{parquet_dir}/part-*.parquet", tmp_path / "glob")
    _preprocess(str(parquet_dir), tmp_path / "beam", "--runner", "beam")
    assert tree(tmp_path / "glob") == tree(tmp_path / "dir")
    assert tree(tmp_path / "beam") == tree(tmp_path / "dir")

    schema = Schema.load(str(tmp_path / "dir"))
    kinds = {c.name: c.kind for c in schema.columns}
    assert kinds == {
        "count": "numeric",
        "price": "numeric",
        "ratio": "numeric",
        "city": "categorical",
        "device": "categorical",
        "member": "categorical",
    }
    assert schema.label_kind == "class" and schema.label_vocabulary == ["0", "1", "2"]
    assert sorted(schema.vocabulary(schema.feature("member"))) == ["false", "true"]
    assert "" in schema.vocabulary(schema.feature("city"))  # a null is the empty value
    assert sum(schema.records.values()) == ROWS


def test_parquet_gives_the_records_that_the_same_csv_gives(
    parquet_dir: Path, tmp_path: Path
) -> None:
    """Parquet's kinds and a CSV's inferred kinds agree here: the records are the same."""
    csv = tmp_path / "same.csv"
    table = _as_csv_values(
        pa.concat_tables(pq.read_table(p) for p in sorted(parquet_dir.glob("*")))
    )
    table = table.set_column(
        table.column_names.index("member"),
        "member",
        pa.array(["true" if v else "false" for v in table["member"].to_pylist()]),
    )
    pacsv.write_csv(table, csv, pacsv.WriteOptions(quoting_style="needed"))
    _preprocess(str(parquet_dir), tmp_path / "parquet")
    _preprocess(str(csv), tmp_path / "csv", "--categorical", "member")
    assert _records(tmp_path / "parquet") == _records(tmp_path / "csv")
    parquet_schema = Schema.load(str(tmp_path / "parquet"))
    csv_schema = Schema.load(str(tmp_path / "csv"))
    assert parquet_schema.columns == csv_schema.columns


def _bad(tmp_path: Path, case: str) -> Path:
    path = tmp_path / "bad"
    path.mkdir()
    table = _table(100)
    if case == "nested":
        table = table.append_column("tags", pa.array([[1, 2]] * 100, pa.list_(pa.int64())))
    if case == "binary":
        table = table.append_column("blob", pa.array([b"\x00"] * 100, pa.binary()))
    pq.write_table(table, path / "a.parquet")
    if case == "truncated":
        data = (path / "a.parquet").read_bytes()
        (path / "a.parquet").write_bytes(data[: len(data) // 2])
    if case == "schema changes":
        other = table.set_column(0, "count", pa.array(np.arange(100) * 0.5))
        pq.write_table(other, path / "b.parquet")
    if case == "columns change":
        pq.write_table(table.drop_columns(["city"]), path / "b.parquet")
    if case == "empty directory":
        (path / "a.parquet").unlink()
    return path


def _refused(path: Path, out: Path) -> list[str]:
    """The lines that `preprocess` of ``path`` says on stderr, having exited 2 and written
    nothing."""
    result = subprocess.run(
        [sys.executable, "-m", "elastic_step", "preprocess", "--input", str(path),
         "--label", "label", "--output", str(out), "--fill-missing", "mean"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert not out.exists()
    return [line for line in result.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "case,message",
    [
        ("nested", r"a.parquet: column 'tags' is of Parquet type list<element: int64>"),
        ("binary", r"a.parquet: column 'blob' is of Parquet type binary, which preprocess"),
        ("truncated", r"a.parquet: not a Parquet file, or damaged: "),
        ("schema changes", r"b.parquet: column 'count' is of type double, but of type int32"),
        (
            "columns change",
            r"b.parquet: its columns \(count, price, ratio, device, member, label\)",
        ),
        ("empty directory", r"bad: no Parquet files \(\*.parquet, \*.pq\) in the directory"),
    ],
)
def test_bad_parquet_exits_2_in_one_line_and_writes_nothing(
    tmp_path: Path, case: str, message: str
) -> None:
    [line] = _refused(_bad(tmp_path, case), tmp_path / "out")
    assert re.search(message, line), line


def test_a_bad_value_names_its_file_and_row(tmp_path: Path) -> None:
    path = tmp_path / "in"
    path.mkdir()
    table = _table(100)
    pq.write_table(table, path / "a.parquet")
    bad = table.set_column(1, "price", pa.array([1.0] * 40 + [float("inf")] + [1.0] * 59))
    pq.write_table(bad, path / "b.parquet")
    [line] = _refused(path, tmp_path / "out")
    assert f"{path}/b.parquet: row 41: column 'price' has value inf, which is not a finite " in line
