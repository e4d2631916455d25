"""Text in, text out: GPTCausalLMPreprocessor, and GPTCausalLM presets that generate from strings."""

import json

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY, char_tokenizer, to_numpy

import kgpt
from kgpt.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor

TEXTS = ["a cab", "the dog ran to the cab!"]


def test_preprocessor_packs_shifts_and_weights():
    tokenizer = char_tokenizer()
    preprocessor = GPTCausalLMPreprocessor(tokenizer, sequence_length=8)
    x, y, sample_weight = preprocessor(TEXTS)
    ids = [tokenizer.encode(t) for t in TEXTS]  # 4 and 16 tokens: the second is cut to 8 + 1
    expected = np.zeros((2, 9), "int32")
    expected[0, :4] = ids[0]
    expected[1] = ids[1][:9]
    np.testing.assert_array_equal(to_numpy(x["token_ids"]), expected[:, :-1])
    np.testing.assert_array_equal(to_numpy(y), expected[:, 1:])
    np.testing.assert_array_equal(to_numpy(x["padding_mask"]), [[1] * 4 + [0] * 4, [1] * 8])
    np.testing.assert_array_equal(to_numpy(sample_weight), [[1] * 3 + [0] * 5, [1] * 8])
    one, _, _ = preprocessor(TEXTS[0])
    np.testing.assert_array_equal(to_numpy(one["token_ids"]), expected[0, :-1])
    prompt = preprocessor.generate_preprocess(TEXTS[0])  # no start token unless asked
    np.testing.assert_array_equal(to_numpy(prompt["token_ids"]), expected[0, :-1])
    with pytest.raises(ValueError, match="no room to generate within max_length=8"):
        preprocessor.generate_preprocess(TEXTS[1])
    with pytest.raises(ValueError, match="at least one token in every prompt"):
        preprocessor.generate_preprocess(["a", ""])
    # tf.data, unbatched and batched, gives the same arrays on every backend.
    for ds in (
        tf.data.Dataset.from_tensor_slices(TEXTS).map(preprocessor).batch(2),
        tf.data.Dataset.from_tensor_slices(TEXTS).batch(2).map(preprocessor),
    ):
        ((dx, dy, dw),) = ds.as_numpy_iterator()
        np.testing.assert_array_equal(dx["token_ids"], expected[:, :-1])
        np.testing.assert_array_equal(dy, expected[:, 1:])
        np.testing.assert_array_equal(dw.astype(int), to_numpy(sample_weight).astype(int))


def test_preprocessor_special_tokens():
    tokenizer = char_tokenizer()
    with_start = GPTCausalLMPreprocessor(tokenizer, sequence_length=6, add_start_token=True)
    x, _, _ = with_start(TEXTS[0])
    np.testing.assert_array_equal(to_numpy(x["token_ids"]), [tokenizer.start_id, *tokenizer.encode(TEXTS[0]), 0])
    with pytest.raises(ValueError, match="no end-of-text token"):
        GPTCausalLMPreprocessor(tokenizer, add_end_token=True)
    out = with_start.generate_preprocess([TEXTS[0]], sequence_length=8)
    # generate_postprocess strips padding and the special tokens.
    assert with_start.generate_postprocess(out) == [tokenizer.decode(tokenizer.encode(TEXTS[0]))]


def tiny_pretrained_preset(tmp_path, **overrides):
    from kgpt.jobs.config import PretrainConfig
    from kgpt.jobs.pretrain import pretrain

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The keeper climbed the steps of the tower.\n" * 20, encoding="utf-8")
    config = PretrainConfig(
        corpus=str(corpus),
        output_dir=str(tmp_path / "out"),
        tokenizer="train",
        num_merges=20,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        dropout=0.0,
        sequence_length=16,
        batch_size=4,
        learning_rate=1e-2,
        warmup_steps=1,
        max_steps=2,
        evaluations=1,
        sample_tokens=3,
        checkpoint_every=0,
        validation_fraction=0.0,
        **overrides,
    )
    lm, tokenizer, _ = pretrain(config)
    return str(tmp_path / "out"), lm, tokenizer


def test_a_pretrained_preset_generates_text(tmp_path):
    out, trained, tokenizer = tiny_pretrained_preset(tmp_path)
    assert json.loads(open(f"{out}/preprocessor.json").read())["registered_name"] == "kgpt>GPTCausalLMPreprocessor"
    lm = kgpt.GPTCausalLM.from_preset(out)
    assert isinstance(lm.preprocessor, GPTCausalLMPreprocessor) and lm.preprocessor.sequence_length == 16
    lm.compile(sampler="greedy")
    text = lm.generate("The keeper", max_length=10)
    assert isinstance(text, str) and text.startswith("the keeper")
    packed = lm.preprocessor.generate_preprocess(["The keeper"], sequence_length=10)
    prompt = tokenizer.encode("The keeper")
    np.testing.assert_array_equal(to_numpy(packed["token_ids"])[0, : len(prompt)], prompt)
    ids = lm.generate(packed)["token_ids"][0]  # token ids still give ids
    assert text == tokenizer.decode([i for i in ids if i not in tokenizer.special_token_ids])
    # The tokenizer loads on its own, through kgpt or keras-hub.
    assert type(keras_hub.tokenizers.Tokenizer.from_preset(out)) is kgpt.GPTTokenizer
    assert kgpt.GPTTokenizer.from_preset(out).merges == tokenizer.merges


