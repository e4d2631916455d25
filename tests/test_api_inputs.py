"""Hostile calls to the Python API: each bad argument is refused by name, nothing wrong comes back silently."""

import os
import threading
import warnings

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kgpt
from conftest import TINY, newline_tokenizer, text_lm, to_numpy
from kgpt.models import inputs as checks


@pytest.fixture(scope="module")
def lm():
    keras.utils.set_random_seed(7)
    model = text_lm(newline_tokenizer())
    table = model.backbone.token_embedding.embeddings
    table.assign(to_numpy(table) * 20)  # far-apart logits: greedy has no ties
    model.compile(sampler="greedy")
    return model


# --- generation from many threads -------------------------------------------------------------

def test_generation_from_threads_equals_sequential_calls(lm):
    tokenizer = lm.preprocessor.tokenizer
    texts = ["a cab", "the dog", "a dog ran", "cab"]
    calls = [("text", t) for t in texts] + [("ids", [tokenizer.encode(t)]) for t in texts]

    def call(kind, value):
        out = lm.generate(value, max_length=12)
        return out if kind == "text" else out["token_ids"].tolist()

    expected = [call(*c) for c in calls]
    results, errors = [None] * (3 * len(calls)), []

    def worker(i):
        try:
            results[i] = call(*calls[i % len(calls)])
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a generate() call hung"
    assert not errors, errors
    assert results == expected * 3
    assert lm.preprocessor is not None  # never detached, not even for a moment


def test_generate_on_ids_leaves_the_inputs_and_model_alone(lm):
    packed = lm._pack_prompts([[5, 6, 7]], 10)
    before = {k: v.copy() for k, v in packed.items()}
    preprocessor = lm.preprocessor
    stripped = lm.generate(packed, strip_prompt=True)
    full = lm.generate(packed)
    for key in packed:
        np.testing.assert_array_equal(packed[key], before[key])
    assert lm.preprocessor is preprocessor
    # The prompt rolled to the end, masked out: the continuation first, as keras-hub's strip_prompt gives it.
    np.testing.assert_array_equal(stripped["token_ids"][0, :7], full["token_ids"][0, 3:])
    np.testing.assert_array_equal(stripped["padding_mask"][0], np.arange(10) < 7)


# --- bad arguments ------------------------------------------------------------------------------

@pytest.mark.parametrize("max_length, error, match", [
    (0, ValueError, "max_length must be an integer >= 2, got 0"),
    (-3, ValueError, "got -3"),
    (1, ValueError, "got 1"),
    (17, ValueError, "Sequence length 17 exceeds the model's context max_sequence_length=16"),
    (2.5, TypeError, "max_length must be an integer, got 2.5"),
    (True, TypeError, "max_length must be an integer, got True"),
    ("8", TypeError, "max_length must be an integer"),
])
def test_generate_refuses_bad_max_length(lm, max_length, error, match):
    for prompt in ("a cab", [[5, 6]]):
        with pytest.raises(error, match=match):
            lm.generate(prompt, max_length=max_length)


@pytest.mark.parametrize("inputs, error, match", [
    (["a cab", 5], TypeError, "mixes strings with token ids"),
    ([["a"], [5]], TypeError, "must hold integer token ids, got strings"),
    ([5, 6, 7], TypeError, r"\[\[5, 6, 7\]\]\), not a flat list"),
    ([], ValueError, "no prompts"),
    (None, TypeError, "got NoneType"),
    ([[5, 99]], ValueError, r"prompt 0\[0, 1\] is 99: token ids must be in \[0, 99\)"),
    ([[5, -1]], ValueError, r"is -1: token ids must be in \[0, 99\)"),
    ([[5.0, 6.0]], TypeError, "must hold integer token ids, got dtype float64"),
    ([[]], ValueError, "prompt 0 is empty"),
    ({"token_ids": np.zeros((1, 8), "int32")}, ValueError, r"missing \['padding_mask'\]"),
    ({"token_ids": np.full((1, 8), 200), "padding_mask": np.ones((1, 8))}, ValueError, "is 200"),
    ({"token_ids": np.zeros((1, 8), "int32"), "padding_mask": np.full((1, 8), 2)}, ValueError, "only 0 and 1"),
    ({"token_ids": np.zeros((1, 8), "int32"), "padding_mask": np.ones((1, 8))}, ValueError, "no room"),
])
def test_generate_refuses_bad_prompts(lm, inputs, error, match):
    with pytest.raises(error, match=match):
        lm.generate(inputs, max_length=8 if not isinstance(inputs, dict) else None)


