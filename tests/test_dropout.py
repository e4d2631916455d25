"""kgpt's Dropout draws exactly keras.layers.Dropout's masks (on JAX by its unrolled threefry), on both backends."""

import keras
import numpy as np
import pytest

from kgpt.layers import dropout

SHAPES = [(3, 5), (2, 2, 7, 7)]


def pair(rate, seed):
    """`(kgpt's, Keras')` dropout layers with the same seed."""
    return dropout.Dropout(rate, seed=seed), keras.layers.Dropout(rate, seed=seed)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_masks_are_keras_own(shape):
    ours, theirs = pair(0.3, seed=1234)
    x = keras.ops.convert_to_tensor(np.random.default_rng(0).uniform(1, 2, shape).astype("float32"))
    for _ in range(2):  # the same seed stream: each call draws the next seed of both layers alike
        expected = keras.ops.convert_to_numpy(theirs(x, training=True))
        got = keras.ops.convert_to_numpy(ours(x, training=True))
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours(x, training=False)), keras.ops.convert_to_numpy(x))


@pytest.mark.skipif(keras.config.backend() != "jax", reason="the unrolled hash is JAX's path")
def test_the_unrolled_hash_is_jax_bernoulli_under_jit():
    import jax

    key = jax.numpy.asarray([0xDEADBEEF, 7], "uint32")
    for shape, p in (((4, 3, 33), 0.9), ((1000,), 0.5), ((2, 1), 0.1)):
        got = jax.jit(lambda k: dropout.bernoulli_mask(k, p, shape))(key)  # noqa: B023 - called at once, in this iteration
        np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.random.bernoulli(key, p, shape)))
    mask = np.asarray(dropout.bernoulli_mask(key, 0.9, (64, 64)))
    assert 0.85 < mask.mean() < 0.95  # a draw, not a constant


@pytest.mark.skipif(keras.config.backend() != "jax", reason="JAX's compiled step")
def test_the_mask_is_fused_without_a_loop():
    import jax

    if jax.default_backend() != "cpu":
        pytest.skip("JAX lowers threefry as a loop on a CPU only")

    layer = dropout.Dropout(0.1, seed=3)
    x = jax.numpy.ones((2, 8, 8))
    text = jax.jit(lambda v: layer(v, training=True)).lower(x).compile().as_text()
    assert " while(" not in text  # JAX's CPU lowering of jax.random.bernoulli is a while loop
    layer.unrolled = False
    text = jax.jit(lambda v: layer(v, training=True)).lower(x).compile().as_text()
    assert " while(" in text


def test_it_falls_back_where_the_masks_could_differ():
    ours, theirs = pair(0.5, seed=9)
    ours.noise_shape = theirs.noise_shape = (2, 1)
    x = keras.ops.ones((2, 6))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(ours(x, training=True)), keras.ops.convert_to_numpy(theirs(x, training=True))
    )
    restored = keras.layers.deserialize(keras.layers.serialize(dropout.Dropout(0.2, seed=1, name="d")))
    assert type(restored) is dropout.Dropout and restored.rate == 0.2
