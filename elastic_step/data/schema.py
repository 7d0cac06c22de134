"""The schema of a preprocessed data directory: columns, label, statistics and shards.

``DIR/schema.json`` describes the data that :func:`elastic_step.data.preprocess.preprocess`
wrote into ``DIR``. Records hold raw values; the schema carries what the default feed needs to
transform them (means and standard deviations, vocabularies).

Categorical ids are ``0..V-1`` in vocabulary order; any value not in the vocabulary maps to the
out-of-vocabulary id ``V``, so an embedding over a column needs ``Column.num_ids = V + 1`` rows.
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
    """A feature column. Numeric columns have ``mean``/``std`` (over the train split, std > 0);
    categorical columns have a ``vocabulary`` (most frequent first)."""

    name: str
    kind: Literal["numeric", "categorical"]
    mean: float | None = None
    std: float | None = None
    vocabulary: list[str] | None = None

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

    ``columns`` are the feature columns in CSV order, without the label. ``splits`` maps
    ``"train"`` and ``"validation"`` to their shards (a split with no records has none);
    ``records`` maps each split to its record count.
    """

    label: str
    label_kind: Literal["numeric", "class"]
    label_vocabulary: list[str] | None
    columns: list[Column]
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
        """The feature column called ``name``; a KeyError naming the known columns if absent."""
        for column in self.columns:
            if column.name == name:
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
            str(name): [Shard(path=str(s["path"]), records=int(s["records"])) for s in shards]
            for name, shards in obj.get("splits", {}).items()
        }
        records = {str(k): int(v) for k, v in obj.get("records", {}).items()}
        return cls(
            label=str(obj["label"]),
            label_kind=label_kind,
            label_vocabulary=[str(v) for v in vocab] if vocab is not None else None,
            columns=columns,
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


def _column(obj: Any) -> Column:
    kind = obj["kind"]
    if kind == "numeric":
        return Column(
            name=str(obj["name"]), kind=kind, mean=float(obj["mean"]), std=float(obj["std"])
        )
    if kind == "categorical":
        vocab = obj["vocabulary"]
        if not isinstance(vocab, list):
            raise TypeError(f"column {obj['name']!r}: vocabulary must be a list")
        return Column(name=str(obj["name"]), kind=kind, vocabulary=[str(v) for v in vocab])
    raise ValueError(
        f"column {obj.get('name')!r}: kind must be numeric or categorical, got {kind!r}"
    )
