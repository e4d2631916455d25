"""Next-token cross-entropy through a tied output embedding, a chunk of tokens at a time.

The plain LM loss multiplies the hidden states `[batch, length, hidden]` by
the embedding matrix into logits `[batch, length, vocabulary]`, takes a float32
log-softmax, and autodiff keeps those arrays alive until the backward pass.
With GPT-1's 40,478-token vocabulary and 64 x 512 tokens per batch that is
5.3 GB per float32 copy: more than all of the model's weights and optimizer
state. `chunked_lm_loss` loops over chunks of `chunk_size` tokens and, while
it has a chunk's logits, computes that chunk's gradients too (the loss is a
weighted sum, so they do not depend on anything after it). Nothing of size
`tokens x vocabulary` outlives one chunk, and there are no extra FLOPs: the
backward pass only scales the stored gradients.

Both models train through it the same way, with `LMLossMixin`:
`lm_loss_chunk_size` is how many tokens' logits exist at once (`None`: all of
them, as one chunk), and the model's `compute_loss` says whether the loss is
for training, so that evaluation skips the gradients.

How `training` reaches the loss: `GPTCausalLM` calls `TiedLMLoss.sums` itself
and passes it. `GPTTaskModel`'s LM loss is one of its compiled losses, which
Keras calls as `loss(y_true, y_pred, sample_weight)` (`CompileLoss.call` in
keras/src/trainers/compile_utils.py), while the `training` flag that
`Model.compute_loss` receives is dropped there (`del training`): no argument
or attribute carries it to a compiled loss. Computing the LM term outside the
compiled losses instead would mean rebuilding what Keras does with them
(loss weights, the per-output `task_loss`/`lm_loss` trackers, a user's own
loss dict), so `LMLossMixin.compute_loss` sets it for the duration of its
call in a context variable (`gradients_wanted`): local to the thread (and
asyncio task), reset on the way out, read only while that call traces the
loss. A loss called outside any model's `compute_loss` computes gradients.
"""

import contextlib
import contextvars

import keras
from keras import ops

from kgpt.checks import one_of, positive_int
from kgpt.train import loss_trackers

# Small enough that a chunk's unfused float32 temporaries (TensorFlow without
# XLA keeps about six [chunk, vocabulary] arrays) stay far below the full
# logits, large enough for efficient matrix multiplies: see benchmarks/model.py.
DEFAULT_CHUNK_SIZE = 1024
# Rows the embedding matrix is padded to a multiple of inside the loss on an accelerator: XLA on a GPU
# multiplies GPT-1's 40,481 rows with a slower kernel than 40,576 (a fine-tuning step of the paper's shape,
# 512 tokens, on one H200 took 0.87x the time padded; docs/performance.md). The padded rows get a logit of -1e30.
VOCABULARY_MULTIPLE = 128
REDUCTIONS = ("mean_with_sample_weight", "sum_over_batch_size", "sum")
# Whether the loss being traced is for a training step (gradients computed alongside): set only by
# `gradients_wanted`, around a model's compute_loss (see the module docstring for why not an argument).
_GRADIENTS_WANTED = contextvars.ContextVar("kgpt_lm_loss_gradients", default=True)


@contextlib.contextmanager
def gradients_wanted(training):
    """Inside, `TiedLMLoss` computes its gradients with its value only when `training` (default: always)."""
    token = _GRADIENTS_WANTED.set(bool(training))
    try:
        yield
    finally:
        _GRADIENTS_WANTED.reset(token)


def resolve_chunk_size(lm_loss_chunk_size, default_loss=True):
    """`lm_loss_chunk_size` as `TiedLMLoss` takes it: `"auto"` is `DEFAULT_CHUNK_SIZE` with the default loss.

    With a custom loss (`default_loss=False`) `"auto"` and `None` give `"logits"`:
    the model's own loss on full logits. An integer must be positive.
    """
    if lm_loss_chunk_size == "auto":
        return DEFAULT_CHUNK_SIZE if default_loss else "logits"
    if lm_loss_chunk_size is None:
        return None if default_loss else "logits"
    lm_loss_chunk_size = positive_int(lm_loss_chunk_size, "lm_loss_chunk_size", or_else="None or 'auto'")
    if not default_loss:
        raise ValueError(
            "lm_loss_chunk_size trains without logits, so it computes the loss and next-token accuracy "
            "itself: leave loss and weighted_metrics at 'auto' and metrics unset."
        )
    return lm_loss_chunk_size


