"""The paper's optimiser: Adam with decoupled weight decay and warm-up schedules.

Pre-training (section 4.1): peak 2.5e-4, linear warm-up over 2000 updates,
cosine annealing to 0. Fine-tuning: peak 6.25e-5, warm-up over 0.2% of
training, then linear decay to 0. Both use decoupled weight decay w = 0.01 on
every weight except biases and layer-norm gains/offsets, and (as the
original code does) global gradient-norm clipping at 1.
"""

import math

import keras
from keras import ops

from kgpt.checks import nonnegative, one_of, positive, positive_int

# Variable names never decayed: biases of every Dense/EinsumDense and the
# layer-norm gain/offset. On TensorFlow Keras matches against the raw
# tf.Variable name ("layer/bias:0"), on JAX against "bias": accept both.
NO_DECAY_NAMES = [r"(^|/)(bias|gamma|beta)(:\d+)?$"]


@keras.saving.register_keras_serializable(package="kgpt")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0 to `peak_learning_rate`, then decay to 0.

    Args:
        peak_learning_rate: float. Rate reached at the end of warm-up.
        warmup_steps: int. Updates of linear warm-up.
        total_steps: int or None. Update at which the rate reaches 0. `None`
            holds the peak after warm-up (when the horizon is not known yet).
        decay: `"cosine"` (pre-training) or `"linear"` (fine-tuning).
        gradient_accumulation_steps: micro-batches per update. Keras gives
            the schedule its micro-batch count; the schedule counts updates,
            so an accumulated run follows the same rates as one without.

    Example:
    ```python
    schedule = kgpt.WarmupSchedule(2.5e-4, warmup_steps=2000, total_steps=100_000)
    float(schedule(1000))  # 1.25e-4
    ```
    """

    def __init__(
        self, peak_learning_rate, warmup_steps, total_steps=None, decay="cosine", gradient_accumulation_steps=1
    ):
        peak_learning_rate = nonnegative(peak_learning_rate, "peak_learning_rate")
        warmup_steps = positive_int(warmup_steps, "warmup_steps", minimum=0)
        total_steps = positive_int(total_steps, "total_steps", minimum=0, allow_none=True, or_else="None")
        self.decay = one_of(decay, "decay", ("cosine", "linear"))
        self.gradient_accumulation_steps = positive_int(gradient_accumulation_steps, "gradient_accumulation_steps")
        if total_steps is not None and total_steps < warmup_steps:
            raise ValueError(
                f"total_steps ({total_steps}) must be >= warmup_steps "
                f"({warmup_steps}); for a run this short pass a shorter warm-up, "
                "e.g. optimizer=kgpt.gpt_adamw(warmup_steps=..., total_steps=...)."
            )
        self.peak_learning_rate = peak_learning_rate
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def __call__(self, step):
        if self.gradient_accumulation_steps > 1:  # micro-batches -> updates
            step = ops.floor_divide(step, self.gradient_accumulation_steps)
        step = ops.cast(step, "float32")
        peak = ops.cast(self.peak_learning_rate, "float32")
        warmup = ops.cast(max(self.warmup_steps, 1), "float32")
        warm = peak * step / warmup
        if self.total_steps is None:
            after = peak
        else:
            span = float(max(self.total_steps - self.warmup_steps, 1))
            progress = ops.clip((step - self.warmup_steps) / span, 0.0, 1.0)
            if self.decay == "cosine":
                after = peak * 0.5 * (1.0 + ops.cos(math.pi * progress))
            else:
                after = peak * (1.0 - progress)
        return ops.where(step < self.warmup_steps, warm, after)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "decay": self.decay,
            **(
                {"gradient_accumulation_steps": self.gradient_accumulation_steps}
                if self.gradient_accumulation_steps > 1
                else {}
            ),
        }


@keras.saving.register_keras_serializable(package="kgpt")
class GPTAdamW(keras.optimizers.AdamW):
    """AdamW that never decays biases or layer-norm parameters.

    The exclusion lives in the class (not in a call made after construction)
    so it survives `.keras` save/load of a compiled model. Global-norm
    clipping measures the gradient of the whole batch under
    `tf.distribute` too (Keras clips each replica's partial gradient before
    summing them, which changes the result of data-parallel training).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.exclude_from_weight_decay(var_names=NO_DECAY_NAMES)

    def _clip_gradients(self, grads):
        if self.global_clipnorm and _tf_replicas() > 1:
            # Clipped after the cross-replica sum (_all_reduce_sum_gradients). Passing
            # through Keras' multiply keeps the gradients in the form its all-reduce expects.
            return [None if g is None else ops.multiply(g, ops.ones((), g.dtype)) for g in grads]
        return super()._clip_gradients(grads)

    def _all_reduce_sum_gradients(self, grads_and_vars):
        # TensorFlow backend only: Keras sums the replicas' gradients here.
        if _tf_replicas() <= 1:
            return super()._all_reduce_sum_gradients(grads_and_vars)
        import tensorflow as tf

        reduced = super()._all_reduce_sum_gradients(grads_and_vars)
        if not self.global_clipnorm:
            return reduced

        present = [(g, v) for g, v in reduced if g is not None]
        clipped, _ = tf.clip_by_global_norm([g for g, _ in present], self.global_clipnorm)
        clipped = iter(clipped)
        return [(None if g is None else next(clipped), v) for g, v in reduced]


def _tf_replicas():
    """Replicas of the enclosing `tf.distribute` replica context (1 outside one, and on JAX)."""
    if keras.config.backend() != "tensorflow":
        return 1
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    return context.num_replicas_in_sync if context is not None else 1


def gpt_adamw(
    learning_rate=2.5e-4,
    warmup_steps=2000,
    total_steps=None,
    decay="cosine",
    weight_decay=0.01,
    global_clipnorm=1.0,
    gradient_accumulation_steps=1,
):
    """The paper's optimiser with its schedule; defaults are pre-training's.

    For fine-tuning: `gpt_adamw(6.25e-5, warmup_steps=int(0.002 * total),
    total_steps=total, decay="linear")`. With `gradient_accumulation_steps`
    K > 1, each update averages the gradients of K micro-batches (Keras'
    own accumulation), clips that average, and `warmup_steps` and
    `total_steps` still count updates.
    """
    # The schedule checks the steps; its rate is checked here, under the name given here.
    schedule = WarmupSchedule(
        nonnegative(learning_rate, "learning_rate"), warmup_steps, total_steps, decay, gradient_accumulation_steps
    )
    weight_decay = nonnegative(weight_decay, "weight_decay")
    if global_clipnorm is not None:
        global_clipnorm = positive(global_clipnorm, "global_clipnorm")
    return GPTAdamW(
        learning_rate=schedule,
        weight_decay=weight_decay,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-8,
        global_clipnorm=global_clipnorm,
        gradient_accumulation_steps=gradient_accumulation_steps if gradient_accumulation_steps > 1 else None,
    )
