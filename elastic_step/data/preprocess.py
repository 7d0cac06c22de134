"""CSV → sharded TFRecord files plus ``schema.json``, in memory bounded whatever the input size.

Layout of the output directory::

    schema.json
    vocabularies/000-NAME.txt        (one per categorical column with a vocabulary)
    train/part-00000.tfrecord        (+ .index)   ...
    validation/part-00000.tfrecord   (+ .index)   ...

Each record is a ``tf.train.Example`` holding RAW values keyed by column name (see
:mod:`elastic_step.data.schema` for how each kind is stored). The default feed standardizes,
fills and looks up ids at read time from the schema.

Three passes, each holding a bounded part of the data (:class:`MemoryBudget`):

1. read the CSV: column types, every value checked, values counted and label classes
   (:mod:`elastic_step.data.csv_scan`); the vocabularies chosen and written
   (:mod:`elastic_step.data.vocabulary`);
2. read it again: choose each row's split (stratified by class for a class label), encode
   the records in batches, and park them in bucket files on local disk by a random key;
   train-split statistics;
3. per shard, read back its buckets one at a time, sort each by key, and append it.

Every random choice is a function of the seed and the row's number (:mod:`row_random`), so
records within a shard are in random order (a CSV sorted by label does not yield single-label
tasks), and the output is the same, byte for byte, whatever the memory budget.

The public pieces below (SplitPlan, BucketLayout, Encoder, ColumnStats, ...) are also the
steps of the Apache Beam pipeline (beam_steps.py), which writes the same output.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from elastic_step.data import storage, vocabulary
from elastic_step.data.csv_scan import Scan, scan
from elastic_step.data.csv_source import BATCH_BYTES, BLOCK_BYTES, CsvBatch
from elastic_step.data.example_encoding import BytesColumn, FloatColumn, encode_examples
from elastic_step.data.input_names import input_names
from elastic_step.data.input_source import Source, open_source
from elastic_step.data.numbers import ExactSum, as_text, to_numbers
from elastic_step.data.progress import Progress
from elastic_step.data.row_random import Permutation, row_keys, stream_key
from elastic_step.data.schema import Column, Schema, Shard
from elastic_step.data.spill import FLUSH_BYTES, Spill
from elastic_step.data.tfrecord import ShardWriter
from elastic_step.data.vocabulary import VOCABULARY_DIR, VocabularyOptions
from elastic_step.errors import InputError

LABEL_KINDS = ("auto", "class", "numeric")
SPLITS = ("train", "validation")
FILL_RULES = "mean, zero or a number"


@dataclass(frozen=True, kw_only=True)
class MemoryBudget:
    """How much of the data is held at once. The output does not depend on it."""

    block_bytes: int = BLOCK_BYTES  # CSV text parsed at a time (a few dozen are read ahead)
    batch_bytes: int = BATCH_BYTES  # CSV text checked and encoded at a time
    spill_bytes: int = FLUSH_BYTES  # encoded records held before they go to bucket files
    bucket_bytes: int = 32 << 20  # encoded records sorted at a time while writing a shard


def preprocess(
    *,
    input_path: str,
    label: str,
    output: str,
    shards: int = 4,
    validation_fraction: float = 0.2,
    seed: int = 0,
    categorical: Sequence[str] = (),
    label_kind: str = "auto",
    fill_missing: str | None = None,
    one_hot: bool = False,
    vocabulary_options: VocabularyOptions = vocabulary.DEFAULTS,
    progress: Callable[[str], None] | None = None,
    progress_every_s: float = 5.0,
    memory: MemoryBudget = MemoryBudget(),
) -> Schema:
    """Converts the CSV ``input_path`` (header row first; a path or URI; gzip-compressed or not,
    whatever its name) into shards and a schema in ``output``.

    Column types follow :mod:`elastic_step.data.csv_scan`; names in ``categorical`` are forced
    categorical. ``label_kind="auto"`` makes the label a class label when it is text, or
    numbers with only integer values and at most 50 distinct ones (vocabulary in numeric
    order, so digits 0..9 get ids 0..9); otherwise numeric. ``"class"`` and ``"numeric"``
    force the kind.

    ``fill_missing`` (``"mean"``, ``"zero"`` or a number) allows empty numeric values: the
    records leave them out, and the schema gives every numeric column the value that readers
    use instead (the mean is the train split's). Without it an empty numeric value is an error.

    The validation split holds ``round(n_c * validation_fraction)`` rows of each class ``c``
    of a class label (of all ``n`` rows for a numeric label), and never all rows. Each split is
    dealt round-robin into ``shards`` shards (fewer when it has fewer records; none when it is
    empty). Means and standard deviations come from the train split's non-empty values (a
    zero std is stored as 1.0); vocabularies come from all rows, as ``vocabulary_options``
    say (:mod:`elastic_step.data.vocabulary`).

    Everything is written into a temporary directory that replaces ``output`` only on success,
    so a failure leaves ``output`` as it was. Bad input raises :class:`InputError` with one
    line naming the file, line and column. ``progress`` receives a line per step, and one
    every ``progress_every_s`` seconds during long passes.
    """
    say = progress or (lambda _line: None)
    fill = check_arguments(shards, validation_fraction, label_kind, fill_missing)
    source = open_input(input_path, label, categorical, memory)
    vocabulary_options.check_columns(input_path, source.header, label)

    def progress_of(what: str) -> Progress:
        return Progress(say, what=what, total_bytes=source.total_bytes, every_s=progress_every_s)

    with storage.atomic_directory(output) as tmp:
        scratch = storage.local_temp_dir()
        try:
            found = scan(
                source,
                label=label,
                categorical=set(categorical),
                label_kind=label_kind,
                fill_missing=fill is not None,
                vocabulary=vocabulary_options,
                spill_dir=os.path.join(scratch, "counts"),
                progress=progress_of("reading"),
            )
            say(f"read {found.rows} rows, {len(found.header)} columns from {input_path}")
            found = write_vocabularies(tmp, found, say)
            plan = SplitPlan.make(found, validation_fraction, shards, seed)
            layout = BucketLayout.make(found, plan, memory.bucket_bytes)
            names = keras_input_names(found, say)
            spill = Spill(scratch, layout.total, flush_bytes=memory.spill_bytes)
            encoder = Encoder(found, plan, layout, seed)
            for batch in source.batches(progress_of("encoding")):
                spill.add(*encoder.encode(batch))
            spill.flush()
            if encoder.rows != found.rows:
                raise InputError(f"{input_path}: the file changed while it was being read")
            schema = new_schema(found, encoder.stats, names, fill, one_hot, vocabulary_options)
            say(describe(schema))
            writing = Progress(
                say, what="writing", total_bytes=spill.bytes_written, every_s=progress_every_s
            )
            for split in SPLITS:
                schema.splits[split] = _write_split(tmp, split, spill, layout, writing)
                schema.records[split] = plan.records[split]
                say(wrote_line(schema, split))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        schema.save(tmp)
    schema.directory = output
    say(f"wrote {output}")
    return schema


def open_input(
    input_path: str, label: str, categorical: Sequence[str], memory: MemoryBudget
) -> Source:
    """The CSV file or Parquet files ``input_path`` (:mod:`elastic_step.data.input_source`),
    the header checked against ``label`` and ``categorical``."""
    source = open_source(input_path, block_bytes=memory.block_bytes, batch_bytes=memory.batch_bytes)
    _check_header(input_path, source.header, label, set(categorical))
    return source


def write_vocabularies(out_dir: str, found: Scan, say: Callable[[str], None]) -> Scan:
    """Writes the vocabulary file of each counted column into ``out_dir``, and says their
    sizes; ``found`` without the entries, with the sizes (``vocabulary_sizes``)."""
    sizes = {}
    for j, chosen in sorted(found.vocabularies.items()):
        if not sizes:
            storage.makedirs(storage.join(out_dir, VOCABULARY_DIR))
        vocabulary.write(storage.join(out_dir, vocabulary_file(found, j)), chosen)
        sizes[j] = chosen.size
    if sizes:
        say(
            "vocabularies: "
            + ", ".join(
                f"'{found.header[j]}' {sizes[j]} of {found.vocabularies[j].distinct} values"
                for j in sorted(sizes)
            )
        )
    return dataclasses.replace(found, vocabularies={}, vocabulary_sizes=sizes)


def vocabulary_file(found: Scan, column: int) -> str:
    """The vocabulary file of column ``column`` of the CSV, relative to the output."""
    features = [j for j in range(len(found.header)) if j != found.label_index]
    return vocabulary.file_name(features.index(column), found.header[column])


def keras_input_names(found: Scan, say: Callable[[str], None]) -> list[str]:
    """The Keras input names of the feature columns; says which differ from the CSV's."""
    features = [j for j in range(len(found.header)) if j != found.label_index]
    names = input_names([found.header[j] for j in features])
    renamed = [
        (found.header[j], n) for j, n in zip(features, names, strict=True) if found.header[j] != n
    ]
    if renamed:
        say("Keras input names: " + ", ".join(f"'{a}' -> '{b}'" for a, b in renamed))
    return names


