"""keras-hub's `CausalLM` interpretability and quantization hooks on a `GPTCausalLM`.

`GPTCausalLM.score(scoring_mode="logits" | "loss", layer_intercept_fn=,
target_ids=)` and `get_quantization_layer_structure` mean what they mean in
keras-hub's GPT-2, so code written for keras-hub (per-token losses, activation
patching, GPTQ/AWQ calibration) runs on GPT-1.
"""

import keras
from keras import ops

from kgpt import checks


def keras_hub_score(lm, inputs, scoring_mode, layer_intercept_fn, target_ids):
    """Logits `[batch, length, vocabulary]` or per-token losses `[batch, length]` of checked `inputs`.

    One eager forward pass (a `tf.GradientTape` or `jax.grad` can follow it): the
    summed token and position embeddings go through `layer_intercept_fn(x, -1)`
    before the embedding dropout, each block's output through
    `layer_intercept_fn(x, i)`; what it returns goes on. `"loss"` is the
    cross-entropy of `target_ids` at every position (padding included, as
    keras-hub computes it).
    """
    if layer_intercept_fn is not None and not callable(layer_intercept_fn):
        raise TypeError(f"layer_intercept_fn must be a function fn(x, i) -> x, got {layer_intercept_fn!r:.80}.")
    token_ids = inputs["token_ids"]
    if scoring_mode == "loss":
        if target_ids is None:
            raise ValueError("scoring_mode='loss' needs target_ids: the token to score at each position, e.g. "
                             "keras.ops.roll(token_ids, -1, axis=1).")
        target_ids = checks.token_ids(target_ids, "target_ids", lm.backbone.vocabulary_size)
        if target_ids.shape != token_ids.shape:
            raise ValueError(f"target_ids must have the shape of token_ids {token_ids.shape}, got "
                             f"{target_ids.shape}.")
    elif target_ids is not None:
        raise ValueError("target_ids is for scoring_mode='loss'; 'logits' scores every vocabulary entry.")
    if not hasattr(lm.backbone, "transformer_layers"):  # the LSTM ablation: no blocks to intercept
        if layer_intercept_fn is not None:
            raise ValueError(f"layer_intercept_fn needs a backbone of transformer blocks, not a "
                             f"{type(lm.backbone).__name__}.")
        logits = lm(inputs, training=False)
    else:
        logits = _intercepted_logits(lm.backbone, inputs, layer_intercept_fn or (lambda x, i: x))
    if scoring_mode == "logits":
        return logits
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    return loss(target_ids, ops.cast(logits, "float32"))


def _intercepted_logits(backbone, inputs, intercept):
    """The backbone's layers one at a time, `intercept(x, i)` after the embeddings (-1) and each block."""
    tokens = backbone.token_embedding(inputs["token_ids"])
    x = intercept(backbone.embeddings_add((tokens, backbone.position_embedding(tokens))), -1)
    x = backbone.embeddings_dropout(x, training=False)
    for i, block in enumerate(backbone.transformer_layers):
        x = intercept(block(x, padding_mask=inputs["padding_mask"], training=False), i)
    return backbone.token_embedding(x, reverse=True)


def quantization_layer_structure(lm, mode):
    """keras-hub's layout for GPTQ/AWQ calibration: what runs before the blocks, then the blocks.

    `pre_block_layers` is one Keras model from token ids `[batch, length]` to the
    first block's input: token plus position embeddings and the embedding
    dropout (the token embedding alone would feed the blocks inputs without
    positions). `sequential_blocks` are the backbone's transformer blocks.
    `None` for other modes, and for a backbone without blocks (the LSTM ablation).
    """
    if mode not in ("gptq", "awq") or not hasattr(lm.backbone, "transformer_layers"):
        return None
    backbone = lm.backbone
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    tokens = backbone.token_embedding(token_ids)
    x = backbone.embeddings_add((tokens, backbone.position_embedding(tokens)))
    embeddings = keras.Model(token_ids, backbone.embeddings_dropout(x), name="embeddings")
    return {"pre_block_layers": [embeddings], "sequential_blocks": backbone.transformer_layers}