def check_tied(embedding):
    """Raises unless `embedding` is a `ReversibleEmbedding` whose reverse pass is a plain tied matmul."""
    if not isinstance(embedding, keras.layers.ReversibleEmbedding) or not embedding.tie_weights:
        raise ValueError(f"The chunked LM loss needs a tied ReversibleEmbedding, got {embedding!r}.")
    if embedding.reverse_dtype is not None or embedding.logit_soft_cap is not None:
        raise ValueError(
            f"The chunked LM loss computes plain logits; {embedding.name!r} has reverse_dtype="
            f"{embedding.reverse_dtype!r}, logit_soft_cap={embedding.logit_soft_cap!r}."
        )
    return embedding


def scale_for_replicas(loss):
    """Divides a replica's loss by the replica count under `tf.distribute`, as Keras' own losses do.

    The strategy sums the replicas' gradients, so each replica's share of the
    global mean is its own mean over the replica count.
    """
    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1:
            loss = loss / replicas
    return loss


def summed_over_replicas(value):
    """`value` summed over the replicas under `tf.distribute` (an all-reduce), or None outside one (and on JAX).

    JAX computes a data-parallel batch as one program, so its means are the
    batch's; under `tf.distribute` each replica sees only its own rows.
    """
    if keras.config.backend() != "tensorflow":
        return None
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync <= 1:
        return None
    return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.stop_gradient(value))


@keras.saving.register_keras_serializable(package="kgpt")
class BatchMean(keras.losses.Loss):
    """`loss`'s per-example values averaged by sample weight over the whole batch, whatever its devices.

    Under `tf.distribute` a Keras loss is each replica's own mean, scaled by
    the replica count: replicas holding different weight totals (a batch
    filled with rows that weigh 0, `kgpt.data.batching.filled`) then weigh
    their examples differently than one device would. This divides each
    replica's weighted sum by the batch's total weight instead (an
    all-reduce), so the replicas' gradients sum to the batch's. Elsewhere it
    is Keras' `"mean_with_sample_weight"`.

    Args:
        loss: a Keras loss whose `call(y_true, y_pred)` gives one value per example.
    """

    def __init__(self, loss, name=None, **kwargs):
        loss = keras.losses.get(loss)
        super().__init__(name=name or f"batch_mean_{loss.name}", **kwargs)
        self.loss = loss

    def __call__(self, y_true, y_pred, sample_weight=None):
        if len(y_pred.shape) == 1:  # one value per example (regression): Keras' losses reduce the last axis
            y_true, y_pred = ops.expand_dims(y_true, -1), ops.expand_dims(y_pred, -1)
        values = ops.cast(self.loss.call(y_true, y_pred), "float32")
        weights = (
            ops.ones_like(values)
            if sample_weight is None
            else ops.cast(ops.reshape(sample_weight, ops.shape(values)), "float32")
        )
        total = ops.sum(values * weights)
        count = ops.sum(weights)
        everywhere = summed_over_replicas(count)
        if everywhere is not None:
            return ops.divide_no_nan(total, everywhere)
        return ops.divide_no_nan(total, count)

    def call(self, y_true, y_pred):
        return self.loss.call(y_true, y_pred)

    def get_config(self):
        return {"loss": keras.saving.serialize_keras_object(self.loss), "name": self.name}

    @classmethod
    def from_config(cls, config):
        return cls(keras.saving.deserialize_keras_object(config.pop("loss")), **config)


def vocabulary_multiple():
    """What `chunked_lm_loss` pads the vocabulary to a multiple of by default: `VOCABULARY_MULTIPLE` on JAX on
    a GPU or TPU, 1 (no padding) elsewhere, where the extra pass over each chunk's logits costs more than the
    kernel saves (a CPU) or nothing is known to gain (TensorFlow without XLA)."""
    if keras.config.backend() != "jax":
        return 1
    import jax

    return 1 if jax.default_backend() == "cpu" else VOCABULARY_MULTIPLE


