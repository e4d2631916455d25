"""Hostile token-id calls to GPTTaskModel and GPTCausalLM: every wrong key, target or shape is named, as text is."""

import threading

import keras
import numpy as np
import pytest
from conftest import TINY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kgpt

V, L = TINY["vocabulary_size"], 8
ONE_PER_EXAMPLE = "one per example"


@pytest.fixture(scope="module")
def task():
    model = kgpt.GPTTaskModel(kgpt.GPTBackbone(**TINY), num_classes=2)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    return model


@pytest.fixture(scope="module")
def lm():
    model = kgpt.GPTCausalLM(kgpt.GPTBackbone(**TINY))
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    return model


def inputs(batch=4, views=1):
    ids = np.random.default_rng(0).integers(0, V, (batch, views, L)).astype("int32")
    return {"token_ids": ids, "padding_mask": np.ones_like(ids)}


def targets(x, task=(0, 1, 1, 0)):
    return {"task": np.asarray(task), "lm": x["token_ids"][..., 1:]}


KEYS = "token-id inputs are a dict {'token_ids': ..., 'padding_mask': ...}"


@pytest.mark.parametrize(
    "x, error, match",
    [
        # Keras matched the keys by position on JAX and returned logits of the wrong arrays.
        (
            {"ids": inputs()["token_ids"], "mask": inputs()["padding_mask"]},
            ValueError,
            r"x has keys \['ids', 'mask'\] \(missing \['token_ids', 'padding_mask'\]; unknown \['ids', 'mask'\]\): "
            + KEYS,
        ),
        (
            {"token_ids": inputs()["token_ids"]},
            ValueError,
            r"missing \['padding_mask'\]\): " + KEYS,
        ),  # JAX: "not connected"
        ({**inputs(), "segment_ids": inputs()["token_ids"]}, ValueError, r"unknown \['segment_ids'\]"),
        (
            {},
            ValueError,
            r"x has keys \[\] \(missing \['token_ids', 'padding_mask'\]\)",
        ),  # KeyError: pop from an empty set
        ([None], TypeError, r"x is a list of NoneType: pass texts, a dict"),  # KeyError: pop from an empty set
        ([1, 2, 3], TypeError, r"x is a list of int: pass texts, a dict .* \[batch, num_views, length\]"),
        (np.ones((2, 1, 4), "int32"), TypeError, "x is a ndarray: pass texts, a dict"),
        (7, TypeError, "x is a int: pass texts"),
        (
            {"token_ids": inputs()["token_ids"] * 1.0, "padding_mask": inputs()["padding_mask"]},
            TypeError,
            r"x\['token_ids'\] must hold integer token ids, got dtype float64",
        ),
        (
            {"token_ids": inputs()["token_ids"][:0], "padding_mask": inputs()["padding_mask"][:0]},
            ValueError,
            r"x\['token_ids'\] is empty",
        ),
        # Two views for a one-view model came back as two rows of logits per example.
        (inputs(batch=2, views=2), ValueError, r"x\['token_ids'\] has 2 views per example .* takes num_views=1"),
        (
            {**inputs(), "padding_mask": np.concatenate([np.ones((4, 1, 4)), np.zeros((4, 1, 4))], -1)[::-1, :, ::-1]},
            ValueError,
            r"x\['padding_mask'\]\[0, 0\] is not right-padded",
        ),
        (
            {**inputs(), "padding_mask": np.zeros((4, 1, L))},
            ValueError,
            r"x\['padding_mask'\]\[0, 0\] has no real token",
        ),
        ([b"a cab"], TypeError, r"x is a list of bytes \(decode bytes to str\)"),
    ],
)
def test_task_predict_names_what_is_wrong_with_x(task, x, error, match):
    with pytest.raises(error, match=match):
        task.predict(x, verbose=0)


@pytest.mark.parametrize(
    "x, error, match",
    [
        ({"ids": np.ones((2, L), "int32")}, ValueError, r"missing \['token_ids', 'padding_mask'\]; unknown \['ids'\]"),
        ({"token_ids": np.ones((2, L), "int32")}, ValueError, r"missing \['padding_mask'\]\): " + KEYS),
        ({}, ValueError, r"x has keys \[\]"),
        ([None], TypeError, "x is a list of NoneType: pass texts"),
        ([1, 2, 3], TypeError, r"x is a list of int: pass texts, .* \[batch, length\]"),
    ],
)
def test_lm_predict_names_what_is_wrong_with_x(lm, x, error, match):
    with pytest.raises(error, match=match):
        lm.predict(x, verbose=0)


