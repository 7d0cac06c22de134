"""``elastic-step evaluate``: loss, metrics, a confusion matrix and ROC of a trained model.
Tests: tests/e2e/test_keras_models.py; tests/e2e/test_fault_tolerance.py (an undisturbed run)."""

from __future__ import annotations

import json
import logging

import numpy as np

from elastic_step.classification import ClassifierOutputs
from elastic_step.data import storage
from elastic_step.data.schema import Schema
from elastic_step.data.tfrecord import read_records
from elastic_step.errors import InputError
from elastic_step.model.definition import load_model_definition
from elastic_step.output_layout import OutputLayout

log = logging.getLogger("elastic_step")
#: Records read from a shard at a time.
SLICE_RECORDS = 16_384


def evaluate(
    *, model_dir: str, data_dir: str, split: str, metrics_output: str, batch_size: int = 256
) -> dict:
    """Evaluates ``model_dir``'s model on ``split``; writes and returns the result.

    The result holds ``split``, ``records``, ``loss`` and ``metrics``; for a class label also
    ``confusion_matrix``, and for two classes ``roc``: points ``{threshold, tpr, fpr}`` with
    class 1 (the label vocabulary's second value) positive.
    """
    import keras

    from elastic_step.data.feed import make_dataset
    from elastic_step.model.serving import trained_model_of

    paths = OutputLayout(model_dir)
    for path in (paths.model_file, paths.model_def):
        if not storage.exists(path):
            raise InputError(f"no {path}; is {model_dir} the --output of a finished training?")
    schema = Schema.load(data_dir)
    if split not in schema.splits:
        raise InputError(
            f"--split must be one of {', '.join(sorted(schema.splits))}, got '{split}'"
        )
    shards = schema.shard_paths(data_dir, split)
    total = sum(records for _, records in shards)
    if total == 0:
        raise InputError(f"{data_dir}: the {split} split holds no records")
    definition = load_model_definition(paths.model_def, schema)
    model = trained_model_of(model_dir, definition)
    metrics = definition.build_metrics()
    loss_sum, count = 0.0, 0
    classifier = None
    if schema.label_kind == "class":
        classifier = ClassifierOutputs(num_classes=schema.num_classes)
    # A shard is read a slice at a time: memory holds a slice, whatever the split's size.
    per_slice = batch_size * max(1, SLICE_RECORDS // batch_size)
    slices = [
        (shard, start, min(per_slice, records - start))
        for shard, records in shards
        for start in range(0, records, per_slice)
    ]
    for shard, start, length in slices:
        dataset = make_dataset(
            read_records(shard, start, start + length),
            batch_size=batch_size,
            mode="evaluate",
            schema=schema,
            feed=definition.feed,
        )
        for features, labels in dataset:
            outputs = model(features, training=False)
            n = int(np.shape(labels)[0])
            loss_sum += float(definition.loss(labels, outputs)) * n
            count += n
            for metric in metrics.values():
                metric.update_state(labels, outputs)
            if classifier is not None:
                classifier.add(np.asarray(labels), keras.ops.convert_to_numpy(outputs))
    result: dict = {"split": split, "records": count, "loss": loss_sum / count, "metrics": {}}
    for name, metric in metrics.items():
        value = np.asarray(metric.result())
        result["metrics"][name] = float(value) if value.ndim == 0 else value.tolist()
    if classifier is not None:
        result["confusion_matrix"] = {
            "labels": schema.label_vocabulary,
            "rows": "true label",
            "columns": "predicted label",
            "matrix": classifier.confusion_matrix().tolist(),
        }
        roc = classifier.roc()
        if roc is not None:
            result["roc"] = roc
        elif schema.num_classes == 2:
            log.warning("no ROC curve: the %s split holds one class only", split)
    storage.write_text_atomic(metrics_output, json.dumps(result, indent=2) + "\n")
    log.info("wrote %s", metrics_output)
    return result
