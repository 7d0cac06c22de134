"""A CSV file (local path or URI, optionally gzip-compressed) read as a stream of batches of text
columns.

Arrow's streaming CSV reader parses the file block by block in C++, so memory holds a few
blocks whatever the file's size. Every value arrives as text.

Arrow does not know line numbers (a quoted value may span lines, blank lines are skipped), so
error messages find them by reading the file again with Python's ``csv`` module, up to the row
in question. That slow path runs only on the way to an error.
Tests: tests/unit/test_preprocess_streaming.py, tests/unit/test_preprocess.py (via preprocess),
tests/unit/test_beam_preprocess.py (ranges of a file).
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import pyarrow as pa
import pyarrow.csv as pacsv

from elastic_step.data import storage
from elastic_step.errors import InputError

# Arrow parses blocks of this many bytes, and reads a few dozen ahead: their size bounds the
# memory that reading takes. Batches handed on gather blocks up to BATCH_BYTES of text, so
# that per-batch costs in Python stay small.
BLOCK_BYTES = 1 << 20
BATCH_BYTES = 8 << 20


@dataclass(frozen=True, kw_only=True)
class CsvBatch:
    """Consecutive data rows: ``columns[j]`` holds column ``j``'s text values as they are in the
    file (surrounding whitespace included)."""

    first_row: int  # 0-based number of the batch's first data row in the file
    columns: list[pa.Array]

    @property
    def rows(self) -> int:
        return len(self.columns[0])


#: The first two bytes of every gzip file (RFC 1952). No UTF-8 text starts with them: 0x8b
#: cannot follow 0x1f there.
GZIP_MAGIC = b"\x1f\x8b"


def _is_gzip(path: str) -> bool:
    """Whether the file is gzip-compressed, by its first bytes: its name need not say so (an
    Argo step saves its input artifact as data.csv whatever it holds)."""
    return storage.storage_for(path).read_range(path, 0, len(GZIP_MAGIC)) == GZIP_MAGIC


@contextlib.contextmanager
def _open_text_bytes(path: str, gzipped: bool) -> Iterator[BinaryIO]:
    """The file's (decompressed) bytes as a binary stream."""
    with storage.open_file(path, "rb") as raw:
        if gzipped:
            with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                yield unzipped
        else:
            yield raw


def _python_rows(path: str, gzipped: bool) -> Iterator[tuple[int, list[str]]]:
    """``(line number, stripped fields)`` of each row, header first, by Python's csv module.

    Empty lines are skipped, as Arrow skips them. The slow reference reader: it finds the line
    numbers and the exact problem for error messages.
    """
    try:
        with _open_text_bytes(path, gzipped) as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
            reader = csv.reader(text)
            try:
                for fields in reader:
                    if fields:
                        yield reader.line_num, [f.strip() for f in fields]
            except csv.Error as e:
                raise InputError(f"{path}: line {reader.line_num}: malformed CSV: {e}") from None
    except UnicodeDecodeError:
        raise InputError(_utf8_error(path, gzipped)) from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise InputError(f"{path}: damaged gzip data: {e}") from None


