"""Prediction parts and their merge: one row per input row with its index, in input order;
a missing, short or misplaced part is an error, never a silent gap or duplicate."""

from __future__ import annotations

import re

import numpy as np
import pytest

from elastic_step.data.predict_output import PredictionsError, format_part, merge_parts, part_path
from elastic_step.data.schema import Column, Schema


def schema(label_kind: str = "class", vocabulary=("cat", "dog, wild", "eel")) -> Schema:
    return Schema(
        label="y",
        label_kind=label_kind,
        label_vocabulary=list(vocabulary) if label_kind == "class" else None,
        columns=[Column(name="x", kind="numeric", mean=0.0, std=1.0)],
    )


def test_a_classifier_part_names_the_class_of_the_largest_output() -> None:
    text = format_part(5, np.array([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]], np.float32), schema())
    assert text.splitlines() == [
        'index,class,output_cat,"output_dog, wild",output_eel',
        '5,"dog, wild",0.100000001,2,-1',
        "6,cat,3,0,0.5",
    ]


def test_a_regressor_or_one_column_part_has_one_output_and_no_class() -> None:
    assert format_part(0, np.array([[1.5], [-2.0]]), schema("numeric")).splitlines() == [
        "index,output",
        "0,1.5",
        "1,-2",
    ]
    two_classes = schema(vocabulary=("no", "yes"))
    assert format_part(0, np.array([0.7]), two_classes).splitlines()[0] == "index,output"


def test_parts_merge_in_input_order_with_one_header(tmp_path) -> None:
    parts, s = str(tmp_path), schema("numeric")
    # Task ids are not row order: task 1 holds the first rows.
    for task_id, first, values in ((1, 0, [1.0, 2.0]), (0, 2, [3.0])):
        with open(part_path(parts, task_id), "w") as f:
            f.write(format_part(first, np.array(values), s))
    out = tmp_path / "predictions.csv"
    assert merge_parts(parts, [(1, 0, 2), (0, 2, 1)], str(out)) == 3
    assert out.read_text() == "index,output\n0,1\n1,2\n2,3\n"


@pytest.mark.parametrize(
    ("tasks", "problem"),
    [
        ([(0, 0, 2), (1, 2, 1)], "missing; task 1 reported no predictions"),
        ([(0, 0, 3)], "holds rows [0]..[1] (2 rows); task 0 has rows 0..2"),
        ([(0, 1, 2)], "task 0 has rows 1..2"),
    ],
)
def test_a_part_that_does_not_fit_its_task_fails_the_merge(tmp_path, tasks, problem) -> None:
    with open(part_path(str(tmp_path), 0), "w") as f:
        f.write(format_part(0, np.array([1.0, 2.0]), schema("numeric")))
    (tmp_path / "out.csv").write_text("an earlier file\n")
    with pytest.raises(PredictionsError, match=re.escape(problem)):
        merge_parts(str(tmp_path), tasks, str(tmp_path / "out.csv"))
    # Left as it was, and no half-written file beside it.
    assert (tmp_path / "out.csv").read_text() == "an earlier file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv", "task-000000000.csv"]
