"""CSV → sharded TFRecord files plus ``schema.json``.

Layout of the output directory::

    schema.json
    train/part-00000.tfrecord        (+ .index)   ...
    validation/part-00000.tfrecord   (+ .index)   ...

Each record is a ``tf.train.Example`` holding RAW values keyed by column name: numeric columns
as one float, categorical columns as one UTF-8 string, the label as one float (numeric label) or
one string (class label, the canonical vocabulary string). The default feed standardizes and
looks up ids at read time from the schema.

Rows are shuffled with ``numpy.random.default_rng(seed)`` before splitting and sharding, so
records within a shard are in random order (a CSV sorted by label does not yield single-label
tasks). That needs the serialized records of the file in memory while writing, which is fine
for the small and medium data this is meant for.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import numpy as np
from tensorflow.core.example import example_pb2, feature_pb2

from elastic_step.data import storage
from elastic_step.data.schema import Column, Schema, Shard
from elastic_step.data.tfrecord import write_shard
from elastic_step.errors import InputError

INFER_ROWS = 100  # column types come from this many leading data rows
MAX_AUTO_CLASSES = 50  # an integer label with at most this many values is a class label
LABEL_KINDS = ("auto", "class", "numeric")


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
    progress: Callable[[str], None] | None = None,
) -> Schema:
    """Converts the CSV ``input_path`` (header row first) into shards and a schema in ``output``.

    Column types come from the first 100 data rows: numeric if every non-empty sampled value
    is a finite float, else categorical; names in ``categorical`` are forced categorical.
    ``label_kind="auto"`` makes the label a class label when it is non-numeric, or numeric with
    only integer values and at most 50 distinct ones (vocabulary in numeric order, so digits
    0..9 get ids 0..9); otherwise numeric. ``"class"`` and ``"numeric"`` force the kind.

    ``round(n * validation_fraction)`` shuffled rows (at most ``n - 1``) form the validation
    split, the rest the train split. Each split is written as ``shards`` shards of
    contiguous blocks of its shuffled rows (fewer shards when it has fewer records; none when
    it is empty). Means and standard deviations come from the train split (a zero std is
    stored as 1.0); vocabularies come from all rows, most frequent first, ties by value.

    Everything is written into a temporary directory that replaces ``output`` only on success,
    so a failure leaves ``output`` as it was. Bad input raises :class:`InputError` with one
    line naming the file, line and column.
    """
    say = progress or (lambda _line: None)
    _check_arguments(shards, validation_fraction, label_kind)
    if not storage.exists(input_path):
        raise InputError(f"{input_path}: file not found")
    if storage.isdir(input_path):
        raise InputError(f"{input_path}: is a directory, expected a CSV file")

    scan = _scan(input_path, label, set(categorical), label_kind)
    n = scan.rows
    say(f"read {n} rows, {len(scan.header)} columns from {input_path}")

    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    n_val = min(round(n * validation_fraction), n - 1)  # the train split is never empty
    split_rows = {"validation": order[:n_val], "train": order[n_val:]}
    in_train = np.zeros(n, dtype=bool)
    in_train[split_rows["train"]] = True

    records, stats = _convert(input_path, scan, in_train)
    columns = _columns(scan, stats)
    schema = Schema(
        label=label,
        label_kind=scan.label_kind,
        label_vocabulary=scan.label_vocabulary,
        columns=columns,
    )
    numeric = sum(c.kind == "numeric" for c in columns)
    label_desc = (
        f"class label with {schema.num_classes} classes"
        if schema.label_kind == "class"
        else "numeric label"
    )
    say(
        f"columns: {numeric} numeric, {len(columns) - numeric} categorical; "
        f"'{label}' is a {label_desc}"
    )

    with storage.atomic_directory(output) as tmp:
        for split in ("train", "validation"):
            rows = split_rows[split]
            written = _write_split(tmp, split, [records[i] for i in rows], shards)
            schema.splits[split] = written
            schema.records[split] = len(rows)
            say(f"wrote {split}: {len(rows)} records in {len(written)} shards")
        schema.save(tmp)
    say(f"wrote {output}")
    return schema


def _check_arguments(shards: int, validation_fraction: float, label_kind: str) -> None:
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise InputError(f"--shards must be an integer >= 1, got {shards!r}")
    if not isinstance(validation_fraction, int | float) or not (0 <= validation_fraction < 1):
        raise InputError(f"--validation-fraction must be >= 0 and < 1, got {validation_fraction!r}")
    if label_kind not in LABEL_KINDS:
        raise InputError(
            f"--label-kind must be one of {', '.join(LABEL_KINDS)}, got {label_kind!r}"
        )


def _parse_float(text: str) -> float | None:
    """The finite float that ``text`` spells, else None (NaN/inf count as non-numeric)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _canonical_number(value: float) -> str:
    """One spelling per number, so "1", "1.0" and "01" are the same class."""
    return str(int(value)) if value.is_integer() else repr(value)


