"""``elastic-step predict``: checks the model and the input, then runs the prediction job.

``--model`` is the ``--output`` of a finished training: its ``model_def.py`` builds the model,
its ``model.keras`` holds the weights and its ``schema.json`` says how the data was encoded.
``--input`` is a CSV file or Parquet files (encoded with that schema into ``--output/input/``
first, see :mod:`elastic_step.predict_input`), or a preprocessed data directory (one that holds
a ``schema.json``; its ``--split``).
"""

from __future__ import annotations

import logging

from elastic_step.data import storage
from elastic_step.data.schema import Schema
from elastic_step.errors import InputError
from elastic_step.master.config import PredictConfig
from elastic_step.master.job import Job
from elastic_step.master.job_state.job_record import check_same_command, command_of
from elastic_step.master.job_state.persistence import SavedJob
from elastic_step.master.prediction_job import PredictInput, PredictionJob
from elastic_step.master.saving.output_owner import read_owner
from elastic_step.master.state_store import create_state_store
from elastic_step.model.definition import load_model_definition
from elastic_step.output_layout import OutputLayout
from elastic_step.predict_input import SPLIT, check_data_dir, encode_input
from elastic_step.process_memory import release_freed_memory

log = logging.getLogger("elastic_step")


def predict(config: PredictConfig, backend_options: object = None) -> int:
    """Runs one prediction job; returns its exit status. Bad input raises InputError before
    any launch. ``config.split`` applies to a data directory input only."""
    from elastic_step.model.serving import trained_model_of

    model_dir, input_path, split = config.model_dir, config.input, config.split

    _check_output(config)
    model = OutputLayout(model_dir)
    for path in (model.model_file, model.model_def, model.schema):
        if not storage.exists(path):
            raise InputError(
                f"no {path}; is {model_dir} the --output of a finished training (by this "
                "version of elastic-step)?"
            )
    schema = Schema.load(model_dir)
    definition = load_model_definition(model.model_def, schema)
    try:
        trained_model_of(model_dir, definition)
    except Exception as e:
        raise InputError(
            f"{model.model_file}: cannot load it into the model of {model.model_def}: "
            f"{type(e).__name__}: {e}"
        ) from e
    # The checked model goes (the workers predict).
    release_freed_memory()
    if storage.exists(storage.join(input_path, "schema.json")):  # preprocessed data
        given = PredictInput(
            shards=tuple(check_data_dir(input_path, split, schema)),
            source=f"{input_path} (split {split})",
        )
    else:
        encoded_dir = OutputLayout(config.output).prediction_input
        storage.makedirs(config.output)
        if storage.exists(storage.join(encoded_dir, "schema.json")):
            log.info("using the input encoded by an earlier run: %s", encoded_dir)
            encoded = Schema.load(encoded_dir)
        else:
            encoded = encode_input(input_path, schema, encoded_dir, progress=log.info)
        given = PredictInput(
            shards=tuple(encoded.shard_paths(encoded_dir, SPLIT)),
            source=input_path,
        )
    kind = PredictionJob(config, schema, definition, given=given)
    return Job(kind, backend_options=backend_options).run()


def _check_output(config: PredictConfig) -> None:
    """Refuses an --output that holds a training job before anything is written there: the
    job's own check (``job_record.resumable_record``) comes after the CSV is encoded into
    --output/input/ and the job's lease is taken."""
    command = _saved_command(config)
    # A finished training's model, with its state where this job does not look (another
    # --state-dir, the cluster): a prediction never writes one.
    if command is None and storage.exists(OutputLayout(config.output).model_file):
        command = "train"
    owner = read_owner(config.output) if command is None else None
    if owner is not None:  # the job that claimed it, its state wherever it is
        command = owner.command
    if command is not None:
        check_same_command(config.output, command, "predict")


def _saved_command(config: PredictConfig) -> str | None:
    """The command of the job saved for ``config``, read as it is: no lease taken, nothing
    written. None when no job is saved, or when the state is on the cluster (--backend
    kubernetes), where the job's own check at its start covers it."""
    if config.backend == "kubernetes":
        return None
    job = SavedJob.of(create_state_store("file", config.local_dir).load()).part("job")
    return None if job is None else command_of(job["settings"])
