"""Parquet input: a file, a directory of ``*.parquet`` files, or a glob of them (local paths or
URIs), read as a stream of batches, as :class:`elastic_step.data.csv_source.CsvSource` reads a
CSV file.

Column kinds come from Parquet's own schema, not from the values:

- integers, floating point and decimals: numeric (a float NaN is an empty cell, as a null);
- strings (dictionary-encoded or not) and booleans (``true``, ``false``): categorical (a null
  is the empty value);
- anything else (binary, nested lists, structs and maps, dates and times) is refused, naming
  the column and its type.

Every file must have the same columns, in the same order, of the same types: a file that
differs is named with the first difference. A file that is not Parquet, or is damaged or cut
short, is named too. Files are read in name order, one row group at a time, so memory holds a
row group whatever the data's size; each row group is also a part that Beam's workers read on
their own (:meth:`ParquetSource.parts`).

Rows are numbered from 1 in each file for error messages (``part-0.parquet: row 12``).
Tests: tests/unit/test_parquet_input.py.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from elastic_step.data import storage
from elastic_step.data.csv_source import BATCH_BYTES, CsvBatch
from elastic_step.errors import InputError

#: The first four bytes (and the last four) of every Parquet file.
PARQUET_MAGIC = b"PAR1"
SUFFIXES = (".parquet", ".pq")


def is_parquet(path: str) -> bool:
    """Whether ``path`` names Parquet input: a directory, a glob, a file named ``*.parquet``
    or ``*.pq``, or a file that begins with Parquet's magic bytes."""
    if any(c in path for c in "*?[") or path.rstrip("/").endswith(SUFFIXES):
        return True
    if not storage.exists(path):
        return False
    if storage.isdir(path):
        return True
    return storage.storage_for(path).read_range(path, 0, 4) == PARQUET_MAGIC


def _kind(field: pa.Field) -> str | None:
    """``numeric`` or ``categorical`` for the types this reads, else None."""
    t = field.type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "numeric"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_boolean(t):
        return "categorical"
    return None


@dataclass(frozen=True)
class RowGroupPart:
    """One row group of one file: a part of the input that is read on its own. ``index`` is
    its place among all parts, in input order; ``rows_before`` its file's rows before it."""

    index: int
    file: str
    group: int
    rows_before: int


