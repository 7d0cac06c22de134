"""The components' settings under kfp.local (issue 18): a CSV with empty numeric cells and a
text column runs through preprocess (fill_missing="mean", one_hot=True) and elastic-train
(early_stopping); a bad setting ends its step as the command would, with one line on stderr
and exit status 2, and the step runs once. (A task with a retry policy is retried on any
failure, bad input too: KFP 2.17's RetryPolicy has no exit-code condition, under kfp.local
or on a cluster. So neither this pipeline nor the example sets one; docs/guides/pipelines.md,
"Retries".)

Each task's command is run as kfp.local's SubprocessRunner runs it, but through a recorder
that keeps its exit status and its stderr apart (kfp.local merges them, and keeps only a
pass or a fail).
"""

# No `from __future__ import annotations`: kfp reads the pipeline's annotations as types.
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runs import mlp_classifier
from kfp import dsl, local
from kfp.local import subprocess_task_handler

from elastic_step.components.kfp_components import elastic_train, preprocess

pytestmark = [
    pytest.mark.e2e,
    # kfp.local warns that the image does not look like a Python image: it runs the
    # components in this environment instead, which is the point.
    pytest.mark.filterwarnings("ignore:You may be attemping:RuntimeWarning"),
]

LABEL = "cultivar"
# Two numeric columns, and the text column as one-hot over 3 regions + the unseen id.
WIDTH = 2 + 4
MODEL = mlp_classifier(WIDTH, 8, 3, optimizer="keras.optimizers.Adam(0.05)")


def write_wine_csv(path: Path, rows: int = 150) -> None:
    """Acidity (noise, empty in one row of five), color (tells the cultivar) and region."""
    rng = np.random.default_rng(0)
    lines = ["acidity,color,region,cultivar"]
    for i in range(rows):
        cultivar = i % 3
        acidity = "" if i % 5 == 0 else f"{rng.normal(8, 1):.3f}"
        color = rng.normal(3 + 2 * cultivar, 0.5)
        region = ["north", "south", "east"][rng.integers(3)]
        lines.append(f"{acidity},{color:.4f},{region},{cultivar}")
    path.write_text("\n".join(lines) + "\n")


@dsl.pipeline
def wine_pipeline(
    csv_uri: str,
    model_def_uri: str,
    fill_missing: str = "mean",
    early_stopping: str = "loss:1:max",
) -> None:
    """preprocess -> elastic-train, with local workers, and no retry policy."""
    csv = dsl.importer(artifact_uri=csv_uri, artifact_class=dsl.Dataset, reimport=False)
    model_def = dsl.importer(
        artifact_uri=model_def_uri, artifact_class=dsl.Artifact, reimport=False
    )
    data = preprocess(
        csv=csv.output, label=LABEL, shards=2, fill_missing=fill_missing, one_hot=True
    )
    train = elastic_train(
        dataset=data.outputs["data"],
        model_def=model_def.output,
        epochs=6,
        batch_size=16,
        workers=1,
        ps=1,
        records_per_task=32,
        backend="local",
        early_stopping=early_stopping,
        task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    )
    train.set_caching_options(False)


class Runs:
    """The tasks' commands that kfp.local ran: each one's exit status and stderr."""

    def __init__(self) -> None:
        self.runs: list[tuple[list[str], int, str]] = []

    def __call__(self, full_command: list[str], env_vars: dict | None = None) -> int:
        # The command is the component's; its stderr is kept apart from its stdout.
        result = subprocess.run(
            full_command, env={**os.environ, **(env_vars or {})},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        print(result.stdout, end="")
        print(result.stderr, end="", file=sys.stderr)
        self.runs.append((full_command, result.returncode, result.stderr))
        return result.returncode

    def of(self, component: str) -> list[tuple[int, str]]:
        """(exit status, stderr) of each run of the component, by its function's name."""
        return [
            (status, stderr)
            for command, status, stderr in self.runs
            if f"def {component}(" in " ".join(command)
        ]


@pytest.fixture
def runs(monkeypatch) -> Runs:
    runs = Runs()
    monkeypatch.setattr(subprocess_task_handler, "run_local_subprocess", runs)
    return runs


@pytest.fixture
def files(tmp_path: Path) -> Path:
    write_wine_csv(tmp_path / "wine.csv")
    (tmp_path / "model.py").write_text(MODEL)
    return tmp_path


def _run(files: Path, **settings) -> Path:
    root = files / "root"
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(root),
        raise_on_error=False,
    )
    wine_pipeline(
        csv_uri=str(files / "wine.csv"), model_def_uri=str(files / "model.py"), **settings
    )
    return root


def executor_output(root: Path, task: str) -> dict:
    (path,) = root.glob(f"*/{task}/executor_output.json")
    return json.loads(path.read_text())


def test_empty_cells_and_a_text_column_train_with_early_stopping(files, runs) -> None:
    root = _run(files)
    assert [status for status, _ in runs.of("preprocess")] == [0]
    assert [status for status, _ in runs.of("elastic_train")] == [0]
    data = executor_output(root, "preprocess")["artifacts"]["data"]["artifacts"][0]
    schema = json.loads((Path(data["uri"]) / "schema.json").read_text())
    assert schema["one_hot"] is True
    acidity = schema["columns"][0]
    assert acidity["name"] == "acidity" and acidity["fill"] == acidity["mean"]
    train = executor_output(root, "elastic-train")["artifacts"]
    summary = json.loads(Path(train["summary"]["artifacts"][0]["uri"]).read_text())
    assert summary["phase"] == "succeeded"
    # The loss falls, so "max" sees no gain: training stops well before its 6 epochs.
    stop = summary["early_stop"]
    assert stop is not None and stop["last_epoch"] < 6, stop
    assert all(np.isfinite(e["metrics"]["loss"]) for e in summary["evaluations"])


@pytest.mark.parametrize(
    ("component", "settings", "line"),
    [
        (
            "preprocess",
            {"fill_missing": "bogus"},
            "elastic-step: error: --fill-missing must be mean, zero or a number, got 'bogus'",
        ),
        (
            "elastic_train",
            {"early_stopping": "loss:soon"},
            "elastic-step: error: --early-stopping: PATIENCE must be an integer, got 'soon'",
        ),
    ],
)
def test_a_bad_setting_is_one_line_exit_2_and_no_retry(
    files, runs, component: str, settings: dict, line: str
) -> None:
    _run(files, **settings)
    ((status, stderr),) = runs.of(component)  # once: not retried
    assert status == 2
    assert stderr.splitlines() == [stderr.splitlines()[0]] and stderr.startswith(line), stderr