def new_schema(
    found: Scan,
    stats: dict[int, ColumnStats],
    names: list[str],
    fill: str | float | None,
    one_hot: bool,
    options: VocabularyOptions,
) -> Schema:
    """The schema of the data, its splits not yet filled in."""
    columns = []
    features = [j for j in range(len(found.header)) if j != found.label_index]
    for j, input_name in zip(features, names, strict=True):
        name = found.header[j]
        if found.kinds[j] == "numeric":
            mean, std = stats[j].mean_std()
            columns.append(
                Column(
                    name=name,
                    kind="numeric",
                    mean=mean,
                    std=std,
                    input_name=input_name,
                    fill=mean if fill == "mean" else fill,  # type: ignore[arg-type]
                )
            )
        elif j in found.hashed:
            columns.append(
                Column(
                    name=name,
                    kind="categorical",
                    input_name=input_name,
                    hash_buckets=options.hash_buckets[name],
                )
            )
        else:
            columns.append(
                Column(
                    name=name,
                    kind="categorical",
                    input_name=input_name,
                    vocabulary_file=vocabulary_file(found, j),
                    vocabulary_size=found.vocabulary_sizes[j],
                    oov_buckets=options.oov_buckets,
                )
            )
    return Schema(
        label=found.header[found.label_index],
        label_kind=found.label_kind,  # type: ignore[arg-type]
        label_vocabulary=found.label_vocabulary,
        columns=columns,
        one_hot=one_hot,
    )


