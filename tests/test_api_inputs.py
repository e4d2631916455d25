"""Hostile calls to the Python API: each bad argument is refused by name, nothing wrong comes back silently."""

import os
import shutil
import threading
import warnings

import keras
import keras_hub
import numpy as np
import pytest
from conftest import TINY, newline_tokenizer, text_lm, to_numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kgpt
from kgpt import checks


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


def test_a_random_sampler_from_threads_draws_as_sequential_calls_do():
    keras.utils.set_random_seed(3)
    model = kgpt.GPTCausalLM(kgpt.GPTBackbone(**TINY))
    model.compile(sampler=keras_hub.samplers.TopKSampler(k=50, seed=5))
    (seed,) = model.sampler.variables
    model.generate([[5, 6]], max_length=16)  # compiled before the calls compared
    start = to_numpy(seed).copy()
    sequential = [model.generate([[5, 6]], max_length=16)["token_ids"].tolist() for _ in range(6)]
    end = to_numpy(seed).copy()
    seed.assign(start)
    results, errors = [None] * 6, []

    def worker(i):
        try:
            results[i] = model.generate([[5, 6]], max_length=16)["token_ids"].tolist()
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a generate() call hung"
    assert not errors, errors
    # Each call drew its own numbers: no two threads shared a seed, no advance of it was lost.
    np.testing.assert_array_equal(to_numpy(seed), end)
    assert sorted(map(str, results)) == sorted(map(str, sequential))
    assert len(set(map(str, sequential))) > 1  # the sampler does draw: the check above can fail


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


@pytest.mark.parametrize(
    "max_length, error, match",
    [
        (0, ValueError, "max_length must be an integer >= 2, got 0"),
        (-3, ValueError, "got -3"),
        (1, ValueError, "got 1"),
        (17, ValueError, "max_length is 17, more than the model's context max_sequence_length=16"),
        (2.5, TypeError, "max_length must be an integer, got 2.5"),
        (True, TypeError, "max_length must be an integer, got True"),
        ("8", TypeError, "max_length must be an integer"),
    ],
)
def test_generate_refuses_bad_max_length(lm, max_length, error, match):
    for prompt in ("a cab", [[5, 6]]):
        with pytest.raises(error, match=match):
            lm.generate(prompt, max_length=max_length)


@pytest.mark.parametrize(
    "inputs, error, match",
    [
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
    ],
)
def test_generate_refuses_bad_prompts(lm, inputs, error, match):
    with pytest.raises(error, match=match):
        lm.generate(inputs, max_length=8 if not isinstance(inputs, dict) else None)


def test_generate_refuses_max_length_a_packed_dict_ignores(lm):
    packed = lm._pack_prompts([[5, 6]], 8)
    with pytest.raises(ValueError, match="max_length=12, but the token_ids are padded to 8"):
        lm.generate(packed, max_length=12)


@pytest.mark.parametrize(
    "stop, error, match",
    [
        ("5", TypeError, "stop_token_ids must be None or a list"),
        ([99], ValueError, "each of stop_token_ids must be an integer between 0 and 98, got 99"),
        ([1.5], TypeError, "each of stop_token_ids must be an integer"),
    ],
)
def test_generate_refuses_bad_stop_token_ids(lm, stop, error, match):
    with pytest.raises(error, match=match):
        lm.generate([[5, 6]], max_length=8, stop_token_ids=stop)


def test_one_stop_token_id_is_taken_as_a_list(lm):
    np.testing.assert_array_equal(
        lm.generate([[5, 6]], max_length=8, stop_token_ids=9)["token_ids"],
        lm.generate([[5, 6]], max_length=8, stop_token_ids=[9])["token_ids"],
    )


