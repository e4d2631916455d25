"""How training is executed, A/B in one process: `steps_per_execution`, TensorFlow's `jit_compile`, per-step syncs.

    KERAS_BACKEND=jax python benchmarks/execution.py --workload finetune --steps_per_execution 1,4,16
    KERAS_BACKEND=tensorflow python benchmarks/execution.py --workload finetune --steps_per_execution 1,4,16 \
        --jit_compile default,true
    KERAS_BACKEND=jax python benchmarks/execution.py --workload pretrain --callbacks none,kgpt,sync

Every combination of the list flags is a variant: a fresh model (same seed,
same weights) compiled with that `steps_per_execution` and `jit_compile`,
fitted with that set of callbacks. Each variant first fits one untimed epoch
(it traces and compiles every shape it will see; on JAX the persistent
compilation cache of `--compilation_cache` turns the other variants'
compilations of the same programs into loads), then the variants take turns,
one timed epoch each, `--rounds` times (A, B, C, A, B, C, ...), so a change in
the machine's load hits them alike. Printed: each variant's median epoch, its
throughput, the ratio of its median to the first variant's, the median of
its per-round ratios to the first variant (the same round's epochs ran
closest in time: the figure to trust under a changing load), and every
epoch's seconds.

Workloads:

- finetune: `benchmarks/finetune.py`'s synthetic MNLI-like split and task
  model (its flags: --num_examples, --hidden_dim, ...), fed as `kgpt-train`
  feeds it (`kgpt.data.batching.dataset` with the compile-aware length plan
  for `--plan_epochs`); an epoch is one pass over the split.
- pretrain: a `GPTCausalLM` of the same shape on `--pretrain_steps` batches of
  `--batch_size` random windows of `--sequence_length` tokens (the shape every
  pre-training step has); throughput in tokens/s.

Callbacks:

- none: only Keras' own (History; `verbose=0`, no progress bar);
- kgpt: what `kgpt-train` adds without an output folder: `StopOnNonFiniteLoss`,
  `Progress` (no checkpoints) and `ProgressLog` (`--log_every`);
- sync: kgpt's plus a callback that only overrides `on_train_batch_end`, which
  makes Keras hand every batch's logs to the callbacks on the main thread as
  Python floats: a host-device sync per execution (what kgpt's callbacks did
  before they were made asynchronous, and what Keras' TensorBoard callback
  does);
- tensorboard: kgpt's plus the TensorBoard callback `kgpt-train` adds with an
  output folder (`EpochTensorBoard`, writing to a temporary folder);
- keras_tensorboard: kgpt's plus Keras' own `TensorBoard` callback, which
  `kgpt-train` added before (the same per-epoch files, and a per-step sync).
"""

import atexit
import itertools
import os
import shutil
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import finetune  # the split's and the model's flags, and their builders (the script's folder is on sys.path)
import keras
import numpy as np
import tensorflow as tf
from absl import app, flags, logging

import kgpt
from kgpt.data import batching
from kgpt.jobs import run
from kgpt.train import callbacks as kgpt_callbacks

flags.DEFINE_enum("workload", "finetune", ["finetune", "pretrain"], "What an epoch trains (see the docstring).")
flags.DEFINE_list("steps_per_execution", ["1", "4", "16"], "Keras' steps_per_execution values to compare.")
flags.DEFINE_list(
    "jit_compile",
    ["default"],
    "Keras' jit_compile values: default (Keras' 'auto': XLA on JAX, on TensorFlow only with a GPU), true, false.",
)
CALLBACK_SETS = ("none", "kgpt", "sync", "tensorboard", "keras_tensorboard")
flags.DEFINE_list("callbacks", ["none"], f"Callback sets to compare: {', '.join(CALLBACK_SETS)} (see the docstring).")
flags.DEFINE_integer("rounds", 3, "Timed epochs per variant, the variants taking turns.")
flags.DEFINE_integer("pretrain_steps", 32, "pretrain: steps in one epoch.")
flags.DEFINE_string("log_every", "100", "The kgpt callbacks' ProgressLog interval (kgpt-train's --log_every).")
FLAGS = flags.FLAGS

