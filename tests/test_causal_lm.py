import keras
import keras_hub
import numpy as np
import pytest
from conftest import TINY, newline_tokenizer, random_inputs, text_lm, to_numpy

import kgpt


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_logits_are_tied_to_the_embedding(causal_lm):
    x = random_inputs()
    logits = to_numpy(causal_lm(x))
    hidden = to_numpy(causal_lm.backbone(x))
    table = to_numpy(causal_lm.backbone.token_embedding.embeddings)
    assert logits.shape == (3, 12, TINY["vocabulary_size"])
    np.testing.assert_allclose(logits, hidden @ table.T, atol=1e-5)
    assert causal_lm.count_params() == causal_lm.backbone.count_params()


def test_score_is_next_token_log_probability(causal_lm):
    x = random_inputs(batch=2, length=10)
    x["padding_mask"][1, 7:] = 0
    scores = causal_lm.score(x["token_ids"], x["padding_mask"], batch_size=1)
    logp = log_softmax(to_numpy(causal_lm(x)).astype("float64"))
    ids = x["token_ids"]
    expected = np.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0]
    expected[1, 6:] = 0.0  # targets 7.. are padding
    assert scores.shape == (2, 9)
    np.testing.assert_allclose(scores, expected, atol=1e-5)


def test_score_rejects_bad_shapes(causal_lm):
    with pytest.raises(ValueError, match="length >= 2"):
        causal_lm.score(np.zeros((2, 1), "int32"))
    with pytest.raises(ValueError, match="max_sequence_length=16"):
        causal_lm.score(np.zeros((1, 17), "int32"))