def chunked_lm_loss(
    hidden, embeddings, targets, weights, chunk_size=DEFAULT_CHUNK_SIZE, training=True, pad_vocabulary_to=None
):
    """Weighted sums of next-token cross-entropies and of correct argmax predictions.

    Equal, up to float rounding, to computing `logits = hidden @ embeddings.T`
    and summing `weights * sparse_categorical_crossentropy(targets, logits)`,
    and `weights * (argmax(logits) == targets)`.

    Args:
        hidden: float `[..., hidden_dim]`, in the compute dtype (bfloat16
            under mixed precision); the logits are its product with
            `embeddings` in that dtype, then float32 for the softmax.
        embeddings: `[vocabulary, hidden_dim]`, the tied embedding matrix
            (its float32 variable value; gradients come back in its dtype).
        targets: int `[...]`, the next-token ids.
        weights: `[...]`, per-token weights (0 for padding).
        chunk_size: tokens per chunk: the peak extra memory is a few float32
            `[chunk_size, vocabulary]` arrays. `None`: one chunk of all the
            tokens (the memory of plain logits, freed before the backward
            pass).
        training: compute the gradients with the loss; `False` for
            evaluation (no gradient can be taken then).
        pad_vocabulary_to: inside the loss, the embedding matrix gets rows
            of zeros (logit -1e30) up to a multiple of this, for faster
            matrix multiplies; `None`: `vocabulary_multiple()`. The result
            is the same.

    Returns:
        float32 `[2]`: the weighted loss sum (differentiable in `hidden` and
        `embeddings`) and the weighted count of correct predictions.

    Example:
    ```python
    import numpy as np
    from kgpt.train.lm_loss import chunked_lm_loss

    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(2, 5, 8)).astype("float32")
    embeddings = rng.normal(size=(11, 8)).astype("float32")
    targets = rng.integers(0, 11, (2, 5))
    loss_sum, correct = chunked_lm_loss(hidden, embeddings, targets, np.ones((2, 5)), chunk_size=4)
    ```
    """
    chunk_size = positive_int(chunk_size, "chunk_size", allow_none=True)
    multiple = vocabulary_multiple() if pad_vocabulary_to is None else pad_vocabulary_to
    multiple = positive_int(multiple, "pad_vocabulary_to")  # a NumPy integer too (from a config or an array's shape)
    hidden = ops.convert_to_tensor(hidden)
    embeddings = ops.convert_to_tensor(embeddings)
    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        # Read a variable here, not inside `fused`: run eagerly, tf.custom_gradient refuses a function
        # that reads variables unless its gradient takes them as `variables` (a Keras variable is a tensor
        # to convert_to_tensor, so it would still be one).
        embeddings = tf.identity(embeddings)
    if embeddings.shape[-1] != hidden.shape[-1]:
        raise ValueError(f"hidden {hidden.shape} and embeddings {embeddings.shape} differ in the last axis.")
    chunks = _Chunks(hidden, targets, weights, chunk_size)
    if not training:
        return _loop(chunks, chunks.flat_hidden, ops.cast(embeddings, hidden.dtype), multiple, gradients=False)[0]

    @ops.custom_gradient
    def fused(flat_hidden, embeddings):
        compute = ops.cast(embeddings, flat_hidden.dtype)
        sums, grad_hidden, grad_embeddings = _loop(chunks, flat_hidden, compute, multiple, gradients=True)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            scale = upstream[0]  # d(total loss) / d(loss sum); the correct count has no gradient
            return (
                ops.cast(ops.cast(grad_hidden, "float32") * scale, flat_hidden.dtype),
                ops.cast(grad_embeddings * scale, embeddings.dtype),
            )

        return sums, grad

    return fused(chunks.flat_hidden, embeddings)


class _Chunks:
    """Rows `[n, hidden]` padded to `chunks x rows` and laid out `[chunks, rows, ...]`.

    Chunk `c` holds tokens `c, c + chunks, c + 2 * chunks, ...` (strided, not
    contiguous): under data parallelism the token axis is split over devices
    and stays split in the `rows` axis, so each device loops over its share.
    """

    def __init__(self, hidden, targets, weights, chunk_size):
        self.flat_hidden = ops.reshape(hidden, (-1, hidden.shape[-1]))
        n = ops.shape(self.flat_hidden)[0]  # a tensor when the batch size is dynamic (TF graphs)
        self.n = n
        if chunk_size is None:
            self.count = 1
        else:
            count = (n + chunk_size - 1) // chunk_size
            self.count = max(count, 1) if isinstance(n, int) else ops.maximum(count, 1)
        self.rows = (n + self.count - 1) // self.count
        self.pad = self.count * self.rows - n
        self.targets = self.layout(ops.cast(ops.reshape(targets, (-1,)), "int32"))
        self.weights = self.layout(ops.cast(ops.reshape(weights, (-1,)), "float32"))

    def layout(self, x):
        """`[n, ...]` -> `[chunks, rows, ...]`, zero-padded (padding has weight 0)."""
        tail = tuple(x.shape[1:])
        x = ops.pad(x, [[0, self.pad]] + [[0, 0]] * len(tail))
        x = ops.reshape(x, (self.rows, self.count, *tail))
        return ops.swapaxes(x, 0, 1)

    def restore(self, x):
        """Inverse of `layout`: `[chunks, rows, ...]` -> `[n, ...]`."""
        tail = tuple(x.shape[2:])
        x = ops.reshape(ops.swapaxes(x, 0, 1), (-1, *tail))
        return x[: self.n]


