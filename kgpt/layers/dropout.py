"""Dropout whose masks are Keras' own, drawn without JAX's rolled random-number loop on a CPU.

On JAX, `keras.layers.Dropout` draws its mask with `jax.random.bernoulli`,
whose threefry hash JAX lowers for the CPU as a 5-iteration `while` loop over
the whole mask (to keep compilation short). XLA cannot fuse across the
loop: each iteration reads and writes two `uint32` arrays the size of the
mask (with copies of the loop state), and the mask is applied in a further
pass. For the attention probabilities (`[batch, heads, length, length]`)
that was the largest single cost of a fine-tuning step on a CPU
(`benchmarks/profile_step.py`; docs/performance.md).

`Dropout` here computes the same hash unrolled, as plain element-wise
`uint32` arithmetic that XLA fuses with the comparison and the select into
one pass: the masks are bit for bit those of `keras.layers.Dropout` with the
same seed (same seed stream, same counters, same float conversion; checked
by tests/test_dropout.py), so results, checkpoints and seeds are unchanged.
Wherever that equality is not known to hold (TensorFlow, a `noise_shape`,
another JAX PRNG implementation, JAX's non-partitionable threefry, masks of
2**32 elements or more) it is `keras.layers.Dropout` unchanged.
"""

import math

import keras
import numpy as np

_KS_PARITY = np.uint32(0x1BD11BDA)  # threefry's key-schedule constant
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_ONE_BITS = np.uint32(0x3F800000)  # float32 1.0: JAX's uniform puts 23 random bits in its mantissa


def _rotate_left(x, bits):
    return (x << np.uint32(bits)) | (x >> np.uint32(32 - bits))


def threefry2x32(key, x0, x1):
    """Threefry-2x32 (20 rounds) of the counter pairs `(x0, x1)` under `key` (`uint32[2]`), unrolled.

    The hash JAX's default PRNG uses (`jax._src.random.threefry2x32`); JAX
    lowers it for the CPU as a loop, this is the same arithmetic written out.
    """
    k0, k1 = key[0], key[1]
    schedule = (k0, k1, k0 ^ k1 ^ _KS_PARITY)
    x0, x1 = x0 + schedule[0], x1 + schedule[1]
    for i in range(5):
        for rotation in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = x0 ^ _rotate_left(x1, rotation)
        x0 = x0 + schedule[(i + 1) % 3]
        x1 = x1 + schedule[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def bernoulli_mask(key, p, shape):
    """`jax.random.bernoulli(key, p, shape)` for a raw threefry `key` (`uint32[2]`), computed unrolled.

    As JAX computes it (partitionable threefry): the 32 random bits of
    element i are the two words of threefry2x32(key, (0, i)) xor-ed, made a
    float in [0, 1) from their top 23 bits, and compared with `p`.
    """
    from jax import lax
    from jax import numpy as jnp

    size = math.prod(shape)
    counts = lax.iota(jnp.uint32, size).reshape(shape)  # the low words of a uint64 iota; the high words are 0
    bits0, bits1 = threefry2x32(key, jnp.zeros(shape, jnp.uint32), counts)
    bits = bits0 ^ bits1
    floats = lax.bitcast_convert_type((bits >> np.uint32(9)) | _ONE_BITS, jnp.float32) - np.float32(1.0)
    return floats < p


def _unrolled_masks_match():
    """Whether JAX would draw `keras.layers.Dropout`'s masks as `bernoulli_mask` computes them."""
    import jax

    return jax.config.jax_default_prng_impl == "threefry2x32" and jax.config.jax_threefry_partitionable


@keras.saving.register_keras_serializable(package="kgpt")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` with the same masks, fused into one pass on JAX (see the module's docstring).

    Attributes:
        unrolled: bool, True. False draws the masks with `keras.random.dropout`
            (JAX's loop): for comparisons (`benchmarks/profile_step.py --ab`).
            Read when the step is traced, so set it before the first call.
    """

    unrolled = True

    def call(self, inputs, training=False):
        if not (
            self.unrolled
            and training
            and 0 < self.rate < 1
            and self.noise_shape is None
            and keras.config.backend() == "jax"
            and math.prod(inputs.shape) < 2**32
            and _unrolled_masks_match()
        ):
            return super().call(inputs, training=training)
        from jax import lax
        from jax import numpy as jnp

        seed = self.seed_generator.next()  # what keras.random.dropout draws: the next uint32[2] of this layer
        keep = 1.0 - self.rate
        mask = bernoulli_mask(seed, keep, tuple(inputs.shape))
        return lax.select(mask, inputs / keep, jnp.zeros_like(inputs))  # keras.random.dropout's arithmetic
