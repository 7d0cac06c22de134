"""TrainConfig: each validation error names the flag, the value and the rule; the fixed settings
covers what a resumed job must share with the saved one and nothing else."""

from __future__ import annotations

import pytest

from elastic_step.errors import InputError
from elastic_step.master.config import TrainConfig


def config(**overrides) -> TrainConfig:
    return TrainConfig(
        **{"model_def": "model.py", "data": "data.csv", "output": "out", **overrides}
    )


def test_defaults_are_valid() -> None:
    cfg = config()
    assert cfg.workers == 2 and cfg.min_workers == 1
    assert cfg.worker_limit == 2  # no --max-workers: no growth
    assert config(max_workers=5).worker_limit == 5


@pytest.mark.parametrize(
    ("field", "flag"),
    [
        ("epochs", "--epochs"),
        ("batch_size", "--batch-size"),
        ("workers", "--workers"),
        ("min_workers", "--min-workers"),
        ("ps", "--ps"),
        ("keep_checkpoints", "--keep-checkpoints"),
    ],
)
def test_counts_must_be_at_least_one(field: str, flag: str) -> None:
    with pytest.raises(InputError) as info:
        config(**{field: 0})
    assert str(info.value) == f"{flag} must be >= 1, got 0"


@pytest.mark.parametrize(
    ("field", "flag"),
    [
        ("evaluation_steps", "--evaluation-steps"),
        ("checkpoint_steps", "--checkpoint-steps"),
        ("max_restarts", "--max-restarts"),
        ("max_task_retries", "--max-task-retries"),
        ("port", "--port"),
        ("local_steps", "--local-steps"),  # 0: chosen by the master
    ],
)
def test_these_may_be_zero_but_not_negative(field: str, flag: str) -> None:
    assert getattr(config(**{field: 0}), field) == 0
    with pytest.raises(InputError) as info:
        config(**{field: -3})
    assert str(info.value) == f"{flag} must be >= 0, got -3"


def test_workers_zero_names_the_flag_value_and_rule() -> None:
    with pytest.raises(InputError, match=r"^--workers must be >= 1, got 0$"):
        config(workers=0, min_workers=0)


def test_min_workers_above_workers_is_an_error() -> None:
    with pytest.raises(InputError) as info:
        config(workers=2, min_workers=3)
    assert str(info.value) == "--min-workers (3) must be <= --workers (2)"
    assert config(workers=3, min_workers=3).min_workers == 3


def test_max_workers_below_workers_is_an_error() -> None:
    with pytest.raises(InputError) as info:
        config(workers=4, max_workers=3)
    assert str(info.value) == "--max-workers (3) must be >= --workers (4)"
    assert config(workers=4, max_workers=4).worker_limit == 4


@pytest.mark.parametrize("field", ["task_timeout_s", "master_timeout_s"])
def test_timeouts_must_be_positive(field: str) -> None:
    with pytest.raises(InputError, match="must be > 0 seconds"):
        config(**{field: 0})
    with pytest.raises(InputError):
        config(**{field: -1.5})


def test_a_bad_timeout_error_names_its_flag_and_value() -> None:
    with pytest.raises(InputError) as info:
        config(master_timeout_s=-1.5)
    message = str(info.value)
    assert "--master-timeout" in message
    assert "--task-timeout" not in message
    assert "-1.5" in message


def test_outer_optimizer_must_be_known() -> None:
    with pytest.raises(
        InputError, match=r"^--outer-optimizer must be one of average, nesterov, got 'adam'$"
    ):
        config(outer_optimizer="adam")


def test_invalid_config_is_an_input_error_with_exit_code_2() -> None:
    with pytest.raises(InputError) as info:
        config(epochs=0)
    assert info.value.exit_code == 2


# -- fixed settings --


@pytest.mark.parametrize(
    "elastic",
    [
        {"workers": 4, "max_workers": 8},
        {"min_workers": 2},
        {"max_workers": 6},
        {"task_timeout_s": 30.0},
        {"master_timeout_s": 900.0},
        {"max_restarts": 10},
        {"max_task_retries": 0},
        {"port": 50051},
        {"output": "elsewhere"},
    ],
)
def test_fixed_settings_ignore_elasticity_settings(elastic: dict) -> None:
    assert config(**elastic).fixed_settings() == config().fixed_settings()


@pytest.mark.parametrize(
    ("fixed", "flag"),
    [
        ({"data": "other.csv"}, "--data"),
        ({"epochs": 2}, "--epochs"),
        ({"batch_size": 32}, "--batch-size"),
        ({"ps": 2}, "--ps"),
        ({"seed": 1}, "--seed"),
        ({"records_per_task": 256}, "--records-per-task"),
        ({"local_steps": 7}, "--local-steps"),
        ({"outer_optimizer": "nesterov"}, "--outer-optimizer"),
    ],
)
def test_fixed_settings_name_what_a_resume_must_share(fixed: dict, flag: str) -> None:
    changed, base = config(**fixed).fixed_settings(), config().fixed_settings()
    assert [k for k in base if base[k] != changed[k]] == [flag]


# -- the job name --


@pytest.mark.parametrize("name", ["a", "job-1", "x" * 40, "train-2024-q3"])
def test_valid_job_names(name: str) -> None:
    assert config(job_name=name).resolved_job_name == name


@pytest.mark.parametrize("name", ["", "Job", "1job", "job-", "job_1", "x" * 41, "a.b"])
def test_a_job_name_that_is_not_a_short_dns_label_is_refused(name: str) -> None:
    with pytest.raises(InputError, match=r"--job-name must be a DNS-1123 label of at most 40"):
        config(job_name=name)


def test_the_default_job_name_follows_the_output() -> None:
    assert config(output="runs/a").resolved_job_name == config(output="runs/a/").resolved_job_name
    assert config(output="runs/a").resolved_job_name != config(output="runs/b").resolved_job_name
    assert config(output="runs/a").resolved_job_name.startswith("es-")