@dataclass
class _Scan:
    """What the first pass learned about the file."""

    header: list[str]
    label_index: int
    kinds: list[str]  # per header column: "numeric" | "categorical" (label included)
    rows: int = 0
    value_counts: dict[int, Counter] = field(default_factory=dict)  # categorical features
    label_kind: str = "numeric"
    label_vocabulary: list[str] | None = None
    label_numeric: bool = True  # label values are read as numbers (numeric or numeric classes)


def _rows(path: str) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of each non-blank row, header first; values are stripped."""
    try:
        with storage.open_file(path, "rb") as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
            reader = csv.reader(text)
            try:
                for fields in reader:
                    if len(fields) > 1 or (fields and fields[0].strip()):  # skip blank lines
                        yield reader.line_num, [f.strip() for f in fields]
            except csv.Error as e:
                raise InputError(f"{path}: line {reader.line_num}: malformed CSV: {e}") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _scan(path: str, label: str, categorical: set[str], label_kind: str) -> _Scan:
    """First pass: header, types, validation of every value, vocabularies, label classes."""
    rows = _rows(path)
    first = next(rows, None)
    if first is None:
        raise InputError(f"{path}: the file is empty, expected a header row and data rows")
    _, header = first
    _check_header(path, header, label, categorical)
    width = len(header)
    label_index = header.index(label)

    # Type inference needs the leading rows before any value can be checked.
    sample: list[tuple[int, list[str]]] = []
    for line, fields in rows:
        _check_width(path, line, fields, width)
        sample.append((line, fields))
        if len(sample) == INFER_ROWS:
            break
    kinds = []
    for j, name in enumerate(header):
        values = [f[j] for _, f in sample if f[j] != ""]
        numeric = bool(values) and all(_parse_float(v) is not None for v in values)
        kinds.append("numeric" if numeric and name not in categorical else "categorical")

    scan = _Scan(header=header, label_index=label_index, kinds=kinds)
    scan.value_counts = {j: Counter() for j, k in enumerate(kinds) if k == "categorical"}
    labels: set[str] = set()
    label_all_numeric = label not in categorical
    label_values: set[float] = set()

    def check(line: int, fields: list[str]) -> None:
        nonlocal label_all_numeric
        for j, value in enumerate(fields):
            if j == label_index:
                continue
            if kinds[j] == "numeric":
                _check_numeric(path, line, header[j], value)
            else:
                scan.value_counts[j][value] += 1
        value = fields[label_index]
        if value == "":
            raise InputError(f"{path}: line {line}: empty value in label column '{label}'")
        labels.add(value)
        if label_all_numeric:
            number = _parse_float(value)
            if number is None:
                if label_kind == "numeric":
                    _numeric_label_error(path, line, label, value)
                label_all_numeric = False
            else:
                label_values.add(number)

    for line, fields in sample:
        check(line, fields)
    count = len(sample)
    for line, fields in rows:
        _check_width(path, line, fields, width)
        check(line, fields)
        count += 1
    if count < 2:
        raise InputError(f"{path}: has {count} data rows, need at least 2")
    scan.rows = count

    if label_kind == "numeric" and not label_all_numeric:
        raise InputError(
            f"{path}: --label-kind numeric, but label column '{label}' is listed as categorical"
        )
    integral = label_all_numeric and all(v.is_integer() for v in label_values)
    if label_kind == "numeric" or (
        label_kind == "auto"
        and label_all_numeric
        and not (integral and len(label_values) <= MAX_AUTO_CLASSES)
    ):
        scan.label_kind = "numeric"
    else:
        scan.label_kind = "class"
        scan.label_numeric = label_all_numeric
        if label_all_numeric:
            scan.label_vocabulary = [_canonical_number(v) for v in sorted(label_values)]
        else:
            scan.label_vocabulary = sorted(labels)
    return scan


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


def _check_width(path: str, line: int, fields: list[str], width: int) -> None:
    if len(fields) != width:
        raise InputError(f"{path}: line {line}: expected {width} fields, got {len(fields)}")


def _check_numeric(path: str, line: int, name: str, value: str) -> float:
    if value == "":
        raise InputError(
            f"{path}: line {line}: empty value in numeric column '{name}' "
            f"(fill it in, or pass --categorical {name})"
        )
    number = _parse_float(value)
    if number is None:
        raise InputError(
            f"{path}: line {line}: column '{name}' has non-numeric value {value!r}, but was "
            f"inferred numeric from its first {INFER_ROWS} values "
            f"(pass --categorical {name} to treat it as categorical)"
        )
    return number


def _numeric_label_error(path: str, line: int, label: str, value: str) -> NoReturn:
    raise InputError(
        f"{path}: line {line}: label column '{label}' has non-numeric value {value!r}, "
        f"but --label-kind is numeric"
    )


@dataclass
class _Stats:
    """Running train-split sums per numeric feature column, shifted by a first value for
    numerical stability of the variance."""

    shift: dict[int, float] = field(default_factory=dict)
    total: dict[int, float] = field(default_factory=dict)
    squares: dict[int, float] = field(default_factory=dict)
    count: int = 0


def _convert(path: str, scan: _Scan, in_train: np.ndarray) -> tuple[list[bytes], _Stats]:
    """Second pass: one serialized Example per data row, and train-split statistics."""
    header, kinds, label_index = scan.header, scan.kinds, scan.label_index
    numeric_cols = [j for j, k in enumerate(kinds) if k == "numeric" and j != label_index]
    stats = _Stats()
    records: list[bytes] = []
    rows = _rows(path)
    next(rows)  # header
    for row, (line, fields) in enumerate(rows):
        if row >= scan.rows or len(fields) != len(header):
            raise InputError(f"{path}: line {line}: the file changed while it was being read")
        feature = {}
        for j, value in enumerate(fields):
            if j == label_index:
                feature[header[j]] = _label_feature(scan, value)
            elif kinds[j] == "numeric":
                number = _check_numeric(path, line, header[j], value)
                feature[header[j]] = feature_pb2.Feature(
                    float_list=feature_pb2.FloatList(value=[number])
                )
                if in_train[row]:
                    shift = stats.shift.setdefault(j, number)
                    stats.total[j] = stats.total.get(j, 0.0) + (number - shift)
                    stats.squares[j] = stats.squares.get(j, 0.0) + (number - shift) ** 2
            else:
                feature[header[j]] = _bytes_feature(value)
        if in_train[row]:
            stats.count += 1
        example = example_pb2.Example(features=feature_pb2.Features(feature=feature))
        records.append(example.SerializeToString())
    if len(records) != scan.rows:
        raise InputError(f"{path}: the file changed while it was being read")
    for j in numeric_cols:
        stats.total.setdefault(j, 0.0)
        stats.squares.setdefault(j, 0.0)
        stats.shift.setdefault(j, 0.0)
    return records, stats


def _bytes_feature(value: str) -> feature_pb2.Feature:
    return feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[value.encode("utf-8")]))


def _label_feature(scan: _Scan, value: str) -> feature_pb2.Feature:
    if scan.label_kind == "numeric":
        return feature_pb2.Feature(float_list=feature_pb2.FloatList(value=[float(value)]))
    if scan.label_numeric:
        return _bytes_feature(_canonical_number(float(value)))
    return _bytes_feature(value)


def _columns(scan: _Scan, stats: _Stats) -> list[Column]:
    columns = []
    for j, name in enumerate(scan.header):
        if j == scan.label_index:
            continue
        if scan.kinds[j] == "numeric":
            n = max(stats.count, 1)
            mean_shifted = stats.total[j] / n
            variance = max(stats.squares[j] / n - mean_shifted**2, 0.0)
            std = math.sqrt(variance)
            columns.append(
                Column(
                    name=name,
                    kind="numeric",
                    mean=stats.shift[j] + mean_shifted,
                    std=std if std > 0 and math.isfinite(std) else 1.0,
                )
            )
        else:
            counts = scan.value_counts[j]
            vocabulary = sorted(counts, key=lambda v: (-counts[v], v))
            columns.append(Column(name=name, kind="categorical", vocabulary=vocabulary))
    return columns


def _write_split(out_dir: str, split: str, records: list[bytes], shards: int) -> list[Shard]:
    """Writes ``records`` as up to ``shards`` contiguous, near-equal shards of ``split``."""
    if not records:
        return []
    split_dir = storage.join(out_dir, split)
    storage.makedirs(split_dir)
    count = min(shards, len(records))
    bounds = np.linspace(0, len(records), count + 1).round().astype(int)
    written = []
    for k in range(count):
        relative = f"{split}/part-{k:05d}.tfrecord"
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        write_shard(storage.join(out_dir, relative), records[lo:hi])
        written.append(Shard(path=relative, records=hi - lo))
    return written