def wrote_line(schema: Schema, split: str) -> str:
    """What preprocessing says once it has written ``split``."""
    return f"wrote {split}: {schema.records[split]} records in {len(schema.splits[split])} shards"


def describe(schema: Schema) -> str:
    numeric = sum(c.kind == "numeric" for c in schema.columns)
    label = (
        f"class label with {schema.num_classes} classes"
        if schema.label_kind == "class"
        else "numeric label"
    )
    return (
        f"columns: {numeric} numeric, {len(schema.columns) - numeric} categorical; "
        f"'{schema.label}' is a {label}"
    )


def check_arguments(
    shards: int, validation_fraction: float, label_kind: str, fill_missing: str | None
) -> str | float | None:
    """Checks the arguments; returns the fill rule: ``"mean"``, a number, or None."""
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise InputError(f"--shards must be an integer >= 1, got {shards!r}")
    if not isinstance(validation_fraction, int | float) or not (0 <= validation_fraction < 1):
        raise InputError(f"--validation-fraction must be >= 0 and < 1, got {validation_fraction!r}")
    if label_kind not in LABEL_KINDS:
        raise InputError(
            f"--label-kind must be one of {', '.join(LABEL_KINDS)}, got {label_kind!r}"
        )
    if fill_missing is None or fill_missing == "mean":
        return fill_missing
    if fill_missing == "zero":
        return 0.0
    try:
        value = float(fill_missing)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InputError(f"--fill-missing must be {FILL_RULES}, got {fill_missing!r}")
    return value


