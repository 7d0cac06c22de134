"""The first pass over a CSV file: column types, validation of every value, and counts.

Column types come from the first 100 data rows (empty values aside):

- every value a number: numeric;
- more than half numbers, but not all: an error naming the first other value, its line and
  the column, and ``--categorical``, since a stray word in a numeric column is far likelier
  than a categorical column of mostly numbers;
- otherwise categorical.

A later value that does not fit its column's type, an empty numeric value without
``--fill-missing``, and an empty label are errors naming the line and the column. Nothing is
held per row: the pass counts the values of categorical columns within a memory bound
(:mod:`elastic_step.data.vocabulary`), and the label's classes. A hashed column
(``--hash-buckets``) is categorical, and not counted.
Tests: tests/unit/test_preprocess.py, tests/unit/test_preprocess_streaming.py (via preprocess),
tests/unit/test_beam_preprocess.py (counted in parts, merged).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from elastic_step.data.csv_source import CsvBatch
from elastic_step.data.input_source import Source
from elastic_step.data.numbers import as_text, first_true, is_number, to_numbers
from elastic_step.data.vocabulary import (
    COUNT_MEMORY_VALUES,
    Chosen,
    ValueCounter,
    VocabularyOptions,
)
from elastic_step.errors import InputError

INFER_ROWS = 100  # column types come from this many leading data rows
MAX_AUTO_CLASSES = 50  # an integer label with at most this many values is a class label
ID_COLUMN_SHARE = 0.9  # a categorical column with this share of distinct values looks like ids
ID_COLUMN_MIN_ROWS = 20

log = logging.getLogger(__name__)


@dataclass
class Scan:
    """What the first pass learned. ``kinds[j]`` is how column ``j``'s values are read
    (the label's included): ``numeric`` or ``categorical`` (text); ``hashed`` are the
    categorical columns without a vocabulary. ``vocabularies`` holds the chosen vocabulary
    of each other categorical column, once the whole file is counted."""

    header: list[str]
    label_index: int
    kinds: list[str]
    sample: CsvBatch  # the leading rows, for estimates
    hashed: frozenset[int] = frozenset()
    rows: int = 0
    vocabularies: dict[int, Chosen] = field(default_factory=dict)
    vocabulary_sizes: dict[int, int] = field(default_factory=dict)  # once written
    label_kind: str = "numeric"
    label_vocabulary: list[str] | None = None
    class_counts: list[int] | None = None  # per label_vocabulary entry

    @property
    def label_numeric(self) -> bool:
        """The label's values are numbers (a numeric label, or classes named by numbers)."""
        return self.kinds[self.label_index] == "numeric"

    @property
    def counted(self) -> list[int]:
        """The categorical feature columns whose values are counted: all but the hashed."""
        return [
            j
            for j, kind in enumerate(self.kinds)
            if kind == "categorical" and j != self.label_index and j not in self.hashed
        ]


def canonical_number(value: float) -> str:
    """One spelling per number, so "1", "1.0" and "01" are the same class."""
    return str(int(value)) if value.is_integer() else repr(value)


def _add_counts(counts: dict, values: pa.Array) -> None:
    for item in pc.value_counts(values).to_pylist():
        counts[item["values"]] = counts.get(item["values"], 0) + item["counts"]


class _LabelCounter:
    """The label's values over the whole file: classes and their counts, while they can be."""

    def __init__(self, label_kind: str) -> None:
        self.label_kind = label_kind
        self.integral = True
        self.counts: dict | None = None if label_kind == "numeric" else {}

    def add_numbers(self, floats: pa.Array) -> None:
        if self.integral and not pc.all(pc.equal(pc.floor(floats), floats)).as_py():
            self.integral = False
        if self.counts is None:
            return
        _add_counts(self.counts, floats)
        self._check_auto_classes()

    def add_text(self, values: pa.Array) -> None:
        _add_counts(self.counts, values)

    def merge(self, other: _LabelCounter) -> None:
        """Adds the counts of other rows: what one counter of both would hold."""
        self.integral = self.integral and other.integral
        if self.counts is None or other.counts is None:
            self.counts = None
            return
        _merge_counts(self.counts, other.counts)
        self._check_auto_classes()

    def _check_auto_classes(self) -> None:
        if self.label_kind == "auto" and len(self.counts) > MAX_AUTO_CLASSES:
            self.counts = None  # too many values for auto classes: a numeric label


def _merge_counts(counts: dict, other: dict) -> None:
    for value, count in other.items():
        counts[value] = counts.get(value, 0) + count


@dataclass
class Counts:
    """What the first pass counts over some consecutive rows. Counts of parts of the file
    merge into those of the whole, in any order: the file can be counted in parts in
    parallel (:mod:`elastic_step.data.beam_preprocess`)."""

    rows: int
    value_counts: dict[int, ValueCounter]  # per counted column (Scan.counted)
    labels: _LabelCounter

    @classmethod
    def start(cls, found: Scan, label_kind: str, spill_dir: str | None = None) -> Counts:
        """No rows yet, for the columns of ``found``. With a ``spill_dir`` (local), counts
        past the memory bound go to disk there; without one the counts stay in memory, to be
        merged into those of the whole file."""
        each = COUNT_MEMORY_VALUES // max(1, len(found.counted))
        value_counts = {
            j: ValueCounter(each, spill_dir and os.path.join(spill_dir, f"column-{j}"))
            for j in found.counted
        }
        return cls(rows=0, value_counts=value_counts, labels=_LabelCounter(label_kind))

    def add(self, source: RowLines, batch: CsvBatch, found: Scan, fill_missing: bool) -> None:
        """Checks every value of ``batch`` and counts it; an :class:`InputError` naming the
        line of the first bad value."""
        _check_batch(source, batch, found, self, fill_missing)
        self.rows += batch.rows

    def merge(self, other: Counts) -> None:
        self.rows += other.rows
        for j, counts in other.value_counts.items():
            self.value_counts[j].merge(counts)
        self.labels.merge(other.labels)

    def label_counts(self) -> dict | None:
        """Rows per label value (a float for numbers), or None for a numeric label."""
        return self.labels.counts


class RowLines(Protocol):
    """Where a row of the input is, for error messages: a source (CSV or Parquet), or a part
    of one that knows its place in the input."""

    def where(self, row: int) -> str:
        """``PATH: line N`` (CSV) or ``FILE: row N`` (Parquet) of data row ``row``."""
        ...


def scan(
    source: Source,
    *,
    label: str,
    categorical: set[str],
    label_kind: str,
    fill_missing: bool,
    vocabulary: VocabularyOptions,
    spill_dir: str,
    progress: Callable[[int, int], None],
) -> Scan:
    """Reads the whole file once; an :class:`InputError` at the first bad value. Counts
    past the memory bound go to the local ``spill_dir``."""
    batches = source.batches(progress)
    leading = leading_batches(batches)
    found = infer_columns(
        source,
        leading,
        label=label,
        categorical=categorical,
        label_kind=label_kind,
        hashed=set(vocabulary.hash_buckets),
    )
    counts = Counts.start(found, label_kind, spill_dir)
    for batch in itertools.chain(leading, batches):
        counts.add(source, batch, found, fill_missing)
    return finish_scan(source.path, found, counts, vocabulary)


def leading_batches(batches: Iterator[CsvBatch]) -> list[CsvBatch]:
    """The first batches of ``batches``, up to :data:`INFER_ROWS` rows or more."""
    leading: list[CsvBatch] = []
    for batch in batches:
        leading.append(batch)
        if sum(b.rows for b in leading) >= INFER_ROWS:
            break
    return leading


def infer_columns(
    source: Source,
    leading: list[CsvBatch],
    *,
    label: str,
    categorical: set[str],
    label_kind: str,
    hashed: Collection[str] = (),
) -> Scan:
    """The columns' kinds: a Parquet source's from its schema, a CSV file's from its first
    rows (``leading``); a :class:`Scan` that knows no counts yet (see :func:`finish_scan`).
    ``hashed`` columns are categorical, as are those in ``categorical``."""
    categorical = {*categorical, *hashed}
    path, header = source.path, source.header
    label_index = header.index(label)
    if not leading:
        raise InputError(f"{path}: has 0 data rows, need at least 2")
    sample = _head(leading, INFER_ROWS)
    kinds = []
    for j, name in enumerate(header):
        if j == label_index and label_kind == "numeric":
            if label in categorical:
                raise InputError(
                    f"{path}: --label-kind numeric, but label column '{label}' is listed as "
                    "categorical"
                )
            kinds.append("numeric")
        elif name in categorical:
            kinds.append("categorical")
        elif getattr(source, "kinds", None) is not None:  # Parquet: its schema says
            kinds.append(source.kinds[name])
        else:
            kinds.append(
                _infer_kind(source, name, sample.first_row, sample.columns[j], label, categorical)
            )
    return Scan(
        header=header,
        label_index=label_index,
        kinds=kinds,
        sample=sample,
        hashed=frozenset(header.index(name) for name in hashed),
    )


def finish_scan(path: str, found: Scan, counts: Counts, options: VocabularyOptions) -> Scan:
    """A copy of ``found`` with the counts of the whole file ``path``: the label's kind and
    classes decided, the vocabularies chosen (``counts`` are spent)."""
    if counts.rows < 2:
        raise InputError(f"{path}: has {counts.rows} data rows, need at least 2")
    vocabularies = {}
    for j, counter in counts.value_counts.items():
        try:
            vocabularies[j] = counter.choose(options.max_size, options.min_frequency)
        finally:
            counter.close()
    found = dataclasses.replace(found, rows=counts.rows, vocabularies=vocabularies)
    _decide_label(found, counts.labels, counts.labels.label_kind)
    _warn_about_id_columns(found, options)
    return found


def _head(batches: list[CsvBatch], rows: int) -> CsvBatch:
    """The first ``rows`` rows of ``batches``, copied: a slice would keep the batches' buffers
    alive (and pickle them whole, for Beam's workers)."""
    columns = [
        pa.concat_arrays([pa.concat_arrays([b.columns[j] for b in batches]).slice(0, rows)])
        for j in range(len(batches[0].columns))
    ]
    return CsvBatch(first_row=0, columns=columns)


def _infer_kind(
    source: Source,
    name: str,
    first_row: int,
    values: pa.Array,
    label: str,
    categorical: set[str],
) -> str:
    if name in categorical:
        return "categorical"
    given = [(i, v.strip()) for i, v in enumerate(values.to_pylist()) if v.strip()]
    numbers = [is_number(v) for _, v in given]
    if given and all(numbers):
        return "numeric"
    if sum(numbers) * 2 > len(given):
        row, value = next(iv for iv, ok in zip(given, numbers, strict=True) if not ok)
        what = (
            "to read its values as class names" if name == label else "to treat it as categorical"
        )
        raise InputError(
            f"{source.where(first_row + row)}: column '{name}' has "
            f"non-numeric value {value!r}, but {sum(numbers)} of its first {len(given)} values "
            f"are numbers (pass --categorical {name} {what})"
        )
    return "categorical"


def _check_batch(
    source: RowLines, batch: CsvBatch, result: Scan, counts: Counts, fill_missing: bool
) -> None:
    header = result.header
    labels, label_kind = counts.labels, counts.labels.label_kind

    def where(index: int) -> str:
        return source.where(batch.first_row + index)

    for j, values in enumerate(batch.columns):
        name = header[j]
        if j == result.label_index:
            values = as_text(values)
            empty = first_true(pc.equal(values, ""))
            if empty is not None:
                raise InputError(f"{where(empty)}: empty value in label column '{name}'")
            if result.kinds[j] == "numeric":
                floats, bad = to_numbers(values)
                if bad is not None:
                    _label_not_a_number(where(bad), name, values[bad].as_py(), label_kind)
                labels.add_numbers(floats)
            else:
                labels.add_text(values)
        elif result.kinds[j] == "numeric":
            floats, bad = to_numbers(values)
            if bad is not None and not pa.types.is_string(values.type):  # Parquet's numbers
                raise InputError(
                    f"{where(bad)}: column '{name}' has value {values[bad].as_py()}, which is "
                    "not a finite number"
                )
            if bad is not None:
                raise InputError(
                    f"{where(bad)}: column '{name}' has non-numeric value "
                    f"{values[bad].as_py().strip()!r}, but was inferred numeric from its first "
                    f"{INFER_ROWS} values (pass --categorical {name} to treat it as categorical)"
                )
            if not fill_missing and floats.null_count:
                empty = first_true(pc.is_null(floats))
                raise InputError(
                    f"{where(empty)}: empty value in numeric column '{name}' "
                    f"(pass --fill-missing mean|zero|VALUE, or --categorical {name})"
                )
        elif j in counts.value_counts:  # not a hashed column
            counts.value_counts[j].add(as_text(values))


def _label_not_a_number(where: str, label: str, value: str, label_kind: str) -> None:
    if label_kind == "numeric":
        raise InputError(
            f"{where}: label column '{label}' has non-numeric value {value!r}, "
            f"but --label-kind is numeric"
        )
    raise InputError(
        f"{where}: label column '{label}' has non-numeric value {value!r}, but was "
        f"inferred numeric from its first {INFER_ROWS} values (pass --categorical {label} to "
        "read its values as class names)"
    )


def _decide_label(result: Scan, labels: _LabelCounter, label_kind: str) -> None:
    """A class label when asked, or (auto) when text or at most 50 integer values."""
    counts = labels.counts
    if result.label_numeric:
        auto_classes = labels.integral and counts is not None
        if label_kind == "numeric" or (label_kind == "auto" and not auto_classes):
            result.label_kind = "numeric"
            return
        ordered = sorted(counts)
        result.label_vocabulary = [canonical_number(v) for v in ordered]
    else:
        ordered = sorted(counts)
        result.label_vocabulary = list(ordered)
    result.label_kind = "class"
    result.class_counts = [counts[v] for v in ordered]


def _warn_about_id_columns(result: Scan, options: VocabularyOptions) -> None:
    """Warns of a column with about as many values as rows, unless its vocabulary is
    already bounded."""
    if options.max_size is not None or options.min_frequency > 1:
        return
    for j, chosen in result.vocabularies.items():
        if result.rows >= ID_COLUMN_MIN_ROWS and chosen.distinct >= ID_COLUMN_SHARE * result.rows:
            name = result.header[j]
            log.warning(
                "column '%s' has %d distinct values in %d rows: probably an id column, which "
                "a model cannot learn from; drop it, or, if its values recur in new data, give "
                "it --hash-buckets %s=%d (about 2 ids per value), or --min-frequency 2 (%d of "
                "its values are seen twice or more)",
                name,
                chosen.distinct,
                result.rows,
                name,
                _buckets_for(chosen.distinct),
                _seen_twice(chosen),
            )


def _buckets_for(distinct: int) -> int:
    """A round number of hash buckets of about twice ``distinct``: few collisions."""
    target = 2 * distinct
    scale = 10 ** max(0, len(str(target)) - 1)
    return -(-target // scale) * scale


def _seen_twice(chosen: Chosen) -> int:
    return int(pc.sum(pc.greater_equal(chosen.counts, 2)).as_py() or 0)
