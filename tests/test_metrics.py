"""Task metrics against values worked out by hand."""

import math

import numpy as np
import pytest

from kgpt.errors import RegistryError
from kgpt.tasks import metrics


def test_accuracy_and_f1():
    labels, predictions = [1, 0, 1, 1, 0], [1, 1, 0, 1, 0]
    assert metrics.accuracy(labels, predictions) == pytest.approx(3 / 5)
    # tp=2, fp=1, fn=1 -> F1 = 2*2 / (2*2 + 1 + 1)
    assert metrics.f1(labels, predictions) == pytest.approx(4 / 6)
    assert metrics.f1([0, 0], [0, 0]) == 0.0


def test_matthews():
    # tp=2 tn=1 fp=1 fn=1: (2*1 - 1*1) / sqrt(3*3*2*2)
    assert metrics.matthews([1, 0, 1, 1, 0], [1, 1, 0, 1, 0]) == pytest.approx(1 / 6)
    assert metrics.matthews([1, 1, 0], [1, 1, 0]) == pytest.approx(1.0)
    assert metrics.matthews([1, 1], [1, 1]) == 0.0  # undefined -> 0, as sklearn


def test_pearson_and_spearman_with_ties():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert metrics.pearson(x, 2 * x + 1) == pytest.approx(1.0)
    # Ranks with ties: [1, 2.5, 2.5, 4] vs [1, 2, 3, 4] -> r = 0.9486832980505138
    assert metrics.spearman([1, 2, 2, 3], [10, 20, 30, 40]) == pytest.approx(0.9486832980505138)
    assert math.isnan(metrics.pearson([1, 1, 1], [1, 2, 3]))


def test_resolve():
    assert metrics.resolve("f1")[1] is metrics.f1
    with pytest.raises(ValueError, match="Unknown metric 'bleu'. Built-in metrics: accuracy"):
        metrics.resolve("bleu")


@pytest.mark.parametrize(
    "value, shown",
    [
        ("high", "str 'high'"),
        (np.array([0.5, 0.5]), r"an array of shape \(2,\)"),
        (None, "NoneType None"),
        (True, "bool"),
    ],
)
def test_a_metric_that_returns_no_number_is_named_with_its_task(value, shown):
    with pytest.raises(RegistryError, match=rf"^Task 'moods': its metric 'mood' returned {shown}.*, not a number"):
        metrics.score("moods", "mood", lambda labels, predictions: value, [0, 1], [0, 1])


def test_a_metrics_number_becomes_a_float():
    for value in (np.float32(0.25), 0.25, np.array(0.25), np.int64(0) + 0.25):
        got = metrics.score("moods", "mood", lambda labels, predictions, v=value: v, [0, 1], [0, 1])
        assert type(got) is float and got == 0.25
    assert math.isnan(metrics.score("moods", "mood", lambda labels, predictions: float("nan"), [0], [0]))
