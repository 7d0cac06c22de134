"""What the master tells its user: status.json (live), summary.json (at the end), progress lines.
Tests: tests/unit/test_watching_master.py, tests/e2e/test_watching.py."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from elastic_step.backends.api import Role
from elastic_step.data import storage
from elastic_step.master.instances.instance_manager import InstanceManager
from elastic_step.master.tasks.task_manager import TaskManager
from elastic_step.output_layout import OutputLayout

if TYPE_CHECKING:
    from elastic_step.master.job_state.coordinator import Coordinator


def _members(instances: InstanceManager, role: Role) -> list[dict]:
    return [
        {"id": i.name, "pid": i.pid, "state": i.state.value}
        for i in instances.instances.values()
        if i.role is role
    ]


def status(
    coordinator: Coordinator,
    master_address: str,
    metrics_address: str | None,
    *,
    kind: str,
    progress: dict,
) -> dict:
    """The live status document of a job of ``kind`` ("train" or "predict"), with its kind's
    ``progress`` fields (:func:`training_progress`, :func:`prediction_progress`); call under
    the coordinator's lock."""
    instances, record = coordinator.instances, coordinator.record
    return {
        "kind": kind,
        "phase": record.phase.value,
        "master": master_address,
        **progress,
        "workers": _members(instances, Role.WORKER),
        "standby": _members(instances, Role.STANDBY),
        "restarts": instances.restarts,
        "restarts_by_reason": instances.restarts_by_reason,
        "worker_sizing": sizing_facts(instances),
        "error": record.error,
        "elapsed_s": instances.elapsed_s(),
        "eta_s": _rounded(coordinator.eta_s()),
        "metrics_endpoint": metrics_address,
        "updated_at": time.time(),
    }


def training_progress(coordinator: Coordinator) -> dict:
    """A training job's place: its epoch, model version, PS, evaluations and losses."""
    tasks, instances, record = coordinator.tasks, coordinator.instances, coordinator.record
    epoch = tasks.current_epoch
    done, total = tasks.records_trained(epoch), tasks.records_per_epoch
    ps = _members(instances, Role.PS)
    for member in ps:
        instance = instances.instances[member["id"]]
        live = not instance.state.ended
        member["address"] = record.ps_addresses[instance.slot] if live else ""
    return {
        "epoch": epoch,
        "epochs": tasks.settings.epochs,
        "progress": {
            "records_trained": done,
            "records_per_epoch": total,
            "fraction": round(done / total, 4) if total else 1.0,
        },
        "model_version": tasks.model_version,
        "ps": ps,
        "latest_evaluation": max(record.evaluations, key=lambda e: e["round"], default=None),
        "train_loss": record.train_loss_windows(),
        "early_stop": record.early_stop,
        "kept_model": kept_model(record),
    }


def prediction_progress(coordinator: Coordinator) -> dict:
    """A prediction job's place: the records predicted of the input's."""
    tasks = coordinator.tasks
    done, total = tasks.records_trained(1), tasks.records_per_epoch
    return {
        "progress": {
            "records_predicted": done,
            "records": total,
            "fraction": round(done / total, 4) if total else 1.0,
        }
    }


def kept_model(record) -> dict | None:
    """Which round's model --keep-best keeps so far (None without it or before a round)."""
    best = record.best_model
    if best is None:
        return None
    keys = ("round", "epoch", "model_version", "metrics", "weights")
    return {k: best[k] for k in keys} | {"skipped_rounds": record.best_skipped}


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def _evaluation_line(entry: dict) -> str:
    values = ", ".join(
        f"{k}={v:.4f}" for k, v in entry.get("metrics", {}).items() if isinstance(v, float)
    )
    return (
        f"round {entry['round']} (epoch {entry['epoch']}, model v{entry['model_version']}): "
        f"{values or 'no metrics'}"
    )


def _train_line(window: dict) -> str:
    values = {"loss": window["loss"], **window.get("metrics", {})}
    shown = ", ".join(f"{k}={v:.4f}" for k, v in values.items() if isinstance(v, float))
    versions = f"v{window['min_model_version']}-v{window['max_model_version']}"
    return f"model {versions}, {window['examples']} examples: {shown}"


def _bar(done: int, total: int) -> str:
    fraction = done / total if total else 1.0
    return f"[{'#' * int(fraction * 20):<20}] {fraction:4.0%}"


def _speed(rate: float | None) -> str:
    return f" | {rate:,.0f} examples/s" if rate else ""


def progress_line(tasks: TaskManager, instances: InstanceManager, rate: float | None) -> str:
    """A training job's progress line, every few seconds in its log."""
    epoch = tasks.current_epoch
    return (
        f"epoch {epoch}/{tasks.settings.epochs} "
        f"{_bar(tasks.records_trained(epoch), tasks.records_per_epoch)} "
        f"| {instances.running_workers()} workers, {len(instances.live(Role.PS))} PS "
        f"| model v{tasks.model_version}{_speed(rate)}"
    )