def _utf8_error(path: str, gzipped: bool) -> str:
    """Where the first byte sequence that is not UTF-8 is: its line and byte offset."""
    offset = 0
    with _open_text_bytes(path, gzipped) as raw:
        for number, line in enumerate(raw, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return (
                    f"{path}: line {number}: not UTF-8 text ({e.reason} at byte {offset + e.start})"
                )
            offset += len(line)
    return f"{path}: not UTF-8 text"


def _gather(reader: pacsv.CSVStreamingReader, batch_bytes: int) -> Iterator[list[pa.RecordBatch]]:
    """Consecutive non-empty record batches of ``reader``, in groups of about ``batch_bytes``."""
    group, size = [], 0
    for block in reader:
        if block.num_rows:
            group.append(block)
            size += block.nbytes
        if size >= batch_bytes:
            yield group
            group, size = [], 0
    if group:
        yield group


class CsvSource:
    """One CSV file with a header row. ``header`` is read on construction."""

    def __init__(
        self, path: str, *, block_bytes: int = BLOCK_BYTES, batch_bytes: int = BATCH_BYTES
    ) -> None:
        self.path = path
        self.block_bytes = block_bytes
        self.batch_bytes = batch_bytes
        self.total_bytes = storage.size(path)
        # Decided once, by the content: every reading of the file below follows it.
        self.gzipped = _is_gzip(path)
        rows = _python_rows(path, self.gzipped)
        first = next(rows, None)
        rows.close()
        if first is None:
            raise InputError(f"{path}: the file is empty, expected a header row and data rows")
        self._header_end, self.header = first  # Arrow skips lines up to the header's last

    def batches(self, progress: Callable[[int, int], None] | None = None) -> Iterator[CsvBatch]:
        """The data rows in order, one block of the file at a time.

        ``progress(bytes_read, rows_read)`` is called after each batch (bytes of the file as
        stored, so compressed bytes for a gzip file). A row with the wrong number of fields,
        malformed quoting or bytes that are not UTF-8 raise an :class:`InputError` naming the
        line.
        """
        with storage.open_file(self.path, "rb") as raw:
            stream = pa.PythonFile(raw, mode="r")
            if self.gzipped:
                stream = pa.CompressedInputStream(stream, "gzip")
            for batch in self._parse(stream, skip_rows=self._header_end, first_row=0):
                yield batch
                if progress is not None:
                    progress(raw.tell(), batch.first_row + batch.rows)

    def data_offset(self) -> int:
        """The byte offset of the first line after the header, in an uncompressed file."""
        size = 1 << 16
        while True:
            head = storage.storage_for(self.path).read_range(self.path, 0, size)
            lines = head.splitlines(keepends=True)
            # A line after the header's last one: that one is whole ("\r\n" not cut in two).
            if len(lines) > self._header_end or len(head) < size:
                return len(b"".join(lines[: self._header_end]))
            size *= 4

    def range_batches(self, start: int, end: int, first_row: int) -> Iterator[CsvBatch]:
        """The data rows in bytes ``[start, end)`` of an uncompressed file, a range that begins
        and ends at row ends (:mod:`elastic_step.data.csv_ranges`); ``first_row`` is the number
        of its first row in the file. The range is read at once (one ranged read of an
        object). Errors as :meth:`batches`."""
        data = storage.read_range(self.path, start, end - start)
        yield from self._parse(pa.BufferReader(data), skip_rows=0, first_row=first_row)

    def _parse(
        self, stream: pa.NativeFile, *, skip_rows: int, first_row: int
    ) -> Iterator[CsvBatch]:
        """The rows of ``stream`` after its first ``skip_rows`` lines, as batches."""
        width = len(self.header)
        names = [f"c{j}" for j in range(width)]  # positional: the header may repeat names
        read_options = pacsv.ReadOptions(
            column_names=names, skip_rows=skip_rows, block_size=self.block_bytes
        )
        parse_options = pacsv.ParseOptions(newlines_in_values=True)
        convert_options = pacsv.ConvertOptions(
            column_types={n: pa.string() for n in names}, strings_can_be_null=False
        )
        try:
            reader = pacsv.open_csv(
                stream,
                read_options=read_options,
                parse_options=parse_options,
                convert_options=convert_options,
            )
            row = first_row
            for blocks in _gather(reader, self.batch_bytes):
                columns = [pa.concat_arrays([b.column(j) for b in blocks]) for j in range(width)]
                batch = CsvBatch(first_row=row, columns=columns)
                yield batch
                row += batch.rows
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(self._diagnose(str(e))) from None

    def _diagnose(self, arrow_message: str) -> str:
        """The first problem the reference reader finds, else Arrow's own words."""
        width = len(self.header)
        for line, fields in _python_rows(self.path, self.gzipped):
            if len(fields) != width:
                return f"{self.path}: line {line}: expected {width} fields, got {len(fields)}"
        first_line = arrow_message.strip().splitlines()[0] if arrow_message.strip() else ""
        return f"{self.path}: malformed CSV: {first_line}"

    def where(self, row: int) -> str:
        """``PATH: line N``, where data row ``row`` (0-based) starts, for error messages."""
        return f"{self.path}: line {self.line_of_row(row)}"

    def line_of_row(self, row: int) -> int:
        """The line on which data row ``row`` (0-based) starts."""
        for number, (line, _) in enumerate(_python_rows(self.path, self.gzipped)):
            if number == row + 1:  # the header is row 0 here
                return line
        raise AssertionError(f"{self.path}: no data row {row}")
