"""Categorical columns for schemas that tests build by hand: their vocabulary files written,
as preprocess writes them."""

from __future__ import annotations

import atexit
import shutil
import tempfile

import pyarrow as pa

from elastic_step.data import storage, vocabulary
from elastic_step.data.schema import Column, Schema


def categorical(directory: str, name: str, entries: list[str], **kwargs) -> Column:
    """A categorical column ``name`` whose vocabulary is ``entries``, its file written under
    ``directory`` (the data directory of its schema)."""
    relative = f"{vocabulary.VOCABULARY_DIR}/{name}.txt"
    storage.makedirs(storage.join(directory, vocabulary.VOCABULARY_DIR))
    chosen = vocabulary.Chosen(
        entries=pa.array(entries, pa.large_string()),
        counts=pa.array([1] * len(entries), pa.int64()),
        distinct=len(entries),
    )
    vocabulary.write(storage.join(directory, relative), chosen)
    return Column(
        name=name,
        kind="categorical",
        vocabulary_file=relative,
        vocabulary_size=len(entries),
        oov_buckets=kwargs.pop("oov_buckets", 1),
        **kwargs,
    )


def new_data_dir() -> str:
    """A directory of its own for a schema's files, removed at exit."""
    directory = tempfile.mkdtemp(prefix="schema-")
    atexit.register(shutil.rmtree, directory, True)
    return directory


def schema_with(columns_of, **kwargs) -> Schema:
    """A :class:`Schema` of ``columns_of(directory)`` (a function of its data directory),
    loaded from there as a reader would."""
    directory = new_data_dir()
    schema = Schema(columns=columns_of(directory), **kwargs)
    schema.directory = directory
    return schema
