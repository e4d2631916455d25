"""Causal flash attention with dropout on the probabilities, as a JAX Pallas kernel (forward and backward).

GPT-1 drops 10% of the attention probabilities. `jax.nn.dot_product_attention`
has no dropout, so with it the block computed `[batch, heads, T, T]`
probabilities, their mask and their dropped copy in device memory. Here the
kernel draws the mask itself, tile by tile, from a counter-based hash of
`(seed, batch, head, row, column)`: the backward pass draws the same bits
again, so no mask or probability is stored (only the output and one
log-sum-exp per row, as in FlashAttention-2).

Why not cuDNN's fused attention with dropout
(`jax._src.cudnn.fused_attention_stablehlo.dot_product_attention(dropout_rate=)`):
its seed is a Python int compiled into the call, not an array, so it cannot
follow the layer's seed stream step by step (each step would need its own
compilation, or the masks would come from state outside the model that
checkpoints cannot restore); it is a private module, GPU only, and cannot run
on a CPU to be tested. This kernel is one implementation for GPUs (Triton),
TPUs (Mosaic) and, interpreted, CPUs, where the tests check it.

The hash is two rounds of MurmurHash3's 32-bit finaliser, in int32
arithmetic (wrapping multiplies, logical shifts) because that is what every
Pallas backend lowers; `dropout_keep_mask` computes the same bits outside a
kernel. A query with no visible key (all its keys padding) outputs zeros.
"""

import functools
import math

import numpy as np

from kgpt import checks

_MASKED = -0.7 * float(np.finfo(np.float32).max)  # finite: a masked tile never makes inf - inf
_LOG2_E = math.log2(math.e)


def _int32(value):
    return np.uint32(value).view(np.int32)


_GOLDEN, _M1, _M2 = _int32(0x9E3779B9), _int32(0x85EBCA6B), _int32(0xC2B2AE35)


def _fmix32(x):
    """MurmurHash3's finaliser on int32 (the bits of its uint32 arithmetic)."""
    from jax import lax

    x = x ^ lax.shift_right_logical(x, np.int32(16))
    x = x * _M1
    x = x ^ lax.shift_right_logical(x, np.int32(13))
    x = x * _M2
    return x ^ lax.shift_right_logical(x, np.int32(16))


def _head_keys(seed0, seed1, head_index):
    """Two int32 keys for one (batch, head): `head_index = batch * heads + head`."""
    key = _fmix32(seed0 ^ _fmix32(seed1 + (head_index + 1) * _GOLDEN))
    return key, _fmix32(key + _GOLDEN)


def _keep(keys, rows, cols, stride, threshold):
    """True where an element is kept: its 31 hash bits are at or above `threshold` (rate * 2**31)."""
    from jax import lax

    bits = _fmix32(_fmix32((rows * np.int32(stride) + cols) ^ keys[0]) ^ keys[1])
    return lax.shift_right_logical(bits, np.int32(1)) >= np.int32(threshold)


def _threshold(rate):
    return min(int(round(rate * 2**31)), 2**31 - 1)


def dropout_keep_mask(seed, batch, heads, length, rate):
    """The kernel's keep mask, bool `[batch, heads, length, length]`, for `seed` (2 int32/uint32 words)."""
    from jax import numpy as jnp

    seed = jnp.asarray(seed).astype(jnp.uint32).view(jnp.int32) if jnp.asarray(seed).dtype != jnp.int32 else seed
    index = jnp.arange(batch * heads, dtype=jnp.int32).reshape(batch, heads, 1, 1)
    keys = _head_keys(seed[0], seed[1], index)
    rows = jnp.arange(length, dtype=jnp.int32)[:, None]
    cols = jnp.arange(length, dtype=jnp.int32)[None, :]
    return _keep(keys, rows, cols, length, _threshold(rate))


class _Config:
    """What the kernels are compiled for; hashable, so it can be a static argument."""

    def __init__(self, *, length, stride, heads, scale, rate, block, block_backward, platform, layout):
        self.length, self.stride, self.heads, self.scale, self.rate = length, stride, heads, scale, rate
        self.block, self.block_backward, self.platform, self.layout = block, block_backward, platform, layout
        self._key = (length, stride, heads, scale, rate, block, block_backward, platform, layout)

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, _Config) and self._key == other._key


