"""--early-stopping and --keep-best: their flags' rules, and the decisions they make over
evaluation rounds."""

from __future__ import annotations

import math

import pytest

from elastic_step.cli import main
from elastic_step.errors import InputError
from elastic_step.master.config import TrainConfig
from elastic_step.master.saving.api import EarlyStopping, MetricGoal
from elastic_step.master.tasks.api import TaskSettings
from elastic_step.master.tasks.task_manager import TaskManager


def rounds(*values: float, metric: str = "loss") -> list[dict]:
    return [
        {"round": i, "epoch": i + 1, "model_version": 10 * (i + 1), "metrics": {metric: v}}
        for i, v in enumerate(values)
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("loss", "loss:2:min"),
        ("accuracy", "accuracy:2:max"),
        ("val_auc:5", "val_auc:5:max"),
        ("mean_squared_error:1:max", "mean_squared_error:1:max"),
        ("xent:3:min", "xent:3:min"),
    ],
)
def test_early_stopping_flag_full_form(text: str, expected: str) -> None:
    assert EarlyStopping.parse(text).text == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "--early-stopping must be METRIC[:PATIENCE[:min|max]], got ''"),
        (
            "loss:2:min:x",
            "--early-stopping must be METRIC[:PATIENCE[:min|max]], got 'loss:2:min:x'",
        ),
        ("loss:two", "--early-stopping: PATIENCE must be an integer, got 'two' in 'loss:two'"),
        ("loss:0", "--early-stopping: PATIENCE must be >= 1, got 0"),
        (
            "loss:2:down",
            "--early-stopping: the mode must be min or max, got 'down' in 'loss:2:down'",
        ),
    ],
)
def test_early_stopping_flag_errors_name_the_value_and_the_rule(text: str, message: str) -> None:
    with pytest.raises(InputError) as raised:
        EarlyStopping.parse(text)
    assert str(raised.value) == message


def test_keep_best_flag() -> None:
    assert MetricGoal.parse("auc").text == "auc:max"
    assert MetricGoal.parse("loss:max").text == "loss:max"
    with pytest.raises(InputError, match=r"--keep-best: the mode must be min or max, got 'up'"):
        MetricGoal.parse("loss:up")
    with pytest.raises(InputError, match=r"--keep-best must be METRIC\[:min\|max\], got ':min'"):
        MetricGoal.parse(":min")
    with pytest.raises(InputError, match="--keep-best names metric 'acc', but the evaluation"):
        MetricGoal.parse("acc").check_known("--keep-best", {"loss", "accuracy"})


def test_the_flags_are_fixed_settings_in_their_full_form() -> None:
    def settings(**flags) -> dict:
        return TrainConfig(model_def="m.py", data="d", output="o", **flags).fixed_settings()

    assert settings(early_stopping="loss") == settings(early_stopping="loss:2:min")
    assert settings(early_stopping="loss")["--early-stopping"] == "loss:2:min"
    assert settings(early_stopping="loss") != settings(early_stopping="loss:3")
    assert settings(keep_best="accuracy")["--keep-best"] == "accuracy:max"
    assert settings()["--keep-best"] is None
    assert settings(metrics_port=9400) == settings()  # not a fixed setting


def test_a_bad_flag_is_one_line_and_exit_status_2(tmp_path, capsys) -> None:
    common = ["train", "--model-def", "m.py", "--data", str(tmp_path), "--output", str(tmp_path)]
    assert main([*common, "--early-stopping", "loss:soon"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "elastic-step: error: --early-stopping: PATIENCE must be an integer, got 'soon' in "
        "'loss:soon'\n"
    )
    assert main([*common, "--metrics-port", "70000"]) == 2
    assert "--metrics-port must be in 0..65535, got 70000" in capsys.readouterr().err


def test_early_stopping_counts_rounds_since_the_best() -> None:
    stopping = EarlyStopping.parse("loss:2")
    assert stopping.decide([]) is None
    assert stopping.decide(rounds(1.0, 0.8, 0.9)) is None  # one round without improvement
    decision = stopping.decide(rounds(1.0, 0.8, 0.9, 0.8))  # equal is not better
    assert (decision["best_round"], decision["round"], decision["best_value"]) == (1, 3, 0.8)
    assert decision["reason"] == (
        "early stopping: loss (min) did not improve on 0.8 (round 1, epoch 2) for 2 "
        "evaluation rounds (patience 2)"
    )
    # Rounds are judged in the order they started, whatever order they were recorded in.
    assert stopping.decide(list(reversed(rounds(1.0, 0.8, 0.9, 0.8))))["round"] == 3
    assert stopping.decide(rounds(1.0, 0.8, 0.9, 0.7)) is None  # improved in time


def test_a_round_without_a_usable_value_is_no_improvement() -> None:
    stopping = EarlyStopping.parse("accuracy:1")
    broken = rounds(0.5, math.nan, metric="accuracy")
    assert stopping.decide(broken)["best_round"] == 0
    failed = [*rounds(0.5, metric="accuracy"), {"round": 1, "epoch": 2, "metrics": {"error": "x"}}]
    assert stopping.decide(failed)["round"] == 1
    # Before any round has a value nothing counts: a metric that never works never stops.
    assert stopping.decide([{"round": 0, "epoch": 1, "metrics": {"error": "x"}}]) is None


def test_the_best_round_is_the_earliest_of_equals() -> None:
    goal = MetricGoal.parse("accuracy")
    assert goal.best(rounds(0.7, 0.9, 0.9, 0.8, metric="accuracy"))["round"] == 1
    assert MetricGoal.parse("loss").best(rounds(math.inf, 2.0, 1.0, 1.0))["round"] == 2
    assert goal.best([]) is None


def test_a_stop_survives_a_snapshot_and_drops_only_unbegun_epochs() -> None:
    settings = TaskSettings(
        train_shards=[("/d/train/part-0", 30)],
        validation_shards=[],
        records_per_task=10,
        epochs=4,
    )
    records: list[dict] = []
    tasks = TaskManager(settings, lease_base=0, journal=records.append)
    for _ in range(3):  # epoch 1
        task = tasks.get_task("w")
        tasks.report_success(task.id, worker="w", lease_id=task.lease_id)
    begun = tasks.get_task("w")  # epoch 2 begins
    assert tasks.stop_early() == 2 and tasks.stop_early() == 2
    snapshot = tasks.snapshot()
    restored = TaskManager.restore(settings, snapshot, [], lease_base=100)
    replayed = TaskManager.restore(settings, None, records, lease_base=100)
    for manager in (tasks, restored, replayed):
        assert manager.last_epoch == 2 and not manager.training_done
        assert [e["epoch"] for e in manager.epoch_accounting()] == [1, 2]
        assert manager.task_counts()["train"] == {"todo": 2, "doing": 1, "done": 3}
    tasks.report_success(begun.id, worker="w", lease_id=begun.lease_id)
    while (task := tasks.get_task("w")) is not None:
        assert task.epoch == 2
        tasks.report_success(task.id, worker="w", lease_id=task.lease_id)
    assert tasks.finished and tasks.epochs_created == 2
    assert [e["records_trained"] for e in tasks.epoch_accounting()] == [30, 30]
