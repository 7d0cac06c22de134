"""The steps of the Beam preprocessing pipeline (beam_preprocess.py), as plain functions of
one element: each does a part of what preprocess.py does to the whole file, with its pieces.

The file is cut into ranges of whole rows (csv_ranges.py; a gzip file is one range), and a
range is read once per pass, as the single-machine path reads the whole file:

1. :func:`count_range`: the scan's checks and counts (csv_scan.Counts) of one range;
2. :func:`make_plan`: all counts merged, as one scan of the file would have them; the split plan;
   each range's first row number, and its rows before it in each stratum;
3. :func:`split_range`: the split of each row of a range (``Encoder.split``): its rows per
   split, and each numeric column's first train value;
4. :func:`place`: where each range's rows begin in each split, and each column's first train
   value in the file (the shift of its statistics);
5. :func:`encode_range`: the Encoder of the single-machine path, its counters started where
   the range begins: the same records, buckets and sort keys, and statistics that merge
   (:func:`merge_stats`);
6. :func:`write_bucket` writes the records of one bucket in key order, straight into its
   shard when the shard has one bucket; :func:`join_shard` joins a shard's buckets in order;
7. :func:`write_schema`.

Row numbers and the counters before each range are what make every row's split, shard,
bucket and key those of the single-machine path: the output is the same, byte for byte.
Tests: tests/unit/test_beam_preprocess.py (through the pipeline, on Beam's local runner).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from elastic_step.data import storage
from elastic_step.data.csv_ranges import RowRange
from elastic_step.data.csv_scan import Counts, Scan, finish_scan
from elastic_step.data.csv_source import CsvBatch, CsvSource
from elastic_step.data.numbers import to_numbers
from elastic_step.data.preprocess import (
    SPLITS,
    BucketLayout,
    ColumnStats,
    Encoder,
    RowsBefore,
    SplitPlan,
    new_schema,
    shard_name,
    train_values,
)
from elastic_step.data.schema import Shard
from elastic_step.data.spill import by_bucket, in_key_order
from elastic_step.data.tfrecord import ShardWriter
from elastic_step.errors import InputError

#: Where buckets of shards that have several wait to be joined, in the output directory.
PIECES = "pieces"


@dataclass(frozen=True)
class Job:
    """What every step knows: the file, the columns' kinds (from its first rows), the
    arguments, and the temporary output directory."""

    source: CsvSource
    found: Scan  # kinds and sample; no counts
    data_start: int  # where the rows begin (0 for a gzip file, read whole)
    label_kind: str
    fill: str | float | None
    validation_fraction: float
    shards: int
    seed: int
    bucket_bytes: int
    names: list[str]  # the features' Keras input names
    one_hot: bool
    out_dir: str

    def batches(self, part: RowRange, first_row: int) -> Iterator[CsvBatch]:
        """The rows of ``part``, numbered from ``first_row``."""
        if self.source.gzipped:  # one range, the whole file
            return self.source.batches()
        return self.source.range_batches(part.start, part.end, first_row)


@dataclass(frozen=True)
class Plan:
    """What the counts of all ranges decide, and (after :func:`place`) where each range's rows
    begin in each split. Lists are per range, in file order."""

    found: Scan
    split: SplitPlan
    layout: BucketLayout
    rows: list[int]
    first_rows: list[int]
    strata_before: list[list[int]]
    splits_before: list[dict[str, int]] = field(default_factory=list)
    shifts: dict[int, float] = field(default_factory=dict)

    def before(self, index: int) -> RowsBefore:
        splits = self.splits_before[index] if self.splits_before else None
        return RowsBefore(strata=self.strata_before[index], splits=splits)


@dataclass(frozen=True)
class _RangeLines:
    """Line numbers of the rows of a range numbered from 0, for the scan's error messages:
    the rows before the range are counted only on the way to an error."""

    job: Job
    part: RowRange

    @property
    def path(self) -> str:
        return self.job.source.path

    def line_of_row(self, row: int) -> int:
        before = RowRange(index=-1, start=self.job.data_start, end=self.part.start)
        rows = sum(b.rows for b in self.job.batches(before, 0)) if before.end > before.start else 0
        return self.job.source.line_of_row(rows + row)


def count_range(part: RowRange, job: Job) -> tuple[int, Counts]:
    """Step 1: ``(range index, counts)``; an :class:`InputError` at the range's first bad
    value."""
    counts = Counts.start(job.found, job.label_kind)
    lines = _RangeLines(job, part)
    for batch in job.batches(part, 0):
        counts.add(lines, batch, job.found, job.fill is not None)
    return part.index, counts


def make_plan(counted: list[tuple[int, Counts]], job: Job) -> Plan:
    """Step 2: the scan of the whole file, and the split plan."""
    ranges = [counts for _, counts in sorted(counted, key=lambda item: item[0])]
    total = Counts.start(job.found, job.label_kind)
    for counts in ranges:
        total.merge(counts)
    found = finish_scan(job.source.path, job.found, total)
    split = SplitPlan.make(found, job.validation_fraction, job.shards, job.seed)
    rows = np.array([counts.rows for counts in ranges], dtype=np.int64)
    strata = np.array([_stratum_rows(found, counts) for counts in ranges], dtype=np.int64)
    return Plan(
        found=found,
        split=split,
        layout=BucketLayout.make(found, split, job.bucket_bytes),
        rows=rows.tolist(),
        first_rows=(np.cumsum(rows) - rows).tolist(),
        strata_before=(np.cumsum(strata, axis=0) - strata).tolist(),
    )


def _stratum_rows(found: Scan, counts: Counts) -> list[int]:
    """The rows of ``counts`` in each stratum of the split (``SplitPlan.sizes``): in each
    class of a class label, else all."""
    if found.label_kind != "class":
        return [counts.rows]
    by_value = counts.label_counts() or {}
    # Numbers are counted by value; a vocabulary entry reads back as exactly that float.
    key = float if found.label_numeric else str
    return [by_value.get(key(v), 0) for v in found.label_vocabulary or []]


def split_range(part: RowRange, job: Job, plan: Plan) -> tuple[int, dict[str, int], dict]:
    """Step 3: ``(range index, rows per split, first train value per numeric column)``."""
    found = plan.found
    encoder = Encoder(found, plan.split, plan.layout, job.seed, before=plan.before(part.index))
    rows = dict.fromkeys(SPLITS, 0)
    first: dict[int, float] = {}
    numeric = [j for j, k in enumerate(found.kinds) if k == "numeric" and j != found.label_index]
    for batch in job.batches(part, plan.first_rows[part.index]):
        validation = encoder.split(batch)
        rows["validation"] += int(np.count_nonzero(validation))
        rows["train"] += int(np.count_nonzero(~validation))
        missing = {j: to_numbers(batch.columns[j])[0] for j in numeric if j not in first}
        for j, values in train_values(missing, validation).items():
            if values.size:
                first[j] = float(values[0])  # what ColumnStats.add takes as the shift
    return part.index, rows, first


def place(splits: list[tuple[int, dict[str, int], dict]], plan: Plan) -> Plan:
    """Step 4: ``plan`` with each range's rows before it per split, and the shifts."""
    splits_before, shifts = [], {}
    running = dict.fromkeys(SPLITS, 0)
    for _, rows, first in sorted(splits, key=lambda item: item[0]):
        splits_before.append(dict(running))
        running = {split: running[split] + rows[split] for split in SPLITS}
        for j, value in first.items():
            shifts.setdefault(j, value)
    return dataclasses.replace(plan, splits_before=splits_before, shifts=shifts)


