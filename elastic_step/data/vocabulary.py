"""Vocabularies of categorical columns: how their values are counted, which values become
entries, and the files that hold them.

**Counting** (:class:`ValueCounter`). A column's values are counted as Arrow arrays of
``(value, count)``, merged by value from time to time. Past ``memory_values`` distinct values
the counts go to disk, split into :data:`PARTS` files by a hash of the value, and memory
starts over. The choice at the end reads one part at a time. So the scan holds about
``memory_values`` values of a column at once (preprocess gives all categorical columns
:data:`COUNT_MEMORY_VALUES` between them: about 40 bytes each, a few hundred MB in all),
plus the chosen entries themselves: ``--max-vocabulary`` bounds those too.

**Choosing** (:class:`VocabularyOptions`):

- the values seen at least ``min_frequency`` times;
- of those, the ``max_size`` most frequent (all of them without a maximum), most frequent
  first, ties broken by value (UTF-8 byte order, the order of Python's ``sorted``);
- a value holding a tab or a line break never becomes an entry (a vocabulary file holds one
  value per line, before a tab): it reads as an unseen value.

**Ids.** Entry ``i`` gets id ``i``. Any other value gets one of the ``oov_buckets`` ids after
the entries, by TF's 64-bit FarmHash fingerprint of the value (``tf.lookup.StaticVocabularyTable``,
which the feed uses): the same id in every process, machine and TF version. A hashed column
(``hash_buckets``) has no vocabulary: its id is the fingerprint modulo its buckets
(``tf.strings.to_hash_bucket_fast``).

**Files.** ``vocabularies/NNN-NAME.txt`` in the data directory, named by the column's place
among the features and its name: a line per entry in id order, ``VALUE<tab>COUNT``, UTF-8 (the
tab lets the empty value have a line, which TF's reader refuses empty). ``schema.json`` names each
column's file and size; workers, the evaluator and the served model load the files into TF
lookup tables (:mod:`elastic_step.data.feed`), never into Python.

Tests: tests/unit/test_vocabulary.py.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from elastic_step.data import storage
from elastic_step.errors import InputError

#: Where a data directory keeps its vocabulary files.
VOCABULARY_DIR = "vocabularies"
#: Distinct values that the scan holds in memory, all categorical columns together.
COUNT_MEMORY_VALUES = 4_000_000
#: Files that a column's spilled counts are split into, by a hash of the value.
PARTS = 16

#: Counts of batches held apart before they are merged: many small buffers fragment memory.
MAX_CHUNKS = 32

_SCHEMA = pa.schema([("value", pa.large_string()), ("count", pa.int64())])
_NOT_AN_ENTRY = "[\t\r\n]"


@dataclass(frozen=True, kw_only=True)
class VocabularyOptions:
    """How the vocabularies are chosen (see the module).

    ``max_size``: at most this many entries per column (None: no maximum).
    ``min_frequency``: only values seen at least this many times.
    ``oov_buckets``: ids for values that are not entries (at least 1).
    ``hash_buckets``: columns without a vocabulary, each hashed into its number of ids.
    """

    max_size: int | None = None
    min_frequency: int = 1
    oov_buckets: int = 1
    hash_buckets: dict[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_size is not None and (_not_int(self.max_size) or self.max_size < 1):
            raise InputError(f"--max-vocabulary must be an integer >= 1, got {self.max_size!r}")
        if _not_int(self.min_frequency) or self.min_frequency < 1:
            raise InputError(f"--min-frequency must be an integer >= 1, got {self.min_frequency!r}")
        if _not_int(self.oov_buckets) or self.oov_buckets < 1:
            raise InputError(f"--oov-buckets must be an integer >= 1, got {self.oov_buckets!r}")
        for column, buckets in self.hash_buckets.items():
            if _not_int(buckets) or buckets < 1:
                raise InputError(
                    f"--hash-buckets {column}={buckets!r}: buckets must be an integer >= 1"
                )

    @classmethod
    def from_flags(
        cls,
        *,
        max_vocabulary: int | None = None,
        min_frequency: int = 1,
        oov_buckets: int = 1,
        hash_buckets: str = "",
    ) -> VocabularyOptions:
        """The options of preprocess's flags; ``hash_buckets`` as given:
        ``COLUMN=N,COLUMN=N``."""
        return cls(
            max_size=max_vocabulary or None,
            min_frequency=min_frequency,
            oov_buckets=oov_buckets,
            hash_buckets=parse_hash_buckets(hash_buckets),
        )

    def check_columns(self, path: str, header: Sequence[str], label: str) -> None:
        """An :class:`InputError` for a hashed column that the file lacks, or is its label."""
        for column in self.hash_buckets:
            if column == label:
                raise InputError(f"--hash-buckets {column}: the label column cannot be hashed")
            if column not in header:
                raise InputError(
                    f"--hash-buckets {column}: no such column in {path} "
                    f"(columns: {', '.join(header)})"
                )


def _not_int(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


#: Every vocabulary whole, one out-of-vocabulary id, no hashed column.
DEFAULTS = VocabularyOptions()


def parse_hash_buckets(text: str) -> dict[str, int]:
    """``{"C1": 1000, ...}`` of ``"C1=1000,C2=50"``; an :class:`InputError` naming the item
    that is not ``COLUMN=N``."""
    buckets: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        column, sep, number = item.rpartition("=")
        if not sep or not column.strip() or not re.fullmatch(r"\d+", number.strip()):
            raise InputError(
                f"--hash-buckets {item!r}: expected COLUMN=N (N buckets, an integer >= 1), "
                "comma-separated"
            )
        if column.strip() in buckets:
            raise InputError(f"--hash-buckets: column {column.strip()!r} is given twice")
        buckets[column.strip()] = int(number)
    return buckets


@dataclass(frozen=True)
class Chosen:
    """A column's vocabulary: its ``entries`` in id order, their ``counts``, and how many
    distinct values the column had."""

    entries: pa.Array
    counts: pa.Array
    distinct: int

    @property
    def size(self) -> int:
        return len(self.entries)


class ValueCounter:
    """The counts of one column's values (see the module).

    With a ``spill_dir`` (a local directory of its own), counts past ``memory_values``
    distinct values go to disk there; without one they stay in memory, as for the counts of
    a part of a file that are merged into the whole's (:meth:`merge`), and pickle with it.
    """

    def __init__(self, memory_values: int, spill_dir: str | None = None) -> None:
        self.memory_values = max(1, memory_values)
        self.spill_dir = spill_dir
        self._chunks: list[pa.Table] = []
        self._held = 0  # rows in _chunks
        self._spills = 0

    def add(self, values: pa.Array) -> None:
        """Counts ``values`` (strings, none null)."""
        if len(values) == 0:
            return
        counted = pc.value_counts(values).flatten()
        self._append(pa.table([counted[0].cast(pa.large_string()), counted[1]], schema=_SCHEMA))

    def merge(self, other: ValueCounter) -> None:
        """Adds the counts of ``other``, which must not have spilled."""
        if other._spills:
            raise ValueError("counts that spilled to disk do not merge into others")
        for chunk in other._chunks:
            self._append(chunk)

    def _append(self, table: pa.Table) -> None:
        self._chunks.append(table)
        self._held += table.num_rows
        if len(self._chunks) >= MAX_CHUNKS:
            self._compact()
        if self._held > self.memory_values:
            self._compact()
            if self.spill_dir is not None and self._held > self.memory_values // 2:
                self._spill()

    def _compact(self) -> None:
        if len(self._chunks) > 1:
            self._chunks = [_sum_by_value(pa.concat_tables(self._chunks))]
            self._held = self._chunks[0].num_rows

    def _spill(self) -> None:
        assert self.spill_dir is not None
        os.makedirs(self.spill_dir, exist_ok=True)
        table = self._chunks[0]
        parts = _part_of(table["value"])
        for p in range(PARTS):
            part = table.filter(pa.array(parts == p))
            if part.num_rows:
                with ipc.new_file(self._part_path(p, self._spills), _SCHEMA) as writer:
                    writer.write_table(part)
        self._spills += 1
        self._chunks, self._held = [], 0

    def _part_path(self, part: int, spill: int) -> str:
        return os.path.join(self.spill_dir or "", f"part-{part:02d}-{spill:05d}.arrow")

    def __getstate__(self) -> dict:
        if self._spills:
            raise ValueError("counts that spilled to disk stay on their machine")
        self._compact()
        return self.__dict__

    def choose(self, max_size: int | None, min_frequency: int) -> Chosen:
        """The vocabulary (see the module); the counter is spent."""
        self._compact()
        if not self._spills:
            held = self._chunks[0] if self._chunks else _SCHEMA.empty_table()
            return _top([_sum_by_value(held)], max_size, min_frequency)
        held = self._chunks[0] if self._chunks else None
        held_parts = _part_of(held["value"]) if held is not None else None
        self._chunks, self._held = [], 0
        candidates, distinct = [], 0
        for p in range(PARTS):
            tables = [
                ipc.open_file(path).read_all()
                for path in (self._part_path(p, s) for s in range(self._spills))
                if os.path.exists(path)
            ]
            if held is not None:
                tables.append(held.filter(pa.array(held_parts == p)))
            part = _sum_by_value(pa.concat_tables(tables))
            distinct += part.num_rows
            chosen = _top([part], max_size, min_frequency)
            candidates.append(pa.table([chosen.entries, chosen.counts], schema=_SCHEMA))
        chosen = _top(candidates, max_size, min_frequency)
        return dataclasses.replace(chosen, distinct=distinct)

    def close(self) -> None:
        """Removes the spilled counts."""
        if self.spill_dir is not None:
            shutil.rmtree(self.spill_dir, ignore_errors=True)


def _sum_by_value(table: pa.Table) -> pa.Table:
    """One row per value, its counts summed. (Not ``Table.group_by``: Arrow's query engine
    reserves a GB of address space on its first use.)"""
    values = table["value"].combine_chunks()
    encoded = pc.dictionary_encode(values)
    # Float sums of integer counts are exact below 2**53.
    counts = table["count"].to_numpy().astype(np.float64)
    sums = np.bincount(
        encoded.indices.to_numpy(), weights=counts, minlength=len(encoded.dictionary)
    )
    return pa.table([encoded.dictionary, pa.array(sums.astype(np.int64))], schema=_SCHEMA)


def _top(tables: Iterable[pa.Table], max_size: int | None, min_frequency: int) -> Chosen:
    """The entries of value-distinct ``tables`` (see the module)."""
    table = pa.concat_tables(list(tables))
    distinct = table.num_rows
    keep = pc.and_(
        pc.greater_equal(table["count"], min_frequency),
        pc.invert(pc.match_substring_regex(table["value"], _NOT_AN_ENTRY)),
    )
    table = table.filter(keep)
    order = pc.sort_indices(table, sort_keys=[("count", "descending"), ("value", "ascending")])
    if max_size is not None:
        order = order[:max_size]
    table = table.take(order)
    return Chosen(
        entries=table["value"].combine_chunks(),
        counts=table["count"].combine_chunks(),
        distinct=distinct,
    )


# Odd 64-bit multipliers, one per byte position modulo 8: a hash that spreads ids such as
# "c12_345" evenly over the parts. Only memory depends on it, never a result.
_MULTIPLIERS = np.array(
    [
        0x9E3779B97F4A7C15,
        0xC2B2AE3D27D4EB4F,
        0x165667B19E3779F9,
        0xD6E8FEB86659FD93,
        0xFF51AFD7ED558CCD,
        0xC4CEB9FE1A85EC53,
        0x27D4EB2F165667C5,
        0x94D049BB133111EB,
    ],
    dtype=np.uint64,
)


def _part_of(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Each value's part, ``0..PARTS-1``, from its bytes."""
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    array = array.cast(pa.large_string())
    n = len(array)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset : array.offset + n + 1]
    data_buffer = array.buffers()[2]
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)
        if data_buffer is not None
        else np.zeros(0, np.uint8)
    )
    start, end = int(offsets[0]), int(offsets[-1])
    data = data[start:end].astype(np.uint64)
    lengths = np.diff(offsets)
    position = np.arange(end - start, dtype=np.int64) - np.repeat(offsets[:-1] - start, lengths)
    with np.errstate(over="ignore"):
        terms = (data + np.uint64(1)) * _MULTIPLIERS[position % len(_MULTIPLIERS)]
        sums = np.zeros(n, dtype=np.uint64)
        nonempty = lengths > 0
        if terms.size:
            starts = (offsets[:-1] - start)[nonempty]
            sums[nonempty] = np.add.reduceat(terms, starts)
        sums ^= sums >> np.uint64(31)
        sums *= np.uint64(0xBF58476D1CE4E5B9)
        sums ^= sums >> np.uint64(29)
    return (sums % np.uint64(PARTS)).astype(np.int64)


def file_name(position: int, column: str) -> str:
    """The vocabulary file of the feature column at ``position`` named ``column``, relative
    to the data directory."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", column)[:60]
    return f"{VOCABULARY_DIR}/{position:03d}-{safe}.txt"


def write(path: str, chosen: Chosen) -> None:
    """Writes the entries of ``chosen`` and their counts to ``path`` (a path or URI),
    atomically."""
    with storage.open_atomic(path) as f:
        for chunk in _lines(chosen):
            f.write(chunk)


def _lines(chosen: Chosen, per_chunk: int = 65_536) -> Iterable[bytes]:
    for start in range(0, chosen.size, per_chunk):
        values = chosen.entries.slice(start, per_chunk).to_pylist()
        counts = chosen.counts.slice(start, per_chunk).to_pylist()
        yield "".join(f"{v}\t{c}\n" for v, c in zip(values, counts, strict=True)).encode()


def read(path: str, limit: int | None = None) -> list[str]:
    """The entries in the vocabulary file ``path`` (the first ``limit`` of them)."""
    entries: list[str] = []
    with storage.open_file(path, "rb") as f:
        for line in f:
            if limit is not None and len(entries) >= limit:
                break
            entries.append(line.decode("utf-8").partition("\t")[0])
    return entries
