"""kgpt.data.inputs_kind: text or token ids, one answer for every model."""

import numpy as np
import pytest
import tensorflow as tf

from kgpt.data import inputs_kind


@pytest.mark.parametrize(
    "x, text",
    [
        ("a film", True),
        (b"a film", True),
        (["a", b"b"], True),
        (("a", "b"), True),
        (np.array(["a", "b"]), True),
        (tf.constant(["a"]), True),
        ([], False),
        (["a", 1], False),
        ([[1, 2]], False),
        (np.array([[1, 2]]), False),
        (tf.constant([1]), False),
        ({"token_ids": np.ones((1, 2))}, False),
    ],
)
def test_is_text(x, text):
    assert inputs_kind.is_text(x) is text


@pytest.mark.parametrize(
    "x, text",
    [
        (["a", "b"], True),
        ([], True),
        ([["premise", "hypothesis"]], True),
        ((["p"], ["h"]), True),
        (np.array(["a"], dtype=object), True),
        (tf.constant([["a", "b"]]), True),
        (b"bytes", False),
        ((), False),
        ([[1, 2]], False),
        (np.array([1, 2]), False),
        (None, False),
    ],
)
def test_is_text_columns(x, text):
    assert inputs_kind.is_text_columns(x) is text


def test_is_text_dataset_reads_the_inputs_of_x_y():
    texts = tf.data.Dataset.from_tensor_slices((["a", "b"], [0, 1]))
    ids = tf.data.Dataset.from_tensor_slices(({"token_ids": [[1, 2]]}, [0]))
    assert inputs_kind.is_text_dataset(texts) and inputs_kind.is_text_dataset(texts.map(lambda x, y: x))
    assert not inputs_kind.is_text_dataset(ids) and not inputs_kind.is_text_dataset(["a"])


def test_texts_gives_strings_and_whether_a_batch_and_names_the_caller():
    assert inputs_kind.texts(b"caf\xc3\xa9", "tokenize()") == (["café"], False)
    assert inputs_kind.texts(np.array(["a", "b"]), "x") == (["a", "b"], True)
    assert inputs_kind.texts(tf.constant("a"), "x") == (["a"], False)
    with pytest.raises(TypeError, match=r"^tokenize\(\) takes strings; the list holds int\.$"):
        inputs_kind.texts(["a", 1], "tokenize()")
    with pytest.raises(TypeError, match=r"^x takes string tensors, got int32\.$"):
        inputs_kind.texts(tf.constant([1]), "x")
    with pytest.raises(ValueError, match=r"^x takes a string or a rank-1 batch of strings, got shape \(1, 1\)\.$"):
        inputs_kind.texts(np.array([["a"]]), "x")
    with pytest.raises(TypeError, match=r"^x takes a str, a list of str or a string tensor, got dict\.$"):
        inputs_kind.texts({}, "x")


def test_as_list_decodes_a_batch_and_leaves_its_items_to_the_caller():
    assert inputs_kind.as_list("a", "x") == ["a"]
    assert inputs_kind.as_list((b"a", None), "x") == ["a", None]
    assert inputs_kind.as_list(tf.constant(["a", "b"]), "x") == ["a", "b"]
    assert inputs_kind.as_list(np.array(["a"], dtype=object), "x") == ["a"]
    with pytest.raises(TypeError, match=r"^segment 1: expected strings, got int\.$"):
        inputs_kind.as_list(3, "segment 1")
