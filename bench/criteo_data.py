"""Criteo-shaped click data, generated deterministically from a seed: what a recommendation
job brings (ElasticDL's own examples are click-through models on Criteo's data).

Each row has a 0/1 ``label``, 13 numeric columns ``i1``..``i13`` and 26 categorical columns
``c1``..``c26``:

- **numeric**: counts, skewed as Criteo's are (``floor(lognormal)``, a different scale per
  column), about 5 % of the cells empty;
- **categorical**: ids written as 8 hex digits (as Criteo hashes its values), their
  cardinalities spread geometrically from 10 (``c1``) to 5,000,000 (``c26``), drawn from a
  Zipf-like power law (:func:`zipf_ids`): the first ids are frequent and most of a large
  column's ids are rare. At 10,000,000 rows the 26 columns hold more than 10 million distinct
  values in all (10.4 million expected); about 4 % of the cells are empty;
- **label**: drawn from a hidden logistic model of every column: a weight per numeric column
  on ``log1p`` of the count, and a weight per (column, id) derived from a hash of the two (so
  5 million ids need no table). The best AUC any model can reach on the data is that of the
  hidden probability itself, which the generator measures and writes.

Rows are made in blocks of 100,000 from one seeded generator, so the same seed gives the
same rows whatever the shards. The output directory gets ``part-NNNNN.csv.gz`` (gzipped
CSV, header first) and/or ``part-NNNNN.parquet`` shards, and ``criteo.json``: the columns,
cardinalities, rows, distinct values seen per column and the best AUC.

    .venv/bin/python bench/criteo_data.py --rows 1000000 --shards 8 --output /tmp/criteo
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

NUMERIC = 13
CATEGORICAL = 26
SMALLEST, LARGEST = 10, 5_000_000
#: The share of empty cells.
EMPTY_NUMERIC, EMPTY_CATEGORICAL = 0.05, 0.04
BLOCK = 100_000
#: The hidden model's intercept: about 1 row in 4 is a click, as in Criteo's data.
INTERCEPT = -1.3
#: The exponent of the ids' power law: P(id) ~ (id + 1) ** -ZIPF_EXPONENT. Under 1 so that a
#: large column's tail is seen: at 10,000,000 rows, 10.4 million distinct ids in all.
ZIPF_EXPONENT = 0.6


def cardinalities() -> list[int]:
    """The ids of each categorical column, geometric from :data:`SMALLEST` to :data:`LARGEST`."""
    ratio = (LARGEST / SMALLEST) ** (1 / (CATEGORICAL - 1))
    return [round(SMALLEST * ratio**i) for i in range(CATEGORICAL)]


def schema() -> pa.Schema:
    """``label``, ``i1``..``i13`` (int64) and ``c1``..``c26`` (strings)."""
    return pa.schema(
        [("label", pa.int64())]
        + [(f"i{j + 1}", pa.int64()) for j in range(NUMERIC)]
        + [(f"c{j + 1}", pa.string()) for j in range(CATEGORICAL)]
    )


def _id_weights(column: int, ids: np.ndarray) -> np.ndarray:
    """The hidden model's weight of each id of a column, from a hash of (column, id): about
    uniform on [-sqrt(3), sqrt(3)) (unit variance), without a table."""
    with np.errstate(over="ignore"):  # the hash wraps around 2**64 on purpose
        mixed = (
            ids.astype(np.uint64) + np.uint64(column) * np.uint64(0x9E3779B97F4A7C15)
        ) * np.uint64(0xBF58476D1CE4E5B9)
    mixed ^= mixed >> np.uint64(31)
    unit = (mixed >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return (unit - 0.5) * np.sqrt(12.0)


def zipf_ids(u: np.ndarray, cardinality: int) -> np.ndarray:
    """Ids in ``[0, cardinality)`` from uniform ``u``, by the inverse of the continuous power
    law of density ``(x + 1) ** -ZIPF_EXPONENT``."""
    power = 1 - ZIPF_EXPONENT
    x = (1 + u * ((cardinality + 1) ** power - 1)) ** (1 / power) - 1
    return np.minimum(np.floor(x), cardinality - 1).astype(np.int64)


class Generator:
    """Rows, a block at a time, from ``seed``."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        setup = np.random.default_rng([seed, 1])
        self.cards = cardinalities()
        self._scales = setup.uniform(0.5, 3.0, NUMERIC)
        self._numeric_weights = setup.normal(0, 0.25, NUMERIC)
        # Larger columns carry less each: their ids are rarer, so each says less.
        self._column_weights = 0.55 / np.sqrt(1 + np.log10(np.array(self.cards)))

    def block(self, rows: int) -> tuple[pa.Table, np.ndarray, list[np.ndarray]]:
        """``rows`` rows as a table of :func:`schema` (ids as hex strings), the hidden
        probability of each, and each categorical column's ids in the cells not empty."""
        rng = self._rng
        logit = np.full(rows, INTERCEPT)
        arrays, present = [], []
        for j in range(NUMERIC):
            counts = np.floor(rng.lognormal(0.0, self._scales[j], rows)).astype(np.int64)
            empty = rng.random(rows) < EMPTY_NUMERIC
            feature = np.log1p(counts) - self._scales[j] / 2
            logit += np.where(empty, 0.0, self._numeric_weights[j] * feature)
            arrays.append(pa.array(counts, mask=empty))
        for j, card in enumerate(self.cards):
            ids = zipf_ids(rng.random(rows), card)
            empty = rng.random(rows) < EMPTY_CATEGORICAL
            logit += np.where(empty, 0.0, self._column_weights[j] * _id_weights(j, ids))
            text = np.char.mod("%08x", (ids * 2654435761 + j * 97) & 0xFFFFFFFF)
            arrays.append(pa.array(text.astype(object), mask=empty, type=pa.string()))
            present.append(ids[~empty])
        probability = 1 / (1 + np.exp(-logit))
        label = (rng.random(rows) < probability).astype(np.int64)
        table = pa.Table.from_arrays([pa.array(label), *arrays], schema=schema())
        return table, probability, present


