"""``elastic-step train``: checks the inputs, then runs the master until the job ends.
Tests: tests/unit/test_kubernetes_pods.py (--dry-run); train() by every run in tests/e2e/."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import yaml

from elastic_step.data.schema import Schema
from elastic_step.data.tfrecord import read_records
from elastic_step.errors import InputError
from elastic_step.master.config import TrainConfig
from elastic_step.master.job import Job
from elastic_step.master.training_job import TrainingJob
from elastic_step.model.definition import check_model_definition, load_model_definition
from elastic_step.process_memory import release_freed_memory

log = logging.getLogger("elastic_step")

SAMPLE_RECORDS = 4


def train(config: TrainConfig, backend_options: object = None) -> int:
    """Runs one job; returns its exit status. Bad input raises InputError before any launch.

    ``backend_options``: the backend's own typed options (``KubernetesOptions``), or None."""
    schema = Schema.load(config.data)
    shards = schema.shard_paths(config.data, "train")
    if not shards or not any(records for _, records in shards):
        raise InputError(f"{config.data}: the train split holds no records")
    kind = TrainingJob(config, schema, load_model_definition(config.model_def, schema))
    shard, records = next((s, r) for s, r in shards if r)
    sample = read_records(shard, 0, min(SAMPLE_RECORDS, records))
    check_model_definition(kind.master_definition, sample)
    release_freed_memory()  # what the check built
    log.info("model definition %s checked on %d sample records", config.model_def, SAMPLE_RECORDS)
    return Job(kind, backend_options=backend_options).run()


#: The master port --dry-run shows when --port is 0 (the master then takes a free port).
DRY_RUN_PORT = 50051


def dry_run(config: TrainConfig, options, out: TextIO | None = None) -> int:
    """Prints, as multi-document YAML, every object the master would create when the job
    starts on Kubernetes, built by the code that builds the real ones; contacts no cluster
    and reads neither the data nor the model definition."""
    from elastic_step.backends import kubernetes_pods
    from elastic_step.backends.kubernetes_options import KubernetesOptions
    from elastic_step.master.instances.job_keys import JobKeys
    from elastic_step.master.instances.launch import planned_specs

    options = options or KubernetesOptions()
    if options.image is None:
        raise InputError(
            "--dry-run needs --image (when the master runs in a pod, the default image is "
            "the master pod's own, which --dry-run cannot read without a cluster)"
        )
    job = config.resolved_job_name
    namespace = options.namespace or "default"
    port = config.port or DRY_RUN_PORT
    address = f"{kubernetes_pods.service_name(job)}.{namespace}.svc:{port}"
    specs = planned_specs(
        ps=config.ps,
        workers=config.workers,
        master_address=address,
        keys=JobKeys(kubernetes_pods.SECRET_PLACEHOLDER, job, tls=config.uses_tls),
    )
    objects = kubernetes_pods.plan_job_objects(
        job, options, specs, port, namespace=namespace, image=options.image
    )
    out = out or sys.stdout
    out.write(
        f"# elastic-step train --dry-run: what the master creates when job {job} starts\n"
        f"# in namespace {namespace}. The owner ConfigMap is made only when no Argo Workflow\n"
        "# or batch Job owns the master pod (then that object is the owner instead); owner\n"
        "# uids are placeholders until the owner exists. The Secret's value is generated at\n"
        "# start."
        + ("" if config.port else f" --port 0: the master picks a free port; shown as {port}.")
        + "\n"
    )
    yaml.safe_dump_all(objects, out, sort_keys=False)
    return 0
