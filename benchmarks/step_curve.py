"""`benchmarks/finetune.py --step_curve`: a train step's time against its padded length, and the plan's model of it.

    KERAS_BACKEND=jax python benchmarks/finetune.py --step_curve 16,32,64,128,256 --hidden_dim 64 \
        --intermediate_dim 256 --num_heads 2 --vocabulary_size 40481

The step is the benchmark's (its task model: classification head,
`compile()` defaults, the auxiliary LM loss), on batches of `--batch_size`
rows, every row as long as the padded length. Each length is compiled (JAX)
or traced (TensorFlow) first, untimed; then `--epochs` rounds time
`STEPS` steps at every length, the lengths taking turns (so a change in the
machine's load hits them alike), and the median is kept. Printed: per
length the step's ms and ms per row per position, and a least-squares fit of
a row's time to `a * L + b * L^2`: its `a / b`, the length at which
attention costs as much as the rest of the row, beside
`kgpt.train.compile_cost.attention_length`, the figure the length plan
derives from the model's shape (`kgpt.data.batching.row_cost`).
"""

import time

import keras
import numpy as np

from kgpt.train import compile_cost

STEPS = 2  # timed steps per length in a round


def fit_row_cost(lengths, row_seconds):
    """`(a, b)` of the least-squares fit of a row's seconds to `a * L + b * L^2` (relative errors weigh alike)."""
    lengths, row_seconds = np.asarray(lengths, float), np.asarray(row_seconds, float)
    design = np.stack([lengths, lengths**2], axis=1) / row_seconds[:, None]
    (a, b), *_ = np.linalg.lstsq(design, np.ones_like(lengths), rcond=None)
    return a, b


def measure(model, split_of, lengths, batch_size, rounds):
    """Times `model`'s train step at each padded length of `lengths` (`split_of(lengths)`: a split of such rows)."""
    lengths = sorted(lengths)
    batches = {n: split_of(np.full(batch_size, n)).batch(np.arange(batch_size), length=n) for n in lengths}
    for length in lengths:  # compiling / tracing, untimed
        began = time.perf_counter()
        model.train_on_batch(*batches[length])
        print(f"length {length}: first step (compiling / tracing) {time.perf_counter() - began:.1f} s")
    times = {length: [] for length in lengths}
    for _ in range(rounds):
        for length in lengths:
            began = time.perf_counter()
            for _ in range(STEPS):
                model.train_on_batch(*batches[length])  # returns the logs as numbers: the step has finished
            times[length].append((time.perf_counter() - began) / STEPS)
    step = {length: float(np.median(t)) for length, t in times.items()}
    a, b = fit_row_cost(lengths, [step[n] / batch_size for n in lengths])
    print("\n| padded length | step ms | ms per row per position | fit ms per row per position |")
    print("|---|---|---|---|")
    for n in lengths:
        print(f"| {n} | {step[n] * 1e3:.1f} | {step[n] / batch_size / n * 1e3:.4f} | {(a + b * n) * 1e3:.4f} |")
    print(
        f"\nfit: a row's time = {a * 1e3:.4f} ms x L + {b * 1e3:.6f} ms x L^2: attention costs as much as the rest "
        f"at L = {a / b:.0f}"
        if b > 0
        else f"\nfit: no growth beyond linear (b = {b:.3g})"
    )
    print(
        f"derived from the model's shape (compile_cost.attention_length): L = "
        f"{compile_cost.attention_length(model.backbone):.0f}; backend {keras.config.backend()}"
    )
    print(
        "rounds (ms per step): " + "; ".join(f"{n}: " + ", ".join(f"{t * 1e3:.0f}" for t in times[n]) for n in lengths)
    )
