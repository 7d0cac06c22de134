"""The steps of the Beam preprocessing pipeline (beam_preprocess.py), as plain functions of
one element: each does a part of what preprocess.py does to the whole file, with its pieces.

The file is cut into ranges of whole rows (csv_ranges.py; a gzip file is one range), and a
range is read once per pass, as the single-machine path reads the whole file:

1. :func:`count_range`: the scan's checks and counts (csv_scan.Counts) of one range;
2. :func:`make_plan`: all counts merged, as one scan of the file would have them (past the
   memory bound, on the driver's disk); the vocabulary files written; the split plan; each
   range's first row number, and its rows before it in each stratum;
3. :func:`split_range`: the split of each row of a range (``Encoder.split``): its rows per
   split, and each numeric column's first train value;
4. :func:`place`: where each range's rows begin in each split, and each column's first train
   value in the file (the shift of its statistics);
5. :func:`encode_range`: the Encoder of the single-machine path, its counters started where
   the range begins: the same records, buckets and sort keys, and statistics that merge
   (:func:`merge_stats`). The range parks its records in its own file, in blocks per bucket
   (spill.RangeParts), and passes on only where each bucket's blocks lie;
6. :func:`write_bucket` reads one bucket's blocks from every range's file and writes its
   records in key order, straight into its shard when the shard has one bucket;
   :func:`join_shard` joins a shard's buckets in order;
7. :func:`write_schema`.

No step holds more than a range's ``spill_bytes`` or a bucket's ``bucket_bytes`` of records:
what goes through Beam's shuffles is counts, plans and file places, never records. So a
worker's memory is bounded by the memory budget, not by the data, on any runner; and no step
has more than one output, which Beam's Dask runner does not tell apart.

Row numbers and the counters before each range are what make every row's split, shard,
bucket and key those of the single-machine path: the output is the same, byte for byte.
Tests: tests/unit/test_beam_preprocess.py (through the pipeline, on Beam's local runner).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from elastic_step.data import storage
from elastic_step.data.csv_ranges import RowRange
from elastic_step.data.csv_scan import Counts, Scan, finish_scan
from elastic_step.data.csv_source import CsvBatch
from elastic_step.data.input_source import Source
from elastic_step.data.numbers import to_numbers
from elastic_step.data.parquet_source import ParquetSource, RowGroupPart
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
    write_vocabularies,
)
from elastic_step.data.schema import Shard
from elastic_step.data.spill import BlockPlace, RangeParts, sorted_blocks
from elastic_step.data.tfrecord import ShardWriter
from elastic_step.data.vocabulary import VocabularyOptions
from elastic_step.errors import InputError

#: Where buckets of shards that have several wait to be joined, in the output directory.
PIECES = "pieces"
#: A part of the input read on its own: a CSV file's range of rows, a Parquet row group.
Part = RowRange | RowGroupPart


@dataclass(frozen=True)
class Job:
    """What every step knows: the file, the columns' kinds (from its first rows), the
    arguments, and the temporary output directory."""

    source: Source
    found: Scan  # kinds and sample; no counts
    data_start: int  # where the rows begin (0 for a gzip file, read whole)
    label_kind: str
    fill: str | float | None
    validation_fraction: float
    shards: int
    seed: int
    bucket_bytes: int  # records sorted at a time, when a bucket is written
    spill_bytes: int  # records held at a time, while a range is encoded
    names: list[str]  # the features' Keras input names
    one_hot: bool
    vocabulary: VocabularyOptions
    out_dir: str

    def batches(self, part: Part, first_row: int) -> Iterator[CsvBatch]:
        """The rows of ``part``, numbered from ``first_row``."""
        if isinstance(self.source, ParquetSource):
            assert isinstance(part, RowGroupPart)
            return self.source.part_batches(part, first_row)
        if self.source.gzipped:  # one range, the whole file
            return self.source.batches()
        assert isinstance(part, RowRange)
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
    part: Part

    def where(self, row: int) -> str:
        source, part = self.job.source, self.part
        if isinstance(source, ParquetSource):
            assert isinstance(part, RowGroupPart)
            return source.part_where(part, row)
        assert isinstance(part, RowRange)
        before = RowRange(index=-1, start=self.job.data_start, end=part.start)
        rows = sum(b.rows for b in self.job.batches(before, 0)) if before.end > before.start else 0
        return source.where(rows + row)


def count_range(part: Part, job: Job) -> tuple[int, Counts]:
    """Step 1: ``(range index, counts)``; an :class:`InputError` at the range's first bad
    value."""
    counts = Counts.start(job.found, job.label_kind)
    lines = _RangeLines(job, part)
    for batch in job.batches(part, 0):
        counts.add(lines, batch, job.found, job.fill is not None)
    return part.index, counts


def make_plan(counted: list[tuple[int, Counts]], job: Job, say: Callable[[str], None]) -> Plan:
    """Step 2: the scan of the whole file, its vocabularies written, and the split plan."""
    ranges = [counts for _, counts in sorted(counted, key=lambda item: item[0])]
    scratch = storage.local_temp_dir()
    try:
        total = Counts.start(job.found, job.label_kind, scratch)
        for counts in ranges:
            total.merge(counts)
        found = finish_scan(job.source.path, job.found, total, job.vocabulary)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    found = write_vocabularies(job.out_dir, found, say)
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


def split_range(part: Part, job: Job, plan: Plan) -> tuple[int, dict[str, int], dict]:
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


@dataclass(frozen=True)
class EncodedRange:
    """What :func:`encode_range` leaves of a range: its statistics, and where its records lie
    per bucket (in its file under :data:`PIECES`)."""

    index: int
    stats: dict[int, ColumnStats]
    blocks: dict[int, list[BlockPlace]]


def encode_range(part: Part, job: Job, plan: Plan) -> EncodedRange:
    """Step 5: the range's records, each with its bucket and sort key, parked in the range's
    own file (``spill_bytes`` of them in memory at a time), and its statistics."""
    i = part.index
    encoder = Encoder(
        plan.found, plan.split, plan.layout, job.seed, before=plan.before(i), shifts=plan.shifts
    )
    path = storage.join(job.out_dir, PIECES, f"range-{i:06d}.blocks")
    with RangeParts(path, flush_bytes=job.spill_bytes) as parked:
        for batch in job.batches(part, plan.first_rows[i]):
            parked.add(*encoder.encode(batch))
    if encoder.rows != plan.rows[i]:
        raise InputError(f"{job.source.path}: the file changed while it was being read")
    return EncodedRange(index=i, stats=encoder.stats, blocks=parked.index)


def bucket_blocks(encoded: list[EncodedRange]) -> list[tuple[int, list[BlockPlace]]]:
    """``(bucket, where its blocks lie)`` of every bucket that was sent records, its blocks
    in range order."""
    places: dict[int, list[BlockPlace]] = {}
    for part in sorted(encoded, key=lambda e: e.index):
        for bucket, blocks in part.blocks.items():
            places.setdefault(bucket, []).extend(blocks)
    return sorted(places.items())


def merge_stats(encoded: Iterable[EncodedRange]) -> dict[int, ColumnStats]:
    """The statistics of all ranges."""
    total: dict[int, ColumnStats] = {}
    for part in sorted(encoded, key=lambda e: e.index):
        for j, stats in part.stats.items():
            total.setdefault(j, ColumnStats(shift=stats.shift)).merge(stats)
    return total


def write_bucket(
    item: tuple[int, list[BlockPlace]], job: Job, plan: Plan
) -> tuple[tuple[str, int], tuple[int, str, int]]:
    """Step 6: ``((split, shard), (bucket, path, records))`` of one bucket, read from the
    ranges' files and written in key order: into its shard if the shard has no other, else
    as a piece of it. It holds one bucket (``bucket_bytes``) at a time."""
    bucket, places = item
    split, shard = plan.layout.shard_of(bucket)
    if plan.layout.per_shard[split] == 1:
        path = storage.join(job.out_dir, shard_name(split, shard))
    else:
        path = storage.join(job.out_dir, PIECES, f"bucket-{bucket:06d}.tfrecord")
    storage.makedirs(storage.parent(path))
    with ShardWriter(path) as writer:
        writer.write_all(sorted_blocks(places))
    return (split, shard), (bucket, path, writer.records)


def by_shard(
    written: list[tuple[tuple[str, int], tuple[int, str, int]]],
) -> list[tuple[tuple[str, int], list[tuple[int, str, int]]]]:
    """The buckets written (:func:`write_bucket`), grouped by their shard, in shard order."""
    shards: dict[tuple[str, int], list[tuple[int, str, int]]] = {}
    for shard, bucket in written:
        shards.setdefault(shard, []).append(bucket)
    return sorted(shards.items())


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


def write_schema(job: Job, plan: Plan, encoded: list[EncodedRange], shards: list) -> None:
    """Step 7: ``schema.json``, as the single-machine path writes it."""
    schema = new_schema(
        plan.found, merge_stats(encoded), job.names, job.fill, job.one_hot, job.vocabulary
    )
    for split in SPLITS:
        written = sorted((k, entry) for s, k, entry in shards if s == split)
        schema.splits[split] = [entry for _, entry in written]
        schema.records[split] = plan.split.records[split]
        if sum(entry.records for entry in schema.splits[split]) != schema.records[split]:
            raise AssertionError(f"{split}: the shards do not hold the split's records")
    schema.save(job.out_dir)
