"""Writes the presets tests/test_presets.py loads to pin what kgpt saved before its layers moved.

Run with kgpt at commit 396dd4d (the tokenizer in kgpt/data/tokenizer.py, the
preprocessors in kgpt/data/, the optimizer in kgpt/train/), from the repository
root, once per backend:

    KERAS_BACKEND=jax python tests/data/preset_v1/make.py
    KERAS_BACKEND=tensorflow python tests/data/preset_v1/make.py

The first run saves, with a BPE vocabulary of 24 merges trained on
tests/data/prose.txt, a tiny GPTCausalLM (context 40) with its preprocessor (causal_lm/) and
a GPTTaskModel for two classes with its task preprocessor, after one
fine-tuning step (task_model/); later runs keep them. Each run writes, for its
backend, expected_BACKEND.npz: the token ids of TEXTS, the causal LM's logits
at their first 8 positions, and the task model's probabilities for PAIRS.
"""

import os
import tempfile

import keras
import numpy as np

import kgpt

HERE = os.path.dirname(os.path.abspath(__file__))
PROSE = os.path.join(os.path.dirname(HERE), "prose.txt")
SIZES = dict(num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=40)
TEXTS = ["The river ran past the old mill.", "A quiet morning, then rain."]
PAIRS = [("The river ran past the mill.", "positive"), ("Rain fell all day.", "negative")]


def save_presets():
    keras.utils.set_random_seed(11)
    tokenizer = kgpt.GPTTokenizer.train([PROSE], num_merges=24, min_frequency=1, directory=tempfile.mkdtemp())
    preprocessor = kgpt.GPTCausalLMPreprocessor(tokenizer, sequence_length=40)
    backbone = kgpt.GPTBackbone(vocabulary_size=tokenizer.vocabulary_size(), **SIZES)
    kgpt.GPTCausalLM(backbone, preprocessor=preprocessor).save_to_preset(os.path.join(HERE, "causal_lm"))
    model = kgpt.GPTTaskModel.from_preset(os.path.join(HERE, "causal_lm"), task="sst2", sequence_length=40)
    model.fit([text for text, _ in PAIRS], np.array([1, 0]), batch_size=2, epochs=1, verbose=0)
    model.save_to_preset(os.path.join(HERE, "task_model"))


def expected_outputs():
    lm = kgpt.GPTCausalLM.from_preset(os.path.join(HERE, "causal_lm"))
    model = kgpt.GPTTaskModel.from_preset(os.path.join(HERE, "task_model"))
    ids = [lm.preprocessor.tokenizer(text).tolist() for text in TEXTS]
    x, _, _ = lm.preprocessor(TEXTS)
    np.savez(
        os.path.join(HERE, f"expected_{keras.config.backend()}.npz"),
        ids=np.array([i + [-1] * (64 - len(i)) for i in ids], dtype="int32"),
        token_ids=keras.ops.convert_to_numpy(x["token_ids"]),
        logits=lm.predict(x, verbose=0)[:, :8],  # the first 8 positions: enough to pin every weight
        probabilities=np.asarray(model.predict([text for text, _ in PAIRS], verbose=0)),
    )


if __name__ == "__main__":
    if not os.path.isdir(os.path.join(HERE, "causal_lm")):
        save_presets()
    expected_outputs()