def test_generate_refuses_max_length_a_packed_dict_ignores(lm):
    packed = lm._pack_prompts([[5, 6]], 8)
    with pytest.raises(ValueError, match="max_length=12, but the token_ids are padded to 8"):
        lm.generate(packed, max_length=12)


@pytest.mark.parametrize("stop, error, match", [
    ("5", TypeError, "stop_token_ids must be None or a list"),
    ([99], ValueError, "each of stop_token_ids must be an integer between 0 and 98, got 99"),
    ([1.5], TypeError, "each of stop_token_ids must be an integer"),
])
def test_generate_refuses_bad_stop_token_ids(lm, stop, error, match):
    with pytest.raises(error, match=match):
        lm.generate([[5, 6]], max_length=8, stop_token_ids=stop)


def test_one_stop_token_id_is_taken_as_a_list(lm):
    np.testing.assert_array_equal(lm.generate([[5, 6]], max_length=8, stop_token_ids=9)["token_ids"],
                                  lm.generate([[5, 6]], max_length=8, stop_token_ids=[9])["token_ids"])


@pytest.mark.parametrize("token_ids, mask, error, match", [
    (np.full((1, 4), 99), None, ValueError, r"token_ids\[0, 0\] is 99"),
    (np.array([[3, -2, 4]]), None, ValueError, r"token_ids\[0, 1\] is -2"),
    (np.ones((1, 4), "float32"), None, TypeError, "integer token ids, got dtype float32"),
    ([[1, 2], [3]], None, ValueError, "rectangular"),
    (np.ones((0, 4), "int32"), None, ValueError, "is empty"),
    (np.ones((2, 4), "int32"), np.ones((2, 3)), ValueError, r"shape of token_ids \(2, 4\)"),
    (np.ones((2, 4), "int32"), np.full((2, 4), 0.5), ValueError, "only 0 and 1"),
])
def test_score_refuses_bad_ids(lm, token_ids, mask, error, match):
    with pytest.raises(error, match=match):
        lm.score(token_ids, mask)


def test_score_refuses_bad_batch_size(lm):
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        lm.score(np.ones((1, 4), "int32"), batch_size=0)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.integers(0, 98), st.integers(-(2**40), 2**40)), min_size=6, max_size=6))
def test_score_is_finite_or_refused(lm, ids):
    """Any integer ids: in range, finite log-probabilities; out of range, a ValueError naming token_ids."""
    array = np.array([ids])
    if array.min() >= 0 and array.max() < lm.backbone.vocabulary_size:
        scores = lm.score(array)
        assert scores.shape == (1, 5) and np.isfinite(scores).all() and (scores <= 0).all()
    else:
        with pytest.raises(ValueError, match=r"token_ids\[0, \d\] is -?\d+: token ids must be in \[0, 99\)"):
            lm.score(array)


# --- fit on text -----------------------------------------------------------------------------------

