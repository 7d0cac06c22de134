"""Each bad input gives one clear error line naming what is wrong, exit code 2, and no output."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runs import TWO_COLUMN_MODEL, classifier_definition, run_cli

from elastic_step.cli import main

pytestmark = pytest.mark.e2e

GOOD_MODEL = classifier_definition(TWO_COLUMN_MODEL, optimizer="keras.optimizers.SGD(0.1)")


def error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]


@pytest.fixture
def csv_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.csv"
    rows = ["a,b,label"] + [f"{i % 7},{(i * 3) % 5},{i % 2}" for i in range(40)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture
def data_dir(tmp_path: Path, csv_file: Path) -> Path:
    out = tmp_path / "data"
    assert (
        main(["preprocess", "--input", str(csv_file), "--label", "label", "--output", str(out)])
        == 0
    )
    return out


def preprocess(csv: Path, out: Path, *extra: str) -> int:
    return main(["preprocess", "--input", str(csv), "--output", str(out), *extra])


def test_missing_csv_file(tmp_path, capsys):
    out = tmp_path / "out"
    assert preprocess(tmp_path / "nope.csv", out, "--label", "y") == 2
    [line] = error_lines(capsys)
    assert "nope.csv" in line
    assert not out.exists()


def test_missing_label_column(csv_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert preprocess(csv_file, out, "--label", "target") == 2
    [line] = error_lines(capsys)
    assert "data.csv" in line and "'target'" in line and "a, b, label" in line
    assert not out.exists()


def test_ragged_row(csv_file, tmp_path, capsys):
    lines = csv_file.read_text().splitlines()
    lines[5] = "1,2"  # file line 6
    csv_file.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert preprocess(csv_file, out, "--label", "label") == 2
    [line] = error_lines(capsys)
    assert "data.csv" in line and "line 6" in line and "expected 3 fields, got 2" in line
    assert not out.exists()


def test_non_numeric_value_in_numeric_column(tmp_path, capsys):
    csv = tmp_path / "late.csv"
    rows = ["a,b,label"] + [f"{i},{i * 2},{i % 2}" for i in range(150)]
    rows[120] = "7,seven,1"  # file line 121, past the 100 rows that decide the column type
    csv.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("earlier output")
    assert preprocess(csv, out, "--label", "label") == 2
    [line] = error_lines(capsys)
    assert "late.csv" in line and "line 121" in line and "'b'" in line and "'seven'" in line
    # An existing output is left exactly as it was.
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_wrong_flag_value_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["preprocess", "--input", "x.csv", "--label", "y", "--output", "o", "--shards", "two"])
    assert exit_info.value.code == 2
    assert "--shards" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        (
            GOOD_MODEL.replace("def optimizer", "def not_optimizer"),
            "no optimizer: define optimizer",
        ),
        (
            "import no_such_module\n" + GOOD_MODEL,
            "importing it raised ModuleNotFoundError at line 1: No module named 'no_such_module'",
        ),
        (
            GOOD_MODEL + "\ndef model():\n    return [1, 2]\n",
            "model() returned list, expected a keras.Model",
        ),
        (
            GOOD_MODEL + "\ndef optimizer():\n    return 0.1\n",
            "optimizer(): got float, expected a keras.optimizers.Optimizer or an optimizer name",
        ),
        (
            GOOD_MODEL + "\ndef loss(labels, outputs):\n    return None\n",
            "the loss failed on the first batch: TypeError: loss() returned NoneType, expected a "
            "tensor of per-example losses or a scalar",
        ),
        ("def model(:\n", "syntax error on line 1"),
    ],
    ids=[
        "missing-function",
        "import-error",
        "model-type",
        "optimizer-type",
        "loss-type",
        "syntax",
    ],
)
def test_broken_model_definition(tmp_path, data_dir, capsys, source, problem):
    model_def = tmp_path / "broken_model.py"
    model_def.write_text(source)
    out = tmp_path / "run"
    code = main(
        ["train", "--model-def", str(model_def), "--data", str(data_dir), "--output", str(out)]
    )
    assert code == 2
    [line] = error_lines(capsys)
    assert f"model definition {model_def}: {problem}" in line
    assert not out.exists(), "nothing starts, and nothing is written, for a broken definition"


def test_unknown_backend_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--model-def", "m.py", "--data", "d", "--output", "o", "--backend", "k8s"])
    assert exit_info.value.code == 2
    assert "--backend: invalid choice: 'k8s' (choose from 'kubernetes', 'local')" in (
        capsys.readouterr().err
    )


def test_train_flag_rule_names_the_value(tmp_path, data_dir, capsys):
    code = main(
        ["train", "--model-def", "m.py", "--data", str(data_dir), "--output", str(tmp_path / "r"),
         "--workers", "2", "--min-workers", "3"]
    )  # fmt: skip
    assert code == 2
    [line] = error_lines(capsys)
    assert "--min-workers (3) must be <= --workers (2)" in line


def test_data_dir_without_schema(tmp_path, capsys):
    code = main(
        ["train", "--model-def", "m.py", "--data", str(tmp_path), "--output", str(tmp_path / "r")]
    )
    assert code == 2
    [line] = error_lines(capsys)
    assert "schema.json" in line


def test_the_real_command_exits_2_with_one_line(tmp_path, csv_file):
    result = run_cli("preprocess", "--input", str(csv_file), "--label", "nope",
                     "--output", str(tmp_path / "out"), timeout=120)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("elastic-step: error: ")
    assert "'nope'" in result.stderr