def prediction_progress_line(
    tasks: TaskManager, instances: InstanceManager, rate: float | None
) -> str:
    """A prediction job's progress line: records predicted, workers, speed."""
    done, total = tasks.records_trained(1), tasks.records_per_epoch
    return (
        f"predicted {_bar(done, total)} ({done}/{total} records) "
        f"| {instances.running_workers()} workers{_speed(rate)}"
    )


def resume_line(coordinator: Coordinator, output: str, place: str) -> str:
    """What a master that resumes a job logs: where the job stands (``place``, its kind's
    words) and whom it adopted."""
    names = sorted(i.name for i in coordinator.instances.instances.values() if not i.state.ended)
    return (
        f"resuming the job in {output} (master restart {coordinator.record.master_restarts}): "
        f"{place}; adopted {', '.join(names) or 'no instances'}"
    )


def run_facts(coordinator: Coordinator) -> dict:
    """What every job's summary.json says of its run: restarts, live workers over time,
    elapsed time and speed. Called under the coordinator's lock."""
    record, instances = coordinator.record, coordinator.instances
    rate = coordinator.examples_per_second()
    return {
        "restarts": {**instances.restarts, "master": record.master_restarts},
        "restarts_by_reason": instances.restarts_by_reason,
        "restart_events": instances.restart_events,
        "standby": {"slots": instances.settings.standby, "promoted": instances.promotions},
        "workers_timeline": instances.timeline,
        "worker_sizing": sizing_facts(instances),
        "elapsed_s": instances.elapsed_s(),
        "examples_per_second": round(rate, 2) if rate else None,
    }


def sizing_facts(instances: InstanceManager) -> dict:
    """The sizing policy, the workers it wants now, and every decision it made, with why."""
    return {
        "policy": instances.sizing.policy.name,
        "wanted": len(instances.worker_slots),
        "decisions": [dict(d) for d in instances.sizing.decisions],
    }


def write_json(path: str, document: dict) -> None:
    storage.write_text_atomic(path, json.dumps(document, indent=2) + "\n")


def format_status(document: dict) -> str:
    """The human-readable form that ``elastic-step status`` prints."""
    if document.get("kind") == "predict":
        return _format_prediction(document)
    progress = document.get("progress", {})
    lines = [
        f"phase:   {document['phase']}",
        f"epoch:   {document['epoch']}/{document.get('epochs', '?')} "
        f"({progress.get('records_trained', 0)}/{progress.get('records_per_epoch', 0)} records)",
        f"model:   version {document.get('model_version', 0)}",
        f"elapsed: {_duration(document.get('elapsed_s'))}",
    ]
    if document["phase"] in ("starting", "running"):
        lines.append(f"eta:     {_duration(document.get('eta_s'))} of training")
    latest = document.get("latest_evaluation")
    lines.append(f"latest evaluation: {_evaluation_line(latest) if latest else 'none yet'}")
    windows = document.get("train_loss")
    lines.append(f"training: {_train_line(windows[-1]) if windows else 'none yet'}")
    if document.get("kept_model"):
        lines.append(f"kept model: {_evaluation_line(document['kept_model'])}")
    if document.get("early_stop"):
        lines.append(f"stopped: {document['early_stop']['reason']}")
    if document.get("error"):
        lines.append(f"error:   {document['error']}")
    return "\n".join(lines + _sizing_lines(document) + _member_lines(document, ("ps", "workers")))


def _format_prediction(document: dict) -> str:
    progress = document.get("progress", {})
    lines = [
        f"phase:   {document['phase']} (prediction)",
        f"records: {progress.get('records_predicted', 0)}/{progress.get('records', 0)} predicted",
        f"elapsed: {_duration(document.get('elapsed_s'))}",
    ]
    if document["phase"] in ("starting", "running"):
        lines.append(f"eta:     {_duration(document.get('eta_s'))}")
    if document.get("error"):
        lines.append(f"error:   {document['error']}")
    return "\n".join(lines + _sizing_lines(document) + _member_lines(document, ("workers",)))


def _sizing_lines(document: dict) -> list[str]:
    """The sizing policy's last decision, once it made one."""
    sizing = document.get("worker_sizing") or {}
    if not sizing.get("decisions"):
        return []
    last = sizing["decisions"][-1]
    return [
        f"sizing:  {sizing['wanted']} workers wanted ({sizing['policy']}); last decision at "
        f"{_duration(last['at_s'])}: {last['action']} to {last['workers_to']}, {last['reason']}"
    ]


def _member_lines(document: dict, roles: tuple[str, ...]) -> list[str]:
    lines = []
    for role in roles:
        lines.append(f"{role}:")
        for member in document.get(role, []):
            lines.append(f"  {member['id']:<12} pid {member['pid']!s:<8} {member['state']}")
    return lines


def print_status(output_dir: str, as_json: bool = False) -> int:
    """Prints a job's status.json; exit status 2 when there is none."""
    from elastic_step.errors import InputError

    path = OutputLayout(output_dir).status
    if not storage.exists(path):
        raise InputError(f"{path}: no status file; is {output_dir} the --output of a job?")
    document = json.loads(storage.read_text(path))
    print(json.dumps(document, indent=2) if as_json else format_status(document))
    return 0
