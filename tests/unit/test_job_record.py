"""The job record: evaluations in epoch order, the final model's metrics, replay."""

from __future__ import annotations

from elastic_step.master.job_state.api import Phase
from elastic_step.master.job_state.job_record import JobRecord


def evaluation(round_: int, epoch: int, version: int, trigger: str = "epoch-end") -> dict:
    return {
        "round": round_,
        "epoch": epoch,
        "trigger": trigger,
        "model_version": version,
        "min_model_version": version,
        "metrics": {"loss": 1.0 / version},
    }


def test_evaluations_are_kept_in_round_order_and_the_final_metrics_are_the_last_started():
    record = JobRecord({"--epochs": 2}, num_ps=1)
    # Recorded out of order (a crash between recording and taking, or a journal of a version
    # whose rounds finished out of order): kept by round, which is epoch order.
    record.add_evaluation(evaluation(2, 2, 50))
    record.add_evaluation(evaluation(0, 1, 10, trigger="steps"))
    record.add_evaluation(evaluation(1, 1, 40))
    assert [(e["epoch"], e["round"]) for e in record.evaluations] == [(1, 0), (1, 1), (2, 2)]
    assert record.final_metrics() == {"loss": 1.0 / 50}


def test_an_evaluation_recorded_twice_is_kept_once_and_replay_rebuilds_the_record():
    records: list[dict] = []
    record = JobRecord({"--epochs": 1}, num_ps=2)
    base = record.snapshot()
    record.attach(records.append)
    record.set_phase(Phase.RUNNING)
    record.set_ps_address(1, "127.0.0.1:5")
    record.add_evaluation(evaluation(0, 1, 7))
    record.add_evaluation(evaluation(0, 1, 7))  # a crash between recording and taking
    record.set_port(4000)
    record.count_master_restart()
    assert len(record.evaluations) == 1

    replayed = JobRecord.restore(base, records)
    assert replayed.snapshot() == record.snapshot()
    assert replayed.differing_settings({"--epochs": 2}) == ["--epochs"]


def test_train_metrics_are_averaged_over_the_examples_that_measured_them():
    records: list[dict] = []
    record = JobRecord({"--epochs": 1}, num_ps=1)
    base = record.snapshot()
    record.attach(records.append)
    # Two workers' tasks in window 0, weighted by their examples: (0.5 * 10 + 1.0 * 30) / 40.
    record.add_train_loss(0, 3, 10, 2.0 * 10, {"accuracy": 0.5 * 10})
    record.add_train_loss(0, 7, 30, 1.0 * 30, {"accuracy": 1.0 * 30})
    # A report without metrics (a worker from before they were measured) counts for the
    # loss only: it does not pull the window's accuracy towards 0.
    record.add_train_loss(0, 9, 20, 4.0 * 20, {})
    record.add_train_loss(1, 12, 5, 0.5 * 5, {"accuracy": 0.2 * 5, "auc": 0.9 * 5})
    windows = record.train_loss_windows()
    assert [(w["window"], w["min_model_version"], w["max_model_version"]) for w in windows] == [
        (0, 3, 9),
        (1, 12, 12),
    ]
    assert [w["examples"] for w in windows] == [60, 5]
    assert windows[0]["loss"] == (20 + 30 + 80) / 60
    assert windows[0]["metrics"] == {"accuracy": 35 / 40}
    assert windows[1]["metrics"] == {"accuracy": 0.2, "auc": 0.9}
    assert JobRecord.restore(base, records).train_loss_windows() == windows


def test_a_window_from_a_snapshot_without_metric_counts_takes_new_reports():
    """A snapshot taken before metrics were counted apart: its windows had no metrics."""
    saved_window = {
        "min_model_version": 1,
        "max_model_version": 4,
        "examples": 40,
        "loss_sum": 40.0,
        "metric_sums": {},
    }

    def old() -> dict:
        snapshot = JobRecord({"--epochs": 1}, num_ps=1).snapshot()
        return {**snapshot, "train_loss": {"0": dict(saved_window, metric_sums={})}}

    journal = [
        {
            "op": "train_loss",
            "window": 0,
            "version": 6,
            "examples": 10,
            "loss_sum": 5.0,
            "metric_sums": {"accuracy": 7.5},
        }
    ]
    restored = JobRecord.restore(old(), journal)
    [window] = restored.train_loss_windows()
    assert (window["examples"], window["loss"]) == (50, 45.0 / 50)
    assert window["metrics"] == {"accuracy": 0.75}
    assert JobRecord.restore(old(), []).train_loss_windows()[0]["metrics"] == {}
