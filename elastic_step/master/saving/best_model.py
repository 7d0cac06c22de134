"""``--keep-best``: saves the model of an evaluation round while training waits for it.

With ``--keep-best`` every evaluation round runs with no training task out, so all its tasks
measured one model version, and the PS still hold that version when the round ends (the
coordinator holds training until the model is saved). The master builds the model, pulls
every value from the PS, checks that every shard answered at the round's version, and writes
the model's weights to ``checkpoints/best-model/round-R.npz``
(:mod:`elastic_step.model.weights_file`). At the end the worker that saves the job's model
reads that file, not the PS (:mod:`..tasks.model_save`).
Tests: tests/e2e/test_watching.py (test_keep_best_exports_the_best_rounds_model).
"""

from __future__ import annotations

from elastic_step.model.api import ModelDefinition
from elastic_step.model.parameters import ModelParameters
from elastic_step.model.tf_runtime import set_random_seed
from elastic_step.model.weights_file import write_weights
from elastic_step.rpc.auth import Credentials
from elastic_step.rpc.ps_client import PSClient


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
    write_weights(path, model.get_weights())


def pull_model(
    definition: ModelDefinition, ps_addresses: list[str], credentials: Credentials, seed: int
) -> tuple[object, list[int]]:
    """The model built from the definition with the PS's parameters, and each shard's model
    version as it answered."""
    set_random_seed(seed)
    model = definition.build_model()
    ps = PSClient(ps_addresses, credentials)
    try:
        ModelParameters(model).pull_all(ps)
        return model, list(ps.versions)
    finally:
        ps.close()
