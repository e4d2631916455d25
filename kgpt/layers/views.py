"""The layers that fold a task's views into the backbone's batch and pick each view's extract state.

A task model's inputs are `[batch, views, length]` (one view per text; two
for similarity, the choices for multiple choice); the backbone reads
`[batch * views, length]`.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="kgpt")
class FoldViews(keras.layers.Layer):
    """`[batch, views, length]` -> `[batch * views, length]`."""

    def call(self, x):
        return ops.reshape(x, (-1, ops.shape(x)[-1]))

    def compute_output_shape(self, input_shape):
        batch, views = input_shape[0], input_shape[1]
        return (None if batch is None or views is None else batch * views, input_shape[-1])


@keras.saving.register_keras_serializable(package="kgpt")
class ExtractStates(keras.layers.Layer):
    """Hidden state at each view's last real token: `[B*K, L, H]` -> `[B, K, H]`."""

    def __init__(self, num_views, **kwargs):
        super().__init__(**kwargs)
        self.num_views = num_views

    def call(self, hidden, padding_mask):
        last = ops.sum(ops.cast(padding_mask, "int32"), axis=-1) - 1  # [B*K]
        last = ops.maximum(last, 0)
        states = ops.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]  # [B*K, H]
        return ops.reshape(states, (-1, self.num_views, ops.shape(hidden)[-1]))

    def compute_output_shape(self, hidden_shape, padding_mask_shape=None):
        return (None, self.num_views, hidden_shape[-1])

    def get_config(self):
        return {**super().get_config(), "num_views": self.num_views}


@keras.saving.register_keras_serializable(package="kgpt")
class UnfoldViews(keras.layers.Layer):
    """`[batch * views, ...]` -> `[batch, views, ...]`."""

    def __init__(self, num_views, **kwargs):
        super().__init__(**kwargs)
        self.num_views = num_views

    def call(self, x):
        shape = ops.shape(x)
        return ops.reshape(x, (-1, self.num_views, *shape[1:]))

    def compute_output_shape(self, input_shape):
        return (None, self.num_views, *input_shape[1:])

    def get_config(self):
        return {**super().get_config(), "num_views": self.num_views}
