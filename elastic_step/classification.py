"""A classifier's outputs, batch by batch, turned into a confusion matrix and ROC points."""

from __future__ import annotations

import numpy as np

#: ROC points kept at most: enough for a smooth curve, small enough for KFP's metadata.
MAX_ROC_POINTS = 100


def sigmoid(x: np.ndarray) -> np.ndarray:
    # tanh form: no overflow warning for large negative logits.
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


def roc_points(
    *, labels: np.ndarray, scores: np.ndarray, max_points: int = MAX_ROC_POINTS
) -> list[dict]:
    """ROC points ``{"threshold", "tpr", "fpr"}``, by falling threshold; label 1 is positive.

    A record counts as positive when its score is at least the threshold. The thresholds are
    the distinct scores, or ``max_points`` of them evenly spaced by rank (the highest and
    lowest always among them), so every point lies exactly on the full ROC curve.
    """
    labels = np.asarray(labels).reshape(-1)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    positives = np.sort(scores[labels == 1])
    negatives = np.sort(scores[labels != 1])
    if len(positives) == 0 or len(negatives) == 0:
        raise ValueError("a ROC curve needs both positive and negative labels")
    distinct = np.unique(scores)
    if len(distinct) > max_points:
        ranks = np.unique(np.linspace(0, len(distinct) - 1, max_points).round().astype(int))
        distinct = distinct[ranks]
    thresholds = distinct[::-1]
    true_positives = len(positives) - np.searchsorted(positives, thresholds, side="left")
    false_positives = len(negatives) - np.searchsorted(negatives, thresholds, side="left")
    return [
        {
            "threshold": float(t),
            "tpr": float(tp / len(positives)),
            "fpr": float(fp / len(negatives)),
        }
        for t, tp, fp in zip(thresholds, true_positives, false_positives, strict=True)
    ]


class ClassifierOutputs:
    """Collects labels and outputs of a classifier with ``num_classes`` classes.

    Outputs of one column (a probability or a logit) or two (softmax probabilities or
    logits) are kept whole, so that whether they are probabilities is decided once over all
    records, not batch by batch; wider outputs are reduced to their argmax at once.
    """

    def __init__(self, *, num_classes: int) -> None:
        self.num_classes = num_classes
        self._labels: list[np.ndarray] = []
        self._outputs: list[np.ndarray] = []

    def add(self, labels: np.ndarray, outputs: np.ndarray) -> None:
        outputs = np.asarray(outputs)
        n = len(np.asarray(labels).reshape(-1))
        outputs = outputs.reshape(n, -1)
        if outputs.shape[1] > 2:
            outputs = outputs.argmax(axis=1)
        self._labels.append(np.asarray(labels).reshape(-1))
        self._outputs.append(outputs)

    def _binary_scores(self) -> np.ndarray | None:
        """The positive class's probability per record; None if the outputs are wider."""
        outputs = np.concatenate(self._outputs)
        if outputs.ndim == 1:
            return None
        in_unit = outputs.min() >= 0 and outputs.max() <= 1
        if outputs.shape[1] == 1:
            return outputs[:, 0].astype(np.float64) if in_unit else sigmoid(outputs[:, 0])
        if in_unit and np.allclose(outputs.sum(axis=1), 1.0, atol=1e-3):
            return outputs[:, 1].astype(np.float64)
        # Softmax of two logits: the positive class's probability is sigmoid(x1 - x0).
        return sigmoid(outputs[:, 1].astype(np.float64) - outputs[:, 0])

    def confusion_matrix(self) -> np.ndarray:
        """Counts by (true class, predicted class)."""
        labels = np.concatenate(self._labels)
        scores = self._binary_scores()
        if scores is None:
            predicted = np.concatenate(self._outputs)
        else:
            predicted = (scores > 0.5).astype(np.int64)
        matrix = np.zeros((self.num_classes, self.num_classes), dtype=np.int64)
        np.add.at(matrix, (labels, predicted), 1)
        return matrix

    def roc(self) -> list[dict] | None:
        """ROC points for a binary classifier (class 1 positive); None when there is no curve:
        more than two classes, or a split that holds one class only."""
        scores = self._binary_scores()
        labels = np.concatenate(self._labels)
        if self.num_classes != 2 or scores is None or len(np.unique(labels)) < 2:
            return None
        return roc_points(labels=labels, scores=scores)
