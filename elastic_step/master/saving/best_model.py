"""``--keep-best``: saves the model of an evaluation round while training waits for it.

With ``--keep-best`` every evaluation round runs with no training task out, so all its tasks
measured one model version, and the PS still hold that version when the round ends (the
coordinator holds training until the model is saved). The master pulls it as it pulls the
final model, checks that every shard answered at the round's version, and writes the
model's weights to ``checkpoints/best-model/round-R.npz``. At the end that file, not the PS,
becomes ``model.keras`` and ``saved_model/``.
Tests: tests/e2e/test_watching.py (test_keep_best_exports_the_best_rounds_model).
"""

from __future__ import annotations

import io

import numpy as np

from elastic_step.data import storage
from elastic_step.master.saving.final_model import pull_model
from elastic_step.model.api import ModelDefinition
from elastic_step.model.tf_runtime import set_random_seed
from elastic_step.rpc.auth import Credentials


class RoundModelGoneError(Exception):
    """The PS no longer hold the round's model (a PS restored an older checkpoint, or the
    round measured more than one version)."""


def save_round_model(
    definition: ModelDefinition,
    ps_addresses: list[str],
    credentials: Credentials,
    entry: dict,
    path: str,
    seed: int,
) -> None:
    """Pulls the model of evaluation ``entry``'s round from the PS and writes its weights to
    ``path``. Raises RoundModelGoneError when the PS are not at the round's version, and
    PSUnavailableError while a PS is away."""
    version = entry["model_version"]
    if entry["min_model_version"] != version:
        raise RoundModelGoneError(
            f"the round measured model versions {entry['min_model_version']} to {version}"
        )
    model, versions = pull_model(definition, ps_addresses, credentials, seed)
    if any(v != version for v in versions):
        raise RoundModelGoneError(
            f"the PS shards are at model versions {versions}, the round measured v{version}"
        )
    buffer = io.BytesIO()
    np.savez(buffer, *model.get_weights())
    storage.makedirs(storage.parent(path))
    storage.write_bytes_atomic(path, buffer.getvalue())


def load_round_model(definition: ModelDefinition, path: str, seed: int):
    """The model built from the definition with the weights ``save_round_model`` wrote."""
    set_random_seed(seed)
    model = definition.build_model()
    with np.load(io.BytesIO(storage.read_bytes(path))) as data:
        model.set_weights([data[f"arr_{i}"] for i in range(len(data.files))])
    return model