def tiny_lm(tokenizer=None, length=16):
    backbone = kgpt.GPTBackbone(
        **{**TINY, "vocabulary_size": (tokenizer or char_tokenizer()).vocabulary_size(), "max_sequence_length": length}
    )
    return kgpt.GPTCausalLM(backbone)


@pytest.mark.parametrize("chunk", ["auto", None], ids=["chunked loss", "loss on logits"])
def test_the_loss_on_padded_text_is_the_mean_over_its_tokens_not_over_the_padding(chunk):
    tokenizer = char_tokenizer()
    lm = tiny_lm(tokenizer)
    lm.preprocessor = GPTCausalLMPreprocessor(tokenizer, sequence_length=16)
    lm.compile(lm_loss_chunk_size=chunk)
    texts = ["a cat.", "the dog sat on a mat."]  # the first is mostly padding
    x, y, weight = (
        to_numpy(v) if not isinstance(v, dict) else {k: to_numpy(t) for k, t in v.items()}
        for v in lm.preprocessor(texts)
    )
    logits = to_numpy(lm.predict_on_batch(x)).astype("float64")
    log_probs = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )
    token_loss = -np.take_along_axis(log_probs, y[..., None].astype(int), -1)[..., 0]
    want = (token_loss * weight).sum() / weight.sum()
    # Dividing by every position (keras-hub's "auto" loss) gave about half of it here.
    assert lm.evaluate(texts, batch_size=2, return_dict=True, verbose=0)["loss"] == pytest.approx(want, rel=1e-4)


def test_from_preset_attaches_a_preprocessor_when_the_preset_has_a_tokenizer(tmp_path):
    tokenizer = char_tokenizer()
    lm = tiny_lm(tokenizer)
    lm.save_to_preset(str(tmp_path / "bare"))
    assert kgpt.GPTCausalLM.from_preset(str(tmp_path / "bare")).preprocessor is None  # no tokenizer: ids only
    lm.save_to_preset(str(tmp_path / "p"))
    tokenizer.save_to_preset(str(tmp_path / "p"))  # a tokenizer but no preprocessor.json
    loaded = kgpt.GPTCausalLM.from_preset(str(tmp_path / "p"))
    assert isinstance(loaded.preprocessor, GPTCausalLMPreprocessor)
    assert loaded.preprocessor.sequence_length == 16  # the model's context
    assert not loaded.preprocessor.add_start_token
    assert loaded.preprocessor.tokenizer.fingerprint() == tokenizer.fingerprint()
    assert kgpt.GPTCausalLM.from_preset(str(tmp_path / "p"), preprocessor=None).preprocessor is None


def test_saved_preprocessor_round_trips_with_its_settings(tmp_path):
    tokenizer = char_tokenizer()
    lm = tiny_lm(tokenizer)
    lm.preprocessor = GPTCausalLMPreprocessor(tokenizer, sequence_length=12, add_start_token=True)
    lm.save_to_preset(str(tmp_path))
    loaded = kgpt.GPTCausalLM.from_preset(str(tmp_path))
    assert (loaded.preprocessor.sequence_length, loaded.preprocessor.add_start_token) == (12, True)
    assert loaded.preprocessor.tokenizer.fingerprint() == tokenizer.fingerprint()
    for a, b in zip(keras.tree.flatten(loaded.preprocessor(TEXTS)), keras.tree.flatten(lm.preprocessor(TEXTS))):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    # A preset whose tokenizer files are gone fails before any weight is loaded, naming the file.
    (tmp_path / "assets" / "tokenizer" / "vocab_40000.bpe").unlink()
    with pytest.raises(FileNotFoundError, match="vocab_40000.bpe"):
        kgpt.GPTCausalLM.from_preset(str(tmp_path))


def test_preprocessor_longer_than_the_context_is_refused():
    tokenizer = char_tokenizer()
    with pytest.raises(
        ValueError,
        match="The preprocessor's sequence_length is 32, more than the model's context max_sequence_length=16",
    ):
        kgpt.GPTCausalLM(tiny_lm(tokenizer).backbone, preprocessor=GPTCausalLMPreprocessor(tokenizer, 32))
