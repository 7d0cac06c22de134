"""Where a training job's MLflow run is, from its flags and its environment.

In order:
1. ``MLFLOW_RUN_ID``: log into that run and leave ending it to whoever made it. KFP 2.17's
   MLflow plugin sets it (with ``MLFLOW_TRACKING_URI`` and ``MLFLOW_EXPERIMENT_ID``) when its
   ``injectUserEnvVars`` is on: the run is the task's nested run, and KFP's launcher ends it.
2. ``KFP_MLFLOW_CONFIG`` (KFP's JSON: ``endpoint``, ``experimentId``, ``parentRunId``, ...):
   make a run in that experiment, nested under that parent, and end it.
3. ``--mlflow-tracking-uri`` or ``MLFLOW_TRACKING_URI``: make a run named by the job in
   ``--mlflow-experiment`` (else ``MLFLOW_EXPERIMENT_ID``, ``MLFLOW_EXPERIMENT_NAME``, or
   "elastic-step"), and end it. Under Argo, that is a run per step.

Nothing set: no tracking. A malformed ``KFP_MLFLOW_CONFIG`` is the platform's, not the
user's: the job goes on without tracking, and says why.
Tests: tests/unit/test_tracking.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from elastic_step.master.tracking.api import TrackingTarget

log = logging.getLogger("elastic_step.master")

DEFAULT_EXPERIMENT = "elastic-step"


def tracking_target(
    *,
    tracking_uri: str | None,
    experiment: str | None,
    job_name: str,
    environ: Mapping[str, str],
) -> TrackingTarget | None:
    """The run the job logs to (see the module), or None for no tracking."""
    env_uri = environ.get("MLFLOW_TRACKING_URI") or None
    kfp = _kfp_config(environ.get("KFP_MLFLOW_CONFIG"))
    run_id = environ.get("MLFLOW_RUN_ID") or None
    if run_id is not None:
        uri = tracking_uri or env_uri or (kfp or {}).get("endpoint")
        if uri:
            return TrackingTarget(
                tracking_uri=uri,
                run_id=run_id,
                run_name=job_name,
                owns_run=False,
                source="MLFLOW_RUN_ID",
            )
        log.warning("MLFLOW_RUN_ID is set but no tracking URI is: not logging to MLflow")
        return None
    if kfp is not None:
        return TrackingTarget(
            tracking_uri=tracking_uri or kfp["endpoint"],
            experiment_id=kfp["experimentId"],
            parent_run_id=kfp["parentRunId"],
            run_name=job_name,
            owns_run=True,
            source="KFP_MLFLOW_CONFIG",
        )
    uri = tracking_uri or env_uri
    if uri is None:
        return None
    experiment_id = None if experiment else environ.get("MLFLOW_EXPERIMENT_ID") or None
    name = experiment or environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    return TrackingTarget(
        tracking_uri=uri,
        experiment_id=experiment_id,
        experiment_name=None if experiment_id else name,
        run_name=job_name,
        owns_run=True,
        source="--mlflow-tracking-uri" if tracking_uri else "MLFLOW_TRACKING_URI",
    )


def _kfp_config(text: str | None) -> dict | None:
    """KFP_MLFLOW_CONFIG's fields; None (with a warning) when it is unset or malformed."""
    if not text:
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        log.warning("KFP_MLFLOW_CONFIG is not JSON (%s): not logging to MLflow", e)
        return None
    if not isinstance(config, dict):
        log.warning("KFP_MLFLOW_CONFIG is not a JSON object: not logging to MLflow")
        return None
    missing = [
        k
        for k in ("endpoint", "experimentId", "parentRunId")
        if not isinstance(config.get(k), str) or not config[k]
    ]
    if missing:
        log.warning(
            "KFP_MLFLOW_CONFIG lacks %s: not logging to MLflow",
            ", ".join(f"'{k}'" for k in missing),
        )
        return None
    return config
