"""The fused attention-dropout kernel (interpreted on this CPU) against plain attention, and its wiring in the block."""

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    keras.config.backend() != "jax", reason="a JAX Pallas kernel; TensorFlow keeps the explicit attention"
)

B, T, N, D = 2, 40, 2, 16  # 40: not a multiple of the tiles, so the padding inside is exercised too


def inputs(length=T, depth=D, seed=0):
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.normal(size=(B, length, N, depth)), jnp.float32) for _ in range(3))
    # Row 0 pads on the right; row 1 on the left, so its first queries see no key at all.
    valid = np.ones((B, length), "int32")
    valid[0, length - 9 :] = 0
    valid[1, :3] = 0
    return q, k, v, jnp.asarray(valid)


def visible(valid):
    """bool `[B, 1, T, T]`: causal and not padding."""
    length = valid.shape[1]
    return np.tril(np.ones((length, length), bool))[None, None] & (np.asarray(valid)[:, None, None, :] != 0)


def plain(q, k, v, valid, keep=None, rate=0.0):
    """Attention written out: softmax over the visible keys, then the given keep mask; empty rows zero."""
    import jax
    import jax.numpy as jnp

    mask = visible(valid)
    scores = jnp.einsum("btnd,bsnd->bnts", q, k) * D**-0.5
    probs = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    probs = jnp.where(mask.any(-1, keepdims=True), probs, 0.0)
    if keep is not None:
        probs = jnp.where(keep, probs / (1 - rate), 0.0)
    return jnp.einsum("bnts,bsnd->btnd", probs, v)


def output_and_grads(attend, q, k, v):
    """`attend(q, k, v)` and the gradients of a random projection of it, in one compiled function."""
    import jax
    import jax.numpy as jnp

    weights = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)

    def loss(*args):
        out = attend(*args)
        return jnp.sum(out * weights), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def kernel(rate, seed=(11, 22), **tiles):
    from kgpt.layers.flash_attention import flash_attention

    tiles = tiles or dict(block=16, block_backward=16)
    return lambda q, k, v, valid: flash_attention(
        q, k, v, np.asarray(seed, "uint32"), rate=rate, scale=D**-0.5, padding_mask=valid, platform="cpu", **tiles
    )


def test_without_dropout_it_is_plain_attention_forward_and_backward():
    import jax

    q, k, v, valid = inputs()
    out, grads = output_and_grads(lambda *a: kernel(0.0)(*a, valid), q, k, v)
    expected, expected_grads = output_and_grads(lambda *a: plain(*a, valid), q, k, v)
    np.testing.assert_allclose(out, expected, atol=2e-6)
    for got, want in zip(grads, expected_grads):
        np.testing.assert_allclose(got, want, atol=1e-5)
    # JAX's own attention agrees wherever a query sees a key; where none is visible the kernel gives 0.
    seen = visible(valid).any(-1)[:, 0]  # [B, T]
    reference = jax.nn.dot_product_attention(q, k, v, mask=visible(valid), scale=D**-0.5)
    np.testing.assert_allclose(np.asarray(out)[seen], np.asarray(reference)[seen], atol=2e-6)
    assert (~seen).sum() == 3 and np.all(np.asarray(out)[~seen] == 0)


def test_with_dropout_it_is_plain_attention_with_the_hash_mask_forward_and_backward():
    from kgpt.layers.flash_attention import dropout_keep_mask

    q, k, v, valid = inputs()
    rate, seed = 0.25, np.asarray([11, 22], "uint32")
    keep = dropout_keep_mask(seed, B, N, T, rate)
    # Other tile sizes backward than forward: the backward pass must still draw the forward's mask.
    out, grads = output_and_grads(lambda *a: kernel(rate, block=16, block_backward=32)(*a, valid), q, k, v)
    expected, expected_grads = output_and_grads(lambda *a: plain(*a, valid, keep, rate), q, k, v)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    for got, want in zip(grads, expected_grads):
        np.testing.assert_allclose(got, want, atol=2e-5)
    undropped = plain(q, k, v, valid)
    assert np.abs(np.asarray(out) - np.asarray(undropped)).max() > 0.1  # the mask did drop something


def test_the_kernel_applies_exactly_the_hash_mask():
    import jax.numpy as jnp

    from kgpt.layers.flash_attention import dropout_keep_mask

    # Equal scores make each probability 1 / (row + 1), and one-hot values read them out one by one.
    length, rate = 32, 0.3
    zeros = jnp.zeros((B, length, N, length), jnp.float32)
    values = jnp.broadcast_to(jnp.eye(length)[None, :, None, :], (B, length, N, length))
    out = kernel(rate, seed=(5, 6))(zeros, zeros, values, None)  # [B, T, N, S]
    counts = np.arange(1, length + 1)[None, :, None, None]
    kept = np.moveaxis(np.round(np.asarray(out) * counts * (1 - rate)), 2, 1)  # [B, N, T, S]
    expected = np.asarray(dropout_keep_mask(np.asarray([5, 6], "uint32"), B, N, length, rate)) & np.tril(
        np.ones((length, length), bool)
    )
    np.testing.assert_array_equal(kept, expected)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_the_masks_drop_at_the_rate_independently_per_head_row_and_seed(rate):
    from kgpt.layers.flash_attention import dropout_keep_mask

    length = 512
    masks = {
        s: np.asarray(dropout_keep_mask(np.asarray(s, "uint32"), 2, 2, length, rate)).astype("float64")
        for s in ((7, 100), (7, 101), (8, 100))
    }  # (7, 101): the next seed of a Keras seed generator
    a = masks[(7, 100)]
    n = a[0, 0].size
    bound = 5 * np.sqrt(rate * (1 - rate) / a.size)
    assert abs(1 - a.mean() - rate) < bound

    def corr(x, y):
        return np.corrcoef(x.ravel(), y.ravel())[0, 1]

    pairs = {
        "heads": (a[0, 0], a[0, 1]),
        "batch rows": (a[0, 0], a[1, 0]),
        "next seed": (a[0, 0], masks[(7, 101)][0, 0]),
        "other seed word": (a[0, 0], masks[(8, 100)][0, 0]),
        "neighbouring columns": (a[0, 0, :, :-1], a[0, 0, :, 1:]),
        "neighbouring rows": (a[0, 0, :-1], a[0, 0, 1:]),
    }
    for name, (x, y) in pairs.items():
        assert abs(corr(x, y)) < 5 / np.sqrt(n), name
    assert abs(corr(a[0, 0], a[0, 0])) > 0.99  # the check can fail: a mask against itself