def _loop(chunks, flat_hidden, embeddings, multiple, gradients):
    """`(sums, d sums[0] / d flat_hidden, d sums[0] / d embeddings)`; the gradients are None without `gradients`.

    The vocabulary is padded to a multiple of `multiple` rows, which no target names and whose logits are
    -1e30: their probabilities are 0, so are their gradients, and they are cut off the embeddings' gradient.
    """
    hidden = chunks.layout(flat_hidden)  # [C, R, H]
    true_vocabulary = embeddings.shape[0]
    vocabulary = true_vocabulary + (-true_vocabulary % multiple)
    bias = None
    if vocabulary > true_vocabulary:
        embeddings = ops.pad(embeddings, [[0, vocabulary - true_vocabulary], [0, 0]])
        bias = ops.concatenate(
            [ops.zeros((true_vocabulary,), "float32"), ops.full((vocabulary - true_vocabulary,), -1e30, "float32")]
        )
    kernel = ops.transpose(embeddings)  # [H, V]

    def body(i, carry):
        sums, grad_hidden, grad_embeddings = carry
        h, t, w = hidden[i], chunks.targets[i], chunks.weights[i]  # [R, H], [R], [R]
        logits = ops.cast(ops.matmul(h, kernel), "float32")  # [R, V]
        if bias is not None:
            logits = logits + bias
        log_z = ops.logsumexp(logits, axis=-1)  # [R]
        picked = ops.take_along_axis(logits, t[:, None], axis=-1)[:, 0]
        if (
            bias is not None
        ):  # a target off the real rows is NaN (as past them unpadded on JAX), not a padded row's -1e30
            picked = ops.where(ops.logical_and(t >= 0, t < true_vocabulary), picked, float("nan"))
        hits = ops.cast(ops.equal(ops.argmax(logits, axis=-1), t), "float32")
        sums = sums + ops.stack([ops.sum(w * (log_z - picked)), ops.sum(w * hits)])
        if gradients:
            probs = ops.exp(logits - log_z[:, None])
            dlogits = (probs - ops.one_hot(t, vocabulary, dtype="float32")) * w[:, None]
            dlogits = ops.cast(dlogits, h.dtype)  # [R, V]
            grad_hidden = ops.slice_update(grad_hidden, (i, 0, 0), ops.matmul(dlogits, embeddings)[None])
            grad_embeddings = grad_embeddings + ops.cast(ops.matmul(ops.transpose(dlogits), h), "float32")
        return sums, grad_hidden, grad_embeddings

    if gradients:
        init = (ops.zeros((2,), "float32"), ops.zeros_like(hidden), ops.zeros(embeddings.shape, "float32"))
    else:  # scalar placeholders: nothing of their size is carried
        init = (ops.zeros((2,), "float32"), ops.zeros((), hidden.dtype), ops.zeros((), "float32"))
    sums, grad_hidden, grad_embeddings = ops.fori_loop(0, chunks.count, body, init)
    if not gradients:
        return sums, None, None
    return sums, chunks.restore(grad_hidden), grad_embeddings[:true_vocabulary]


