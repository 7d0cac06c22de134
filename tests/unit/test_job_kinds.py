"""The two kinds of job (elastic_step/master/job_kind.py): what training and prediction each
take from their own settings, and what neither takes from the other's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from elastic_step.cli import main
from elastic_step.data.schema import Schema
from elastic_step.errors import InputError
from elastic_step.examples import path_of
from elastic_step.master.config import PredictConfig, TrainConfig
from elastic_step.master.prediction_job import PredictInput, PredictionJob
from elastic_step.master.training_job import TrainingJob
from elastic_step.model.definition import load_model_definition


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kinds")
    rows = ["x,y,label"] + [f"{i * 0.5},{-i},{i % 2}" for i in range(40)]
    (root / "data.csv").write_text("\n".join(rows) + "\n")
    assert main(["preprocess", "--input", str(root / "data.csv"), "--label", "label",
                 "--output", str(root / "data")]) == 0  # fmt: skip
    return root / "data"


def training(data: Path, **flags) -> TrainingJob:
    config = TrainConfig(
        model_def=str(path_of("breast_cancer")), data=str(data), output="run", **flags
    )
    schema = Schema.load(str(data))
    return TrainingJob(config, schema, load_model_definition(config.model_def, schema))


def prediction(data: Path, **flags) -> PredictionJob:
    config = PredictConfig(model_dir="run", input="new.csv", output="predicted", **flags)
    schema = Schema.load(str(data))
    definition = load_model_definition(str(path_of("breast_cancer")), schema)
    given = PredictInput(shards=(("predicted/input/part-0", 7),), source="new.csv")
    return PredictionJob(config, schema, definition, given=given)


def test_a_training_job_starts_its_ps_and_tells_workers_its_training_settings(data) -> None:
    kind = training(data, ps=2, workers=3, local_steps=4)
    assert kind.members_text() == "2 PS and 3 workers"
    assert kind.membership().num_ps == 2
    settings = kind.job_settings()
    assert (settings.num_ps, settings.local_steps, settings.predict_model_dir) == (2, 4, "")
    fixed = kind.fixed_settings()
    assert fixed["--ps"] == 2 and fixed["--local-steps"] == 4
    assert len(fixed["the model definition"]) == 64  # sha256 of the definition's source


def test_a_prediction_job_has_no_ps_epochs_or_training_settings(data) -> None:
    kind = prediction(data, workers=2)
    assert kind.members_text() == "2 workers"
    assert kind.membership().num_ps == 0
    settings = kind.job_settings()
    assert settings.num_ps == 0 and settings.predict_model_dir == "run"
    assert settings.predict_parts_dir.startswith("predicted/")
    assert (settings.local_steps, settings.checkpoint_steps, settings.outer_optimizer) == (0, 0, "")
    training_only = {"ps", "epochs", "keep_best", "early_stopping", "local_steps", "model_def"}
    assert not training_only & {f.name for f in dataclasses.fields(PredictConfig)}


def test_a_prediction_job_checks_its_own_settings_by_flag() -> None:
    with pytest.raises(InputError, match="--batch-size must be >= 1, got 0"):
        PredictConfig(model_dir="run", input="new.csv", output="o", batch_size=0)
    with pytest.raises(InputError, match=r"--max-workers \(1\) must be >= --workers \(2\)"):
        PredictConfig(model_dir="run", input="new.csv", output="o", max_workers=1)


def test_settings_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        TrainConfig("m.py", "data", "run")  # type: ignore[misc]


def test_the_master_builds_its_models_with_each_columns_ids_cut(tmp_path) -> None:
    """The training master checks the model definition and resolves its metrics on models
    whose categorical columns have at most MASTER_IDS ids besides the out-of-vocabulary
    ones: the same layers, small tables. Workers build the full model."""
    from elastic_step.data.tfrecord import read_records
    from elastic_step.master import training_job
    from elastic_step.model.definition import check_model_definition

    rows = ["x,shop,user,label"] + [f"{i % 7},s{i % 1200},u{i % 50},{i % 2}" for i in range(1500)]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    assert main(["preprocess", "--input", str(tmp_path / "data.csv"), "--label", "label",
                 "--oov-buckets", "4", "--hash-buckets", "user=5000",
                 "--output", str(tmp_path / "data")]) == 0  # fmt: skip
    config = TrainConfig(model_def=str(path_of("ctr")), data=str(tmp_path / "data"), output="o")
    schema = Schema.load(config.data)
    kind = TrainingJob(config, schema, load_model_definition(config.model_def, schema))

    cut = kind.master_definition.schema
    shop, user = cut.feature("shop"), cut.feature("user")
    full_shop = schema.feature("shop")
    assert full_shop.vocabulary_size > training_job.MASTER_IDS
    assert (shop.vocabulary_size, shop.oov_buckets) == (training_job.MASTER_IDS, 4)
    assert user.hash_buckets == training_job.MASTER_IDS
    assert cut.vocabulary(shop) == schema.vocabulary(full_shop, training_job.MASTER_IDS)
    assert cut.directory != schema.directory and cut.splits == schema.splits

    def table_rows(definition) -> dict[str, int]:
        model = definition.build_model()
        return {
            v.path: v.shape[0]
            for v in model.variables
            if v.path.endswith("/embeddings") and v.path.startswith("deep_")
        }

    assert table_rows(kind.master_definition) == {
        "deep_shop/embeddings": training_job.MASTER_IDS + 4,
        "deep_user/embeddings": training_job.MASTER_IDS,
    }
    assert table_rows(kind.definition) == {
        "deep_shop/embeddings": full_shop.vocabulary_size + 4,
        "deep_user/embeddings": 5000,
    }
    # A record with values past the cut (ids of the full vocabulary) is checked as unseen.
    shard, _ = schema.shard_paths(config.data, "train")[-1]
    check_model_definition(kind.master_definition, read_records(shard, 0, 4))
    assert set(kind.master_definition.build_metrics()) == {"auc"}
