"""The schema of a preprocessed data directory: columns, label, statistics and shards.

``DIR/schema.json`` describes the data that :func:`elastic_step.data.preprocess.preprocess`
wrote into ``DIR``. Records hold raw values; the schema carries what the default feed needs to
transform them (means and standard deviations, and where the vocabularies are).

A categorical column's ids (:mod:`elastic_step.data.vocabulary`): ``0..V-1`` for the ``V``
entries of its vocabulary, in the order of its file under ``DIR/vocabularies/``; any other
value one of the ``B`` out-of-vocabulary ids ``V..V+B-1`` after them, by a hash of the value.
A hashed column has no vocabulary: its ids are ``0..N-1``, by a hash of the value. An
embedding over a column needs ``Column.num_ids`` rows (``V + B``, or ``N``).

How the records store each kind (one value per feature, keyed by the CSV's column name):

- numeric column: a float (``float_list``); absent where the CSV cell was empty, which only
  ``preprocess --fill-missing`` allows; readers use ``Column.fill`` there;
- categorical column: the stripped text (``bytes_list``, UTF-8); an empty cell is ``""``,
  a value of the vocabulary like any other;
- the label: a float (numeric label) or its class name (``bytes_list``, an entry of
  ``Schema.label_vocabulary``).

Tests: tests/unit/test_preprocess.py (test_schema_and_records, test_schema_load_errors).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from elastic_step.data import storage
from elastic_step.errors import InputError

SCHEMA_FILE = "schema.json"


@dataclass
class Column:
    """A feature column.

    ``name`` is the CSV's column name, which keys the records. ``input_name`` is the name of
    its Keras input and of its entry in the default feed's features: the CSV name where
    ``keras.Input`` accepts it, else a valid name made from it (see
    :func:`elastic_step.data.input_names.input_names`). Numeric columns have ``mean``/``std``
    (over the train split's non-empty values, std > 0) and ``fill``: the value of an empty
    cell, or None when empty cells were refused. A categorical column has either a
    vocabulary (``vocabulary_size`` entries, most frequent first, in ``vocabulary_file``,
    relative to the data directory) and ``oov_buckets`` ids for other values, or
    ``hash_buckets`` ids and no vocabulary.
    """

    name: str
    kind: Literal["numeric", "categorical"]
    mean: float | None = None
    std: float | None = None
    input_name: str | None = None  # None: the same as ``name``
    fill: float | None = None
    vocabulary_file: str | None = None
    vocabulary_size: int | None = None
    oov_buckets: int | None = None
    hash_buckets: int | None = None

    def __post_init__(self) -> None:
        if self.input_name is None:
            self.input_name = self.name

    @property
    def hashed(self) -> bool:
        """A categorical column without a vocabulary, its ids a hash of the value."""
        return self.hash_buckets is not None

    @property
    def num_ids(self) -> int:
        """Number of ids of a categorical column: its vocabulary's entries and its
        out-of-vocabulary ids, or its hash buckets."""
        if self.kind != "categorical":
            raise ValueError(f"column {self.name!r} is {self.kind}, it has no ids")
        if self.hash_buckets is not None:
            return self.hash_buckets
        return (self.vocabulary_size or 0) + (self.oov_buckets or 1)


@dataclass
class Shard:
    """One TFRecord shard: its path relative to the data directory, and its record count."""

    path: str
    records: int


@dataclass
class Schema:
    """What a data directory holds.

    ``columns`` are the feature columns in CSV order, without the label. ``one_hot`` makes the
    default feed give each categorical column as a one-hot vector of ``num_ids`` floats instead
    of one id (``preprocess --one-hot``). ``splits`` maps ``"train"`` and ``"validation"`` to
    their shards (a split with no records has none); ``records`` maps each split to its record
    count. ``directory`` is where it was loaded from (not saved): its vocabulary files are
    there.
    """

    label: str
    label_kind: Literal["numeric", "class"]
    label_vocabulary: list[str] | None
    columns: list[Column]
    one_hot: bool = False
    splits: dict[str, list[Shard]] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)
    directory: str | None = field(default=None, compare=False)

    @property
    def num_classes(self) -> int | None:
        """The number of classes of a class label, else None."""
        if self.label_kind == "class" and self.label_vocabulary is not None:
            return len(self.label_vocabulary)
        return None

    @property
    def feature_names(self) -> list[str]:
        """Names of the feature columns, in CSV order."""
        return [c.name for c in self.columns]

    def feature(self, name: str) -> Column:
        """The feature column whose CSV name or input name is ``name``; a KeyError naming the
        known columns if absent."""
        for column in self.columns:
            if name in (column.name, column.input_name):
                return column
        raise KeyError(f"no feature column {name!r} (columns: {', '.join(self.feature_names)})")

    def shard_paths(self, data_dir: str, split: str) -> list[tuple[str, int]]:
        """``(full path, records)`` of each shard of ``split``, in order."""
        if split not in self.splits:
            known = ", ".join(sorted(self.splits))
            raise InputError(f"{data_dir}: no split {split!r} in the schema (splits: {known})")
        return [(storage.join(data_dir, s.path), s.records) for s in self.splits[split]]

    def vocabulary_path(self, column: Column) -> str:
        """Where ``column``'s vocabulary file is (a path or URI)."""
        if column.vocabulary_file is None:
            raise ValueError(f"column {column.name!r} has no vocabulary")
        if self.directory is None:
            raise ValueError("the schema was not loaded from a data directory")
        return storage.join(self.directory, column.vocabulary_file)

    def vocabulary(self, column: Column, limit: int | None = None) -> list[str]:
        """The entries of ``column``'s vocabulary (the first ``limit``), read from its file."""
        from elastic_step.data import vocabulary

        return vocabulary.read(self.vocabulary_path(column), limit)

    def copy_to(self, data_dir: str) -> None:
        """Writes this schema and its vocabulary files into ``data_dir`` (not its shards)."""
        for column in self.columns:
            if column.vocabulary_file is not None:
                target = storage.join(data_dir, column.vocabulary_file)
                storage.makedirs(storage.parent(target))
                with (
                    storage.open_file(self.vocabulary_path(column)) as source,
                    storage.open_atomic(target) as f,
                ):
                    shutil.copyfileobj(source, f, 1 << 20)
        self.save(data_dir)

    def with_ids_cut(self, limit: int, directory: str) -> Schema:
        """A copy whose categorical columns have at most ``limit`` ids besides their
        out-of-vocabulary ones: each vocabulary cut to its ``limit`` most frequent entries
        (the first lines of its file, written under the local ``directory``, which the copy
        is loaded from), each hashed column to ``limit`` buckets. A model built on it has the
        same layers, and tables of at most ``limit`` plus the out-of-vocabulary rows."""
        columns = []
        for column in self.columns:
            if column.vocabulary_file is not None:
                target = os.path.join(directory, column.vocabulary_file)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with storage.open_file(self.vocabulary_path(column)) as source:
                    lines = list(itertools.islice(source, limit))
                with open(target, "wb") as out:
                    out.writelines(lines)
                column = dataclasses.replace(column, vocabulary_size=len(lines))
            elif column.hash_buckets is not None and column.hash_buckets > limit:
                column = dataclasses.replace(column, hash_buckets=limit)
            columns.append(column)
        return dataclasses.replace(self, columns=columns, directory=directory)

    def to_json(self) -> str:
        document = asdict(self)
        del document["directory"]
        return json.dumps(document, indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Schema:
        """Parses :meth:`to_json` output; ValueError/KeyError/TypeError on malformed input."""
        obj = json.loads(text)
        if not isinstance(obj, dict):
            raise TypeError("the schema is not a JSON object")
        columns = [_column(c) for c in obj["columns"]]
        label_kind = obj["label_kind"]
        if label_kind not in ("numeric", "class"):
            raise ValueError(f"label_kind must be numeric or class, got {label_kind!r}")
        vocab = obj.get("label_vocabulary")
        if label_kind == "class" and not isinstance(vocab, list):
            raise ValueError("a class label needs a label_vocabulary list")
        splits = {
            str(name): [_shard(s) for s in shards] for name, shards in obj.get("splits", {}).items()
        }
        records = {str(k): int(v) for k, v in obj.get("records", {}).items()}
        return cls(
            label=str(obj["label"]),
            label_kind=label_kind,
            label_vocabulary=[str(v) for v in vocab] if vocab is not None else None,
            columns=columns,
            one_hot=bool(obj.get("one_hot", False)),
            splits=splits,
            records=records,
        )

    def save(self, data_dir: str) -> None:
        """Writes ``data_dir/schema.json`` atomically."""
        storage.write_text_atomic(storage.join(data_dir, SCHEMA_FILE), self.to_json())

    @classmethod
    def load(cls, data_dir: str) -> Schema:
        """Reads ``data_dir/schema.json``; an InputError naming the file if missing or bad."""
        path = storage.join(data_dir, SCHEMA_FILE)
        if not storage.exists(path):
            raise InputError(f"{path}: schema file not found (is {data_dir} preprocessed data?)")
        try:
            schema = cls.from_json(storage.read_text(path))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise InputError(f"{path}: malformed schema: {type(e).__name__}: {e}") from None
        schema.directory = data_dir
        return schema


def _shard(obj: Any) -> Shard:
    """One shard's entry: a path inside the data directory, and a record count >= 0."""
    path, records = str(obj["path"]), obj["records"]
    if path.startswith("/") or "://" in path or ".." in path.split("/") or not path.strip("/"):
        raise ValueError(f"shard path {path!r} must be a relative path inside the data directory")
    if type(records) is not int or records < 0:
        raise ValueError(f"shard {path}: records must be an integer >= 0, got {records!r}")
    return Shard(path=path, records=records)


def _column(obj: Any) -> Column:
    kind = obj["kind"]
    name = str(obj["name"])
    input_name = str(obj.get("input_name") or name)  # schemas before input names: the CSV's
    if kind == "numeric":
        fill = obj.get("fill")
        return Column(
            name=name,
            kind=kind,
            mean=float(obj["mean"]),
            std=float(obj["std"]),
            input_name=input_name,
            fill=None if fill is None else float(fill),
        )
    if kind == "categorical":
        if "vocabulary" in obj:
            raise ValueError(
                f"column {name!r} keeps its vocabulary inline, as elastic-step wrote schemas "
                "before vocabulary files: preprocess the data again"
            )
        hash_buckets = obj.get("hash_buckets")
        if hash_buckets is not None:
            return Column(
                name=name, kind=kind, input_name=input_name, hash_buckets=_count(obj, 1, name)
            )
        path = str(obj["vocabulary_file"])
        if path.startswith("/") or "://" in path or ".." in path.split("/"):
            raise ValueError(f"column {name!r}: vocabulary_file {path!r} must be relative")
        return Column(
            name=name,
            kind=kind,
            input_name=input_name,
            vocabulary_file=path,
            vocabulary_size=_count(obj, 0, name, "vocabulary_size"),
            oov_buckets=_count(obj, 1, name, "oov_buckets"),
        )
    raise ValueError(
        f"column {obj.get('name')!r}: kind must be numeric or categorical, got {kind!r}"
    )


def _count(obj: dict, least: int, column: str, key: str = "hash_buckets") -> int:
    value = obj[key]
    if type(value) is not int or value < least:
        raise ValueError(f"column {column!r}: {key} must be an integer >= {least}, got {value!r}")
    return value
