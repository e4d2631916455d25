"""The original GPT-1 forward pass in plain NumPy (float64), from finetune-transformer-lm's train.py.

Written from the original equations, not from kgpt's code, so that loading a
checkpoint can be checked against an independent implementation.
"""

import numpy as np


def _norm(x, g, b, e=1e-5):
    u = x.mean(-1, keepdims=True)
    s = ((x - u) ** 2).mean(-1, keepdims=True)
    return (x - u) / np.sqrt(s + e) * g + b


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def forward(params, token_ids, n_head):
    """`(hidden [B, T, H], lm_logits [B, T, vocab])` of the original model, dropout off.

    `params` is the list of arrays in `params_shapes.json` order.
    """
    params = [np.asarray(p, np.float64) for p in params]
    positions, tokens = params[0], params[1]
    n_layer = (len(params) - 2) // 12
    b, t = token_ids.shape
    h = tokens[token_ids] + positions[None, :t]
    mask = np.tril(np.ones((t, t)))
    for i in range(n_layer):
        attn_w, attn_b, proj_w, proj_b, g1, b1, fc_w, fc_b, out_w, out_b, g2, b2 = params[2 + 12 * i : 14 + 12 * i]
        c = h @ attn_w[0] + attn_b  # conv1d with rf=1
        q, k, v = np.split(c, 3, axis=-1)

        def split_heads(x):
            return x.reshape(b, t, n_head, -1).transpose(0, 2, 1, 3)  # [B, heads, T, d]

        q, k, v = split_heads(q), split_heads(k), split_heads(v)
        w = q @ k.transpose(0, 1, 3, 2) / np.sqrt(v.shape[-1])
        w = w * mask + -1e9 * (1 - mask)
        a = (_softmax(w) @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)  # merge_heads
        a = a @ proj_w[0] + proj_b
        n = _norm(h + a, g1, b1)
        m = _gelu(n @ fc_w[0] + fc_b) @ out_w[0] + out_b
        h = _norm(n + m, g2, b2)
    return h, h @ tokens.T


def random_checkpoint(vocab, n_ctx, hidden, inner, n_layer, seed=0):
    """Random arrays in the original layout; larger than N(0, 0.02) so attention is far from uniform."""
    rng = np.random.default_rng(seed)
    shapes = [[n_ctx, hidden], [vocab, hidden]]
    shapes += [
        [1, hidden, 3 * hidden],
        [3 * hidden],
        [1, hidden, hidden],
        [hidden],
        [hidden],
        [hidden],
        [1, hidden, inner],
        [inner],
        [1, inner, hidden],
        [hidden],
        [hidden],
        [hidden],
    ] * n_layer
    arrays = []
    for index, shape in enumerate(shapes):
        which = (index - 2) % 12 if index >= 2 else None
        if which in (4, 10):  # layer-norm gains
            arrays.append(rng.uniform(0.5, 1.5, shape))
        else:
            arrays.append(rng.normal(0.0, 0.3, shape))
    return shapes, [a.astype("float32") for a in arrays]