def test_fit_on_text_refuses_what_it_cannot_train_on():
    lm = text_lm(newline_tokenizer(), sequence_length=8)
    lm.compile(optimizer=keras.optimizers.Adam(1e-3))
    with pytest.raises(ValueError, match="nothing to predict"):
        lm.fit([""], verbose=0)
    with pytest.raises(ValueError, match="takes no y"):
        lm.fit(["a cab", "the dog"], np.array([0, 1]), verbose=0)
    with pytest.raises(ValueError, match="fit.. got no examples: x is empty"):
        lm.fit([], verbose=0)
    with pytest.raises(ValueError, match="evaluate.. on text uses each text's own next tokens .* takes no y"):
        lm.evaluate(["a cab"], np.array([1]), verbose=0)
    with pytest.raises(ValueError, match="evaluate.. got 1 text.s. with nothing to predict"):
        lm.evaluate(["a"], verbose=0)
    with pytest.raises(ValueError, match="predict.. got no examples"):
        lm.predict([], verbose=0)
    with pytest.raises(ValueError, match=r"x\['token_ids'\] is empty"):
        lm.fit({"token_ids": np.zeros((0, 8), "int32"), "padding_mask": np.zeros((0, 8), "int32")}, verbose=0)
    ids = np.full((2, 8), 3, "int32")
    with pytest.raises(ValueError, match=r"x\['token_ids'\]\[1, 7\] is 99"):
        lm.fit({"token_ids": np.where(np.arange(16).reshape(2, 8) == 15, 99, ids), "padding_mask": ids * 0 + 1},
               ids, verbose=0)
    with pytest.raises(ValueError, match=r"y\[0, 0\] is -1"):
        lm.fit({"token_ids": ids, "padding_mask": ids * 0 + 1}, ids - 4, verbose=0)
    # After every refusal the model still trains (TensorFlow kept a half-built train function before).
    history = lm.fit(["a cab ran", "the dog"], batch_size=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_fit_on_text_counts_cut_and_empty_texts():
    lm = text_lm(newline_tokenizer(), sequence_length=8)
    lm.compile(optimizer=keras.optimizers.Adam(1e-3))
    texts = ["a cab", "", "the dog ran far away", "abcdefghij"]  # tokens: 4, 0, 16, 10
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm.fit(texts, batch_size=2, verbose=0)
    said = [str(w.message) for w in caught]
    assert any("1 of 4 texts have fewer than 2 tokens" in m for m in said), said
    assert any("2 of 4 texts are longer than sequence_length=8" in m and "8 tokens past it are not trained on" in m
               for m in said), said
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logits = lm.predict(texts[2:], batch_size=2, verbose=0)
    assert logits.shape == (2, 8, lm.backbone.vocabulary_size)
    assert any("2 of 2 texts are longer" in str(w.message) and "not predicted" in str(w.message) for w in caught)


# --- the tokenizer ---------------------------------------------------------------------------------

def test_tokenizer_training_refuses_bad_arguments(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text("the keeper climbed the tower and the keeper slept\n" * 20)
    with pytest.raises(TypeError, match=r"single path .*pass \['"):
        kgpt.GPTTokenizer.train(str(text), num_merges=10)
    with pytest.raises(ValueError, match="got no files"):
        kgpt.GPTTokenizer.train([], num_merges=10)
    with pytest.raises(ValueError, match="num_merges must be an integer >= 0, got -1"):
        kgpt.GPTTokenizer.train([text], num_merges=-1)
    with pytest.raises(TypeError, match="num_merges must be an integer, got 2.5"):
        kgpt.GPTTokenizer.train([text], num_merges=2.5)
    with pytest.raises(ValueError, match="min_frequency must be an integer >= 1, got 0"):
        kgpt.GPTTokenizer.train([text], num_merges=10, min_frequency=0)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    with pytest.raises(ValueError, match="found no text in .*empty.txt"):
        kgpt.GPTTokenizer.train([empty], num_merges=10)
    tokenizer = kgpt.GPTTokenizer.train([text], num_merges=10)  # a path object is fine
    assert tokenizer.decode(tokenizer.encode("the keeper")) == "the keeper"


# --- presets ---------------------------------------------------------------------------------------

def test_a_save_replaces_the_preset_in_the_folder(tmp_path, lm):
    folder = str(tmp_path / "preset")
    lm.save_to_preset(folder)
    assert os.path.isfile(os.path.join(folder, "task.json"))
    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": lm.backbone.vocabulary_size})
    backbone.save_to_preset(folder)
    # The causal LM's files went with it: the folder is the new backbone's preset, loadable as one.
    assert not os.path.exists(os.path.join(folder, "task.json"))
    assert not os.path.exists(os.path.join(folder, "preprocessor.json"))
    loaded = kgpt.GPTBackbone.from_preset(folder)
    for a, b in zip(loaded.weights, backbone.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    assert sorted(os.listdir(folder)) == ["assets", "config.json", "metadata.json", "model.weights.h5",
                                          "tokenizer.json"]


def test_an_interrupted_save_leaves_the_old_preset(tmp_path, lm, monkeypatch):
    from keras_hub.src.utils import preset_utils

    folder = str(tmp_path / "preset")
    lm.save_to_preset(folder)
    before = lm.generate("a cab", max_length=10)
    other = text_lm(newline_tokenizer())

    def crash(self, *args, **kwargs):
        raise KeyboardInterrupt  # as if the process were stopped while the weights were written

    monkeypatch.setattr(preset_utils.KerasPresetSaver, "save_backbone", crash)
    with pytest.raises(KeyboardInterrupt):
        other.save_to_preset(folder)
    monkeypatch.undo()
    again = kgpt.GPTCausalLM.from_preset(folder)
    again.compile(sampler="greedy")
    assert again.generate("a cab", max_length=10) == before
    other.save_to_preset(folder)  # the next save clears what the interrupted one left
    assert ".preset.partial" not in os.listdir(folder)


def test_checks_name_the_argument():
    assert checks.positive_int(np.int64(3), "n") == 3
    with pytest.raises(TypeError, match="n must be an integer, got None"):
        checks.positive_int(None, "n")
    assert checks.positive_int(None, "n", allow_none=True) is None
