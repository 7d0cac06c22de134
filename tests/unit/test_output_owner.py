"""One job per --output: the claim, its take-over by the same job, the refusal of another,
and a marker that cannot be read."""

from __future__ import annotations

import json
import logging

import pytest

from elastic_step.errors import InputError
from elastic_step.master.saving.output_owner import (
    MARKER,
    OutputOwner,
    OutputTakenError,
    claim_output,
    read_owner,
    refuse_legacy_output,
)
from elastic_step.output_layout import OutputLayout


def owner(**changes) -> OutputOwner:
    fields = dict(job="es-a", state="/state/a", command="train", token=1, master="host:1")
    return OutputOwner(**{**fields, **changes})


def test_a_new_output_is_claimed_and_the_marker_names_the_job(tmp_path):
    output = str(tmp_path / "out")
    claim_output(output, owner())
    assert json.loads((tmp_path / "out" / MARKER).read_text()) == {
        "job": "es-a",
        "state": "/state/a",
        "command": "train",
        "token": 1,
        "master": "host:1",
    }
    assert read_owner(output) == owner()


def test_the_next_master_of_the_same_job_takes_the_claim_over(tmp_path):
    output = str(tmp_path)
    claim_output(output, owner(token=1))
    claim_output(output, owner(token=2, master="other-host:7"))
    assert read_owner(output) == owner(token=2, master="other-host:7")


@pytest.mark.parametrize(
    "other",
    [owner(job="es-b"), owner(state="/state/b"), owner(command="predict")],
    ids=["another job name", "another state", "another command"],
)
def test_another_job_is_refused_with_both_jobs_named_and_the_claim_kept(tmp_path, other):
    output = str(tmp_path)
    claim_output(output, owner())
    with pytest.raises(OutputTakenError) as raised:
        claim_output(output, other)
    message = str(raised.value)
    assert isinstance(raised.value, InputError)  # exit status 2
    assert "belongs to another job: train job es-a with its state in /state/a" in message
    assert f"job is {other.job} with its state in {other.state}" in message
    assert "give it its own --output" in message and "\n" not in message
    assert read_owner(output) == owner()


def test_an_unreadable_marker_is_set_aside_with_one_line_and_the_output_claimed(tmp_path, caplog):
    (tmp_path / MARKER).write_text('{"job": "es-a"')  # torn
    with caplog.at_level(logging.WARNING):
        claim_output(str(tmp_path), owner(job="es-b"))
    (kept,) = (tmp_path / "set-aside").iterdir()
    assert kept.name.endswith(MARKER) and kept.read_text() == '{"job": "es-a"'
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "not a job-owner marker" in lines[0] and str(kept) in lines[0]
    assert read_owner(str(tmp_path)) == owner(job="es-b")


def test_a_marker_missing_a_field_is_set_aside_too(tmp_path):
    (tmp_path / MARKER).write_text(json.dumps({"job": "es-a", "state": "/s"}))
    assert read_owner(str(tmp_path)) is None
    assert not (tmp_path / MARKER).exists()
    assert len(list((tmp_path / "set-aside").iterdir())) == 1


def test_an_output_of_an_older_version_is_refused(tmp_path):
    refuse_legacy_output(OutputLayout(str(tmp_path)))  # nothing there: fine
    (tmp_path / "master-state.json").write_text("{}")
    with pytest.raises(InputError, match="older elastic-step version"):
        refuse_legacy_output(OutputLayout(str(tmp_path)))
