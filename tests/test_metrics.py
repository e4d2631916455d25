"""Task metrics against values worked out by hand."""

import math

import numpy as np
import pytest

import kgpt
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


class Plugin:
    """A plugin registering `task`."""

    def __init__(self, task):
        self.task = task

    @kgpt.hookimpl
    def register_tasks(self, register):
        register(self.task)


def moods(metric):
    """A task whose one metric is `metric`."""

    def read(split, data_dir):
        words = ["sad", "glad", "grim", "happy"] * (2 if split == "train" else 1)
        return [kgpt.Example((w,), "high" if i % 2 else "low", source=f"{split}:{i}") for i, w in enumerate(words)]

    return kgpt.Task("moods", kgpt.tasks.transforms.Classification(), read, labels=("low", "high"), metrics=(metric,))


def test_check_calls_each_metric_once_and_names_one_returning_no_number():
    calls = []

    def mood(labels, predictions):
        calls.append((labels.tolist(), predictions.tolist()))
        return "high"

    with pytest.raises(RegistryError, match=r"^Task 'moods': its metric 'mood' returned str 'high', not a number"):
        metrics.check(moods(mood))
    assert calls == [([0, 1, 1, 0], [0, 1, 1, 0])]
    calls.clear()
    with pytest.raises(RegistryError, match=r"returned str 'high'"):
        metrics.check(moods(mood), [1, 1, 0])
    assert calls == [([1, 1, 0], [1, 1, 0])]
    metrics.check(moods("f1"))  # the built-in metrics return numbers

    def wants_more(labels, predictions):
        raise ValueError("needs 100 labels")

    metrics.check(moods(wants_more))  # left to its first real call, which may well succeed
    with pytest.raises(RegistryError, match=r"^Task 'moods': its metric 'wants_more' raised ValueError: needs 100 "):
        metrics.check(moods(wants_more), [0, 1, 1, 0, 1])  # a run's training targets: it is broken

    def inverse_errors(labels, predictions):  # undefined for a perfect prediction only
        return 1 / int((labels != predictions).sum())

    metrics.check(moods(inverse_errors), [0, 1, 1, 0, 1])


def test_a_metric_that_raises_is_named_with_its_task_in_one_line():
    def mood(labels, predictions):
        return {}["f1"]

    with pytest.raises(RegistryError, match=r"^Task 'moods': its metric 'mood' raised KeyError: 'f1' \(on 2 labels;"):
        metrics.score("moods", "mood", mood, [0, 1], [0, 1])

    def lines(labels, predictions):
        raise ValueError("first\nsecond")

    with pytest.raises(RegistryError, match=r"raised ValueError: first second \(on 2 labels; [^\n]*$"):
        metrics.score("moods", "lines", lines, [0, 1], [0, 1])


@pytest.mark.parametrize("returned, message", [("array", r"returned an array of shape \(2,\)"), ("raise", "raised")])
def test_fine_tuning_names_a_broken_metric_before_it_trains(tiny_preset, tmp_path, monkeypatch, returned, message):
    from kgpt.jobs import dry_run, finetune, run
    from kgpt.jobs.config import FinetuneConfig

    def fit(*args, **kwargs):
        raise AssertionError("trained before the metric was checked")

    monkeypatch.setattr(run, "fit", fit)

    def mood(labels, predictions):
        if returned == "raise":
            raise ZeroDivisionError("the plugin's bug")
        return np.array([0.5, 0.5])

    registry = kgpt.TaskRegistry(plugins=[Plugin(moods(mood))], entry_points=[])
    config = FinetuneConfig(
        task="moods", data_dir=str(tmp_path), init=tiny_preset, epochs=1, batch_size=4, max_length=16
    )
    with pytest.raises(RegistryError, match=rf"^Task 'moods'.*: its metric 'mood' {message}"):
        finetune.finetune(config, registry)
    with pytest.raises(RegistryError, match=rf"^Task 'moods'.*: its metric 'mood' {message}"):
        dry_run.finetune(config, registry)  # it said "no problem found"
