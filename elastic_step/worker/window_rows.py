"""A worker's table rows during a window of local steps (K > 1), held in numpy.

The window's rows come from the PS before it; after it, their change goes back. In between,
each local step updates the rows its batch read with the row optimizer (``Steps.local``), and
the window's end spends their momentum (``Steps.flush``). The worker keeps the rows here, the
tables' groups joined (model/table_rows.py): a step takes and puts back the rows of its
gradients by position, reads nothing back from TensorFlow, and writes to the model's tables
only the rows it changed, in one call. The rows as pulled are kept beside, for the change.
Tests: tests/unit/test_model_parameters.py.
"""

from __future__ import annotations

import numpy as np

from elastic_step.model.row_optimizer import RowOptimizer
from elastic_step.model.table_rows import TableLayout
from elastic_step.rpc.ps_client import Rows


class WindowRows:
    """The rows ``ids`` of the tables (by name; each table's sorted and unique), whose values
    pulled from the PS are ``values``."""

    def __init__(
        self,
        layout: TableLayout,
        ids: dict[str, np.ndarray],
        values: dict[str, np.ndarray],
        optimizers: list[RowOptimizer],
    ) -> None:
        self.layout = layout
        #: Per group, the window's row ids (sorted: each table's are, and offsets grow).
        self.ids = layout.join_ids(ids)
        self._pulled = layout.join_values(values)
        #: Per group, the rows as the window's steps left them.
        self.values = [np.array(v) for v in self._pulled]
        #: Per group, the row optimizer's state of the window's rows (row i: ``ids[i]``),
        #: taken from ``optimizers`` (the worker's, one per group of tables).
        self.optimizers = [o.take_rows(i) for o, i in zip(optimizers, self.ids, strict=True)]

    def positions(self, group: int, ids: np.ndarray) -> np.ndarray:
        """Where the group's rows ``ids`` (all in the window) are in :attr:`values`."""
        positions = np.searchsorted(self.ids[group], ids)
        if len(ids) and (
            positions.max() >= len(self.ids[group])
            or not np.array_equal(self.ids[group][positions], ids)
        ):
            raise ValueError("a step updated table rows that its window did not pull")
        return positions

    def put_state(self, optimizers: list[RowOptimizer]) -> None:
        """Gives the window's row optimizer state back to ``optimizers``."""
        for optimizer, ids, part in zip(optimizers, self.ids, self.optimizers, strict=True):
            optimizer.put_rows(ids, part)

    def change(self) -> Rows:
        """Each table's rows and their change since they were pulled, negated (what a push
        carries: the PS's outer optimizer takes it as a gradient)."""
        return self.layout.split(
            self.ids, [pulled - now for pulled, now in zip(self._pulled, self.values, strict=True)]
        )
