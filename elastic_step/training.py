"""``elastic-step train``: checks the inputs, then runs the master until the job ends."""

from __future__ import annotations

import logging

from elastic_step.data.schema import Schema
from elastic_step.data.tfrecord import read_records
from elastic_step.errors import InputError
from elastic_step.master.config import TrainConfig
from elastic_step.master.job import Job
from elastic_step.model_def import check_model_definition, load_model_definition

log = logging.getLogger("elastic_step")

SAMPLE_RECORDS = 4


def train(config: TrainConfig) -> int:
    """Runs one job; returns its exit status. Bad input raises InputError before any launch."""
    schema = Schema.load(config.data)
    shards = schema.shard_paths(config.data, "train")
    if not shards or not any(records for _, records in shards):
        raise InputError(f"{config.data}: the train split holds no records")
    definition = load_model_definition(config.model_def)
    shard, records = next((s, r) for s, r in shards if r)
    check_model_definition(definition, schema, read_records(shard, 0, min(SAMPLE_RECORDS, records)))
    log.info("model definition %s checked on %d sample records", config.model_def, SAMPLE_RECORDS)
    return Job(config, schema, definition).run()