def generate(
    output: str, *, rows: int, shards: int, seed: int, formats: tuple[str, ...], log=print
) -> dict:
    """Writes the shards and ``criteo.json`` into ``output``; returns what ``criteo.json``
    holds."""
    os.makedirs(output, exist_ok=True)
    generator = Generator(seed)
    per_shard = -(-rows // shards)
    shards = -(-rows // per_shard)  # none empty
    seen = [np.zeros(card, dtype=bool) for card in generator.cards]
    labels, probabilities = [], []
    started = time.monotonic()
    written, shard = 0, 0
    writers = _open_writers(output, shard, formats)
    try:
        while written < rows:
            # Blocks of BLOCK rows from the start, whatever the shards: the same rows.
            table, probability, present = generator.block(min(BLOCK, rows - written))
            labels.append(table["label"].to_numpy())
            probabilities.append(probability)
            for j, ids in enumerate(present):
                seen[j][ids] = True
            offset = 0
            while offset < table.num_rows:
                take = min(table.num_rows - offset, (shard + 1) * per_shard - written)
                for write in writers.values():
                    write(table.slice(offset, take))
                offset, written = offset + take, written + take
                if written == (shard + 1) * per_shard and written < rows:
                    _close(writers)
                    log(f"  shard {shard + 1} of {shards}: {written:,} rows "
                        f"({time.monotonic() - started:.0f}s)")  # fmt: skip
                    shard += 1
                    writers = _open_writers(output, shard, formats)
    finally:
        _close(writers)
    log(f"  shard {shard + 1} of {shards}: {written:,} rows ({time.monotonic() - started:.0f}s)")
    from sklearn.metrics import roc_auc_score

    all_labels, all_probabilities = np.concatenate(labels), np.concatenate(probabilities)
    distinct = {f"c{j + 1}": int(column.sum()) for j, column in enumerate(seen)}
    about = {
        "rows": written,
        "shards": shards,
        "seed": seed,
        "formats": list(formats),
        "columns": schema().names,
        "cardinalities": dict(
            zip([f"c{j + 1}" for j in range(CATEGORICAL)], generator.cards, strict=True)
        ),
        "distinct": distinct,
        "distinct_total": sum(distinct.values()),
        "click_rate": round(float(all_labels.mean()), 4),
        "best_auc": round(float(roc_auc_score(all_labels, all_probabilities)), 4),
    }
    with open(os.path.join(output, "criteo.json"), "w") as f:
        json.dump(about, f, indent=1)
    return about


def _close(writers: dict) -> None:
    for close in writers.values():
        close(None)


def _open_writers(output: str, shard: int, formats: tuple[str, ...]) -> dict:
    """A writer per format: each takes a table, and ``None`` to close."""
    writers = {}
    if "csv" in formats:
        stream = gzip.open(os.path.join(output, f"part-{shard:05d}.csv.gz"), "wb", compresslevel=3)  # noqa: SIM115 (closed with the writer)
        csv = pacsv.CSVWriter(stream, schema())

        def write_csv(table, csv=csv, stream=stream):
            if table is None:
                csv.close()
                stream.close()
            else:
                csv.write_table(table)

        writers["csv"] = write_csv
    if "parquet" in formats:
        parquet = pq.ParquetWriter(os.path.join(output, f"part-{shard:05d}.parquet"), schema())

        def write_parquet(table, parquet=parquet):
            if table is None:
                parquet.close()
            else:
                parquet.write_table(table)

        writers["parquet"] = write_parquet
    return writers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="(default 1,000,000)")
    parser.add_argument("--shards", type=int, default=8, help="files per format (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="(default 0)")
    parser.add_argument(
        "--formats", default="csv,parquet", help="csv and/or parquet (default both)"
    )
    parser.add_argument("--output", required=True, help="the directory to write")
    args = parser.parse_args(argv)
    formats = tuple(args.formats.split(","))
    for name in formats:
        if name not in ("csv", "parquet"):
            parser.error(f"--formats: {name!r} is not csv or parquet")
    if args.rows < 1 or args.shards < 1:
        parser.error("--rows and --shards must be at least 1")
    about = generate(args.output, rows=args.rows, shards=args.shards, seed=args.seed,
                     formats=formats)  # fmt: skip
    print(json.dumps({k: about[k] for k in ("rows", "distinct_total", "click_rate", "best_auc")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
