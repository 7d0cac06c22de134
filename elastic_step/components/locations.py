"""Where the training job's pods reach a KFP artifact: its remote URI or its local path.

The KFP launcher copies each input artifact from its URI (``s3://``, ``gs://``,
``minio://``) to a local path in the step's pod (``/s3/...``, ``/gcs/...``, ``/minio/...``),
and uploads each output artifact's local path to its URI after the step. Workers and PS run in
other pods, which see neither copy. So the train step hands the master:

1. the local path, when the workers run beside the master (``backend="local"``), or when a
   PersistentVolumeClaim mounted in the step's pod and, through ``volumes``, in every worker
   and PS holds that path (mount the claim at ``/minio``, ``/s3`` or ``/gcs``);
2. else the remote URI, which the master and its pods read and write directly (a non-empty
   ``uri`` in the executor output is the artifact's; nothing is left at the local path, so
   the launcher uploads nothing over it);
3. else nothing works: an :class:`InputError` says what to do.

Steps that run in one pod (preprocess, evaluate) use the local path.
Tests: tests/unit/test_components.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from kfp.dsl import Artifact

from elastic_step.backends.kubernetes_options import Volume
from elastic_step.data import storage
from elastic_step.errors import InputError


def _under(path: str, mount: str) -> bool:
    mount = mount.rstrip("/")
    return path == mount or path.startswith(mount + "/")


def shared_location(artifact: Artifact, *, backend: str, volumes: Sequence[Volume]) -> str:
    """Where the master, its workers and its PS all reach ``artifact`` (see the module)."""
    if backend == "local" or any(_under(artifact.path, v.mount) for v in volumes):
        return artifact.path
    # The object stores that KFP's launcher maps to local paths are the storage layer's.
    if storage.scheme_of(artifact.uri) in storage.OBJECT_STORE_SCHEMES:
        return artifact.uri
    stores = ", ".join(storage.OBJECT_STORE_SCHEMES)
    raise InputError(
        f"artifact '{artifact.name}' is at {artifact.uri}, which worker and PS pods cannot "
        f"reach: use an object-store pipeline root ({stores}), or mount a "
        f"PersistentVolumeClaim holding {artifact.path} in the step and pass it in volumes"
    )