def _scores(q, k, c, row0, col0, key_valid):
    """Log2-domain scores of a `[bq, D] x [bk, D]` tile, the visibility mask and the tile's positions."""
    from jax import lax
    from jax import numpy as jnp

    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    s = s * np.float32(c.scale * _LOG2_E)
    rows = row0 + lax.broadcasted_iota(jnp.int32, s.shape, 0)
    cols = col0 + lax.broadcasted_iota(jnp.int32, s.shape, 1)
    visible = (rows >= cols) & (key_valid != 0)
    return jnp.where(visible, s, np.float32(_MASKED)), visible, rows, cols


def _dropped(p, keys, rows, cols, c):
    """`p` with the kernel's dropout applied (kept elements scaled by 1 / (1 - rate))."""
    from jax import numpy as jnp

    if c.rate == 0:
        return p
    keep = _keep(keys, rows, cols, c.stride, _threshold(c.rate))
    return jnp.where(keep, p * np.float32(1.0 / (1.0 - c.rate)), np.float32(0.0))


def _program_keys(seed_ref, c):
    from jax.experimental import pallas as pl

    batch, head = (pl.program_id(1), pl.program_id(2))
    return _head_keys(seed_ref[0], seed_ref[1], batch * c.heads + head)


def _forward_kernel(seed_ref, q_ref, k_ref, v_ref, valid_ref, o_ref, lse_ref, *, c):
    from jax import lax
    from jax import numpy as jnp
    from jax.experimental import pallas as pl

    bq = bk = c.block
    i = pl.program_id(0)
    keys = _program_keys(seed_ref, c)
    q = q_ref[...]

    def body(j, carry):
        o, m, l = carry
        start = pl.multiple_of(j * bk, bk)
        s, visible, rows, cols = _scores(
            q, k_ref[pl.ds(start, bk), :], c, i * bq, start, valid_ref[:, pl.ds(start, bk)]
        )
        m_next = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        p = jnp.where(visible, jnp.exp2(s - m_next), np.float32(0.0))
        correction = jnp.exp2(m - m_next)
        v = v_ref[pl.ds(start, bk), :]
        # The normaliser sums the probabilities before dropout, the output their dropped copy.
        o = o * correction + jnp.dot(
            _dropped(p, keys, rows, cols, c).astype(v.dtype), v, preferred_element_type=jnp.float32
        )
        return o, m_next, l * correction + jnp.sum(p, axis=1, keepdims=True)

    init = (jnp.zeros(q.shape, jnp.float32), jnp.full((bq, 1), _MASKED, jnp.float32), jnp.zeros((bq, 1), jnp.float32))
    o, m, l = lax.fori_loop(0, i + 1, body, init)  # causal: key tiles up to the diagonal's
    empty = l == 0  # no visible key: zeros out, and no gradient
    o_ref[...] = jnp.where(empty, 0.0, o / jnp.where(empty, 1.0, l)).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log2(jnp.where(empty, 1.0, l))


