"""The input of ``elastic-step predict``: a CSV file or Parquet files encoded with the
model's schema, or the split of a preprocessed data directory whose columns are the model's.

A CSV file or Parquet input (:mod:`elastic_step.data.input_source`) is encoded as
``preprocess`` encodes its rows (raw values keyed by column name, see
:mod:`elastic_step.data.schema`), into one shard in input order, so that a record's position
is its data row's. Its header must hold every feature column of the model's schema; the
label column may be there (it is ignored), no other column may. Values are checked as
``preprocess`` checks them: a numeric column's values are numbers, and empty only where the
schema has a fill value. The default feed then standardizes, fills and looks up ids with the
MODEL's statistics and vocabularies, whatever the input.
Tests: tests/e2e/test_predict.py (a CSV's rows predicted in order, columns that do not match).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from elastic_step.data import storage
from elastic_step.data.example_encoding import BytesColumn, FloatColumn, encode_examples
from elastic_step.data.input_source import open_source
from elastic_step.data.numbers import as_text, first_true, to_numbers
from elastic_step.data.progress import Progress
from elastic_step.data.schema import Schema, Shard
from elastic_step.data.tfrecord import ShardWriter
from elastic_step.errors import InputError

#: The split of an encoded CSV.
SPLIT = "predict"
SHARD = f"{SPLIT}/part-00000.tfrecord"


def check_columns(path: str, header: list[str], schema: Schema) -> None:
    """An InputError unless ``header`` holds every feature column and nothing but the label
    besides."""
    features = schema.feature_names
    missing = [name for name in features if name not in header]
    extra = [name for name in header if name not in features and name != schema.label]
    duplicates = sorted({name for name in header if header.count(name) > 1})
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    if extra:
        problems.append(f"unknown {', '.join(extra)}")
    if duplicates:
        problems.append(f"repeated {', '.join(duplicates)}")
    if problems:
        raise InputError(
            f"{path}: the columns do not match the model's schema ({'; '.join(problems)}); "
            f"the model reads {', '.join(features)} (and ignores its label '{schema.label}')"
        )


#: The input read a batch of about this many bytes at a time: the master encodes it, with
#: TensorFlow and the checked model's memory beside it (preprocess reads 8 MB batches).
ENCODE_BATCH_BYTES = 1 << 20


def encode_input(
    input_path: str, schema: Schema, output: str, progress: Callable[[str], None]
) -> Schema:
    """Encodes ``input_path`` (a CSV file, or Parquet) into the data directory ``output``
    (written atomically): its rows in one shard of split ``predict``, and the model's schema
    with that split."""
    source = open_source(input_path, batch_bytes=ENCODE_BATCH_BYTES)
    check_columns(input_path, source.header, schema)
    position = {name: j for j, name in enumerate(source.header)}
    reading = Progress(progress, what="encoding", total_bytes=source.total_bytes, every_s=5.0)
    with storage.atomic_directory(output) as tmp:
        storage.makedirs(storage.join(tmp, SPLIT))
        with ShardWriter(storage.join(tmp, SHARD)) as writer:
            for batch in source.batches(reading):

                def where(index: int, first_row: int = batch.first_row) -> str:
                    return source.where(first_row + index)

                columns: list[FloatColumn | BytesColumn] = []
                for column in schema.columns:
                    values = batch.columns[position[column.name]]
                    if column.kind == "categorical":
                        columns.append(BytesColumn(key=column.name, values=as_text(values)))
                        continue
                    numbers, bad = to_numbers(values)
                    if bad is not None:
                        raise InputError(
                            f"{where(bad)}: column '{column.name}' has value "
                            f"{str(values[bad].as_py()).strip()!r}, not a finite number; the "
                            "model reads it as numeric"
                        )
                    if column.fill is None and numbers.null_count:
                        empty = first_true(pc.is_null(numbers))
                        raise InputError(
                            f"{where(empty)}: empty value in numeric column "
                            f"'{column.name}' (the model was trained without --fill-missing)"
                        )
                    columns.append(FloatColumn(key=column.name, values=numbers))
                writer.write_all(encode_examples(columns))
            rows = writer.records
        if rows == 0:
            raise InputError(f"{input_path}: has no data rows")
        encoded = dataclasses.replace(
            schema, splits={SPLIT: [Shard(path=SHARD, records=rows)]}, records={SPLIT: rows}
        )
        encoded.save(tmp)
    pa.default_memory_pool().release_unused()  # the master goes on for the whole job
    progress(f"encoded {rows} rows of {input_path} with the model's schema")
    return encoded


def check_data_dir(data_dir: str, split: str, schema: Schema) -> list[tuple[str, int]]:
    """The shards of ``split`` of a preprocessed ``data_dir``, after checking its columns are
    the model's (names and kinds)."""
    data = Schema.load(data_dir)
    theirs = [(c.name, c.kind) for c in data.columns]
    ours = [(c.name, c.kind) for c in schema.columns]
    if theirs != ours:
        raise InputError(
            f"{data_dir}: its columns {', '.join(f'{n} ({k})' for n, k in theirs)} are not the "
            f"model's: {', '.join(f'{n} ({k})' for n, k in ours)}"
        )
    shards = data.shard_paths(data_dir, split)
    if not any(records for _, records in shards):
        raise InputError(f"{data_dir}: the {split} split holds no records")
    return shards
