"""The job name of a pipeline step that runs a job (elastic-train, batch-predict): the same
run and step give the same name.

The master keeps its state on the cluster under ``--job-name``; a retried step (a new pod in
the same run) that finds the same name resumes the job and adopts its pods. Runs and steps
are told apart by a hash of 48 bits, so two runs do not share a name.

- Kubeflow Pipelines: the run's id (the ``pipeline/runid`` label that KFP puts on every pod
  of a run, read from the step's own pod) and the task's name (an input whose value is
  ``dsl.PIPELINE_TASK_NAME_PLACEHOLDER``; KFP resolves a placeholder only when a task's input
  *equals* it, so a component cannot default to it).
- Argo Workflows: ``{{workflow.uid}}`` and ``{{node.name}}`` (which a retry keeps), hashed by
  the same rule in an Argo expression: :data:`ARGO_JOB_NAME`.

Tests: tests/unit/test_components.py; on a cluster, tests/k8s/test_k8s_kfp_step.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from elastic_step.backends.kubernetes_client import Kube
from elastic_step.errors import InputError

JOB_NAME_PREFIX = "es-"
#: Hex digits of the hash: 48 bits, so that two live jobs in one namespace do not collide.
HASH_DIGITS = 12
#: The label Kubeflow Pipelines puts on every pod of a run.
KFP_RUN_ID_LABEL = "pipeline/runid"
#: What a task input reads when its placeholder was not resolved.
_UNRESOLVED = "{{$."

#: :func:`job_name_for` as an Argo expression over the workflow's uid and the node's name.
ARGO_JOB_NAME = (
    JOB_NAME_PREFIX
    + f"{{{{=sprig.trunc({HASH_DIGITS}, sprig.sha256sum(workflow.uid + '/' + node.name))}}}}"
)


def job_name_for(run: str, step: str) -> str:
    """``es-`` and the first 12 hex digits of sha256("RUN/STEP"): a DNS-1123 label."""
    digest = hashlib.sha256(f"{run}/{step}".encode()).hexdigest()
    return JOB_NAME_PREFIX + digest[:HASH_DIGITS]


def kfp_job_name(*, job_name: str, task_name: str, output: str, env: Mapping[str, str]) -> str:
    """The ``--job-name`` of a step that runs a job, under Kubeflow Pipelines.

    ``job_name`` when given. On a KFP cluster (``KFP_POD_NAME`` set), one derived from the
    run's id and ``task_name``. Elsewhere (``kfp.local``), from ``output``, which is unique
    to a local run, and ``task_name``.
    """
    if job_name:
        return job_name
    pod = env.get("KFP_POD_NAME")
    if not pod:
        return job_name_for(output, task_name)
    if not task_name or task_name.startswith(_UNRESOLVED):
        raise InputError(
            "elastic-train and batch-predict need task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER "
            f"(or a job_name) to name their job on the cluster, got task_name '{task_name}'"
        )
    return job_name_for(kfp_run_id(pod), task_name)


def kfp_run_id(pod_name: str, kube: Kube | None = None) -> str:
    """The ``pipeline/runid`` label of pod ``pod_name``, read through ``kube`` (default: the
    in-cluster API, in this pod's namespace)."""
    if kube is None:
        from elastic_step.kube.client import load_api_client

        api_client, namespace, _ = load_api_client(None)
        kube = Kube(api_client, namespace or "default")
    pod = kube.read_pod(pod_name)
    run_id = (pod.get("metadata", {}).get("labels") or {}).get(KFP_RUN_ID_LABEL)
    if not run_id:
        raise InputError(
            f"pod {pod_name} has no {KFP_RUN_ID_LABEL} label: is this step running under "
            "Kubeflow Pipelines? Pass a job_name otherwise"
        )
    return run_id
