"""One GPT-1 transformer block: masked self-attention and a GELU MLP, each followed by a layer norm.

    h = LN(x + dropout(attention(x)))        attention: causal, padded keys hidden
    y = LN(h + dropout(W2 gelu(W1 h)))

This is the file to touch to change the attention. Its sublayers are public
and named after the arrays they hold, so the original/Hugging Face formats
(`kgpt.models.converters.original`) and the model-parallel layout (`kgpt.parallel.distribute`)
map onto them by name: `query_dense`, `key_dense`, `value_dense`
(kernels `[hidden, heads, head_dim]`), `attention_output_dense`
(`[heads, head_dim, hidden]`), `attention_layer_norm`,
`feedforward_intermediate_dense`, `feedforward_output_dense`,
`feedforward_layer_norm`. The arithmetic is that of keras-hub's
`TransformerDecoder` (post-LN) with Keras' `MultiHeadAttention`.
"""

import math

import keras
from keras import ops

from kgpt.layers.dropout import Dropout


@keras.saving.register_keras_serializable(package="kgpt")
def gelu_tanh(x):
    """GELU in the tanh approximation the original GPT used."""
    return keras.activations.gelu(x, approximate=True)


def _clone(initializer):
    # A fresh instance per weight: an unseeded initializer draws its own seed,
    # so two weights never start equal.
    return initializer.__class__.from_config(initializer.get_config())


