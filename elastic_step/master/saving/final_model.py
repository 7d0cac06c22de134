"""Assembles the trained model from the PS shards and saves it: model.keras and saved_model/.
Tests: tests/e2e/test_fault_tolerance.py (test_undisturbed_run_outputs) and
tests/e2e/test_keras_models.py (model.keras loads and evaluates as the job did)."""

from __future__ import annotations

import logging
import os
import shutil

from elastic_step.data import storage
from elastic_step.model.api import ModelDefinition
from elastic_step.model.parameters import ModelParameters
from elastic_step.model.tf_runtime import set_random_seed
from elastic_step.output_layout import MODEL_FILE, SAVED_MODEL_DIR, OutputLayout
from elastic_step.rpc.auth import Credentials
from elastic_step.rpc.ps_client import PSClient


def save_final_model(
    definition: ModelDefinition,
    ps_addresses: list[str],
    credentials: Credentials,
    output: str,
    seed: int,
) -> None:
    model, _ = pull_model(definition, ps_addresses, credentials, seed)
    save_model(model, output, definition)


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


def save_model(model, output: str, definition: ModelDefinition) -> None:
    """Writes ``model.keras`` and a TF Serving ``saved_model/`` through the storage layer:
    ``model`` behind the schema's preprocessing (see :mod:`elastic_step.model.serving`)."""
    from elastic_step.model.keras_parts import build_compiled_optimizer
    from elastic_step.model.serving import save_servable

    # A compiled model is saved with its compile() settings: keras.models.load_model gives a
    # model that evaluates at once.
    build_compiled_optimizer(model)
    scratch = storage.local_temp_dir()
    try:
        # The export logs "Assets written to <scratch dir>" twice, naming a directory about
        # to be removed; the master logs where the model really went.
        tf_log = logging.getLogger("tensorflow")
        level = tf_log.level
        tf_log.setLevel(logging.WARNING)
        try:
            save_servable(model, definition, scratch)
        finally:
            tf_log.setLevel(level)
        paths = OutputLayout(output)
        # Streamed: the file holds every table of the model.
        with (
            open(os.path.join(scratch, MODEL_FILE), "rb") as source,
            storage.open_atomic(paths.model_file) as target,
        ):
            shutil.copyfileobj(source, target, 1 << 20)
        with storage.atomic_directory(paths.saved_model) as target:
            storage.copy_tree(os.path.join(scratch, SAVED_MODEL_DIR), target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