def test_it_lowers_for_gpus_and_tpus():
    import jax
    import jax.numpy as jnp
    from jax import export

    from kgpt.layers.flash_attention import flash_attention

    x = jax.ShapeDtypeStruct((2, 200, 4, 64), jnp.bfloat16)

    def grads(platform):
        def loss(q, k, v, seed, valid):
            out = flash_attention(q, k, v, seed, rate=0.1, scale=0.125, padding_mask=valid, platform=platform)
            return jnp.sum(out.astype(jnp.float32))

        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))

    seed, valid = jax.ShapeDtypeStruct((2,), jnp.uint32), jax.ShapeDtypeStruct((2, 200), jnp.int32)
    triton = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    for platform, target, kernel_call in (("gpu", "cuda", "__gpu$xla.gpu.triton"), ("tpu", "tpu", "tpu_custom_call")):
        exported = export.export(grads(platform), platforms=[target], disabled_checks=triton)(x, x, x, seed, valid)
        assert exported.mlir_module().count(kernel_call) >= 2, platform  # forward and backward kernels


def test_bad_arguments_are_refused():
    q, k, v, valid = inputs()
    with pytest.raises(ValueError, match="rate"):
        kernel(1.0)(q, k, v, valid)
    with pytest.raises(ValueError, match="powers of 2"):
        kernel(0.1, block=24)(q, k, v, valid)


def block_and_input(length=T):
    import kgpt

    layer = kgpt.GPTDecoderBlock(num_heads=N, intermediate_dim=32, dropout=0.0, attention_dropout=0.25)
    x = np.random.default_rng(2).normal(size=(B, length, N * D)).astype("float32")
    layer.build(x.shape)
    return layer, x


def test_the_block_trains_through_the_kernel_with_its_own_seed_stream(monkeypatch):
    import kgpt
    from kgpt.layers.flash_attention import dropout_keep_mask

    monkeypatch.setattr(kgpt.GPTDecoderBlock, "fused_dropout_attention", True)
    layer, x = block_and_input()
    _, _, _, valid = inputs()
    outs = []
    for _ in range(2):
        seed = np.asarray(layer.attention_probs_dropout.seed_generator.state.value)
        q, k, v = (dense(x) for dense in (layer.query_dense, layer.key_dense, layer.value_dense))
        keep = dropout_keep_mask(seed, B, N, T, 0.25)
        expected = layer.attention_output_dense(plain(q, k, v, valid, keep, 0.25))
        out, _ = layer.attention(x, valid, training=True)
        np.testing.assert_allclose(out, expected, atol=1e-5)
        outs.append(np.asarray(out))
    assert np.abs(outs[0] - outs[1]).max() > 0.01  # each step draws the next seed
    explicit, _ = layer.attention(x, valid, training=False)  # inference: no dropout, the explicit path
    monkeypatch.setattr(kgpt.GPTDecoderBlock, "fused_dropout_attention", False)
    np.testing.assert_allclose(layer.attention(x, valid, training=False)[0], explicit)


def test_the_kernel_is_chosen_on_one_gpu_or_tpu_only_and_can_be_turned_off(monkeypatch):
    import jax

    import kgpt

    layer, _ = block_and_input()
    chosen = {}
    for platform in ("cpu", "gpu", "tpu"):
        monkeypatch.setattr(jax, "default_backend", lambda platform=platform: platform)
        for switch in (None, True, False):
            monkeypatch.setattr(kgpt.GPTDecoderBlock, "fused_dropout_attention", switch)
            chosen[platform, switch] = layer._fused_dropout()
    assert chosen == {
        ("cpu", None): False,
        ("cpu", True): True,
        ("cpu", False): False,
        ("gpu", None): True,
        ("gpu", True): True,
        ("gpu", False): False,
        ("tpu", None): True,
        ("tpu", True): True,
        ("tpu", False): False,
    }
    monkeypatch.setattr(kgpt.GPTDecoderBlock, "fused_dropout_attention", None)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    keras.config.disable_flash_attention()
    try:
        assert not layer._fused_dropout()
    finally:
        keras.config.enable_flash_attention()  # Keras' default again: "where available" (None)
    assert layer._fused_dropout()
    monkeypatch.setattr(keras.distribution, "distribution", lambda: object())
    assert not layer._fused_dropout()


def test_on_a_cpu_training_keeps_the_explicit_path(monkeypatch):
    from kgpt.layers import flash_attention

    def refuse(*args, **kwargs):
        raise AssertionError("the kernel was called")

    monkeypatch.setattr(flash_attention, "flash_attention", refuse)
    layer, x = block_and_input()
    out, _ = layer.attention(x, None, training=True)
    assert out.shape == x.shape