def _check_header(path: str, header: list[str], label: str, categorical: set[str]) -> None:
    if any(name == "" for name in header):
        position = header.index("") + 1
        raise InputError(f"{path}: line 1: header column {position} has no name")
    duplicates = sorted({n for n in header if header.count(n) > 1})
    if duplicates:
        raise InputError(f"{path}: line 1: duplicate column names: {', '.join(duplicates)}")
    if label not in header:
        raise InputError(
            f"{path}: no label column '{label}' in the header (columns: {', '.join(header)})"
        )
    unknown = sorted(categorical - set(header))
    if unknown:
        raise InputError(
            f"--categorical {', '.join(unknown)}: no such column in {path} "
            f"(columns: {', '.join(header)})"
        )
    if len(header) < 2:
        raise InputError(f"{path}: only the label column '{label}', no feature columns")


@dataclass
class SplitPlan:
    """Which rows go to validation: ``validation[s]`` of stratum ``s``'s ``sizes[s]`` rows,
    picked by a keyed permutation of the stratum's row positions."""

    sizes: list[int]
    validation: list[int]
    permutations: list[Permutation]
    records: dict[str, int]
    shards: dict[str, int]

    @classmethod
    def make(cls, found: Scan, fraction: float, shards: int, seed: int) -> SplitPlan:
        sizes = found.class_counts if found.label_kind == "class" else [found.rows]
        validation = [round(n * fraction) for n in sizes]
        if sum(validation) >= found.rows:  # the train split is never empty
            validation[int(np.argmax(validation))] -= 1
        key = stream_key(seed, "validation")
        permutations = [Permutation(n, stream_key(key, str(s))) for s, n in enumerate(sizes)]
        records = {"validation": sum(validation)}
        records["train"] = found.rows - records["validation"]
        return cls(
            sizes=sizes,
            validation=validation,
            permutations=permutations,
            records=records,
            shards={s: min(shards, records[s]) for s in SPLITS},
        )


@dataclass(frozen=True)
class BucketLayout:
    """The spill's buckets: ``per_shard[split]`` consecutive buckets for each shard of each
    split, train first. A shard's buckets are ranges of sort keys, in key order."""

    shards: dict[str, int]
    per_shard: dict[str, int]

    @classmethod
    def make(cls, found: Scan, plan: SplitPlan, bucket_bytes: int) -> BucketLayout:
        """About ``bucket_bytes`` of records per bucket, from the size of the sample's."""
        sample = _encode_batch(found, found.sample)[0]
        record_bytes = sample.nbytes / max(len(sample), 1)
        per_shard = {
            split: max(
                1,
                math.ceil(
                    record_bytes * plan.records[split] / max(plan.shards[split], 1) / bucket_bytes
                ),
            )
            for split in SPLITS
        }
        return cls(shards=plan.shards, per_shard=per_shard)

    @property
    def total(self) -> int:
        return sum(self.shards[s] * self.per_shard[s] for s in SPLITS)

    def first(self, split: str, shard: int | np.ndarray = 0) -> int | np.ndarray:
        """The first bucket of ``shard`` of ``split``."""
        before = 0 if split == SPLITS[0] else self.shards[SPLITS[0]] * self.per_shard[SPLITS[0]]
        return before + shard * self.per_shard[split]

    def shard_of(self, bucket: int) -> tuple[str, int]:
        """The split and the shard that ``bucket`` belongs to."""
        rest = bucket
        for split in SPLITS:
            if rest < self.shards[split] * self.per_shard[split]:
                return split, rest // self.per_shard[split]
            rest -= self.shards[split] * self.per_shard[split]
        raise ValueError(f"no bucket {bucket} in {self}")


def shard_name(split: str, shard: int) -> str:
    """The path of a shard in the output directory."""
    return f"{split}/part-{shard:05d}.tfrecord"


