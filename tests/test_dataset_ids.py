"""Token ids inside a tf.data.Dataset are checked as each batch is read (they cannot be checked before the call)."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY

import kgpt
from kgpt import checks

V, T = TINY["vocabulary_size"], 8


@pytest.fixture(scope="module")
def lm():
    model = kgpt.GPTCausalLM(kgpt.GPTBackbone(**TINY))
    model.compile(optimizer="adam")
    return model


def windows(bad=None, batch=8, row=5):
    ids = np.random.default_rng(0).integers(0, V, (batch, T + 1)).astype("int32")
    if bad is not None:
        ids[row, 3] = bad
    x = {"token_ids": ids[:, :-1].copy(), "padding_mask": np.ones((batch, T), "int32")}
    return x, ids[:, 1:].copy()


@pytest.mark.parametrize("bad", [V, -1])
@pytest.mark.parametrize("method", ["fit", "evaluate", "predict"])
def test_an_id_out_of_range_in_a_dataset_is_a_value_error_naming_it(lm, method, bad):
    x, y = windows(bad)
    ds = tf.data.Dataset.from_tensor_slices((x, y) if method != "predict" else x).batch(4)
    with pytest.raises(ValueError, match=rf"out of range at x token_ids: token ids must be in 0\.\.{V - 1}"):
        getattr(lm, method)(ds, verbose=0)


def test_a_target_out_of_range_is_named_as_y(lm):
    x, y = windows()
    y[2, 2] = V + 5
    with pytest.raises(ValueError, match="out of range at y"):
        lm.evaluate(tf.data.Dataset.from_tensor_slices((x, y)).batch(4), verbose=0)


def test_a_dataset_of_valid_ids_gives_what_arrays_give(lm):
    x, y = windows()
    from_arrays = lm.evaluate(x, y, batch_size=4, verbose=0)
    from_dataset = lm.evaluate(tf.data.Dataset.from_tensor_slices((x, y)).batch(4), verbose=0)
    np.testing.assert_allclose(from_dataset, from_arrays, rtol=1e-6)


def test_the_task_model_checks_its_datasets_too():
    model = kgpt.GPTTaskModel(kgpt.GPTBackbone(**TINY), head=kgpt.tasks.heads.ClassificationHead(["a", "b"]))
    ids = np.random.default_rng(1).integers(0, V, (4, 1, T)).astype("int32")
    ids[1, 0, 2] = V
    x = {"token_ids": ids, "padding_mask": np.ones((4, 1, T), "int32")}
    with pytest.raises(ValueError, match="out of range at x token_ids"):
        model.predict(tf.data.Dataset.from_tensor_slices(x).batch(2), verbose=0)


def test_other_datasets_and_inputs_pass_unchanged():
    texts = tf.data.Dataset.from_tensor_slices(["some text", "more"])
    assert checks.dataset_ids(texts, V).element_spec == texts.element_spec
    assert list(checks.dataset_ids(texts, V).as_numpy_iterator()) == [b"some text", b"more"]
    arrays = windows()
    assert checks.dataset_ids(arrays, V) is arrays


def test_a_model_whose_dataset_failed_still_works(lm):
    """Keras' JAX trainer detaches the weights while it loops; a failed read must not leave them detached."""
    x, y = windows()
    before = lm.evaluate(x, y, batch_size=4, verbose=0)
    for method, row in (("fit", 1), ("evaluate", 5)):  # fit: in the first batch, before any step
        with pytest.raises(ValueError, match="out of range"):
            getattr(lm, method)(tf.data.Dataset.from_tensor_slices(windows(bad=V, row=row)).batch(4), verbose=0)
        np.testing.assert_allclose(lm.evaluate(x, y, batch_size=4, verbose=0), before, rtol=1e-6)