@keras.saving.register_keras_serializable(package="kgpt")
class TiedLMLoss(keras.losses.Loss):
    """Next-token cross-entropy of hidden states through a tied embedding, by `chunked_lm_loss`.

    A Keras loss whose `y_pred` is the final hidden states `[..., hidden]`
    (not logits) and `y_true` the next-token ids `[...]`; `sample_weight`
    masks padding. Compile a model whose output is hidden states with it.

    Args:
        embedding: the backbone's tied `ReversibleEmbedding`
            (`backbone.token_embedding`).
        chunk_size: tokens whose logits exist at once (`None`: all).
        reduction: `"mean_with_sample_weight"` (mean over weighted tokens),
            `"sum_over_batch_size"` (sum over the number of tokens) or `"sum"`.

    Its gradients are computed with its value (see the module docstring);
    inside `gradients_wanted(False)` (a model's evaluation, by `LMLossMixin`)
    they are not.

    Example:
    ```python
    loss = kgpt.train.lm_loss.TiedLMLoss(backbone.token_embedding, chunk_size=2048)
    value = loss(next_ids, backbone(inputs), sample_weight=padding_mask)
    ```
    """

    def __init__(
        self,
        embedding=None,
        chunk_size=DEFAULT_CHUNK_SIZE,
        reduction="mean_with_sample_weight",
        name="tied_lm_loss",
        dtype=None,
    ):
        super().__init__(name=name, reduction=one_of(reduction, "reduction", REDUCTIONS), dtype=dtype)
        self.embedding = None if embedding is None else check_tied(embedding)
        self.chunk_size = chunk_size

    def sums(self, y_true, y_pred, sample_weight=None, training=None):
        """float32 `[2]`: the weighted loss sum and the weighted count of correct argmaxes.

        `training`: compute the gradients with them; `None` (a compiled
        loss, which Keras calls without it) reads `gradients_wanted`.
        """
        if self.embedding is None:
            raise ValueError("TiedLMLoss needs the tied embedding layer (a loss restored from a config has none).")
        weights = ops.ones(ops.shape(y_true), "float32") if sample_weight is None else sample_weight
        training = _GRADIENTS_WANTED.get() if training is None else bool(training)
        return chunked_lm_loss(y_pred, self.embedding.embeddings, y_true, weights, self.chunk_size, training=training)

    def reduce(self, loss_sum, y_true, sample_weight=None):
        """The loss of a weighted sum, reduced as `reduction` says and shared over replicas."""
        if self.reduction == "sum":
            return scale_for_replicas(loss_sum)
        if self.reduction == "mean_with_sample_weight" and sample_weight is not None:
            divisor = ops.sum(ops.cast(sample_weight, "float32"))
        else:
            divisor = ops.cast(ops.size(y_true), "float32")
        total = summed_over_replicas(divisor)
        if total is not None:  # the mean over the whole batch's tokens: the replicas' gradients sum to its gradient
            return ops.divide_no_nan(loss_sum, total)
        return scale_for_replicas(ops.divide_no_nan(loss_sum, divisor))

    def __call__(self, y_true, y_pred, sample_weight=None):
        return self.reduce(self.sums(y_true, y_pred, sample_weight)[0], y_true, sample_weight)

    def call(self, y_true, y_pred):
        raise NotImplementedError("TiedLMLoss reduces inside __call__: its per-token losses never exist.")

    def get_config(self):
        return {"chunk_size": self.chunk_size, "reduction": self.reduction, "name": self.name}


class LMLossMixin:
    """The LM-loss wiring `GPTCausalLM` and `GPTTaskModel` share (mixed in ahead of their keras-hub base).

    `tied_lm_loss` builds the loss from `lm_loss_chunk_size` with one meaning
    in both (`resolve_chunk_size`); `compute_loss` runs the losses inside
    `gradients_wanted(training)`, so an evaluation step never computes the
    LM loss's gradients; the running losses count real examples only
    (`kgpt.train.loss_trackers`).
    """

    def tied_lm_loss(self, lm_loss_chunk_size, reduction="mean_with_sample_weight"):
        """A `TiedLMLoss` through this model's token embedding, `lm_loss_chunk_size` tokens at a time."""
        return TiedLMLoss(self.backbone.token_embedding, resolve_chunk_size(lm_loss_chunk_size), reduction=reduction)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        _, outputs = loss_trackers.trackers(self)
        weight = loss_trackers.real_examples(sample_weight) if outputs else None
        for tracker in outputs:  # Keras updates them inside this call
            tracker.weight = weight
        try:
            with gradients_wanted(training):
                return super().compute_loss(x, y, y_pred, sample_weight, training=training)
        finally:
            for tracker in outputs:
                tracker.weight = None

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        total, _ = loss_trackers.trackers(self)
        if total is not None:
            total.settle(loss_trackers.real_examples(sample_weight))
        return super().compute_metrics(x, y, y_pred, sample_weight)

    # A step is traced once: its trackers must be ExampleMeans before.
    def make_train_function(self, force=False):
        loss_trackers.trackers(self)
        return super().make_train_function(force)

    def make_test_function(self, force=False):
        loss_trackers.trackers(self)
        return super().make_test_function(force)