@pytest.mark.parametrize(
    "token_ids, mask, error, match",
    [
        (np.full((1, 4), 99), None, ValueError, r"token_ids\[0, 0\] is 99"),
        (np.array([[3, -2, 4]]), None, ValueError, r"token_ids\[0, 1\] is -2"),
        (np.ones((1, 4), "float32"), None, TypeError, "integer token ids, got dtype float32"),
        ([[1, 2], [3]], None, ValueError, "rectangular"),
        (np.ones((0, 4), "int32"), None, ValueError, "is empty"),
        (np.ones((2, 4), "int32"), np.ones((2, 3)), ValueError, r"shape of token_ids \(2, 4\)"),
        (np.ones((2, 4), "int32"), np.full((2, 4), 0.5), ValueError, "only 0 and 1"),
        # Both were "got strings".
        (None, None, TypeError, r"integer token ids, got None\.$"),
        ({"token_ids": np.ones((1, 4), "int32")}, None, TypeError, r"integer token ids, got a dict\.$"),
        ([[1, 2**70]], None, TypeError, r"integer token ids, got integers past int64\.$"),  # a StopIteration
        (["a cab", None], None, TypeError, r"integer token ids, got strings mixed with None\.$"),  # was "strings"
    ],
)
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
        lm.fit(
            {"token_ids": np.where(np.arange(16).reshape(2, 8) == 15, 99, ids), "padding_mask": ids * 0 + 1},
            ids,
            verbose=0,
        )
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
    assert any(
        "2 of 4 texts are longer than sequence_length=8" in m and "8 tokens past it are not trained on" in m
        for m in said
    ), said
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
    # The causal LM's tokenizer too: this backbone, of another config, was not trained with it (it stayed, and
    # loaded with it silently at the same vocabulary size).
    assert sorted(os.listdir(folder)) == ["config.json", "metadata.json", "model.weights.h5"]


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


# --- constructors, layers and presets: the wider hostile set -----------------------------------------


def backbone_with(**overrides):
    return lambda: kgpt.GPTBackbone(**{**TINY, **overrides})