@pytest.mark.parametrize(
    "y, match",
    [
        (
            {"task": np.array([0, 1, 7, 0])},
            r"y has keys \['task'\]; the model's outputs are \['lm', 'task'\], so y on "
            r"token ids is \{'task': targets \[batch\], 'lm': x\['token_ids'\]\[..., 1:\]\}",
        ),
        (np.array([0, 1, 1, 0]), r"y is a ndarray; the model's outputs are \['lm', 'task'\]"),
        (  # an optree structure error, after which a TensorFlow model could not fit again
            None,
            r"^(fit|evaluate|train_on_batch)\(\) on token ids needs y, \{'task': targets \[batch\], 'lm': x\['tok",
        ),
        ("task_lm_extra", r"unknown|has keys \['extra', 'lm', 'task'\]"),
        ("task_7", r"y\['task'\]\[2\] is 7: class indices must be in \[0, 2\) \(the head's 2 classes\)"),
        ("task_-1", r"y\['task'\]\[0\] is -1: class indices must be in \[0, 2\)"),
        ("task_0.5", r"y\['task'\] must hold integer class indices, got dtype float64"),
        ("lm_past_vocabulary", rf"y\['lm'\]\[1, 0, 3\] is {V}: token ids must be in \[0, {V}\)"),  # NaN loss on JAX
        ("lm_shape", r"y\['lm'\] must have shape \(4, 1, 7\) \(x\['token_ids'\]\[..., 1:\]"),
        (
            "task_rows",
            rf"y\['task'\] has 3 rows, x\['token_ids'\] has 4: {ONE_PER_EXAMPLE}",
        ),  # Keras' cardinality message
    ],
)
@pytest.mark.parametrize("method", ["fit", "evaluate", "train_on_batch"])
def test_targets_on_token_ids_are_checked(task, method, y, match):
    x = inputs()
    good = targets(x)
    if isinstance(y, str):
        what, value = y.split("_", 1)
        y = dict(good)
        if what == "lm" and value == "past_vocabulary":
            y["lm"] = y["lm"].copy()
            y["lm"][1, 0, 3] = V
        elif what == "lm":
            y["lm"] = y["lm"][..., :-1]
        elif value == "rows":
            y["task"] = y["task"][:3]
        elif value == "lm_extra":
            y["extra"] = y["task"]
        else:
            y["task"] = np.array([0, 1, 1, 0], type(float(value)) if "." in value else "int64")
            y["task"][0 if value == "-1" else 2] = float(value) if "." in value else int(value)
    kwargs = {} if method == "train_on_batch" else {"verbose": 0}
    with pytest.raises(ValueError if "dtype" not in match else TypeError, match=match):
        getattr(task, method)(x, y, **kwargs)
    if y is None and method == "fit":
        task.fit(x, good, **kwargs)  # the model still trains


def test_sample_weights_and_validation_data_are_checked_too(task):
    x = inputs()
    weights = {"task": np.ones(3, "float32"), "lm": x["padding_mask"][..., 1:]}
    with pytest.raises(
        ValueError, match=rf"sample_weight\['task'\] has 3 rows, x\['token_ids'\] has 4: {ONE_PER_EXAMPLE}"
    ):
        task.fit(x, targets(x), sample_weight=weights, verbose=0)
    with pytest.raises(ValueError, match=r"y\['task'\]\[2\] is 9"):
        task.fit(x, targets(x), validation_data=(x, targets(x, (0, 1, 9, 0))), verbose=0)
    with pytest.raises(ValueError, match=r"validation_data\[0\] has keys \['token_ids'\]"):
        task.fit(x, targets(x), validation_data=({"token_ids": x["token_ids"]}, targets(x)), verbose=0)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(-3, 4), min_size=4, max_size=4), st.integers(-2, V + 2))
