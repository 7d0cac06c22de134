"""What each top-level field of a job's ``status.json`` and ``summary.json`` holds, by kind of
job: the documentation site's reference is generated from here (docs/hooks.py), and the
end-to-end tests check that a job writes exactly these fields (tests/e2e/test_watching.py,
tests/e2e/test_predict.py). The documents themselves are made in :mod:`.reports` and by
each kind's ``summary``."""

from __future__ import annotations

_LIVE = {
    "kind": "`train` or `predict`.",
    "phase": (
        "`starting` (adopting live instances, launching the missing ones), `running`, "
        "`succeeded`, `failed` or `interrupted` (stopped: the same command resumes it)."
    ),
    "master": "Where the workers and PS reach the master: `HOST:PORT` (on Kubernetes, its "
    "Service's DNS name).",
    "workers": "Each worker: `id`, `pid` and `state`.",
    "standby": "Each standby (`--standby`): `id`, `pid` and `state`.",
    "restarts": "Worker and PS restarts so far, by role.",
    "restarts_by_reason": "Worker and PS restarts so far, by how the replaced one ended.",
    "worker_sizing": "The sizing policy, the workers it wants now, and each decision it "
    "made, with why (`--auto-workers`).",
    "error": "Why the job failed, or null.",
    "elapsed_s": "Seconds since the job first started (a resumed job's included).",
    "eta_s": "Seconds of training left at the steady-state rate; null before the rate is known.",
    "metrics_endpoint": "The Prometheus endpoint's `HOST:PORT` with `--metrics-port`, else null.",
    "updated_at": "When the master wrote this, in seconds since the Unix epoch (it rewrites "
    "it every second).",
}

_TRAINING = {
    "epoch": "The oldest epoch not fully trained.",
    "epochs": "The epochs the job trains (`--epochs`).",
    "progress": "The current epoch's `records_trained` of its `records_per_epoch`, and "
    "their `fraction`.",
    "model_version": "The model version: one more at each push of a worker's update.",
    "ps": "Each PS: `id`, `pid`, `state` and the `address` it serves at.",
    "latest_evaluation": "The latest evaluation round: its `round`, `epoch`, `trigger`, "
    "`model_version` and `metrics`; null before the first.",
    "train_loss": "The training loss and metrics, averaged over windows of model versions "
    "(`window`, `min_model_version`, `max_model_version`, `examples`, `loss`, `metrics`).",
    "early_stop": "With `--early-stopping`: why and when training stopped early, the metric, "
    "its mode and patience, and the best round; else null.",
    "kept_model": "With `--keep-best`: the round whose model is kept so far (`round`, "
    "`epoch`, `model_version`, `metrics`, `weights`, `skipped_rounds`); else null.",
}

_RUN = {
    "restarts": "Worker, PS and master restarts, by role.",
    "restarts_by_reason": "Worker and PS restarts, by how the replaced one ended.",
    "restart_events": "Each restart: when, which instance, and why.",
    "standby": "The standby `slots` (`--standby`), and how many standbys were `promoted` "
    "to workers.",
    "workers_timeline": "Live workers over time: `[seconds since the start, workers]` at "
    "each change.",
    "worker_sizing": _LIVE["worker_sizing"],
    "elapsed_s": "Seconds from the job's first start to its end.",
    "examples_per_second": "The steady-state rate of training (of prediction, for "
    "`predict`); null if too short to tell.",
    "job_name": "The job's name: where its state is, and its pods' names' prefix.",
}

#: status.json's fields, by kind of job.
STATUS: dict[str, dict[str, str]] = {
    "train": {**_LIVE, **_TRAINING},
    "predict": {
        **_LIVE,
        "progress": "The input's `records_predicted` of its `records`, and their `fraction`.",
    },
}

#: summary.json's fields, by kind of job.
SUMMARY: dict[str, dict[str, str]] = {
    "train": {
        "phase": "`succeeded`, `failed` or `interrupted`.",
        "error": _LIVE["error"],
        "model_def": "The model definition file (`--model-def`).",
        "data": "The training data (`--data`).",
        "written_at": "When the master wrote this (ISO 8601, UTC).",
        "epochs": "Each epoch: `records_trained` of `records_expected` (equal when no "
        "record was lost or trained twice), and the model version it `ended_at_version`.",
        "metrics": "The final evaluation's metrics (with `--keep-best`, the kept round's).",
        "evaluations": "Every evaluation round (as `latest_evaluation` in status.json).",
        "ps_restores": "Each relaunched PS that restored its shard: `ps`, `shard`, "
        "`model_version_when_lost`, `restored_version` and `versions_lost`.",
        "model_version": "The last model version.",
        "train_loss": _TRAINING["train_loss"],
        "early_stop": _TRAINING["early_stop"],
        "kept_model": _TRAINING["kept_model"],
        **_RUN,
    },
    "predict": {
        "phase": "`succeeded`, `failed` or `interrupted`.",
        "error": _LIVE["error"],
        "input": "What was predicted: the `--input`, or the data directory and its split.",
        "records": "The input's records.",
        "records_predicted": "The records predicted: `records` once the job succeeded.",
        "predictions": "Where `predictions.csv` is.",
        **_RUN,
    },
}
