"""The schema of a preprocessed data directory: columns, label, statistics and shards.

``DIR/schema.json`` describes the data that :func:`elastic_step.data.preprocess.preprocess`
wrote into ``DIR``. Records hold raw values; the schema carries what the default feed needs to
transform them (means and standard deviations, vocabularies).

Categorical ids are ``0..V-1`` in vocabulary order; any value not in the vocabulary maps to the
out-of-vocabulary id ``V``, so an embedding over a column needs ``Column.num_ids = V + 1`` rows.

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

import json
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
    cell, or None when empty cells were refused. Categorical columns have a ``vocabulary``
    (most frequent first).
    """

    name: str
    kind: Literal["numeric", "categorical"]
    mean: float | None = None
    std: float | None = None
    vocabulary: list[str] | None = None
    input_name: str | None = None  # None: the same as ``name``
    fill: float | None = None

    def __post_init__(self) -> None:
        if self.input_name is None:
            self.input_name = self.name

    @property
    def num_ids(self) -> int:
        """Number of ids of a categorical column: its vocabulary plus one out-of-vocabulary id."""
        if self.kind != "categorical" or self.vocabulary is None:
            raise ValueError(f"column {self.name!r} is {self.kind}, it has no ids")
        return len(self.vocabulary) + 1


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
    count.
    """

    label: str
    label_kind: Literal["numeric", "class"]
    label_vocabulary: list[str] | None
    columns: list[Column]
    one_hot: bool = False
    splits: dict[str, list[Shard]] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)

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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"

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
            return cls.from_json(storage.read_text(path))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise InputError(f"{path}: malformed schema: {type(e).__name__}: {e}") from None


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
        vocab = obj["vocabulary"]
        if not isinstance(vocab, list):
            raise TypeError(f"column {name!r}: vocabulary must be a list")
        return Column(
            name=name, kind=kind, vocabulary=[str(v) for v in vocab], input_name=input_name
        )
    raise ValueError(
        f"column {obj.get('name')!r}: kind must be numeric or categorical, got {kind!r}"
    )
