"""Writes the presets of tests/test_presets.py::test_presets_saved_before_the_decoder_block_load.

Run once with kgpt at commit 57f1afb (the backbone built on keras-hub's
TransformerDecoder), from the repository root:

    KERAS_BACKEND=jax python tests/data/preset_v0/make.py

It saves a tiny GPTCausalLM and a fine-tuned GPTTaskModel with that layout,
expected.npz: fixed inputs, the models' outputs on them, and the weights a
fresh backbone of the same sizes gets from seed 1234 (so later code can check
it still initialises the same way), and special_rows_seed0.npy: the special-token
rows `GPTBackbone.from_original(..., num_special_tokens=3, seed=0)` appended to
tests/test_original.py's checkpoint when that still seeded the global generators.
"""

import os

import keras
import numpy as np

import kgpt
from kgpt.tasks import heads

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = dict(vocabulary_size=24, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=8)


def main():
    keras.utils.set_random_seed(1234)
    fresh = kgpt.GPTBackbone(**SIZES)
    init = [keras.ops.convert_to_numpy(w) for w in fresh.weights]

    keras.utils.set_random_seed(7)
    lm = kgpt.GPTCausalLM(kgpt.GPTBackbone(**SIZES))
    model = kgpt.GPTTaskModel(kgpt.GPTBackbone(**SIZES), head=heads.Classification(["neg", "pos"]))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, SIZES["vocabulary_size"], (3, 8)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    x = {"token_ids": ids, "padding_mask": mask}
    task_x = {"token_ids": ids[:, None], "padding_mask": mask[:, None]}
    lm.save_to_preset(os.path.join(HERE, "causal_lm"))
    model.save_to_preset(os.path.join(HERE, "task_model"))
    outputs = model.predict(task_x, verbose=0)
    np.savez(
        os.path.join(HERE, "expected.npz"),
        token_ids=ids,
        padding_mask=mask,
        hidden=keras.ops.convert_to_numpy(lm.backbone(x)),
        logits=lm.predict(x, verbose=0),
        task=outputs["task"],
        lm=outputs["lm"],
        **{f"init_{i}": w for i, w in enumerate(init)},
    )
    special_rows()


def special_rows():
    import sys
    import tempfile

    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    import gpt1_reference
    from test_original import HEADS, SIZES, write_original

    shapes, arrays = gpt1_reference.random_checkpoint(**SIZES)
    directory = tempfile.mkdtemp()
    write_original(directory, shapes, arrays)
    backbone = kgpt.GPTBackbone.from_original(directory, num_heads=HEADS, num_special_tokens=3, seed=0)
    rows = keras.ops.convert_to_numpy(backbone.token_embedding.embeddings)[SIZES["vocab"]:]
    np.save(os.path.join(HERE, "special_rows_seed0.npy"), rows)


if __name__ == "__main__":
    main()
