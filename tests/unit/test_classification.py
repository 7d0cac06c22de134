"""Confusion matrix and ROC points from a classifier's outputs, checked against scikit-learn
on the scores of a real classifier (logistic regression on the breast cancer data)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import confusion_matrix, roc_auc_score, roc_curve

from elastic_step.classification import MAX_ROC_POINTS, ClassifierOutputs, roc_points


@pytest.fixture(scope="module")
def fitted() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels, logits and probabilities of the positive class, on 569 records."""
    data = load_breast_cancer()
    features = (data.data - data.data.mean(axis=0)) / data.data.std(axis=0)
    # Weak regularization on few features: a good but imperfect classifier, so the ROC
    # curve has many distinct points.
    model = LogisticRegression(C=0.05, max_iter=1000).fit(features[:, :4], data.target)
    logits = model.decision_function(features[:, :4])
    return data.target, logits, model.predict_proba(features[:, :4])[:, 1]


def area(points: list[dict]) -> float:
    """Trapezoid area under the points, from (0, 0)."""
    fpr = [0.0] + [p["fpr"] for p in points]
    tpr = [0.0] + [p["tpr"] for p in points]
    return float(np.trapezoid(tpr, fpr))


def test_roc_points_lie_on_scikit_learns_curve(fitted) -> None:
    labels, _, probabilities = fitted
    points = roc_points(labels=labels, scores=probabilities)
    fpr, tpr, thresholds = roc_curve(labels, probabilities, drop_intermediate=False)

    assert len(np.unique(probabilities)) > MAX_ROC_POINTS
    assert len(points) == MAX_ROC_POINTS
    assert [p["threshold"] for p in points] == sorted(
        (p["threshold"] for p in points), reverse=True
    )
    assert points[0]["threshold"] == probabilities.max()
    assert (points[-1]["tpr"], points[-1]["fpr"]) == (1.0, 1.0)
    for point in points:
        [index] = np.flatnonzero(thresholds == point["threshold"])
        assert (point["tpr"], point["fpr"]) == pytest.approx((tpr[index], fpr[index]))
    assert area(points) == pytest.approx(roc_auc_score(labels, probabilities), abs=0.005)


def test_with_few_distinct_scores_every_point_of_the_curve_is_kept(fitted) -> None:
    labels, _, probabilities = fitted
    scores = probabilities.round(1)  # ties, and at most 11 distinct values
    points = roc_points(labels=labels, scores=scores)
    fpr, tpr, thresholds = roc_curve(labels, scores, drop_intermediate=False)

    # scikit-learn starts with an infinite threshold at (0, 0); JSON has no infinity.
    assert [p["threshold"] for p in points] == list(thresholds[1:])
    assert [p["tpr"] for p in points] == pytest.approx(list(tpr[1:]))
    assert [p["fpr"] for p in points] == pytest.approx(list(fpr[1:]))
    assert area(points) == pytest.approx(roc_auc_score(labels, scores))


@pytest.mark.parametrize("form", ["probability", "logit", "softmax", "two logits"])
def test_probabilities_and_logits_in_one_or_two_columns_give_the_same_results(fitted, form) -> None:
    labels, logits, probabilities = fitted
    outputs = {
        "probability": probabilities[:, None],
        "logit": logits[:, None],
        "softmax": np.stack([1 - probabilities, probabilities], axis=1),
        "two logits": np.stack([-logits / 2, logits / 2], axis=1),
    }[form].astype(np.float32)
    classifier = ClassifierOutputs(num_classes=2)
    for start in range(0, len(labels), 64):
        classifier.add(labels[start : start + 64], outputs[start : start + 64])

    roc = classifier.roc()
    thresholds = [p["threshold"] for p in roc]
    # Thresholds are probabilities of the positive class, whatever the output's form.
    assert thresholds == sorted(thresholds, reverse=True)
    assert thresholds[0] == pytest.approx(probabilities.max(), abs=1e-6)
    assert thresholds[-1] == pytest.approx(probabilities.min(), abs=1e-6)
    assert (roc[-1]["tpr"], roc[-1]["fpr"]) == (1.0, 1.0)
    assert area(roc) == pytest.approx(roc_auc_score(labels, logits), abs=0.005)
    assert classifier.confusion_matrix().tolist() == (
        confusion_matrix(labels, (logits > 0).astype(int)).tolist()
    )


def test_whether_outputs_are_logits_is_decided_over_all_batches() -> None:
    classifier = ClassifierOutputs(num_classes=2)
    classifier.add(np.array([0, 1]), np.array([[-0.2], [0.3]]))
    classifier.add(np.array([0, 1]), np.array([[0.4], [0.6]]))  # logits, though within [0, 1]
    assert classifier.confusion_matrix().tolist() == [[1, 1], [0, 2]]


def test_no_roc_for_one_class_or_more_than_two() -> None:
    one_class = ClassifierOutputs(num_classes=2)
    one_class.add(np.array([1, 1, 1]), np.array([[0.2], [0.7], [0.9]]))
    assert one_class.roc() is None
    assert one_class.confusion_matrix().tolist() == [[0, 0], [1, 2]]
    with pytest.raises(ValueError, match="both positive and negative"):
        roc_points(labels=np.array([1, 1]), scores=np.array([0.1, 0.2]))

    three = ClassifierOutputs(num_classes=3)
    three.add(np.array([0, 1, 2, 2]), np.array([[5, 1, 0], [0, 3, 1], [0, 1, 2], [4, 0, 1]]))
    assert three.roc() is None
    assert three.confusion_matrix().tolist() == [[1, 0, 0], [0, 1, 0], [1, 0, 1]]
