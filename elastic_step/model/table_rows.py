"""The rows of many embedding tables, joined: one array of ids and one of values per group of
tables of the same width and dtype.

A worker reads, updates and writes the rows of every table of its model at each step, and a
recommendation model has dozens of tables (bench/scale.py's has 52, in two groups: widths 1
and 8). Per table, that is dozens of numpy calls and, worse, a compiled call that takes an
argument per table: TensorFlow matches each call's arguments against its traces in Python,
one by one (a third of a worker's time in a profile). Joined, a step costs a few calls
whatever the number of tables.

In a group, table ``i``'s row ``r`` is the group's row ``offsets[i] + r`` (tables in the
order of their names). Arrays of a group's ids are *table-blocked*: the rows of each table
together, tables in order; they are sorted when each table's ids are.
Tests: tests/unit/test_model_parameters.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from elastic_step.rpc.ps_client import Rows, TableSpec


@dataclass(frozen=True)
class TableGroup:
    """Tables of one width and dtype, and where each one's rows start in the group."""

    dim: int
    dtype: np.dtype
    names: tuple[str, ...]
    #: Row offset of each table, and the group's row count last.
    offsets: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.offsets[-1])

    def tables_of(self, ids: np.ndarray) -> np.ndarray:
        """The index (in :attr:`names`) of the table of each of the group's row ``ids``."""
        return np.searchsorted(self.offsets, ids, side="right") - 1


class TableLayout:
    """The groups of a model's tables (``specs``, by name)."""

    def __init__(self, specs: Mapping[str, TableSpec]) -> None:
        kinds: dict[tuple[int, np.dtype], list[str]] = {}
        for name in sorted(specs):
            kinds.setdefault((specs[name].dim, np.dtype(specs[name].dtype)), []).append(name)
        self.groups = [
            TableGroup(
                dim,
                dtype,
                tuple(names),
                np.cumsum([0] + [specs[n].rows for n in names], dtype=np.int64),
            )
            for (dim, dtype), names in kinds.items()
        ]

    def join_ids(self, ids: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Each group's row ids (table-blocked) for the tables' ``ids``; a table not named has
        none."""
        return [
            np.concatenate(
                [np.zeros(0, np.int64)]
                + [
                    np.asarray(ids[n], np.int64) + group.offsets[i]
                    for i, n in enumerate(group.names)
                    if n in ids
                ]
            )
            for group in self.groups
        ]

    def join_values(self, values: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Each group's rows (table-blocked, in the order of :meth:`join_ids`)."""
        return [
            np.concatenate(
                [np.zeros((0, group.dim), group.dtype)]
                + [np.asarray(values[n], group.dtype) for n in group.names if n in values]
            )
            for group in self.groups
        ]

    def split(self, ids: Sequence[np.ndarray], values: Sequence[np.ndarray] | None = None) -> Rows:
        """Each group's table-blocked ``ids`` (and their ``values``) back by table, as table
        row ids: ``{name: (ids, values)}`` (values None if not given), for the tables that
        have any. The arrays are views."""
        rows = {}
        for g, group in enumerate(self.groups):
            if not len(ids[g]):
                continue
            tables = group.tables_of(ids[g])
            cuts = np.searchsorted(tables, np.arange(len(group.names) + 1))
            for i, name in enumerate(group.names):
                start, end = cuts[i], cuts[i + 1]
                if end > start:
                    table_ids = ids[g][start:end] - group.offsets[i]
                    rows[name] = (table_ids, None if values is None else values[g][start:end])
        return rows

    def split_ids(self, ids: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """Each group's table-blocked ``ids`` back by table, as table row ids (views)."""
        return {name: table_ids for name, (table_ids, _) in self.split(ids).items()}


class TableRowAccess:
    """Compiled reads (:meth:`gather`) and writes (:meth:`scatter`) of the rows of a model's
    tables (Keras variables of shape rows x dim, by name), joined as ``layout`` says: one
    compiled call for all the tables, with a few arguments per group. A group's ids must be
    table-blocked; each table's count is found in numpy, and the compiled call splits by it
    (0.6 ms to write 10,000 rows of 52 tables, where finding the tables in the graph took
    0.9 ms and an argument per table 3.4 ms)."""

    def __init__(self, layout: TableLayout, tables: Mapping[str, object]) -> None:
        import tensorflow as tf

        self.layout = layout
        groups = [
            (group.offsets[:-1].tolist(), [tables[n] for n in group.names])
            for group in layout.groups
        ]

        def by_table(offsets, variables, ids, sizes):
            """Each table's share of a group's table-blocked ``ids``, as its row ids."""
            parts = tf.split(ids, sizes, num=len(variables))
            return [part - offset for part, offset in zip(parts, offsets, strict=True)]

        @tf.function(reduce_retracing=True)
        def gather(all_ids, all_sizes):
            joined = []
            for (offsets, variables), ids, sizes in zip(groups, all_ids, all_sizes, strict=True):
                local = by_table(offsets, variables, ids, sizes)
                # A sparse read: tf.gather on the Keras variable would read (copy) the table.
                rows = [v.value.sparse_read(i) for v, i in zip(variables, local, strict=True)]
                joined.append(tf.concat(rows, 0))
            return joined

        @tf.function(reduce_retracing=True)
        def scatter(all_ids, all_sizes, all_values):
            for (offsets, variables), ids, sizes, values in zip(
                groups, all_ids, all_sizes, all_values, strict=True
            ):
                local = by_table(offsets, variables, ids, sizes)
                parts = tf.split(values, sizes, num=len(variables))
                for variable, i, rows in zip(variables, local, parts, strict=True):
                    variable.value.scatter_update(tf.IndexedSlices(rows, i))

        self._gather, self._scatter = gather, scatter

    def _sizes(self, ids: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [
            np.bincount(group.tables_of(group_ids), minlength=len(group.names))
            for group, group_ids in zip(self.layout.groups, ids, strict=True)
        ]

    def gather(self, ids: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The rows of each group's ``ids`` (table-blocked): writable arrays of their own."""
        return [np.array(rows) for rows in self._gather(list(ids), self._sizes(ids))]

    def scatter(self, ids: Sequence[np.ndarray], values: Sequence[np.ndarray]) -> None:
        """Writes each group's rows ``ids`` (table-blocked) with ``values``."""
        self._scatter(list(ids), self._sizes(ids), list(values))