def greedy_without_cache(lm, prompts, max_length):
    """Reference decoding: a full forward pass for every new token."""
    ids = np.zeros((len(prompts), max_length), "int32")
    for row, p in enumerate(prompts):
        ids[row, : len(p)] = p
    for pos in range(min(map(len, prompts)), max_length):
        logits = to_numpy(lm({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
        for row, p in enumerate(prompts):
            if pos >= len(p):
                ids[row, pos] = logits[row, pos - 1].argmax()
    return ids


def test_cached_generation_equals_uncached(causal_lm):
    # Larger weights so logits are far apart and ties cannot flip the argmax.
    table = causal_lm.backbone.token_embedding.embeddings
    table.assign(to_numpy(table) * 20)
    prompts = [[5, 9, 2], [7], [1, 2, 3, 4, 5, 6]]
    causal_lm.compile(sampler="greedy")
    out = causal_lm.generate(prompts, max_length=14)
    reference = greedy_without_cache(causal_lm, prompts, 14)
    np.testing.assert_array_equal(out["token_ids"], reference)
    assert out["padding_mask"].all()


@pytest.mark.parametrize(
    "sampler",
    [keras_hub.samplers.TopKSampler(k=1), keras_hub.samplers.TopPSampler(p=1e-6)],
    ids=["top_k=1", "top_p=tiny"],
)
def test_degenerate_samplers_equal_greedy(causal_lm, sampler):
    prompts = [[5, 9, 2], [7, 7]]
    causal_lm.compile(sampler="greedy")
    greedy = causal_lm.generate(prompts, max_length=12)["token_ids"]
    causal_lm.compile(sampler=sampler)
    np.testing.assert_array_equal(causal_lm.generate(prompts, max_length=12)["token_ids"], greedy)


@pytest.mark.parametrize("sampler", ["top_k", "top_p"])
def test_sampling_keeps_prompt_and_stays_in_vocabulary(causal_lm, sampler):
    causal_lm.compile(sampler=sampler)
    out = causal_lm.generate([[3, 4, 5]], max_length=16)["token_ids"]
    assert out.shape == (1, 16)
    np.testing.assert_array_equal(out[0, :3], [3, 4, 5])
    assert ((out >= 0) & (out < TINY["vocabulary_size"])).all()


def test_stop_token_masks_what_follows(causal_lm):
    causal_lm.compile(sampler="greedy")
    free = causal_lm.generate([[3, 4]], max_length=12)["token_ids"][0]
    stop = int(free[4])
    first = 2 + list(free[2:]).index(stop)
    out = causal_lm.generate([[3, 4]], max_length=12, stop_token_ids=[stop])
    expected = np.arange(12) <= first
    np.testing.assert_array_equal(out["padding_mask"][0], expected)


def test_generate_rejects_bad_lengths(causal_lm):
    with pytest.raises(ValueError, match="max_sequence_length=16"):
        causal_lm.generate([[1, 2]], max_length=32)
    with pytest.raises(ValueError, match="no room"):
        causal_lm.generate([[1] * 8], max_length=8)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        causal_lm.generate([[]], max_length=8)
    wide = {"token_ids": np.ones((1, 17), "int32"), "padding_mask": np.ones((1, 17), "int32")}
    with pytest.raises(ValueError, match="The length of token_ids is 17, more than the model's context"):
        causal_lm.generate(wide)


def test_learns_repeated_text_to_low_loss():
    text = "hello world! " * 60
    vocab = sorted(set(text))
    ids = np.array([vocab.index(c) for c in text], "int32")
    length = 32
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(ids) - length - 1, 512)
    windows = np.stack([ids[s : s + length + 1] for s in starts])
    x = {"token_ids": windows[:, :-1], "padding_mask": np.ones((512, length), "int32")}
    backbone = kgpt.GPTBackbone(
        vocabulary_size=len(vocab),
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=length,
        dropout=0.0,
    )
    lm = kgpt.GPTCausalLM(backbone)
    lm.compile(optimizer=kgpt.gpt_adamw(3e-3, warmup_steps=20, total_steps=320))
    history = lm.fit(x, windows[:, 1:], batch_size=16, epochs=10, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.1, losses
    assert losses[-1] < losses[0] / 10


def test_keras_file_round_trip_keeps_optimizer(causal_lm, tmp_path):
    x = random_inputs()
    causal_lm.compile(total_steps=5000)
    causal_lm.fit(x, x["token_ids"], epochs=1, verbose=0)
    causal_lm.score(x["token_ids"])  # its helper model shares layers and must not be saved
    path = tmp_path / "lm.keras"
    causal_lm.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, kgpt.GPTCausalLM)
    assert isinstance(loaded.backbone, kgpt.GPTBackbone)
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(causal_lm(x)), atol=0)
    assert isinstance(loaded.optimizer, kgpt.GPTAdamW)
    schedule = loaded.optimizer._learning_rate
    assert isinstance(schedule, kgpt.WarmupSchedule) and schedule.total_steps == 5000
    assert int(to_numpy(loaded.optimizer.iterations)) == 1
    saved = {v.path: to_numpy(v) for v in causal_lm.optimizer.variables}
    for v in loaded.optimizer.variables:
        np.testing.assert_array_equal(to_numpy(v), saved[v.path])


def test_auto_optimizer_rejects_horizon_shorter_than_warmup(causal_lm):
    with pytest.raises(ValueError, match="shorter warm-up"):
        causal_lm.compile(total_steps=50)


def test_get_config_round_trip(causal_lm):
    clone = kgpt.GPTCausalLM.from_config(causal_lm.get_config())
    assert isinstance(clone, kgpt.GPTCausalLM)
    assert clone.backbone.get_config() == causal_lm.backbone.get_config()


# --- text in, text out (with a GPTCausalLMPreprocessor) ------------------------


def greedy_text_lm(tokenizer):
    """A tiny text LM that generates greedily, its logits far apart (no argmax ties)."""
    lm = text_lm(tokenizer)
    table = lm.backbone.token_embedding.embeddings
    table.assign(to_numpy(table) * 20)
    lm.compile(sampler="greedy")
    return lm


def test_generate_text_equals_generate_ids():
    tokenizer = newline_tokenizer()
    lm = greedy_text_lm(tokenizer)
    prompts = ["a cab", "the dog"]
    ids = lm.generate([tokenizer.encode(p) for p in prompts], max_length=12)["token_ids"]
    expected = [tokenizer.decode([i for i in row if i not in tokenizer.special_token_ids]) for row in ids]
    assert lm.generate(prompts, max_length=12) == expected
    # Token ids, listed or packed, bypass the preprocessor (which would try to tokenize them).
    packed = lm._pack_prompts([tokenizer.encode(p) for p in prompts], 12)
    np.testing.assert_array_equal(lm.generate(packed)["token_ids"], ids)


def test_generate_text_errors():
    tokenizer = newline_tokenizer()
    lm = text_lm(tokenizer)
    bare = kgpt.GPTCausalLM(lm.backbone)
    with pytest.raises(ValueError, match="has no preprocessor.*lm.preprocessor = kgpt.GPTCausalLMPreprocessor"):
        bare.generate("a cab")
    with pytest.raises(ValueError, match="has no preprocessor"):
        bare.score("a cab")
    with pytest.raises(ValueError, match="max_sequence_length=16"):
        lm.generate("a cab", max_length=17)
    with pytest.raises(ValueError, match="no room to generate within max_length=4"):
        lm.generate("a cab", max_length=4)
    # A preprocessor attached later, packing more than the context: generate's default length is refused.
    lm.preprocessor = kgpt.GPTCausalLMPreprocessor(tokenizer, sequence_length=32)
    with pytest.raises(ValueError, match=r"The preprocessor's sequence_length \(generate's default max_length\) is 32"):
        lm.generate("a cab")


def test_generate_takes_bytes_as_utf8_text():
    tokenizer = newline_tokenizer()
    lm = greedy_text_lm(tokenizer)
    ids = lm.generate([tokenizer.encode("a cab")], max_length=12)["token_ids"][0]
    expected = tokenizer.decode([i for i in ids if i not in tokenizer.special_token_ids])
    assert lm.generate(b"a cab", max_length=12) == expected
    assert lm.generate(np.array(b"a cab"), max_length=12) == expected  # a 0-d bytes array: one prompt
    with pytest.raises(ValueError, match=r"inputs is bytes that are not UTF-8 .*at byte 2.*pass the prompt as a str"):
        lm.generate(b"a \xff cab", max_length=12)


def test_from_preset_loads_the_backbone_under_the_given_dtype(tmp_path):
    lm = text_lm(newline_tokenizer())
    lm.save_to_preset(str(tmp_path / "lm"))  # task.json: the task preset loader
    lm.backbone.save_to_preset(str(tmp_path / "backbone"))  # config.json only: the LM head is built around it
    table = to_numpy(lm.backbone.token_embedding.embeddings)
    x = random_inputs(vocabulary_size=lm.backbone.vocabulary_size)
    for name in ("lm", "backbone"):
        loaded = kgpt.GPTCausalLM.from_preset(str(tmp_path / name), dtype="bfloat16")
        assert loaded.backbone.dtype_policy.name == "bfloat16", name
        weights = loaded.backbone.token_embedding.embeddings
        assert keras.backend.standardize_dtype(weights.dtype) == "bfloat16", name
        np.testing.assert_allclose(to_numpy(weights).astype("float32"), table, rtol=2**-8)  # the saved weights
        assert keras.backend.standardize_dtype(loaded(x).dtype) == "bfloat16", name
    kept = kgpt.GPTCausalLM.from_preset(str(tmp_path / "lm"))
    assert kept.backbone.dtype_policy.name == "float32"
    with pytest.raises(ValueError, match=r"^dtype must name a float or mixed policy .* got 'int8'"):
        kgpt.GPTCausalLM.from_preset(str(tmp_path / "lm"), dtype="int8")


def test_score_text_matches_score_ids():
    from conftest import char_tokenizer

    from kgpt.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor

    lm = text_lm(newline_tokenizer())
    texts = ["a cab", "the dog ran"]
    for tokenizer in (lm.preprocessor.tokenizer, char_tokenizer()):  # one model: its scorer compiles once
        lm.preprocessor = GPTCausalLMPreprocessor(tokenizer, 16)
        scores = lm.score(texts)
        # With a newline token every token is scored, the first after the newline; without, the first only
        # conditions.
        prefix = [tokenizer.encoder["\n</w>"]] if "\n</w>" in tokenizer.encoder else []
        rows = [prefix + tokenizer.encode(t) for t in texts]
        ids, mask = np.zeros((2, 16), "int32"), np.zeros((2, 16), "int32")
        for i, row in enumerate(rows):
            ids[i, : len(row)], mask[i, : len(row)] = row, 1
        expected = lm.score(ids, mask)
        for i, (row, score) in enumerate(zip(rows, scores)):
            assert score.shape == (len(row) - 1,) and score.dtype == np.float32
            np.testing.assert_allclose(score, expected[i, : len(row) - 1], atol=1e-5)
        np.testing.assert_allclose(lm.score(texts[0]), scores[0], atol=1e-5)  # one text: one array
    assert len(scores[0]) == len(texts[0].split()[0]) + len(texts[0].split()[1]) - 1  # no newline: 4 - 1
    with pytest.raises(ValueError, match="more than the model's context max_sequence_length=16"):
        lm.score("a" * 20 + " b")
    # A long text is named by its start in closed quotes, with its length.
    with pytest.raises(ValueError, match=r"the text 'a{3,}\.\.\.' \(62 characters\) is 61, more than"):
        lm.score("a" * 60 + " b")


def test_fit_evaluate_predict_on_text():
    tokenizer = newline_tokenizer()
    lm = text_lm(tokenizer, sequence_length=12)
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    assert lm._chunked_loss is not None  # kgpt's memory-lean default loss still applies
    texts = ["a cab", "the dog ran", "a cab ran", "the cab"] * 2
    history = lm.fit(texts, batch_size=4, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0], losses
    # Text evaluates exactly like its preprocessed ids.
    x, y, weight = lm.preprocessor(texts)
    ids_result = lm.evaluate(x, y, sample_weight=weight, batch_size=4, verbose=0, return_dict=True)
    text_result = lm.evaluate(texts, batch_size=4, verbose=0, return_dict=True)
    assert text_result.keys() == ids_result.keys()
    for key in text_result:
        np.testing.assert_allclose(text_result[key], ids_result[key], rtol=1e-5)
    logits = lm.predict(texts[:3], batch_size=2, verbose=0)
    assert logits.shape == (3, 12, tokenizer.vocabulary_size())
    np.testing.assert_allclose(logits, to_numpy(lm(keras.tree.map_structure(lambda t: t[:3], x))), atol=1e-5)


@pytest.mark.parametrize(
    "method, kwargs",
    [
        ("fit", {"sample_weight": np.zeros(2)}),
        ("fit", {"class_weight": {0: 1.0}}),
        ("evaluate", {"sample_weight": np.array([np.nan, -5.0])}),
    ],
)
def test_keras_weights_on_text_are_refused_not_ignored(method, kwargs):
    # The preprocessor's padding mask is the weight on text: keras-hub dropped the user's (zero, NaN or negative
    # weights trained as ones).
    lm = text_lm(newline_tokenizer(), sequence_length=12)
    lm.compile()
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=rf"^{method} on text takes no {name}: kgpt encodes and batches"):
        getattr(lm, method)(["a cab", "the dog ran"], batch_size=2, verbose=0, **kwargs)


