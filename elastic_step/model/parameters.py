"""A Keras model's variables as the PS sees them: dense ones, embedding tables and state.

Each variable is named by its Keras path (``dense_1/kernel``), the same in every process that
builds the model from the same definition. The tables of ``keras.layers.Embedding`` layers
are split across PS shards by row id; every other trainable variable is dense. The
floating-point non-trainable variables (BatchNorm's moving mean and variance) are *state*:
the PS keeps the last values a worker pushed, so the saved model has them. Integer ones
(random seed generators) stay with each worker.

A worker's copy of a table is a cache: before a batch uses rows, the worker pulls exactly
those rows (:meth:`ModelParameters.batch_ids` finds them), so rows no batch of its used are
never sent either way.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from elastic_step.model.api import UnsupportedOptimizerError
from elastic_step.model.table_rows import TableLayout, TableRowAccess
from elastic_step.rpc.ps_client import PSClient, Rows, TableSpec


def embedding_layers(model) -> list:
    import keras

    return [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.Embedding)]


def table_optimizer_problem(model, optimizer) -> str | None:
    """Why ``optimizer`` cannot update ``model``'s embedding tables row by row, or None."""
    from elastic_step.model.row_optimizer import check_optimizer

    if not embedding_layers(model):
        return None
    try:
        check_optimizer(optimizer)
    except UnsupportedOptimizerError as e:
        return str(e)
    return None