def test_any_targets_evaluate_finitely_or_are_refused(task, classes, next_token):
    """Class indices and LM targets of any value: in range, a finite loss; out of range, a ValueError naming them."""
    x = inputs()
    y = targets(x, classes)
    y["lm"] = y["lm"].copy()
    y["lm"][3, 0, 6] = next_token
    if min(classes) >= 0 and max(classes) < 2 and 0 <= next_token < V:
        assert np.isfinite(task.evaluate(x, y, verbose=0)).all()
    else:
        with pytest.raises(
            ValueError, match=r"y\['(task|lm)'\]\[[\d, ]+\] is -?\d+: (class indices|token ids) must be"
        ):
            task.evaluate(x, y, verbose=0)


def test_a_model_without_the_lm_output_takes_a_bare_task_array(task):
    model = kgpt.GPTTaskModel(task.backbone, head=kgpt.tasks.heads.MultipleChoiceHead(3), num_views=3, lm_coef=0)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    x = inputs(views=3)
    assert np.isfinite(model.evaluate(x, np.array([0, 2, 1, 1]), verbose=0)).all()
    assert np.isfinite(model.evaluate(x, np.array([[0.0], [2.0], [1.0], [1.0]]), verbose=0)).all()  # Keras' forms
    with pytest.raises(ValueError, match=r"y\['task'\]\[1\] is 3: class indices must be in \[0, 3\)"):
        model.evaluate(x, np.array([0, 3, 1, 1]), verbose=0)
    regression = kgpt.GPTTaskModel(task.backbone, head=kgpt.tasks.heads.RegressionHead(), lm_coef=0)
    with pytest.raises(ValueError, match=r"y\['task'\] holds a non-finite value"):
        regression.evaluate(inputs(), np.array([0.5, np.nan, 1.0, 2.0]), verbose=0)


def test_a_refused_call_leaves_the_model_working(task):
    x = inputs()
    before = task.predict(x, verbose=0)
    for bad in ({"ids": x["token_ids"]}, [None]):
        with pytest.raises((ValueError, TypeError)):
            task.predict(bad, verbose=0)
    np.testing.assert_array_equal(task.predict(x, verbose=0), before)


def test_calls_from_several_threads_equal_sequential_ones(task, lm):
    """On JAX Keras detaches a model's variable values while a loop runs: a predict, score or generate in
    another thread (on this model or one sharing its layers) failed with "'NoneType' object is not callable"."""
    rows = [inputs(batch=n) for n in (1, 2, 3, 4)]
    ids = rows[3]["token_ids"][:, 0]
    calls = [lambda x=x: task.predict(x, verbose=0) for x in rows] + [
        lambda: lm.predict({"token_ids": ids, "padding_mask": np.ones_like(ids)}, verbose=0),
        lambda: lm.score(ids),
        lambda: np.asarray(lm.evaluate({"token_ids": ids, "padding_mask": np.ones_like(ids)}, ids, verbose=0)),
        lambda: lm.generate([[5, 6]], max_length=10)["token_ids"],
    ]
    lm.compile(optimizer=keras.optimizers.Adam(1e-3), sampler="greedy")
    assert_threads_equal_sequential(calls, copies=2)


def assert_threads_equal_sequential(calls, copies):
    """Runs `copies` of each call at once in threads: each result equals the call's run alone."""
    expected = [call() for call in calls]
    results, errors = [None] * (copies * len(calls)), []

    def worker(i):
        try:
            results[i] = calls[i % len(calls)]()
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a call hung"
    assert not errors, errors
    for i, result in enumerate(results):
        np.testing.assert_allclose(result, expected[i % len(calls)], rtol=1e-5, atol=1e-6)


def test_evaluates_from_several_threads_report_their_own_metrics(task, lm):
    """`evaluate` resets and updates the model's metric trackers: on TensorFlow two at once in threads read each
    other's state (8 of 40 losses were 0.0 or another call's)."""
    x = inputs()
    ids = x["token_ids"][:, 0]
    calls = [
        lambda: np.asarray(task.evaluate(x, targets(x), verbose=0)),
        lambda: np.asarray(lm.evaluate({"token_ids": ids, "padding_mask": np.ones_like(ids)}, ids, verbose=0)),
    ]
    assert_threads_equal_sequential(calls, copies=8)
