"""What `elastic-step predict` refuses before it writes anything: an --output that holds a
training job, finished or not."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_step.cli import main
from elastic_step.errors import InputError
from elastic_step.master.config import TrainConfig
from elastic_step.master.job_state.api import Phase
from elastic_step.master.job_state.job_record import JobRecord, check_same_command
from elastic_step.master.state_store import create_state_store

MODEL_DEF = """
import keras

def model():
    inputs = {n: keras.Input(shape=(), name=n) for n in ("x", "y")}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in ("x", "y")])
    return keras.Model(inputs, keras.layers.Dense(3)(x))
"""


@pytest.fixture
def model_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A --model that passes predict's checks: the data's real schema.json and a real model
    definition; its model.keras stands in for weights that are never loaded."""
    rows = ["x,y,label"] + [f"{i * 0.5},{-i},{i % 3}" for i in range(30)]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    data = tmp_path / "data"
    assert main(["preprocess", "--input", str(tmp_path / "data.csv"), "--label", "label",
                 "--output", str(data)]) == 0  # fmt: skip
    model = tmp_path / "model"
    model.mkdir()
    (model / "schema.json").write_bytes((data / "schema.json").read_bytes())
    (model / "model_def.py").write_text(MODEL_DEF)
    (model / "model.keras").write_bytes(b"weights")
    # Were the check after the model's, predict would go on as with a real model.
    monkeypatch.setattr("elastic_step.model.serving.trained_model_of", lambda *args: None)
    return model


def training_output(run: Path, *, state: bool, model: bool) -> None:
    """What a training job leaves in its --output, as far as predict can tell: its master
    state (the job's settings), and model.keras once it has finished."""
    run.mkdir()
    (run / "model_def.py").write_text(MODEL_DEF)
    (run / "status.json").write_text('{"phase": "running"}\n')
    if model:
        (run / "model.keras").write_bytes(b"weights")
    if state:
        config = TrainConfig(model_def="model_def.py", data="data", output=str(run), epochs=3)
        record = JobRecord(config.fixed_settings(), num_ps=1, phase=Phase.SUCCEEDED)
        store = create_state_store("file", str(run))
        store.acquire("master", timeout_s=10)
        store.snapshot({"job": record.snapshot(), "tasks": {}, "instances": {}})
        store.close()


def listing(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` (itself included) with its size and modification time."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in [root, *sorted(root.rglob("*"))]
    }


@pytest.mark.parametrize(
    ("state", "model"),
    [(True, True), (True, False), (False, True)],
    ids=["finished", "interrupted", "state-kept-elsewhere"],
)
def test_an_output_that_holds_a_training_job_is_one_line_and_nothing_written(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture, state: bool, model: bool
) -> None:
    run = tmp_path / "run"
    training_output(run, state=state, model=model)
    (tmp_path / "new.csv").write_text("x,y\n1.5,-2\n3,4\n")
    before = listing(run)
    capsys.readouterr()
    status = main([
        "predict", "--model", str(model_dir), "--input", str(tmp_path / "new.csv"),
        "--output", f"{run}/", "--workers", "1",
    ])  # fmt: skip
    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        f"elastic-step: error: {run}/ holds a training job, not a prediction: give predict "
        "another --output"
    ]
    assert listing(run) == before


def test_the_jobs_own_check_names_the_other_command_either_way_round() -> None:
    """At a job's start, where the state is on the cluster: the same line, not a list of
    settings that differ because they belong to another command."""
    check_same_command("run/", "train", "train")
    with pytest.raises(InputError) as raised:
        check_same_command("preds/", "predict", "train")
    assert str(raised.value) == (
        "preds/ holds a prediction, not a training job: give train another --output"
    )
