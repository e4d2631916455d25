"""What one XLA compilation of a model's train step costs, in its own steps: the price of a padded length.

The length plan (`kgpt.data.batching.length_plan`) trades padding against
compilations, and what a compilation is worth in steps varies by orders of
magnitude: 3-8 steps for a 2 x 64 model with GPT-1's vocabulary on a CPU,
40-70 for a 2 x 32 model with a small one, thousands on an accelerator whose
steps take milliseconds. So, on JAX, a run measures it before planning: it
compiles the train step at the split's longest length (a length every plan
has, so `fit` reuses the program) and times two steps after it, on a copy of
the model's state that it then drops: the weights, the optimizer and the
random state are left as they were.

A program loaded from the persistent compilation cache counts what compiling
it cost when it was compiled (JAX keeps that time with the program), so a
run with a warm cache plans the lengths, and so the programs, that the run
which filled it planned.
"""

import itertools
import time

import keras
import numpy as np

from kgpt.data import batching

TIMED_STEPS = 2
# What one attention score costs a train step on a CPU (its mask, softmax and dropout mask, forward and backward:
# element-wise passes, dropout's hash the dearest), in FLOPs of the step's matmuls: fitted to JAX's step times
# against the padded length (docs/performance.md, "A step's cost against its padded length").
SCORE_FLOPS = 500
# What JAX reports when it loads a program from its persistent cache instead of compiling it: the compile
# time the load saved, and the load's own time (together: what compiling it took).
CACHE_EVENTS = ("/jax/compilation_cache/compile_time_saved_sec", "/jax/compilation_cache/cache_retrieval_time_sec")


def attention_length(backbone, lm_head=True):
    """The padded length at which a row's attention costs a train step as much as the rest of its work, or None.

    Per position, a row's work is its matmuls: the blocks' projections and
    feed-forward and, with `lm_head`, the tied LM head of the auxiliary loss
    (with GPT-1's vocabulary, most of it). Per position and per position it
    attends to, it is `heads` attention scores (the mask, softmax and
    dropout mask of each, forward and backward), priced at `SCORE_FLOPS`
    matmul FLOPs each, and `4 x hidden` FLOPs of attention's two matmuls.
    None for a backbone without attention (`kgpt.data.batching.row_cost`:
    positions alone).
    """
    heads = getattr(backbone, "num_heads", None)
    if not heads:
        return None
    layers, hidden, inner = backbone.num_layers, backbone.hidden_dim, backbone.intermediate_dim
    per_position = 2 * (layers * (4 * hidden**2 + 2 * hidden * inner) + lm_head * hidden * backbone.vocabulary_size)
    per_pair = layers * (4 * hidden + SCORE_FLOPS * heads)
    return float(per_position / per_pair)


def _measurable(model):
    """Whether `measure` can time `model`'s train step here (the cases its docstring names)."""
    if keras.config.backend() != "jax" or not model.jit_compile or model.run_eagerly:
        return False
    import jax

    return jax.process_count() == 1 and keras.distribution.distribution() is None


def measure(model, batch):
    """`(compile_seconds, step_seconds)` of `model`'s train step on one `(x, y, sample_weight)` batch, or None.

    None where nothing is measured: not JAX, not XLA-compiled, several
    processes (every process must plan the same lengths) or a distribution
    (the state would need its layouts). With `steps_per_execution` N, a step
    is an N-th of an execution.
    """
    if not _measurable(model):
        return None
    import jax

    model._symbolic_build(data_batch=batch)  # what fit does first: the metrics and the optimizer get their variables
    model.make_train_function()
    state = model._get_jax_state(
        trainable_variables=True, non_trainable_variables=True, optimizer_variables=True, metrics_variables=True
    )
    # Keras' step donates its state: it gets a copy (one program for the whole state, not one per shape).
    state = jax.jit(lambda values: jax.tree.map(jax.numpy.copy, values))(state)
    batches = itertools.repeat(batch)
    saved = []

    def listen(event, duration, **kwargs):
        if event in CACHE_EVENTS:
            saved.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        started = time.perf_counter()
        _, state = model.train_function(state, batches)
        jax.block_until_ready(state)
        first = time.perf_counter() - started
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    times = []
    for _ in range(TIMED_STEPS):
        started = time.perf_counter()
        _, state = model.train_function(state, batches)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - started)
    step = min(times)
    return max(first - step, 0.0) + sum(saved), step / model.steps_per_execution


def measure_longest(model, split, batch_size, lm=True, micro_batches=1):
    """`(compile_seconds, step_seconds, rows, length)`: `measure` on a batch of `split` at its longest length, or None.

    With gradient accumulation the step is one of a batch's `micro_batches`
    micro-batches, as the run feeds them; `step_seconds` is the whole
    batch's, of `rows` rows.
    """
    if not _measurable(model):
        return None
    longest = int(split.lengths.max())
    rows = np.argsort(split.lengths, kind="stable")[-batch_size:]  # a batch as long as the split's longest
    rows, _ = batching.filled(rows, micro_batches)
    micro = rows[: len(rows) // micro_batches]
    measured = measure(model, split.batch(micro, lm=lm, length=longest))
    if measured is None:
        return None
    compile_seconds, step_seconds = measured
    return compile_seconds, step_seconds * micro_batches, len(rows), longest


def compile_batches(model, split, batch_size, lm=True, micro_batches=1, attention_length=None):
    """One compilation of `model`'s train step, in average batches of `split` (`kgpt.data.batching.compile_batches`).

    Measured (`measure_longest`) at the split's longest length where that
    can be done, else `kgpt.data.batching.COMPILE_BATCHES`. A batch costs its
    rows' `kgpt.data.batching.row_cost(length, attention_length)`.
    """
    measured = measure_longest(model, split, batch_size, lm, micro_batches)
    if measured is None:
        return batching.COMPILE_BATCHES
    return batching.compile_batches(*measured, split, batch_size, attention_length)