def _encode_batch(
    found: Scan, batch: CsvBatch
) -> tuple[pa.Array, dict[int, pa.Array], pa.Array | None]:
    """``(records, numbers, classes)`` of ``batch``: its serialized Examples, the float values
    of each numeric feature column (null where empty), and each row's class id (class label)."""
    header, label_index = found.header, found.label_index
    columns: list[FloatColumn | BytesColumn] = []
    numbers: dict[int, pa.Array] = {}
    for j, values in enumerate(batch.columns):
        if j == label_index:
            continue
        if found.kinds[j] == "numeric":
            numbers[j] = to_numbers(values)[0]
            columns.append(FloatColumn(key=header[j], values=numbers[j]))
        else:
            columns.append(BytesColumn(key=header[j], values=as_text(values)))
    label = batch.columns[label_index]
    classes = None
    if found.label_kind == "numeric":
        columns.append(FloatColumn(key=header[label_index], values=to_numbers(label)[0]))
    else:
        classes = _classes(found, label)
        names = pc.take(pa.array(found.label_vocabulary or [], pa.string()), classes)
        columns.append(BytesColumn(key=header[label_index], values=names))
    return encode_examples(columns), numbers, classes


def _classes(found: Scan, label: pa.Array) -> pa.Array:
    """The class id of each of the text values ``label`` of a class label."""
    vocabulary = found.label_vocabulary or []
    if found.label_numeric:
        floats = to_numbers(label)[0]
        return pc.index_in(floats, value_set=pa.array([float(v) for v in vocabulary]))
    return pc.index_in(as_text(label), value_set=pa.array(vocabulary, pa.string()))


