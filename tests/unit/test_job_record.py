"""The job record: evaluations in epoch order, the final model's metrics, replay."""

from __future__ import annotations

from elastic_step.master.job_record import JobRecord
from elastic_step.master.phase import Phase


def evaluation(round_: int, epoch: int, version: int, trigger: str = "epoch-end") -> dict:
    return {
        "round": round_,
        "epoch": epoch,
        "trigger": trigger,
        "model_version": version,
        "min_model_version": version,
        "metrics": {"loss": 1.0 / version},
    }


def test_evaluations_are_kept_in_epoch_order_and_the_final_metrics_are_the_last_started():
    record = JobRecord({"--epochs": 2}, num_ps=1)
    # Epoch 2's round started first (round 1 < round 2) but epoch 1 completed last:
    # round 2 measured the final model.
    record.add_evaluation(evaluation(1, 2, 40))
    record.add_evaluation(evaluation(0, 1, 10, trigger="steps"))
    record.add_evaluation(evaluation(2, 1, 50))
    assert [(e["epoch"], e["round"]) for e in record.evaluations] == [(1, 0), (1, 2), (2, 1)]
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