class ModelParameters:
    def __init__(self, model) -> None:
        self._model = model
        self._layers = embedding_layers(model)
        table_ids = {id(layer.embeddings) for layer in self._layers}
        self.variables = list(model.trainable_variables)
        names = [v.path for v in self.variables]
        if len(set(names)) != len(names):
            raise ValueError("the model's trainable variables must have unique names (paths)")
        self.dense = {v.path: v for v in self.variables if id(v) not in table_ids}
        self.tables = {v.path: v for v in self.variables if id(v) in table_ids}
        self.state = {
            v.path: v
            for v in model.non_trainable_variables
            if np.issubdtype(np.dtype(v.dtype), np.floating)
        }
        #: Per table, which rows this worker has pulled: what it can offer a relaunched PS.
        self._pulled = {n: np.zeros(int(v.shape[0]), bool) for n, v in self.tables.items()}
        self._assign_functions: dict[tuple[str, ...], object] = {}
        #: The tables in groups of one width and dtype, whose rows travel joined.
        self.layout = TableLayout(self.table_specs())
        self._row_access: TableRowAccess | None = None
        self._ids_function = None

    def table_specs(self) -> dict[str, TableSpec]:
        return {
            n: TableSpec(int(v.shape[0]), int(v.shape[1]), v.dtype) for n, v in self.tables.items()
        }

    def dense_values(self) -> dict[str, np.ndarray]:
        return {n: v.numpy() for n, v in self.dense.items()}

    def state_values(self) -> dict[str, np.ndarray]:
        return {n: v.numpy() for n, v in self.state.items()}

    def pulled_rows(self) -> Rows:
        """The table rows this worker has pulled, as it holds them now."""
        ids = {n: i for n, mask in self._pulled.items() if len(i := np.flatnonzero(mask))}
        values = self.gather_rows(ids)
        return {n: (i, values[n]) for n, i in ids.items()}

    def gather_rows(self, ids: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Rows ``ids`` of each table named (new arrays), read in one compiled call."""
        if not ids:
            return {}
        joined = self.layout.join_ids(ids)
        rows = self.layout.split(joined, self.row_access().gather(joined))
        return {n: values for n, (_, values) in rows.items()} | {
            n: np.zeros((0, self.tables[n].shape[1]), self.tables[n].dtype)
            for n in ids
            if n not in rows
        }

    def scatter_rows(self, rows: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """Writes each table's ``(ids, values)``, in one compiled call."""
        if rows:
            self.row_access().scatter(
                self.layout.join_ids({n: i for n, (i, _) in rows.items()}),
                self.layout.join_values({n: v for n, (_, v) in rows.items()}),
            )

    def row_access(self) -> TableRowAccess:
        """The compiled reads and writes of the tables' joined rows (see table_rows.py)."""
        if self._row_access is None:
            self._row_access = TableRowAccess(self.layout, self.tables)
        return self._row_access

    # -- which rows a batch needs --

    def batch_rows(self, features) -> list[np.ndarray]:
        """The rows the tables' lookups read for ``features``: each group's (see
        table_rows.py), sorted and unique; [] for a model without tables.

        Runs the model with every Embedding layer replaced by a recorder of its ids that
        returns zeros: TensorFlow prunes the rest of the model from the graph, so this costs
        the feed-side ops only (0.3 ms against a 13 ms forward pass, measured).
        """
        if not self.tables:
            return []
        if self._ids_function is None:
            self._ids_function = self._compile_ids_function()
        return [np.sort(ids.numpy()) for ids in self._ids_function(features)]

    def batch_ids(self, features) -> dict[str, np.ndarray]:
        """The unique row ids each table's lookups read for ``features``, sorted."""
        return self.layout.split_ids(self.batch_rows(features))

    def _compile_ids_function(self):
        import tensorflow as tf

        model, layers, groups = self._model, self._layers, self.layout.groups

        @tf.function(reduce_retracing=True)
        def ids_of(features):
            seen = {layer.embeddings.path: [] for layer in layers}
            for layer in layers:

                def record(inputs, layer=layer):
                    seen[layer.embeddings.path].append(tf.reshape(tf.cast(inputs, tf.int64), [-1]))
                    shape = tf.concat([tf.shape(inputs), [layer.output_dim]], 0)
                    return tf.zeros(shape, layer.compute_dtype)

                layer.call = record  # on the instance, for this trace only
            try:
                model(features, training=False)
            finally:
                for layer in layers:
                    del layer.call
            joined = []
            for group in groups:
                parts = [tf.zeros([0], tf.int64)] + [
                    tf.concat(seen[n], 0) + int(group.offsets[i])
                    for i, n in enumerate(group.names)
                    if seen[n]
                ]
                joined.append(tf.unique(tf.concat(parts, 0)).y)
            return joined

        return ids_of

    # -- taking values --

    def assign(self, dense: dict[str, np.ndarray], rows: dict[str, tuple]) -> None:
        """Sets dense and state variables in one compiled call, and table rows by id."""
        if dense:
            self._assign_dense(dense)
        self.scatter_rows(rows)
        for name, (ids, _) in rows.items():
            self._pulled[name][ids] = True

    def _assign_dense(self, values: dict[str, np.ndarray]) -> None:
        # A push answers the trainable values, a pull the state too: one function each.
        names = tuple(sorted(values))
        assign = self._assign_functions.get(names)
        if assign is None:
            import tensorflow as tf

            variables = [self.dense[n] if n in self.dense else self.state[n] for n in names]

            @tf.function
            def assign(new_values):
                for variable, value in zip(variables, new_values, strict=True):
                    variable.assign(value)

            self._assign_functions[names] = assign
        assign([values[name] for name in names])

    def pull(self, ps: PSClient, ids: dict[str, np.ndarray], dense: bool = True) -> dict:
        """Takes the dense values (if ``dense``) and the rows ``ids`` from the PS; returns the
        rows pulled by table, as ``(ids, values)``."""
        values, pulled = ps.pull(ids, dense)
        rows = {n: (ids[n], pulled[n]) for n in ids}
        self.assign(values, rows)
        return rows

    def pull_all(self, ps: PSClient) -> None:
        """Replaces every value with the PS's, every row of every table included."""
        self.pull(ps, {n: np.arange(spec.rows) for n, spec in self.table_specs().items()})