@dataclass
class ColumnStats:
    """Exact running train-split sums of one numeric column, shifted by its first value for
    the numerical stability of the variance; exact, so batching cannot change the result.
    Sums of parts of the file under the same ``shift`` merge exactly (:meth:`merge`)."""

    shift: float | None = None
    total: ExactSum = field(default_factory=ExactSum)
    squares: ExactSum = field(default_factory=ExactSum)
    count: int = 0

    def add(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        if self.shift is None:
            self.shift = float(values[0])
        shifted = values - self.shift
        self.total.add(shifted)
        self.squares.add(np.square(shifted))
        self.count += values.size

    def merge(self, other: ColumnStats) -> None:
        """Adds the sums of other values, summed under the same shift."""
        if other.count == 0:
            return
        if self.count and self.shift != other.shift:
            raise ValueError(f"sums under shifts {self.shift} and {other.shift} do not add up")
        self.shift = other.shift
        self.total.merge(other.total)
        self.squares.merge(other.squares)
        self.count += other.count

    def mean_std(self) -> tuple[float, float]:
        if self.count == 0 or self.shift is None:
            return 0.0, 1.0
        mean_shifted = self.total.value() / self.count
        variance = self.squares.value() / self.count - mean_shifted**2
        std = math.sqrt(max(float(variance), 0.0))
        return self.shift + float(mean_shifted), std if std > 0 and math.isfinite(std) else 1.0


@dataclass(frozen=True)
class RowsBefore:
    """Where a part of the file begins: the rows before it in each stratum of the split plan,
    and in each split. The start of the file by default."""

    strata: list[int] | None = None
    splits: dict[str, int] | None = None


@dataclass
class Encoder:
    """The second pass, one batch at a time: split, shard and bucket of every row, records,
    and statistics. Its counters run over the whole file, so batching changes nothing.

    An encoder of a part of the file starts its counters at ``before``, and its statistics at
    ``shifts`` (each column's first train value in the file): then it encodes the part as the
    encoder of the whole file does.
    """

    found: Scan
    plan: SplitPlan
    layout: BucketLayout
    seed: int
    before: RowsBefore = field(default_factory=RowsBefore)
    shifts: dict[int, float] = field(default_factory=dict)
    rows: int = 0
    stats: dict[int, ColumnStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Rows per stratum so far, and rows per split so far.
        strata = self.before.strata or [0] * len(self.plan.sizes)
        self._seen = np.array(strata, dtype=np.int64)
        self._dealt = dict(self.before.splits or {split: 0 for split in SPLITS})
        self._order_key = stream_key(self.seed, "order")
        self.stats = {
            j: ColumnStats(shift=self.shifts.get(j))
            for j, k in enumerate(self.found.kinds)
            if k == "numeric" and j != self.found.label_index
        }

    def encode(self, batch: CsvBatch) -> tuple[np.ndarray, np.ndarray, pa.Array]:
        """``(bucket, key, record)`` of each row of ``batch``."""
        records, numbers, classes = _encode_batch(self.found, batch)
        n = batch.rows
        validation = self._validation_rows(classes, n)
        row_numbers = np.arange(batch.first_row, batch.first_row + n)
        keys = row_keys(self._order_key, row_numbers)
        bucket = np.empty(n, dtype=np.int64)
        for split, in_split in (("train", ~validation), ("validation", validation)):
            index = np.flatnonzero(in_split)
            dealt = self._dealt[split] + np.arange(index.size)
            self._dealt[split] += index.size
            if index.size == 0:
                continue
            per_shard = self.layout.per_shard[split]
            shard = dealt % self.plan.shards[split]
            # The top 53 bits of the key as a fraction: buckets are ranges of keys.
            fraction = (keys[index] >> np.uint64(11)).astype(np.float64) / float(1 << 53)
            within = np.minimum((fraction * per_shard).astype(np.int64), per_shard - 1)
            bucket[index] = self.layout.first(split, shard) + within
        for j, values in train_values(numbers, validation).items():
            self.stats[j].add(values)
        self.rows += n
        return bucket, keys, records

    def split(self, batch: CsvBatch) -> np.ndarray:
        """Whether each row of ``batch`` goes to validation, without encoding it; the next
        batch's rows follow these."""
        label = batch.columns[self.found.label_index]
        classes = None if self.found.label_kind == "numeric" else _classes(self.found, label)
        self.rows += batch.rows
        return self._validation_rows(classes, batch.rows)

    def _validation_rows(self, classes: pa.Array | None, n: int) -> np.ndarray:
        """Whether each row goes to validation, from its position within its stratum."""
        strata = (
            np.zeros(n, dtype=np.int64)
            if classes is None
            else classes.to_numpy(zero_copy_only=False).astype(np.int64)
        )
        order = np.argsort(strata, kind="stable")
        sorted_strata = strata[order]
        starts = np.flatnonzero(np.r_[True, sorted_strata[1:] != sorted_strata[:-1]])
        position = np.empty(strata.size, dtype=np.int64)
        validation = np.zeros(strata.size, dtype=bool)
        for start, end in zip(starts, np.r_[starts[1:], strata.size], strict=True):
            stratum = int(sorted_strata[start])
            rows = order[start:end]
            position[rows] = self._seen[stratum] + np.arange(end - start)
            self._seen[stratum] += end - start
            count = self.plan.validation[stratum]
            if count:
                validation[rows] = self.plan.permutations[stratum](position[rows]) < count
        return validation


def train_values(numbers: dict[int, pa.Array], validation: np.ndarray) -> dict[int, np.ndarray]:
    """The non-empty values of the train split's rows, per numeric column: what its
    statistics are over."""
    train = ~validation
    values = {}
    for j, column in numbers.items():
        present = column.is_valid().to_numpy(zero_copy_only=False) & train
        values[j] = column.to_numpy(zero_copy_only=False)[present]
    return values


def _write_split(
    out_dir: str, split: str, spill: Spill, layout: BucketLayout, progress: Progress
) -> list[Shard]:
    """Writes the shards of ``split``, each from its buckets in key order."""
    if layout.shards[split] == 0:
        return []
    storage.makedirs(storage.join(out_dir, split))
    written = []
    for k in range(layout.shards[split]):
        relative = shard_name(split, k)
        first = layout.first(split, k)
        with ShardWriter(storage.join(out_dir, relative)) as writer:
            for bucket in range(first, first + layout.per_shard[split]):
                records = spill.sorted_bucket(bucket)
                writer.write_all(records)
                progress.add(records.nbytes, len(records))
            written.append(Shard(path=relative, records=writer.records))
    return written
