"""The command line's conduct around its commands: a reader of its output that goes away."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_step import cli
from elastic_step.cli import main


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """`elastic-step status run/ | head -3`: no traceback, and the exit status of a command
    killed by SIGPIPE."""
    run = tmp_path / "run"
    run.mkdir()
    # Far more than a pipe holds (64 KiB): the command is still printing when the reader goes.
    workers = [{"id": f"worker-{i}", "pid": 1000 + i, "state": "running"} for i in range(20_000)]
    status = {"phase": "running", "epoch": 1, "epochs": 1, "workers": workers, "ps": []}
    (run / "status.json").write_text(json.dumps(status))
    proc = subprocess.Popen(
        [sys.executable, "-m", "elastic_step", "status", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    head = [proc.stdout.readline() for _ in range(3)]
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=60)
    assert head[0] == "phase:   running\n"
    assert stderr == ""
    assert proc.returncode == 141  # 128 + SIGPIPE, as a shell gives


def test_a_broken_pipe_that_is_not_stdouts_is_not_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a reader of stdout that has gone makes a BrokenPipeError quiet: one from another
    pipe or socket is a bug, raised whole."""

    def broken(args) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "_run", broken)
    with pytest.raises(BrokenPipeError):
        main(["status", str(tmp_path)])


def test_predict_help_speaks_of_workers_only_and_train_help_of_ps_too(
    capsys: pytest.CaptureFixture,
) -> None:
    def help_of(command: str) -> str:
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        assert exit_.value.code == 0
        return capsys.readouterr().out

    predict = help_of("predict")
    assert "PS" not in predict and "--ps-" not in predict, predict
    assert "--worker-cpu" in predict and "--high-priority-class" in predict
    train = help_of("train")
    assert "--ps-cpu" in train and "PriorityClass of PS pods" in train


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"elastic-step {version('elastic-step')}"
