"""A Keras model's variables as the PS sees them: dense ones, embedding tables and state.

Each variable is named by its Keras path (``dense_1/kernel``), the same in every process that
builds the model from the same definition. The tables of ``keras.layers.Embedding`` layers
are split across PS shards by row id; every other trainable variable is dense. The
floating-point non-trainable variables (BatchNorm's moving mean and variance) are *state*:
the PS keeps the last values a worker pushed, so the saved model has them. Integer ones
(random seed generators) stay with each worker.
"""

from __future__ import annotations

import numpy as np

from elastic_step.rpc.ps_client import PSClient, TableSpec


class ModelParameters:
    def __init__(self, model) -> None:
        import keras

        table_ids = {
            id(layer.embeddings)
            for layer in model._flatten_layers()
            if isinstance(layer, keras.layers.Embedding)
        }
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
        self._assign_functions: dict[tuple[str, ...], object] = {}

    def table_specs(self) -> dict[str, TableSpec]:
        return {
            n: TableSpec(int(v.shape[0]), int(v.shape[1]), v.dtype) for n, v in self.tables.items()
        }

    def dense_values(self) -> dict[str, np.ndarray]:
        return {n: v.numpy() for n, v in self.dense.items()}

    def state_values(self) -> dict[str, np.ndarray]:
        return {n: v.numpy() for n, v in self.state.items()}

    def table_values(self) -> dict[str, np.ndarray]:
        return {n: v.numpy() for n, v in self.tables.items()}

    def assign_dense(self, values: dict[str, np.ndarray]) -> None:
        """Sets the dense and state variables named in ``values`` in one compiled call.

        A push returns the trainable values, a pull the state too: one function each.
        """
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

    def assign_rows(self, rows: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        import tensorflow as tf

        for name, (ids, values) in rows.items():
            self.tables[name].value.scatter_update(tf.IndexedSlices(values, ids))

    def pull(self, ps: PSClient) -> None:
        """Replaces every value with the PS's."""
        self.assign_dense(ps.pull_dense())
        for name, spec in self.table_specs().items():
            self.tables[name].assign(ps.pull_rows(name, np.arange(spec.rows)))

    def split_gradients(
        self, grads: list
    ) -> tuple[dict[str, np.ndarray], dict[str, tuple[np.ndarray, np.ndarray]]]:
        """Dense gradients by name, and each table's gradient as (unique row ids, summed rows)."""
        import tensorflow as tf

        dense, rows = {}, {}
        for variable, grad in zip(self.variables, grads, strict=True):
            if grad is None:
                continue
            name = variable.path
            if name not in self.tables:
                dense[name] = tf.convert_to_tensor(grad).numpy()
                continue
            if isinstance(grad, tf.IndexedSlices):
                ids, values = grad.indices.numpy().astype(np.int64), grad.values.numpy()
            else:
                values = grad.numpy()
                ids = np.flatnonzero(np.any(values != 0, axis=1)).astype(np.int64)
                values = values[ids]
            unique, inverse = np.unique(ids, return_inverse=True)
            summed = np.zeros((len(unique), values.shape[1]), values.dtype)
            np.add.at(summed, inverse, values)
            rows[name] = (unique, summed)
        return dense, rows