JIT = {"default": "auto", "true": True, "false": False}


class Synced(keras.callbacks.Callback):
    """Overrides `on_train_batch_end` and nothing else: Keras then syncs every execution's logs on the main thread."""

    def on_train_batch_end(self, batch, logs=None):
        pass


class EpochTimer(keras.callbacks.Callback):
    """Wall seconds of every epoch; the last batch's work is waited for by Keras before `on_epoch_end`."""

    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.start)


def finetune_data():
    """`(dataset, steps per epoch, examples per epoch)` of the fine-tuning workload, as kgpt-train feeds it."""
    rng = np.random.default_rng(FLAGS.seed)
    lengths = finetune.tsv_lengths(FLAGS.tsv) if FLAGS.tsv else finetune.sample_lengths(FLAGS.num_examples, rng)
    split = finetune.synthetic_split(lengths, FLAGS.vocabulary_size, FLAGS.sequence_length, rng)
    plan, budget = finetune.plan_budget(split)
    data = batching.dataset(split, FLAGS.batch_size, seed=FLAGS.seed, max_lengths=budget, epochs=FLAGS.plan_epochs)
    steps = -(-len(split) // FLAGS.batch_size)
    print(f"finetune: {len(split):,} examples, {steps} batches an epoch, padded lengths {plan}")
    return data, steps, len(split)


def pretrain_data():
    """`(dataset, steps per epoch, tokens per epoch)`: random windows of one shape, as every pre-training step has."""
    rng = np.random.default_rng(FLAGS.seed)
    shape = (FLAGS.batch_size * FLAGS.pretrain_steps, FLAGS.sequence_length)
    ids = rng.integers(0, FLAGS.vocabulary_size, (shape[0], shape[1] + 1)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones(shape, "int32")}
    data = tf.data.Dataset.from_tensor_slices((x, ids[:, 1:])).batch(FLAGS.batch_size).repeat().prefetch(2)
    print(f"pretrain: {FLAGS.pretrain_steps} steps an epoch of {FLAGS.batch_size} x {FLAGS.sequence_length} tokens")
    return data, FLAGS.pretrain_steps, shape[0] * shape[1]


def build(steps_per_execution, jit_compile):
    """A fresh model of the workload (same seed, so the same weights), compiled with these execution settings."""
    if FLAGS.workload == "finetune":
        model = finetune.build_model()
        model.compile(steps_per_execution=steps_per_execution, jit_compile=jit_compile)
        return model
    keras.utils.set_random_seed(FLAGS.seed)
    backbone = kgpt.GPTBackbone(
        vocabulary_size=FLAGS.vocabulary_size,
        num_layers=FLAGS.num_layers,
        num_heads=FLAGS.num_heads,
        hidden_dim=FLAGS.hidden_dim,
        intermediate_dim=FLAGS.intermediate_dim,
        max_sequence_length=FLAGS.sequence_length,
    )
    model = kgpt.GPTCausalLM(backbone)
    model.compile(
        optimizer=kgpt.gpt_adamw(warmup_steps=10, total_steps=10_000),
        steps_per_execution=steps_per_execution,
        jit_compile=jit_compile,
    )
    return model


class Variant:
    """One combination of the settings: its model, its callbacks, its epochs' seconds."""

    def __init__(self, steps_per_execution, jit_compile, callback_set, data, steps):
        self.name = f"spe={steps_per_execution} jit={jit_compile} callbacks={callback_set}"
        self.data, self.steps = data, steps
        self.model = build(int(steps_per_execution), JIT[jit_compile])
        self.callback_set = callback_set
        if callback_set.endswith("tensorboard"):  # the event files go to a folder removed at exit
            self.log_dir = tempfile.mkdtemp(prefix="kgpt-execution-logs-")
            atexit.register(shutil.rmtree, self.log_dir, ignore_errors=True)
        self.timer = EpochTimer()
        warmup = EpochTimer()
        self.model.fit(
            data, epochs=1, steps_per_epoch=steps, callbacks=[*self.callbacks(), warmup], verbose=0, shuffle=False
        )
        self.warmup = warmup.seconds[0]
        self.jit = self.model.jit_compile

    def callbacks(self):
        """A fresh set each fit, as each kgpt-train run has (their step counters start over)."""
        if self.callback_set == "none":
            return []
        total = self.steps * (FLAGS.rounds + 1)
        kgpt_set = [
            kgpt_callbacks.StopOnNonFiniteLoss(),
            kgpt_callbacks.Progress(None, {}, self.steps),
            kgpt_callbacks.ProgressLog(FLAGS.log_every, total),
        ]
        if self.callback_set in ("tensorboard", "keras_tensorboard"):
            board = (
                kgpt_callbacks.EpochTensorBoard if self.callback_set == "tensorboard" else keras.callbacks.TensorBoard
            )
            return kgpt_set + [board(self.log_dir)]
        return kgpt_set + ([Synced()] if self.callback_set == "sync" else [])

    def epoch(self):
        self.model.fit(
            self.data,
            epochs=1,
            steps_per_epoch=self.steps,
            callbacks=[*self.callbacks(), self.timer],
            verbose=0,
            shuffle=False,
        )


def main(argv):
    with run.compilation_cache(FLAGS.compilation_cache):
        measure()


def measure():
    logging.set_verbosity(logging.WARNING)
    began = time.perf_counter()
    for name in FLAGS.jit_compile:
        if name not in JIT:
            raise app.UsageError(f"--jit_compile takes default, true or false, got {name!r}.")
    for name in FLAGS.callbacks:
        if name not in CALLBACK_SETS:
            raise app.UsageError(f"--callbacks takes {', '.join(CALLBACK_SETS)}, got {name!r}.")
    config = ", ".join(
        f"{f}={FLAGS[f].value}"
        for f in (
            "num_layers",
            "hidden_dim",
            "num_heads",
            "intermediate_dim",
            "vocabulary_size",
            "sequence_length",
            "batch_size",
        )
    )
    print(f"backend={keras.config.backend()} keras={keras.__version__} {config}")
    data, steps, units = finetune_data() if FLAGS.workload == "finetune" else pretrain_data()
    unit = "examples/s" if FLAGS.workload == "finetune" else "tokens/s"
    variants = [
        Variant(s, j, c, data, steps)
        for s, j, c in itertools.product(FLAGS.steps_per_execution, FLAGS.jit_compile, FLAGS.callbacks)
    ]
    for _ in range(FLAGS.rounds):  # taking turns: A, B, C, A, B, C, ...
        for variant in variants:
            variant.epoch()
    first = float(np.median(variants[0].timer.seconds))
    print()
    print(f"| variant | XLA | warm-up s | median epoch s | {unit} | x first | x first, paired |")
    print("|---|---|---|---|---|---|---|")
    for v in variants:
        median = float(np.median(v.timer.seconds))
        # Each round's epoch over the first variant's in the same round (minutes apart at most), then the median.
        paired = float(np.median(np.asarray(v.timer.seconds) / np.asarray(variants[0].timer.seconds)))
        print(
            f"| {v.name} | {v.jit} | {v.warmup:.1f} | {median:.2f} | {units / median:,.0f} | {median / first:.2f} "
            f"| {paired:.2f} |"
        )
    print()
    print(
        "epoch seconds: " + "; ".join(f"{v.name}: " + ", ".join(f"{t:.2f}" for t in v.timer.seconds) for v in variants)
    )
    print(f"whole run: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    app.run(main)