class ParquetSource:
    """Parquet files with one schema. ``header`` and ``kinds`` (by column name) come from it."""

    gzipped = False  # for the Beam path: the input can be read in parts

    def data_offset(self) -> int:
        """For the Beam path, as a CSV file's: its parts are row groups, not bytes."""
        return 0

    def __init__(self, path: str, *, batch_bytes: int = BATCH_BYTES) -> None:
        self.path = path
        self.batch_bytes = batch_bytes
        self.files = _files(path)
        self._sizes = {f: storage.size(f) for f in self.files}  # one stat per file
        self.total_bytes = sum(self._sizes.values())
        first = self._metadata(self.files[0])
        self.schema = first.schema.to_arrow_schema()
        self.header = list(self.schema.names)
        self.kinds: dict[str, str] = {}
        for field in self.schema:
            kind = _kind(field)
            if kind is None:
                raise InputError(
                    f"{self.files[0]}: column '{field.name}' is of Parquet type {field.type}, "
                    "which preprocess cannot read (numbers, strings and booleans only)"
                )
            self.kinds[field.name] = kind
        self._groups: list[tuple[str, int, int]] = []  # (file, row group, rows)
        for file in self.files:
            metadata = first if file == self.files[0] else self._metadata(file)
            self._check_schema(file, metadata.schema.to_arrow_schema())
            for group in range(metadata.num_row_groups):
                self._groups.append((file, group, metadata.row_group(group).num_rows))

    @staticmethod
    def _metadata(file: str) -> pq.FileMetaData:
        try:
            with storage.open_file(file, "rb") as f:
                return pq.ParquetFile(f).metadata
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
            raise InputError(f"{file}: not a Parquet file, or damaged: {_first_line(e)}") from None

    def _check_schema(self, file: str, schema: pa.Schema) -> None:
        if schema.names != self.header:
            raise InputError(
                f"{file}: its columns ({', '.join(schema.names)}) differ from those of "
                f"{self.files[0]} ({', '.join(self.header)}); every file must have the same"
            )
        for field, first in zip(schema, self.schema, strict=True):
            if field.type != first.type:
                raise InputError(
                    f"{file}: column '{field.name}' is of type {field.type}, but of type "
                    f"{first.type} in {self.files[0]}; every file must have the same types"
                )

    @property
    def rows(self) -> int:
        """Rows in all the files, from their metadata."""
        return sum(rows for _, _, rows in self._groups)

    def parts(self) -> list[RowGroupPart]:
        """Each row group of each file, in input order."""
        parts, before, last = [], 0, None
        for index, (file, group, rows) in enumerate(self._groups):
            if file != last:
                before, last = 0, file
            parts.append(RowGroupPart(index=index, file=file, group=group, rows_before=before))
            before += rows
        return parts

    def batches(self, progress: Callable[[int, int], None] | None = None) -> Iterator[CsvBatch]:
        """All rows in order, a row group (or less) at a time: numeric columns as Arrow's
        numbers, the others as strings. ``progress(bytes_read, rows_read)`` after each."""
        row, done_bytes = 0, 0
        for file in self.files:
            for batch in self._read(file, groups=None, first_row=row):
                row += batch.rows
                yield batch
                if progress is not None:
                    progress(done_bytes, row)
            done_bytes += self._sizes[file]
            if progress is not None:
                progress(done_bytes, row)

    def part_batches(self, part: RowGroupPart, first_row: int) -> Iterator[CsvBatch]:
        """The rows of ``part``, numbered from ``first_row``."""
        yield from self._read(part.file, groups=[part.group], first_row=first_row)

    def _read(self, file: str, groups: list[int] | None, first_row: int) -> Iterator[CsvBatch]:
        row = first_row
        try:
            with storage.open_file(file, "rb") as f:
                reader = pq.ParquetFile(f)
                rows_per_batch = max(1024, self.batch_bytes // max(1, _row_bytes(reader)))
                # A row group at a time: a reader over the whole file holds on to what it
                # decoded of every group so far (twice the memory, in a file of 13 groups).
                for group in range(reader.num_row_groups) if groups is None else groups:
                    for batch in reader.iter_batches(batch_size=rows_per_batch, row_groups=[group]):
                        columns = [_plain(batch.column(j)) for j in range(batch.num_columns)]
                        yield CsvBatch(first_row=row, columns=columns)
                        row += batch.num_rows
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
            raise InputError(f"{file}: damaged Parquet data: {_first_line(e)}") from None

    def where(self, row: int) -> str:
        """``FILE: row N`` of data row ``row`` (0-based, over all files)."""
        for file, rows in self._file_rows():
            if row < rows:
                return f"{file}: row {row + 1}"
            row -= rows
        raise AssertionError(f"{self.path}: no data row {row}")

    def part_where(self, part: RowGroupPart, row: int) -> str:
        """``FILE: row N`` of row ``row`` of ``part`` (0-based)."""
        return f"{part.file}: row {part.rows_before + row + 1}"

    def _file_rows(self) -> Iterator[tuple[str, int]]:
        totals: dict[str, int] = {}
        for file, _, rows in self._groups:
            totals[file] = totals.get(file, 0) + rows
        yield from totals.items()


def _files(path: str) -> list[str]:
    """The Parquet files of ``path``: itself, the ``*.parquet`` and ``*.pq`` files in it (a
    directory), or those its last part matches (a glob), in name order."""
    parent, _, pattern = path.rstrip("/").rpartition("/")
    if any(c in pattern for c in "*?["):
        if any(c in parent for c in "*?["):
            raise InputError(f"{path}: only the last part of a path may be a glob")
        if not storage.isdir(parent or "."):
            raise InputError(f"{path}: no directory {parent}")
        files = [
            storage.join(parent, name)
            for name in sorted(storage.listdir(parent))
            if fnmatch.fnmatchcase(name, pattern)
        ]
        if not files:
            raise InputError(f"{path}: no file matches")
        return files
    if not storage.exists(path):
        raise InputError(f"{path}: file not found")
    if not storage.isdir(path):
        return [path]
    files = [
        storage.join(path, name)
        for name in sorted(storage.listdir(path))
        if name.endswith(SUFFIXES) and not name.startswith((".", "_"))
    ]
    if not files:
        raise InputError(f"{path}: no Parquet files (*.parquet, *.pq) in the directory")
    return files


def _row_bytes(reader: pq.ParquetFile) -> int:
    """About the bytes of a row once decoded, from the first row group's metadata."""
    metadata = reader.metadata
    if metadata.num_row_groups == 0 or metadata.row_group(0).num_rows == 0:
        return 1
    group = metadata.row_group(0)
    return max(1, group.total_byte_size // group.num_rows)


def _plain(values: pa.Array) -> pa.Array:
    """A column as the readers take it: numbers as Arrow numbers (decimals as float64, NaN
    as null), the rest as strings (a null as the empty value)."""
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    t = values.type
    if pa.types.is_decimal(t):
        values = pc.cast(values, pa.float64())
    if pa.types.is_floating(values.type):
        return pc.if_else(pc.is_nan(values), pa.scalar(None, values.type), values)
    if pa.types.is_integer(values.type):
        return values
    if not pa.types.is_string(values.type):  # large strings, booleans
        values = pc.cast(values, pa.string())
    return pc.fill_null(values, "")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