@keras.saving.register_keras_serializable(package="kgpt")
class GPTDecoderBlock(keras.layers.Layer):
    """A post-layer-norm decoder block with a key/value cache for generation.

    Args:
        num_heads: int. Attention heads; `hidden_dim` (the input width) must
            be a multiple of it.
        intermediate_dim: int. Width of the MLP's inner layer.
        dropout: float. Dropout on both residual branches.
        attention_dropout: optional float. Dropout on the attention
            probabilities (`None`: `dropout`). At 0 attention runs through
            `keras.ops.dot_product_attention` (flash attention where the
            device has it). Otherwise, in training on JAX on a GPU or TPU,
            through `kgpt.layers.flash_attention`'s kernel, which draws the
            mask inside (see `fused_dropout_attention`); elsewhere the
            probabilities are computed explicitly, in float32 under mixed
            precision.
        layer_norm_epsilon: float.
        kernel_initializer: initializer of every kernel (biases start at 0).

    Call arguments:
        x: float `[batch, length, hidden]`.
        padding_mask: optional `[batch, length]`, 1 for the keys that may be attended to.
        cache: optional `[batch, 2, max_length, heads, head_dim]`: keys and
            values of the positions before; with it the call returns `(y, cache)`.
        cache_update_index: the position of `x[:, 0]` (with `cache`).

    Attributes:
        fused_dropout_attention: where attention with dropout runs fused in
            training (a class attribute, read when the step is traced).
            `None` (default): on JAX on one GPU or TPU, unless
            `keras.config.disable_flash_attention()` was called or a Keras
            distribution is set (the kernel has no sharding rule, so XLA
            would gather its inputs onto every device). `False`: never, the
            explicit probabilities as on a CPU. `True`: on JAX on any device
            (a CPU interprets the kernel, slowly: for tests).
    """

    fused_dropout_attention = None

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        dropout=0.0,
        attention_dropout=None,
        layer_norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.layer_norm_epsilon = layer_norm_epsilon
        self.activation = gelu_tanh
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, input_shape):
        hidden = input_shape[-1]
        if hidden % self.num_heads:
            raise ValueError(f"The input width {hidden} is not a multiple of num_heads={self.num_heads}.")
        head_dim = hidden // self.num_heads

        def dense(name, equation, shape, bias_axes):
            return keras.layers.EinsumDense(
                equation,
                output_shape=shape,
                bias_axes=bias_axes,
                name=name,
                kernel_initializer=_clone(self.kernel_initializer),
                dtype=self.dtype_policy,
            )

        heads = (None, self.num_heads, head_dim)
        self.query_dense = dense("query", "abc,cde->abde", heads, "de")
        self.key_dense = dense("key", "abc,cde->abde", heads, "de")
        self.value_dense = dense("value", "abc,cde->abde", heads, "de")
        # Probabilities in float32 even when the block computes in 16 bits.
        self.attention_softmax = keras.layers.Softmax(axis=-1, dtype="float32", name="attention_softmax")
        self.attention_probs_dropout = Dropout(
            self._attention_rate(), dtype=self.dtype_policy, name="attention_probs_dropout"
        )
        self.attention_output_dense = dense("attention_output", "abcd,cde->abe", (None, hidden), "e")
        self.attention_layer_norm = self._layer_norm("self_attention_layer_norm")
        self.attention_residual_dropout = Dropout(self.dropout, dtype=self.dtype_policy, name="self_attention_dropout")
        self.feedforward_intermediate_dense = keras.layers.Dense(
            self.intermediate_dim,
            activation=self.activation,
            kernel_initializer=_clone(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="feedforward_intermediate_dense",
        )
        self.feedforward_output_dense = keras.layers.Dense(
            hidden,
            kernel_initializer=_clone(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="feedforward_output_dense",
        )
        self.feedforward_layer_norm = self._layer_norm("feedforward_layer_norm")
        self.feedforward_dropout = Dropout(self.dropout, dtype=self.dtype_policy, name="feedforward_dropout")
        for layer in (self.query_dense, self.key_dense, self.value_dense):
            layer.build(input_shape)
        self.attention_output_dense.build((*input_shape[:-1], self.num_heads, head_dim))
        self.attention_layer_norm.build(input_shape)
        self.feedforward_intermediate_dense.build(input_shape)
        self.feedforward_output_dense.build((*input_shape[:-1], self.intermediate_dim))
        self.feedforward_layer_norm.build(input_shape)
        self.built = True

    def _layer_norm(self, name):
        return keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name)

    def _attention_rate(self):
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    def call(self, x, padding_mask=None, cache=None, cache_update_index=None, training=None):
        y, cache = self.attention(x, padding_mask, cache, cache_update_index, training)
        h = self.attention_layer_norm(x + self.attention_residual_dropout(y, training=training))
        y = self.feedforward_output_dense(self.feedforward_intermediate_dense(h))
        out = self.feedforward_layer_norm(h + self.feedforward_dropout(y, training=training))
        return out if cache is None else (out, cache)

    def attention(self, x, padding_mask=None, cache=None, cache_update_index=None, training=None):
        """Causal multi-head self-attention: `(output [batch, length, hidden], updated cache or None)`."""
        query = self.query_dense(x)  # [B, T, N, D]
        key, value = self.key_dense(x), self.value_dense(x)  # [B, T, N, D]
        start = 0
        if cache is not None:
            start = 0 if cache_update_index is None else cache_update_index
            key = ops.slice_update(cache[:, 0], [0, start, 0, 0], key)  # [B, S, N, D]
            value = ops.slice_update(cache[:, 1], [0, start, 0, 0], value)
            cache = ops.stack((key, value), axis=1)
        mask = self._mask(ops.shape(query), ops.shape(key)[1], start, padding_mask)  # [B, 1, T, S]
        scale = 1.0 / math.sqrt(float(query.shape[-1]))
        if self._attention_rate() == 0:
            y = ops.dot_product_attention(
                query, key, value, mask=mask, scale=scale, flash_attention=keras.config.is_flash_attention_enabled()
            )
        elif training and cache is None and self._fused_dropout():
            from kgpt.layers.flash_attention import flash_attention

            # The seed the explicit path's dropout would draw: the layer's seed stream (and so a
            # checkpoint's random state) advances the same way whichever path runs.
            seed = self.attention_probs_dropout.seed_generator.next()
            y = flash_attention(
                query, key, value, seed, rate=self._attention_rate(), scale=scale, padding_mask=padding_mask
            )
        else:
            scores = ops.einsum("aecd,abcd->acbe", key, ops.multiply(query, ops.cast(scale, query.dtype)))
            probs = self.attention_softmax(scores, mask=mask)  # [B, N, T, S]
            probs = self.attention_probs_dropout(probs, training=training)
            y = ops.einsum("acbe,aecd->abcd", probs, value)  # [B, T, N, D]
        return self.attention_output_dense(y), cache

    def _fused_dropout(self):
        if keras.config.backend() != "jax" or self.fused_dropout_attention is False:
            return False
        if self.fused_dropout_attention:
            return True
        import jax

        return (
            jax.default_backend() in ("gpu", "tpu")
            and keras.config.is_flash_attention_enabled() is not False
            and keras.distribution.distribution() is None
        )

    @staticmethod
    def _mask(query_shape, key_length, start, padding_mask):
        """Boolean `[batch, 1, T, S]`: query `start + t` sees keys `<= start + t` that are not padding."""
        batch, query_length = query_shape[0], query_shape[1]
        rows = ops.arange(query_length, dtype="float32") + ops.cast(start, "float32")
        mask = (ops.expand_dims(rows, 1) >= ops.arange(key_length, dtype="float32"))[None, None]  # [1, 1, T, S]
        if padding_mask is None:
            return ops.broadcast_to(mask, (batch, 1, query_length, key_length))
        return ops.logical_and(mask, ops.cast(padding_mask, "bool")[:, None, None, :])

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            layer_norm_epsilon=self.layer_norm_epsilon,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