def _backward_kernel(
    seed_ref, q_ref, k_ref, v_ref, valid_ref, do_ref, lse_ref, delta_ref, dq_ref, dk_ref, dv_ref, *, c
):
    from jax import lax
    from jax import numpy as jnp
    from jax.experimental import pallas as pl

    b = c.block_backward
    n = pl.program_id(0)
    keys = _program_keys(seed_ref, c)
    scale = np.float32(c.scale)

    def tile(q_start, k_start, q, k, v, do, lse, delta):
        s, visible, rows, cols = _scores(q, k, c, q_start, k_start, valid_ref[:, pl.ds(k_start, b)])
        p = jnp.where(visible, jnp.exp2(s - lse), np.float32(0.0))
        dropped = _dropped(p, keys, rows, cols, c)
        dp = lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        # d(scores) = P * (Z * dP - rowsum(dO * O)), Z the mask scaled by 1 / (1 - rate).
        ds = p * (_dropped(dp, keys, rows, cols, c) - delta) * scale
        return dropped, ds

    # Key tile n: its dK and dV from the query tiles at or below the diagonal.
    k_start = pl.multiple_of(n * b, b)
    k, v = k_ref[pl.ds(k_start, b), :], v_ref[pl.ds(k_start, b), :]

    def over_queries(j, carry):
        dk, dv = carry
        q_start = pl.multiple_of(j * b, b)
        q, do = q_ref[pl.ds(q_start, b), :], do_ref[pl.ds(q_start, b), :]
        dropped, ds = tile(
            q_start, k_start, q, k, v, do, lse_ref[pl.ds(q_start, b), :], delta_ref[pl.ds(q_start, b), :]
        )
        dv = dv + jnp.dot(dropped.astype(do.dtype).T, do, preferred_element_type=jnp.float32)
        return dk + jnp.dot(ds.astype(q.dtype).T, q, preferred_element_type=jnp.float32), dv

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(n, c.length // b, over_queries, (zeros, zeros))
    dk_ref[...], dv_ref[...] = dk.astype(dk_ref.dtype), dv.astype(dv_ref.dtype)

    # Query tile n: its dQ from the key tiles up to the diagonal.
    q_start = k_start
    q, do = q_ref[pl.ds(q_start, b), :], do_ref[pl.ds(q_start, b), :]
    lse, delta = lse_ref[pl.ds(q_start, b), :], delta_ref[pl.ds(q_start, b), :]

    def over_keys(j, dq):
        start = pl.multiple_of(j * b, b)
        k = k_ref[pl.ds(start, b), :]
        _, ds = tile(q_start, start, q, k, v_ref[pl.ds(start, b), :], do, lse, delta)
        return dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    dq = lax.fori_loop(0, n + 1, over_keys, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = dq.astype(dq_ref.dtype)


def _call(kernel, c, grid, in_specs, out_specs, out_shape, args):
    from jax.experimental import pallas as pl

    params = {}
    if c.platform == "gpu":
        from jax.experimental.pallas import triton as plgpu

        params["compiler_params"] = plgpu.CompilerParams(num_warps=4, num_stages=2)
    elif c.platform == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        params["compiler_params"] = pltpu.CompilerParams(dimension_semantics=("parallel",) * len(grid))
    return pl.pallas_call(
        functools.partial(kernel, c=c),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=c.platform == "cpu",
        **params,
    )(*args)


def _specs(c, block, rows):
    """BlockSpecs of the seed, a `[B, T, N, D]` / `[B, N, T, D]` tensor tiled by rows or whole, and the rest."""
    from jax.experimental import pallas as pl

    if c.platform == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        seed = pl.BlockSpec(memory_space=pltpu.SMEM)
    else:
        seed = pl.BlockSpec(memory_space=None)
    size = block if rows else c.length
    index = (
        (lambda i, b, h: (b, i if rows else 0, h, 0))
        if c.layout == "BTND"
        else (lambda i, b, h: (b, h, i if rows else 0, 0))
    )

    def tensor(depth):
        shape = (None, size, None, depth) if c.layout == "BTND" else (None, None, size, depth)
        return pl.BlockSpec(shape, index)

    valid = pl.BlockSpec((None, 1, c.length), lambda i, b, h: (b, 0, 0))
    stats = pl.BlockSpec((None, None, size, 1), lambda i, b, h: (b, h, i if rows else 0, 0))
    return seed, tensor, valid, stats


def _forward(c, seed, q, k, v, valid):
    import jax
    from jax import numpy as jnp

    batch, depth = q.shape[0], q.shape[-1]
    seed_spec, tensor, valid_spec, stats = _specs(c, c.block, True)
    _, whole, _, _ = _specs(c, c.block, False)
    lse_shape = jax.ShapeDtypeStruct((batch, c.heads, c.length, 1), jnp.float32)
    return _call(
        _forward_kernel,
        c,
        (c.length // c.block, batch, c.heads),
        [seed_spec, tensor(depth), whole(depth), whole(depth), valid_spec],
        [tensor(depth), stats],
        [jax.ShapeDtypeStruct(q.shape, q.dtype), lse_shape],
        (seed, q, k, v, valid),
    )


def _attention_forward(c, seed, q, k, v, valid):
    o, lse = _forward(c, seed, q, k, v, valid)
    return o, (seed, q, k, v, valid, o, lse)


def _attention_backward(c, residuals, do):
    import jax
    from jax import numpy as jnp

    seed, q, k, v, valid, o, lse = residuals
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1, keepdims=True)  # [B, T, N, 1]
    delta = jnp.moveaxis(delta, 2, 1) if c.layout == "BTND" else delta  # as lse: [B, N, T, 1]
    depth = q.shape[-1]
    seed_spec, _, valid_spec, _ = _specs(c, c.block_backward, True)
    _, whole, _, whole_stats = _specs(c, c.block_backward, False)
    _, tile, _, _ = _specs(c, c.block_backward, True)
    dq, dk, dv = _call(
        _backward_kernel,
        c,
        (c.length // c.block_backward, q.shape[0], c.heads),
        [seed_spec, whole(depth), whole(depth), whole(depth), valid_spec, whole(depth), whole_stats, whole_stats],
        [tile(depth)] * 3,
        [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)],
        (seed, q, k, v, valid, do, lse, delta),
    )
    return None, dq, dk, dv, None


@functools.cache
def _attention():
    """The differentiable kernel pair (made on first use: importing this module does not import JAX)."""
    import jax

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def attention(c, seed, q, k, v, valid):
        return _forward(c, seed, q, k, v, valid)[0]

    attention.defvjp(_attention_forward, _attention_backward)
    return attention


def flash_attention(
    query, key, value, seed, *, rate, scale, padding_mask=None, block=128, block_backward=64, platform=None
):
    """Causal softmax attention with dropout `rate` on the probabilities, fused; differentiable.

    Args:
        query, key, value: `[batch, length, heads, head_dim]`, one length (self-attention).
        seed: 2 int32 or uint32 words; one mask per seed (and per batch row and head).
        rate: float in [0, 1): dropout on the probabilities (0: none).
        scale: the scores' factor, usually `head_dim ** -0.5`.
        padding_mask: optional `[batch, length]`, nonzero for the keys that may be attended to.
        block, block_backward: tile sizes (query and key rows, powers of 2 from 8) of the forward and
            backward kernels; a length that is not a multiple is padded up to one inside.
        platform: `"gpu"`, `"tpu"` or `"cpu"` (interpreted, slow: for tests); default JAX's backend.

    Returns `softmax(scores)`, masked and dropped, times `value`: `query`'s shape and dtype.
    """
    import jax
    from jax import numpy as jnp

    checks.rate(rate, "rate")
    for size in (block, block_backward):
        if size < 8 or size & (size - 1):
            raise ValueError(f"Tile sizes must be powers of 2 from 8, got {size}.")
    platform = platform or jax.default_backend()
    batch, length, heads = query.shape[:3]
    seed = jnp.asarray(seed)
    seed = seed.view(jnp.int32) if seed.dtype == jnp.uint32 else seed.astype(jnp.int32)
    valid = (
        jnp.ones((batch, length), jnp.int32)
        if padding_mask is None
        else (jnp.asarray(padding_mask) != 0).astype(jnp.int32)
    )
    # Shorter inputs take one tile; a length between tiles is padded with keys no query sees.
    tile = 8 * _next_power_of_2(-(-length // 8))
    block, block_backward = min(block, tile), min(block_backward, tile)
    padded = -(-length // max(block, block_backward)) * max(block, block_backward)
    if padded != length:
        query, key, value = (jnp.pad(x, ((0, 0), (0, padded - length), (0, 0), (0, 0))) for x in (query, key, value))
        valid = jnp.pad(valid, ((0, 0), (0, padded - length)))
    # Mosaic (TPU) tiles only the last two axes: heads go before positions there.
    layout = "BNTD" if platform == "tpu" else "BTND"
    if layout == "BNTD":
        query, key, value = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))
    c = _Config(
        length=padded,
        stride=length,
        heads=heads,
        scale=float(scale),
        rate=float(rate),
        block=block,
        block_backward=block_backward,
        platform=platform,
        layout=layout,
    )
    out = _attention()(c, seed, query, key, value, valid[:, None, :])
    out = jnp.swapaxes(out, 1, 2) if layout == "BNTD" else out
    return out[:, :length]


def _next_power_of_2(n):
    return 1 << max(n - 1, 0).bit_length()
