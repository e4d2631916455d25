"""Presets saved before kgpt's modules moved between layers load, with the same tokens and outputs.

tests/data/preset_v1/make.py wrote them with kgpt at 396dd4d, when the
tokenizer and preprocessors lived in kgpt/data/ and the optimizer in
kgpt/train/: a causal LM with its BPE tokenizer, and a fine-tuned two-class
task model with its task preprocessor.
"""

import functools
import os

import keras
import numpy as np

import kgpt

HERE = os.path.join(os.path.dirname(__file__), "data", "preset_v1")
TEXTS = ["The river ran past the old mill.", "A quiet morning, then rain."]
PAIRS = ["The river ran past the mill.", "Rain fell all day."]
# Not bit for bit: XLA compiles for the CPU it runs on (see tests/test_presets.py).
same = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)


def expected():
    return np.load(os.path.join(HERE, f"expected_{keras.config.backend()}.npz"))


def test_a_causal_lm_saved_before_tokenizes_and_predicts_the_same():
    want = expected()
    lm = kgpt.GPTCausalLM.from_preset(os.path.join(HERE, "causal_lm"))
    assert isinstance(lm.preprocessor.tokenizer, kgpt.GPTTokenizer)
    for text, ids in zip(TEXTS, want["ids"]):
        assert lm.preprocessor.tokenizer(text).tolist() == [i for i in ids.tolist() if i >= 0]
    x, _, _ = lm.preprocessor(TEXTS)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(x["token_ids"]), want["token_ids"])
    same(lm.predict(x, verbose=0)[:, :8], want["logits"])


def test_a_task_model_saved_before_predicts_the_same_probabilities():
    model = kgpt.GPTTaskModel.from_preset(os.path.join(HERE, "task_model"))
    assert model.task_name == "sst2"
    same(model.head.probabilities(model.predict(PAIRS, verbose=0)), expected()["probabilities"])
