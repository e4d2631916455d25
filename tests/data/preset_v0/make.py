"""Writes the fixtures of tests/test_presets.py and tests/test_original.py that pin kgpt's earlier behaviour.

Run with kgpt at commit 57f1afb (the backbone built on keras-hub's
TransformerDecoder), from the repository root, once per backend:

    KERAS_BACKEND=jax python tests/data/preset_v0/make.py
    KERAS_BACKEND=tensorflow python tests/data/preset_v0/make.py

The first run saves a tiny GPTCausalLM and a fine-tuned GPTTaskModel with that
layout (causal_lm/, task_model/); later runs keep them. Each run writes, for
its backend, expected_BACKEND.npz: fixed inputs, the loaded presets' outputs on
them, and the weights a fresh backbone of the same sizes gets from seed 1234;
and special_rows_seed0_BACKEND.npy: the special-token rows
`GPTBackbone.from_original(..., num_special_tokens=3, seed=0)` appended to
tests/test_original.py's checkpoint when that still seeded the global generators.
"""

import os
import sys
import tempfile

import keras
import numpy as np

import kgpt
from kgpt.tasks import heads

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = dict(vocabulary_size=24, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=8)


def save_presets():
    keras.utils.set_random_seed(7)
    kgpt.GPTCausalLM(kgpt.GPTBackbone(**SIZES)).save_to_preset(os.path.join(HERE, "causal_lm"))
    model = kgpt.GPTTaskModel(kgpt.GPTBackbone(**SIZES), head=heads.Classification(["neg", "pos"]))
    model.save_to_preset(os.path.join(HERE, "task_model"))


def expected_outputs():
    keras.utils.set_random_seed(1234)
    init = [keras.ops.convert_to_numpy(w) for w in kgpt.GPTBackbone(**SIZES).weights]
    ids = np.random.default_rng(0).integers(0, SIZES["vocabulary_size"], (3, 8)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    x = {"token_ids": ids, "padding_mask": mask}
    lm = kgpt.GPTCausalLM.from_preset(os.path.join(HERE, "causal_lm"))
    model = kgpt.GPTTaskModel.from_preset(os.path.join(HERE, "task_model"))
    outputs = model.predict({k: v[:, None] for k, v in x.items()}, verbose=0)
    np.savez(
        os.path.join(HERE, f"expected_{keras.config.backend()}.npz"),
        token_ids=ids,
        padding_mask=mask,
        hidden=keras.ops.convert_to_numpy(lm.backbone(x)),
        logits=lm.predict(x, verbose=0),
        task=outputs["task"],
        lm=outputs["lm"],
        **{f"init_{i}": w for i, w in enumerate(init)},
    )


def special_rows():
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    import gpt1_reference
    from test_original import HEADS, SIZES as CHECKPOINT, write_original

    shapes, arrays = gpt1_reference.random_checkpoint(**CHECKPOINT)
    directory = tempfile.mkdtemp()
    write_original(directory, shapes, arrays)
    backbone = kgpt.GPTBackbone.from_original(directory, num_heads=HEADS, num_special_tokens=3, seed=0)
    rows = keras.ops.convert_to_numpy(backbone.token_embedding.embeddings)[CHECKPOINT["vocab"]:]
    np.save(os.path.join(HERE, f"special_rows_seed0_{keras.config.backend()}.npy"), rows)


if __name__ == "__main__":
    if not os.path.isdir(os.path.join(HERE, "causal_lm")):
        save_presets()
    expected_outputs()
    special_rows()
