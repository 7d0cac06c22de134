"""The predictions of ``elastic-step predict``: each task's part, and the one merged file.

A part is a small CSV file named by its task id, written atomically once by the worker that
ran the task: a task run again (its worker died before reporting) overwrites it with the
same rows, so a part never holds a row twice. Each row starts with ``index``, the position of
its input row (the CSV's data row, or the record's position in the split), then:

- ``class``: for a class label and outputs of one column per class, the name of the class
  of the largest output (the same for probabilities and logits). One column for two classes
  says nothing about being a probability or a logit, so it gets no ``class``;
- the model's outputs as they are: ``output`` (one column); for a classifier's one output
  per class, ``output_CLASS`` for each class in the label's vocabulary order
  (``output_benign``, ``output_malignant``); else ``output_0`` ... ``output_{k-1}``.

At the end the master merges the parts in task order, which is input order, into
``predictions.csv``, checking that every index from 0 on appears exactly once.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from elastic_step.data import storage
from elastic_step.data.schema import Schema
from elastic_step.errors import ElasticStepError


class PredictionsError(ElasticStepError):
    """The parts do not add up to one prediction per input row."""


def part_path(parts_dir: str, task_id: int) -> str:
    return storage.join(parts_dir, f"task-{task_id:09d}.csv")


def format_part(first_index: int, outputs: np.ndarray, schema: Schema) -> str:
    """The CSV text of a part: a header, then one row per row of ``outputs`` (the model's
    outputs for consecutive input rows from ``first_index`` on)."""
    outputs = np.asarray(outputs)
    outputs = outputs.reshape(len(outputs), -1)
    width = outputs.shape[1]
    header = ["index"]
    classes = schema.label_vocabulary if schema.label_kind == "class" else None
    named = classes is not None and width == len(classes) and width > 1
    if named:
        header.append("class")
    if width == 1:
        header.append("output")
    else:
        header += [_csv_cell(f"output_{c}") for c in (classes if named else range(width))]
    out = io.StringIO()
    out.write(",".join(header) + "\n")
    names = np.asarray(classes, dtype=object)[outputs.argmax(axis=1)] if named else None
    for i, row in enumerate(outputs.tolist()):
        cells = [str(first_index + i)]
        if names is not None:
            cells.append(_csv_cell(names[i]))
        cells += [format(float(v), ".9g") for v in row]
        out.write(",".join(cells) + "\n")
    return out.getvalue()


def _csv_cell(text: str) -> str:
    if any(c in text for c in ',"\n\r') or text != text.strip():
        return '"' + text.replace('"', '""') + '"'
    return text


def merge_parts(parts_dir: str, tasks: Sequence[tuple[int, int, int]], path: str) -> int:
    """Writes the parts of ``tasks`` (``(task id, first index, rows)`` in input order) into
    ``path`` atomically, with one header; returns the rows written. Raises
    :class:`PredictionsError` when a part is missing, has another header, or does not hold
    exactly its task's rows with their indexes; ``path`` is then left as it was.

    One part is in memory at a time: the predictions of a large input stream through."""
    header = None
    expected = 0
    with storage.open_atomic(path) as out:
        for task_id, first_index, rows in tasks:
            part = part_path(parts_dir, task_id)
            if not storage.exists(part):
                raise PredictionsError(f"{part}: missing; task {task_id} reported no predictions")
            lines = storage.read_text(part).splitlines()
            if header is None:
                header = lines[0]
                out.write((header + "\n").encode())
            elif lines[0] != header:
                raise PredictionsError(f"{part}: header {lines[0]!r} differs from {header!r}")
            indexes = [int(line.split(",", 1)[0]) for line in lines[1:]]
            if first_index != expected or indexes != list(range(first_index, first_index + rows)):
                raise PredictionsError(
                    f"{part}: holds rows {indexes[:1]}..{indexes[-1:]} ({len(indexes)} rows); "
                    f"task {task_id} has rows {first_index}..{first_index + rows - 1}"
                )
            out.write(("\n".join(lines[1:]) + "\n").encode())
            expected += rows
        if header is None:
            out.write(b"index\n")
    return expected
