"""bench/criteo_data.py, the Criteo-shaped generator of issue 34's benchmark: the same rows
from the same seed whatever the shards, in both formats; the columns, the empty cells, the
skew of the ids and a label that the hidden model predicts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from criteo_data import CATEGORICAL, NUMERIC, cardinalities, generate, zipf_ids


def read(directory: Path, pattern: str, reader) -> pa.Table:
    return pa.concat_tables([reader(str(path)) for path in sorted(directory.glob(pattern))])


def test_the_same_rows_whatever_the_shards_in_csv_and_parquet(tmp_path: Path) -> None:
    tables = {}
    for shards in (1, 3):
        out = tmp_path / f"s{shards}"
        about = generate(str(out), rows=12_000, shards=shards, seed=5,
                         formats=("csv", "parquet"), log=lambda _: None)  # fmt: skip
        assert len(list(out.glob("part-*.csv.gz"))) == len(list(out.glob("*.parquet"))) == shards
        tables[shards] = read(out, "*.parquet", pq.read_table)
        from_csv = read(out, "*.csv.gz", pacsv.read_csv)
        # An empty id is an empty field in the CSV, a null in Parquet.
        ids = [value or "" for value in tables[shards].column("c26").to_pylist()]
        assert from_csv.column("c26").to_pylist() == ids
        assert from_csv.column("i3").to_pylist() == tables[shards].column("i3").to_pylist()
        assert json.loads((out / "criteo.json").read_text()) == about
    assert tables[1].equals(tables[3])
    other = generate(str(tmp_path / "other"), rows=12_000, shards=1, seed=6, formats=("parquet",),
                     log=lambda _: None)  # fmt: skip
    assert not read(tmp_path / "other", "*.parquet", pq.read_table).equals(tables[1])

    table = tables[1]
    assert table.num_columns == 1 + NUMERIC + CATEGORICAL and table.num_rows == 12_000
    numeric_empty = np.mean([table.column(f"i{j}").null_count for j in range(1, 14)]) / 12_000
    ids_empty = np.mean([table.column(f"c{j}").null_count for j in range(1, 27)]) / 12_000
    assert 0.04 < numeric_empty < 0.06 and 0.03 < ids_empty < 0.05
    # A label to learn, as Criteo's: about a click in four, which the hidden model ranks well.
    assert 0.2 < about["click_rate"] < 0.35 and 0.78 < about["best_auc"] < 0.9
    assert other["best_auc"] > 0.78
    # The small columns are all seen; the large ones' tails mostly not, at this size.
    assert about["distinct"]["c1"] == 10 and about["distinct"]["c26"] < 12_000


def test_ids_follow_a_power_law_within_their_cardinality() -> None:
    assert cardinalities()[0] == 10 and cardinalities()[-1] == 5_000_000
    ids = zipf_ids(np.random.default_rng(0).random(200_000), 1000)
    assert ids.min() == 0 and ids.max() < 1000
    counts = np.bincount(ids, minlength=1000)
    # Density ~ (id + 1) ** -0.6: the first ten ids far above the last ten, and the first
    # tenth of the ids a quarter of the draws and more.
    assert counts[:10].sum() > 3 * counts[-10:].sum()
    assert counts[:100].sum() / len(ids) > 0.25