def encode_range(
    part: RowRange, job: Job, plan: Plan
) -> Iterator[tuple[int, tuple[np.ndarray, pa.Array]] | dict[int, ColumnStats]]:
    """Step 5: ``(bucket, (keys, records))`` per bucket of each batch, then the range's
    statistics (tagged by the pipeline)."""
    i = part.index
    found = plan.found
    encoder = Encoder(
        found, plan.split, plan.layout, job.seed, before=plan.before(i), shifts=plan.shifts
    )
    for batch in job.batches(part, plan.first_rows[i]):
        for bucket, keys, records in by_bucket(*encoder.encode(batch)):
            # A copy of the slice: a pickled slice holds all of its parent's buffers.
            yield bucket, (keys, pa.concat_arrays([records]))
    if encoder.rows != plan.rows[i]:
        raise InputError(f"{job.source.path}: the file changed while it was being read")
    yield encoder.stats


def merge_stats(parts: Iterable[dict[int, ColumnStats]]) -> dict[int, ColumnStats]:
    """The statistics of all ranges (of partial merges too)."""
    total: dict[int, ColumnStats] = {}
    for part in parts:
        for j, stats in part.items():
            total.setdefault(j, ColumnStats(shift=stats.shift)).merge(stats)
    return total


def write_bucket(
    item: tuple[int, Iterable[tuple[np.ndarray, pa.Array]]], job: Job, plan: Plan
) -> tuple[tuple[str, int], tuple[int, str, int]]:
    """Step 6: ``((split, shard), (bucket, path, records))`` of one bucket written in key
    order: into its shard if the shard has no other, else as a piece of it."""
    bucket, parts = item
    keys, blocks = zip(*parts, strict=True)
    split, shard = plan.layout.shard_of(bucket)
    if plan.layout.per_shard[split] == 1:
        path = storage.join(job.out_dir, shard_name(split, shard))
    else:
        path = storage.join(job.out_dir, PIECES, f"bucket-{bucket:06d}.tfrecord")
    storage.makedirs(storage.parent(path))
    with ShardWriter(path) as writer:
        writer.write_all(in_key_order(list(keys), list(blocks)))
    return (split, shard), (bucket, path, writer.records)


def join_shard(
    item: tuple[tuple[str, int], Iterable[tuple[int, str, int]]], job: Job
) -> tuple[str, int, Shard]:
    """``(split, shard, its entry)``; a shard written as pieces is joined from them, in
    bucket order (the pieces are removed with the directory, at the end)."""
    (split, shard), pieces = item
    ordered = sorted(pieces)
    relative = shard_name(split, shard)
    path = storage.join(job.out_dir, relative)
    if [piece for _, piece, _ in ordered] != [path]:
        storage.makedirs(storage.parent(path))
        with ShardWriter(path) as writer:
            for _, piece, _ in ordered:
                writer.append_shard(piece)
    return split, shard, Shard(path=relative, records=sum(n for _, _, n in ordered))


def write_schema(
    _: object, job: Job, plan: Plan, stats: dict[int, ColumnStats], shards: list
) -> None:
    """Step 7: ``schema.json``, as the single-machine path writes it."""
    schema = new_schema(plan.found, stats, job.names, job.fill, job.one_hot)
    for split in SPLITS:
        written = sorted((k, entry) for s, k, entry in shards if s == split)
        schema.splits[split] = [entry for _, entry in written]
        schema.records[split] = plan.split.records[split]
        if sum(entry.records for entry in schema.splits[split]) != schema.records[split]:
            raise AssertionError(f"{split}: the shards do not hold the split's records")
    schema.save(job.out_dir)