@pytest.mark.parametrize(
    "build, error, match",
    [
        (backbone_with(num_layers=0), ValueError, "num_layers must be an integer >= 1, got 0"),
        (backbone_with(num_heads=0), ValueError, "num_heads must be an integer >= 1, got 0"),
        (backbone_with(hidden_dim=-16), ValueError, "hidden_dim must be an integer >= 1, got -16"),
        (backbone_with(hidden_dim=16.0), TypeError, "hidden_dim must be an integer, got 16.0"),
        (backbone_with(intermediate_dim=0), ValueError, "intermediate_dim must be"),
        (backbone_with(vocabulary_size=0), ValueError, "vocabulary_size must be"),
        (backbone_with(max_sequence_length=8.5), TypeError, "max_sequence_length must be an integer, got 8.5"),
        (backbone_with(max_sequence_length=0), ValueError, "max_sequence_length must be"),
        (backbone_with(dropout=1.5), ValueError, r"dropout must be a number in \[0, 1\), got 1.5"),
        (backbone_with(attention_dropout=2.0), ValueError, "attention_dropout must be a number"),
        (backbone_with(initializer_range=float("nan")), ValueError, "initializer_range must be a finite number > 0"),
        (backbone_with(dtype="int8"), ValueError, r"dtype must name a float or mixed policy .* got 'int8'.*quantize"),
        (backbone_with(dtype="int8_from_float32"), ValueError, "dtype must name a float or mixed policy"),
        (backbone_with(dtype="float64x"), ValueError, "dtype must name a float or mixed policy"),
    ],
)
def test_backbone_refuses_bad_sizes(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_backbone_call_checks_host_arrays():
    backbone = kgpt.GPTBackbone(**TINY)
    ids = np.ones((2, 8), "int32")
    mask = np.ones((2, 8), "int32")
    with pytest.raises(ValueError, match=r"inputs\['token_ids'\]\[0, 0\] is 97"):
        backbone({"token_ids": ids * 97, "padding_mask": mask})
    with pytest.raises(ValueError, match=r"is -1"):
        backbone({"token_ids": -ids, "padding_mask": mask})
    with pytest.raises(TypeError, match="integer token ids, got dtype float64"):
        backbone({"token_ids": ids * 3.5, "padding_mask": mask})
    with pytest.raises(
        ValueError, match=r"The length of x\['token_ids'\] is 32, more than the model's context max_sequence_length=16"
    ):
        backbone.predict({"token_ids": np.ones((2, 32), "int32"), "padding_mask": np.ones((2, 32), "int32")}, verbose=0)
    with pytest.raises(ValueError, match=r"inputs\['padding_mask'\] must have the shape of token_ids \(2, 8\)"):
        backbone({"token_ids": ids, "padding_mask": mask[:, :5]})
    # The model still works after each refusal (a failed over-long call broke it on JAX before).
    assert to_numpy(backbone({"token_ids": ids, "padding_mask": mask})).shape == (2, 8, TINY["hidden_dim"])


def test_models_refuse_a_tokenizer_larger_than_the_vocabulary():
    from kgpt.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor

    small = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": 20})
    with pytest.raises(ValueError, match="tokenizer has 99 ids, more than the backbone's vocabulary_size=20"):
        kgpt.GPTCausalLM(small, preprocessor=GPTCausalLMPreprocessor(newline_tokenizer(), 16))


def test_task_model_refuses_bad_settings():
    from kgpt.tasks.heads import ClassificationHead

    backbone = kgpt.GPTBackbone(**TINY)
    for kwargs, error, match in [
        ({"lm_coef": float("nan")}, ValueError, "lm_coef must be a finite number >= 0, got nan"),
        ({"num_views": 0}, ValueError, "num_views must be an integer >= 1, got 0"),
        ({"classifier_dropout": 1.5}, ValueError, "classifier_dropout must be a number in"),
    ]:
        with pytest.raises(error, match=match):
            kgpt.GPTTaskModel(backbone, head=ClassificationHead(["a", "b"]), **kwargs)


def test_models_name_a_keyword_argument_keras_would_drop():
    from kgpt.tasks.heads import ClassificationHead

    backbone = kgpt.GPTBackbone(**TINY, name="gpt", trainable=True)  # Keras' own pass
    lstm = dict(vocabulary_size=50, hidden_dim=8, lstm_units=8)
    for build, owner in [
        (lambda **kw: kgpt.GPTBackbone(**TINY, **kw), "GPTBackbone"),
        (lambda **kw: kgpt.LSTMBackbone(**lstm, **kw), "LSTMBackbone"),
        (lambda **kw: kgpt.GPTCausalLM(backbone, **kw), "GPTCausalLM"),
        (lambda **kw: kgpt.GPTTaskModel(backbone, head=ClassificationHead(["a", "b"]), **kw), "GPTTaskModel"),
    ]:
        with pytest.raises(TypeError, match=rf"^{owner} got an unexpected keyword argument 'dropuot'\.$"):
            build(dropuot=0.2)  # was dropped silently: the model trained with the default rate
        with pytest.raises(TypeError, match=rf"^{owner} got unexpected keyword arguments 'a', 'b'\.$"):
            build(b=1, a=2)
    kgpt.GPTCausalLM(backbone, compile=False, name="lm")


def test_causal_lm_preprocessor_refuses_bad_arguments():
    from kgpt.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor

    tokenizer = newline_tokenizer()
    for args, error, match in [
        ((tokenizer, 0), ValueError, "sequence_length must be an integer >= 1, got 0"),
        ((tokenizer, 2.5), TypeError, "sequence_length must be an integer, got 2.5"),
        ((tokenizer, "8"), TypeError, "sequence_length must be an integer"),
        ((None, 8), TypeError, "tokenizer must be a kgpt.GPTTokenizer, got None"),
        (("gpt1", 8), TypeError, "tokenizer must be a kgpt.GPTTokenizer, got 'gpt1'"),
    ]:
        with pytest.raises(error, match=match):
            GPTCausalLMPreprocessor(*args)
    preprocessor = GPTCausalLMPreprocessor(tokenizer, 8)
    with pytest.raises(ValueError, match="got no texts"):
        preprocessor([])
    with pytest.raises(ValueError, match="takes no y"):
        preprocessor(["a cab"], y=[1])
    with pytest.raises(ValueError, match="sequence_length must be an integer >= 2, got 0"):
        preprocessor.generate_preprocess(["a cab"], sequence_length=0)


def test_tokenizer_refuses_bad_ids_and_encoders():
    tokenizer = newline_tokenizer()
    for ids, error, match in [
        ([2.7], TypeError, "integer token ids, got float64"),
        ([True, 2], TypeError, "integer token ids"),
        (None, TypeError, "sequence of token ids, got None"),
        (5, TypeError, "sequence of token ids, got 5"),
        ("abc", TypeError, "sequence of token ids, got 'abc'"),
        ([[1, 2], [3]], ValueError, "rows of different lengths"),
        (np.ones((2, 2), "int32"), ValueError, r"got shape \(2, 2\)"),
    ]:
        with pytest.raises(error, match=match):
            tokenizer.decode(ids)
    assert tokenizer.decode([]) == ""
    with pytest.raises(ValueError, match="ids run from 0 to 5 with gaps"):
        kgpt.GPTTokenizer({"a</w>": 0, "b</w>": 5}, [])
    with pytest.raises(ValueError, match="id 0 is given to more than one symbol"):
        kgpt.GPTTokenizer({"a</w>": 0, "b</w>": 0}, [])
    with pytest.raises(TypeError, match="encoder must be a dict"):
        kgpt.GPTTokenizer(["a</w>"], [])


def test_fit_and_predict_refuse_bad_batches(lm):
    task = kgpt.GPTTaskModel(lm.backbone, head=kgpt.tasks.heads.ClassificationHead(["a", "b"]))
    for call in (
        lambda: lm.fit(["a cab"], batch_size=0),
        lambda: lm.predict(["a cab"], batch_size=-2),
        lambda: task.predict(["a cab"], batch_size=0),
        lambda: task.fit(["a"], ["a"], batch_size=2.5),
    ):
        with pytest.raises((ValueError, TypeError), match="batch_size must be an integer"):
            call()
    with pytest.raises(TypeError, match="x.0. is None, not text"):
        lm.fit([None, "a cab"])
    for call in (lambda: task.predict(None), lambda: task.fit(None), lambda: lm.predict(None), lambda: lm.fit(None)):
        with pytest.raises(TypeError, match="x is None: pass texts, token ids or a tf.data.Dataset"):
            call()
    ids = np.ones((2, 8), "int32")
    with pytest.raises(ValueError, match=r"y must have the shape of x\['token_ids'\] \(2, 8\).*got \(2, 5\)"):
        lm.fit({"token_ids": ids, "padding_mask": ids}, ids[:, :5], verbose=0)
    for method in ("fit", "evaluate"):  # AttributeError: 'NoneType' object has no attribute 'shape'
        with pytest.raises(ValueError, match=rf"^{method}\(\) on token ids needs y, the next token at each position"):
            getattr(lm, method)({"token_ids": ids, "padding_mask": ids}, verbose=0)
    lm.fit({"token_ids": ids, "padding_mask": ids}, ids, verbose=0)  # the model still trains (TensorFlow could not)
    import tensorflow as tf  # a dataset of token ids without y, likewise

    alone = tf.data.Dataset.from_tensor_slices({"token_ids": ids, "padding_mask": ids}).batch(2)
    with pytest.raises(ValueError, match=r"^fit\(\) on a tf.data.Dataset of token ids needs \(x, y\) elements"):
        lm.fit(alone, verbose=0)
    lm.fit({"token_ids": ids, "padding_mask": ids}, ids, verbose=0)
    # None: generate() failed with AttributeError; "Greedy": keras-hub's KeyError.
    for sampler in ("nucleus", None, "Greedy"):
        with pytest.raises(ValueError, match=rf"^sampler={sampler!r} is not a keras-hub sampler"):
            text_lm(newline_tokenizer()).compile(sampler=sampler)
    # keras-hub ran these without a word (temperature 0 gave id 0 everywhere, a negative one the least likely
    # tokens, p past 1 was clipped) or failed inside generate() (k of 0 or past the vocabulary, 0 beams).
    model = text_lm(newline_tokenizer())
    samplers = keras_hub.samplers
    too_many = model.backbone.vocabulary_size + 1
    for sampler, message in [
        (samplers.TopKSampler(k=5, temperature=0.0), "TopKSampler temperature must be a finite number > 0, got 0.0"),
        (samplers.GreedySampler(temperature=-1.0), "GreedySampler temperature must be a finite number > 0"),
        (samplers.TopKSampler(k=0), "TopKSampler k must be an integer between 1 and"),
        (samplers.TopKSampler(k=too_many), f"TopKSampler k must be an integer between 1 and {too_many - 1}, got"),
        (samplers.TopPSampler(p=1.5), r"TopPSampler p must be a number in \(0, 1\], got 1.5"),
        (samplers.TopPSampler(p=0.0), r"TopPSampler p must be a number in \(0, 1\], got 0.0"),
        (samplers.BeamSampler(num_beams=0), "BeamSampler num_beams must be an integer >= 1, got 0"),
        (samplers.ContrastiveSampler(alpha=1.5), r"ContrastiveSampler alpha must be a number in \[0, 1\]"),
        # keras-hub's get() hands back a string for this one: generate() failed on it.
        ({"class_name": "TopKSampler", "config": {"k": 3}}, r"sampler must be a keras_hub.samplers.Sampler or its"),
    ]:
        with pytest.raises((ValueError, TypeError), match="^" + message):
            model.compile(sampler=sampler)
    model.compile(sampler=samplers.TopPSampler(p=1.0, k=too_many - 1))  # the edges are allowed


def test_presets_refuse_bad_paths_and_arguments(tmp_path, lm):
    folder = str(tmp_path / "lm")
    lm.save_to_preset(folder)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for save in (lm.save_to_preset, lm.backbone.save_to_preset, lm.preprocessor.tokenizer.save_to_preset):
        with pytest.raises(ValueError, match="file.txt is a file: a preset is saved as a folder"):
            save(str(a_file))
        with pytest.raises(ValueError, match="preset_dir is empty"):
            save("")
    with pytest.raises(TypeError, match="GPTCausalLM.from_preset.. got 'bogus_kwarg'"):
        kgpt.GPTCausalLM.from_preset(folder, bogus_kwarg=1)
    with pytest.raises(TypeError, match="got 'sequence_length', which GPTCausalLM does not take"):
        kgpt.GPTCausalLM.from_preset(folder, sequence_length=64)
    with pytest.raises(TypeError, match="load_weights must be True or False, got 'no'"):
        kgpt.GPTCausalLM.from_preset(folder, load_weights="no")
    with pytest.raises(TypeError, match="task must be a registered task's name or a kgpt.Task, got 5"):
        kgpt.GPTTaskModel.from_preset(folder, task=5)
    with pytest.raises(ValueError, match="sequence_length must be an integer >= 1, got 0"):
        kgpt.GPTTaskModel.from_preset(folder, task="sst2", sequence_length=0)
    # A missing folder, or one without a model, was "not a fine-tuned task model: pass task=NAME".
    for path, message in ((tmp_path / "missing", "No preset directory"), (tmp_path, "Missing .*config.json")):
        for load in (kgpt.GPTTaskModel.from_preset, kgpt.load_finetuned):
            with pytest.raises(kgpt.CheckpointError, match=message):
                load(str(path))


def test_a_sequence_length_past_the_context_is_said_when_a_task_model_loads(tmp_path, lm, caplog):
    folder = str(tmp_path / "lm")
    lm.save_to_preset(folder)
    context = lm.backbone.max_sequence_length
    with caplog.at_level("WARNING", logger="kgpt"):  # kgpt-predict --max_length 1000 was capped without a word
        model = kgpt.GPTTaskModel.from_preset(folder, task="sst2", sequence_length=context + 1)
    assert model.preprocessor.sequence_length == context
    assert [r.getMessage() for r in caplog.records] == [
        f"Warning: sequence_length {context + 1} is longer than the model's context ({context} tokens, preset {folder}): "
        f"views are cut to {context} tokens."
    ]


def test_from_preset_without_weights_builds_fresh_ones(tmp_path, lm):
    folder = str(tmp_path / "lm")
    lm.save_to_preset(folder)
    os.remove(os.path.join(folder, "model.weights.h5"))  # not read, not needed
    fresh = kgpt.GPTCausalLM.from_preset(folder, load_weights=False)
    assert fresh.preprocessor is not None
    table, saved = to_numpy(fresh.backbone.token_embedding.embeddings), to_numpy(lm.backbone.token_embedding.embeddings)
    assert table.shape == saved.shape and not np.allclose(table, saved)
    backbone = kgpt.GPTBackbone.from_preset(folder, load_weights=False)
    assert backbone.count_params() == lm.backbone.count_params()


def test_a_preset_whose_tokenizer_outgrows_the_model_is_refused(tmp_path, lm):
    folder = str(tmp_path / "lm")
    lm.save_to_preset(folder)
    chars = [chr(c) for c in range(ord("a"), ord("a") + 60)]
    encoder = {
        "<unk>": 0,
        **{c: 1 + i for i, c in enumerate(chars)},
        **{c + "</w>": 61 + i for i, c in enumerate(chars)},
    }
    kgpt.GPTTokenizer(encoder, []).save_to_preset(str(tmp_path / "other"))  # saved beside the model it is refused
    shutil.copytree(tmp_path / "other", folder, dirs_exist_ok=True)  # another vocabulary's files, copied in
    with pytest.raises(
        kgpt.io.presets.CheckpointError,
        match=r"lm: The preprocessor's tokenizer has 124 ids, more "
        r"than the backbone's vocabulary_size=99",
    ):
        kgpt.GPTCausalLM.from_preset(folder)


def test_eager_tensors_are_checked_like_arrays(lm):
    """Ids given as a backend's eager tensors (a JAX array, a tf.Tensor) are checked as NumPy ones are: out of
    range gave NaN on JAX and an error deep in TensorFlow's gather."""
    ids = keras.ops.convert_to_tensor(np.full((1, 6), 150, "int32"))
    mask = keras.ops.convert_to_tensor(np.ones((1, 6), "int32"))
    with pytest.raises(ValueError, match=r"inputs\['token_ids'\]\[0, 0\] is 150"):
        lm.backbone({"token_ids": ids, "padding_mask": mask})
    with pytest.raises(ValueError, match=r"x\['token_ids'\]\[0, 0\] is 150"):
        lm.predict({"token_ids": ids, "padding_mask": mask}, verbose=0)
    task = kgpt.GPTTaskModel(lm.backbone, head=kgpt.tasks.heads.ClassificationHead(["a", "b"]))
    with pytest.raises(ValueError, match=r"x\['token_ids'\]\[0, 0, 0\] is 150"):
        task.predict({"token_ids": np.full((1, 1, 4), 150), "padding_mask": np.ones((1, 1, 4))}, verbose=0)


def test_inputs_of_the_wrong_kind_are_named(lm, tmp_path):
    lm.save_to_preset(str(tmp_path / "lm"))
    task = kgpt.GPTTaskModel.from_preset(
        str(tmp_path / "lm"),
        task=kgpt.Task(
            name="tone", transform=kgpt.tasks.transforms.Classification(), labels=("a", "b"), read=lambda s, d: []
        ),
    )
    with pytest.raises(TypeError, match="x is a generator: pass a list"):
        lm.predict(t for t in ["a cab"])
    with pytest.raises(TypeError, match="x is a generator"):
        task.predict(t for t in ["a cab"])
    with pytest.raises(TypeError, match=r"x\[0\] is None, not text"):
        task.fit([None, "a", "b"], ["a", "b", "a"])
    with pytest.raises(TypeError, match="A tuple is read as columns of segments"):
        task.predict(("a cab", "the dog", "a dog"))
    with pytest.raises(TypeError, match=r"takes a list of texts, got one string: pass \['a cab'\]"):
        lm.predict("a cab")
    # A tuple of texts is texts (keras-hub read it as (x, y, sample_weight)); a 0-d array is one prompt.
    assert lm.predict(("a cab", "the dog"), verbose=0).shape[0] == 2
    assert lm.generate(np.array("a cab"), max_length=10) == lm.generate("a cab", max_length=10)


def test_a_fit_inside_the_default_warm_up_says_so():
    lm = text_lm(newline_tokenizer(), sequence_length=8)
    lm.compile()  # the paper's pre-training schedule: 2,000 updates of warm-up
    texts = ["a cab ran", "the dog ran"] * 32  # whole batches: a last partial one is a second compilation
    with pytest.warns(
        UserWarning,
        match=r"fit\(\) runs 4 update\(s\), ending at update 4 of the optimizer's "
        r"2000-update warm-up: the learning rate reaches only 5e-07",
    ):
        lm.fit(texts, batch_size=32, epochs=2, verbose=0)
    lm.compile(optimizer=kgpt.gpt_adamw(warmup_steps=2, total_steps=10))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm.fit(texts, batch_size=32, epochs=2, verbose=0)
    assert not [w for w in caught if "warm-up" in str(w.message)]  # a warm-up the run gets past: nothing to say


def test_small_mistakes_are_named(lm, tmp_path):
    with pytest.raises(ValueError, match=r"x\[0\] is not valid UTF-8 text \(surrogates not allowed at character 1\)"):
        lm.fit(["x\ud800y dog", "the dog"], verbose=0)
    folder = tmp_path / "lm"
    lm.save_to_preset(str(folder))
    with pytest.raises(
        kgpt.io.presets.CheckpointError,
        match=r"tokenizer.json is a file: a preset is the folder that "
        r"holds it; pass GPTTokenizer.from_preset\(",
    ):
        kgpt.GPTTokenizer.from_preset(str(folder / "tokenizer.json"))
    text = tmp_path / "a.txt"
    text.write_text("the keeper climbed the tower\n" * 5)
    with pytest.raises(ValueError, match="a.txt is a file: the tokenizer's two files are saved into a folder"):
        kgpt.GPTTokenizer.train([text], num_merges=5, directory=str(text))