def test_fit_on_text_draws_a_new_order_every_epoch(monkeypatch):
    # keras-hub batched in-memory text in order, every epoch, whatever fit(shuffle=) said.
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    lm = text_lm(newline_tokenizer(), sequence_length=12)
    texts = [f"{word} cab" for word in ("a", "the", "dog", "ran", "cab", "a a", "the the", "dog dog")]
    batches = lm._text_batches(texts, batch_size=3)
    epochs = [[t.decode() for batch in batches for t in batch.numpy()] for _ in range(2)]
    assert [len(b) for b in batches] == [3, 3, 2]
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(texts) and epochs[0] != epochs[1] and epochs[0] != texts
    assert [t.decode() for b in lm._text_batches(texts, shuffle=False) for t in b.numpy()] == texts
    given = {}
    monkeypatch.setattr(keras_hub.models.CausalLM, "fit", lambda self, x, y=None, **kwargs: given.update(x=x, **kwargs))
    lm.compile()
    lm.fit(texts, batch_size=3, epochs=2)
    assert isinstance(given["x"], tf.data.Dataset) and given["shuffle"] is False and given["batch_size"] is None
    lm.fit(texts, batch_size=3, shuffle=False)
    assert given["x"] == texts and given["shuffle"] is False and given["batch_size"] == 3
