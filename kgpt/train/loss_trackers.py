"""Keras' running losses (`loss`, `task_loss`, `lm_loss`) averaged over a batch's real examples.

Keras weighs each batch's loss by its row count, rows that weigh nothing
included. kgpt fills batches with such rows (`kgpt.data.batching.filled`: a
batch split over devices, the last batch of a gradient-accumulated run cut into
micro-batches, the last held-out batch of pre-training), so Keras' epoch loss
would average over the filler too: 40 examples in micro-batches of 1 filled to
64 reported 40/64 of the loss. `use_real_examples` makes the model's loss
trackers weigh each batch by its real examples instead: the sum of its 1-D
sample weights (a task's examples), or its rows with any positive weight (an
LM's windows); without sample weights, its rows, as Keras does.
"""

import threading

import keras
from keras import ops

# A tracker's weight and waiting update belong to the step being traced, which under `tf.distribute`'s
# MirroredStrategy means one thread per replica, all tracing the same step at once: kept on the tracker,
# one replica's update was taken by another's settle, and the running loss was a single replica's (up to
# 0.35% off one device's on a 2-replica pre-training).
_traced = threading.local()


def _state(tracker):
    """This thread's `[weight, pending]` for `tracker`."""
    states = _traced.__dict__.setdefault("states", {})
    return states.setdefault(id(tracker), [None, None])


class ExampleMean(keras.metrics.Mean):
    """A `Mean` of batch losses weighed by `weight` (set around the update) instead of the row count given.

    With `deferred`, an update waits for `settle(weight)`: Keras updates the
    total-loss tracker before `compute_metrics`, the first place that sees
    the sample weights outside the gradient's trace. Both are the calling
    thread's own (see `_traced`).
    """

    deferred = False

    @property
    def weight(self):
        return _state(self)[0]

    @weight.setter
    def weight(self, value):
        _state(self)[0] = value

    def update_state(self, values, sample_weight=None):
        if self.deferred:
            _state(self)[1] = (values, sample_weight)
            return
        super().update_state(values, sample_weight if self.weight is None else self.weight)

    def settle(self, weight):
        """Applies the update that waits, weighed by `weight` (None: the rows Keras gave)."""
        state = _state(self)
        if state[1] is None:
            return
        (values, rows), state[1] = state[1], None
        super().update_state(values, rows if weight is None else weight)


def real_examples(sample_weight):
    """How many real examples a batch holds under `sample_weight`, summed over replicas (None: unknown)."""
    if isinstance(sample_weight, dict):
        sample_weight = sample_weight.get("task", next(iter(sample_weight.values()), None))
    if sample_weight is None:
        return None
    weight = ops.cast(sample_weight, "float32")
    if len(weight.shape) > 1:  # token weights: a row is an example when any of its tokens counts
        weight = ops.cast(ops.max(ops.reshape(weight, (ops.shape(weight)[0], -1)), axis=1) > 0, "float32")
    count = ops.sum(weight)
    return _per_replica(count)


def _per_replica(count):
    """`count` as each replica's share of the whole batch's: under `tf.distribute` every replica's tracker holds
    its loss scaled to the batch (`kgpt.train.lm_loss.BatchMean`), and the replicas' trackers are summed."""
    if keras.config.backend() != "tensorflow":
        return count
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync <= 1:
        return count
    return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.stop_gradient(count)) / context.num_replicas_in_sync


def trackers(model):
    """The model's total-loss tracker and its per-output ones, made `ExampleMean`s (None before compile).

    Their class is swapped in place (no variables change) wherever Keras
    built them: in `compile`, `compile_from_config` or its first loss.
    """
    total = getattr(model, "_loss_tracker", None)
    if total is None:
        return None, []
    compile_loss = getattr(model, "_compile_loss", None)
    outputs = list(compile_loss.metrics) if compile_loss is not None else []
    for tracker in (total, *outputs):
        if type(tracker) is keras.metrics.Mean:
            tracker.__class__ = ExampleMean
    total.deferred = True
    return total, outputs
