"""Fine-tuning compute on MNLI-like lengths: length-bucketed batches against padding to the longest.

    KERAS_BACKEND=jax python benchmarks/finetune.py          # defaults: 2048 examples, 2 x 128, vocabulary 1024
    KERAS_BACKEND=jax python benchmarks/finetune.py --tsv RTE/train.tsv --feeds planned,bucketed,padded_to_longest
    KERAS_BACKEND=tensorflow python benchmarks/finetune.py   # ~2 min on 2 CPU cores (JAX ~3.5: 19 XLA compiles)
    python benchmarks/finetune.py --vocabulary_size 40481     # GPT-1's vocabulary (~11 min on 2 CPU cores)
    python benchmarks/finetune.py --num_examples 8192 --epochs 3            # several pools, median of 3 epochs
    KERAS_BACKEND=jax python benchmarks/finetune.py --tsv RTE/train.tsv --feeds planned_by_positions,planned
    KERAS_BACKEND=jax python benchmarks/finetune.py --step_curve 16,32,64,128,256   # step time against length
    python benchmarks/finetune.py --num_layers 12 --hidden_dim 768 --num_heads 12 --intermediate_dim 3072 \
        --vocabulary_size 40481 --sequence_length 512 --num_examples 32768 --epochs 3   # paper shape, accelerator

A synthetic one-view (entailment-like) split, `[start] premise [delim]
hypothesis [extract]` with random token ids, whose view lengths (special
tokens included) are log-normal like MultiNLI's under the GPT-1 vocabulary
(mean ~39, clipped to [8, 230]); the longest example is pinned at 230, the
longest of MNLI's training split, so "padded to longest" pads to what it did
on MNLI (`--nopin_longest` keeps the sample's own maximum). It is built with
`kgpt.data.batching.SplitBuilder`, as `kgpt.jobs.finetune_data.encode_split` does, and a
small `kgpt.GPTTaskModel` (classification head, `compile()` defaults:
auxiliary LM loss, lm_coef 0.5) is trained on three feeds of it. Its default
vocabulary is 1024, not GPT-1's 40481: the run stays short on a CPU, and the
tied embedding keeps about the share of the weights (and of the matmul FLOPs
per token) it has in GPT-1 (a quarter); with 40481 and hidden 128 it would be
13x the two blocks and dominate every step.

The feeds:

- bucketed: `kgpt.data.batching.dataset(split, batch_size, seed)`, every
  bucket length the split needs (kgpt's feed where nothing compiles);
- planned: the same, rounded up to the compile-aware plan `kgpt-train` uses
  where steps compile (`max_lengths_for`, `length_plan` for `--plan_epochs`),
  a row's cost growing with attention (`compile_cost.attention_length`);
- planned by positions: the same plan with a row's cost its positions alone
  (kgpt-train's plan before attention was priced; `attention_length=None`);
- padded to longest: every batch padded to the split's longest view, as kgpt
  did before (shuffled `tf.data` slices of the fully padded arrays, built as
  `EncodedSplit.batch` builds a batch);
- all at max length: as many examples, every one as long as the longest,
  fed the same way (the reference point: 100% real tokens at that length).

Each feed gets a fresh model (same seed), an untimed warm-up `fit` over one
batch of every shape `(rows, padded length)` the feed will give, which does
all the tracing (TensorFlow) and XLA compiling (JAX) of the timed epochs, and
then `--epochs` timed epochs, the feeds taking turns (so a change in the
machine's load hits them alike); the table gives their median. On JAX
the warm-up column also counts the XLA compilations and their seconds, and the
run checks that no compilation happened in a timed epoch; on TensorFlow (no
XLA on a CPU: Keras' `jit_compile="auto"`) it counts the traces of the
training loop, and retraces in timed epochs. Reported:
the padded lengths (shapes) a feed used, the share of computed positions that
are real tokens (`EncodedSplit.real_share` / `padded_share`), seconds per
epoch, real tokens and computed positions per second, and the epoch time as a
fraction of the all-at-max-length epoch. The issue's targets: >= 90% real
tokens and a bucketed epoch at most 0.35x the all-at-max-length epoch.
"""

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import step_curve  # --step_curve (the script's folder is on sys.path)
from absl import app, flags, logging

import kgpt
from kgpt.data import batching
from kgpt.jobs import run
from kgpt.train import compile_cost

flags.DEFINE_integer("num_examples", 2048, "Examples in the synthetic split (with --tsv: its first pairs, at most).")
flags.DEFINE_float("mean_length", 39.0, "Mean tokens per view (MNLI with the GPT-1 BPE, special tokens included).")
flags.DEFINE_float("length_sigma", 0.5, "Log-normal shape of the view lengths (sigma of log length).")
flags.DEFINE_integer("min_length", 8, "Shortest view, in tokens.")
flags.DEFINE_integer("max_length", 230, "Longest view, in tokens (MNLI train's longest).")
flags.DEFINE_bool("pin_longest", True, "Make one example max_length long, as in the full MNLI split.")
flags.DEFINE_integer("num_layers", 2, "Transformer blocks.")
flags.DEFINE_integer("hidden_dim", 128, "Hidden size.")
flags.DEFINE_integer("num_heads", 2, "Attention heads.")
flags.DEFINE_integer("intermediate_dim", 512, "Feed-forward inner size.")
flags.DEFINE_integer("vocabulary_size", 1024, "Vocabulary, the 3 special tokens included (GPT-1: 40481 = 40478 + 3).")
flags.DEFINE_integer("sequence_length", 256, "Context of the model; also the split's view limit.")
flags.DEFINE_integer("batch_size", 32, "Examples per batch.")
flags.DEFINE_integer("epochs", 1, "Timed epochs per feed (after an untimed warm-up); the median is reported.")
flags.DEFINE_string(
    "tsv",
    None,
    "Real lengths instead: a GLUE sentence-pair TSV (header; sentence1 and sentence2 "
    "columns, e.g. RTE's train.tsv), each pair encoded with the GPT-1 BPE as "
    "[start] s1 [delim] s2 [extract]; the ids stay random, only the lengths are the file's.",
)
flags.DEFINE_integer("plan_epochs", 3, "The planned feed's plan serves this many epochs (fine-tuning's default).")
flags.DEFINE_list(
    "feeds",
    ["bucketed", "padded_to_longest", "all_max_length"],
    "Feeds to time; ratios are to all_max_length when it is among them.",
)
flags.DEFINE_integer("seed", 0, "Seed of the data, the model and the batch order.")
flags.DEFINE_string(
    "compilation_cache",
    "none",
    "JAX: a folder for the persistent compilation cache, as kgpt-train's "
    "--compilation_cache (run twice to see a second run's warm-up); 'none': every program compiled.",
)
flags.DEFINE_float(
    "compile_share",
    batching.COMPILE_SHARE,
    "The share of a run the planned feeds' compilations may "
    "take (kgpt's COMPILE_SHARE); another value shows what the bound costs or saves.",
)
flags.DEFINE_list(
    "step_curve",
    [],
    "Instead of the feeds: time the train step at these padded lengths, the lengths "
    "taking turns for --epochs rounds, and fit a row's time to a*L + b*L^2 (benchmarks/step_curve.py).",
)
flags.DEFINE_string(
    "json", None, "Also write the figures of every feed to this JSON file (benchmarks/backends.py reads it)."
)
FLAGS = flags.FLAGS

FEED_NAMES = {
    "bucketed": "bucketed",
    "planned": "planned",
    "planned_by_positions": "planned by positions",
    "padded_to_longest": "padded to longest",
    "all_max_length": "all at max length",
}
PLANNED = ("planned", "planned_by_positions")
REAL_SHARE_TARGET = 0.90  # the issue: >= 90% of computed positions are real tokens
TIME_RATIO_TARGET = 0.35  # the issue: a bucketed epoch takes at most 0.35x the all-at-max-length epoch


def sample_lengths(num_examples, rng):
    """`[num_examples]` view lengths: log-normal with mean `mean_length`, clipped to [min_length, max_length]."""
    sigma = FLAGS.length_sigma
    mu = np.log(FLAGS.mean_length) - sigma**2 / 2  # E[exp(N(mu, sigma^2))] = mean_length
    lengths = np.clip(np.rint(rng.lognormal(mu, sigma, num_examples)), FLAGS.min_length, FLAGS.max_length)
    if FLAGS.pin_longest and num_examples:
        lengths[rng.integers(num_examples)] = FLAGS.max_length
    return lengths.astype("int64")


def tsv_lengths(path):
    """`[pairs]` view lengths of a sentence-pair TSV under the GPT-1 BPE, 3 special tokens included."""
    import csv

    tokenizer = kgpt.GPTTokenizer.gpt1()
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    rows = rows[: FLAGS.num_examples]
    lengths = [len(tokenizer.encode(r["sentence1"])) + len(tokenizer.encode(r["sentence2"])) + 3 for r in rows]
    return np.minimum(np.asarray(lengths, "int64"), FLAGS.sequence_length)


def plan_budget(split, compile_batches=batching.COMPILE_BATCHES, attention_length=None):
    """The planned feed's padded lengths and their budget: kgpt-train's compile-aware plan for `plan_epochs` epochs,
    each compilation worth `compile_batches` steps, a row's cost growing with `attention_length`."""
    jit = keras.config.backend() == "jax"  # what Keras compiles with here (TensorFlow: jit_compile False on a CPU)
    budget = batching.max_lengths_of(jit, split, FLAGS.batch_size, FLAGS.plan_epochs, compile_batches, attention_length)
    return batching.length_plan(
        split.lengths,
        FLAGS.batch_size,
        FLAGS.seed,
        split.limit,
        budget,
        compile_batches,
        FLAGS.plan_epochs,
        attention_length,
    ), budget


def synthetic_split(lengths, vocabulary_size, limit, rng, name="train"):
    """An entailment-like `EncodedSplit`: `[start] premise [delim] hypothesis [extract]`, random ids and labels."""
    start, delim, extract = vocabulary_size - 3, vocabulary_size - 2, vocabulary_size - 1  # added last, as in GPT-1
    builder = batching.SplitBuilder(name, num_views=1, limit=limit)
    for i, length in enumerate(lengths):
        body = rng.integers(0, vocabulary_size - 3, int(length) - 3).tolist()  # [n - 3]
        cut = int(rng.integers(1, max(len(body), 1) + 1))  # premise | hypothesis
        view = [start, *body[:cut], delim, *body[cut:], extract]
        builder.add([view], target=int(rng.integers(2)), uid=f"synthetic:{i}")
    return builder.build(counts={"read": len(lengths), "used": len(lengths)})


def padded_batch(split, indices, length):
    """`(x, y, sample_weight)` as `EncodedSplit.batch` builds them, but every view padded to `length`."""
    x = split.inputs(indices, length=length)  # [B, views, length]
    y = {"task": split.targets[indices], "lm": x["token_ids"][..., 1:]}
    sample_weight = {"task": np.ones(len(indices), "float32"), "lm": x["padding_mask"][..., 1:].astype("float32")}
    return x, y, sample_weight


def padded_dataset(split, batch_size, seed):
    """Every example padded to the split's longest view, reshuffled each epoch: kgpt's feed before bucketing."""
    import tensorflow as tf  # here, not at the top: profile_step.py shares this module and runs on JAX without TF

    arrays = padded_batch(split, np.arange(len(split)), int(split.lengths.max()))  # [N, views, longest]
    data = tf.data.Dataset.from_tensor_slices(arrays)
    data = data.shuffle(len(split), seed=seed, reshuffle_each_iteration=True)
    return data.batch(batch_size).prefetch(2)


def feed_batches(feed, split, all_max, epochs, compile_batches=batching.COMPILE_BATCHES, attention_length=None):
    """`(split fed, per epoch its batches as index arrays, per epoch each batch's padded length)`.

    The padded feeds' batches are listed unshuffled: all have one length, so only their sizes matter.
    """
    if feed in ("bucketed", *PLANNED):
        plan = plan_budget(split, compile_batches, attention_length)[0] if feed in PLANNED else None
        orders = [batching.batch_indices(split.lengths, FLAGS.batch_size, FLAGS.seed, epoch) for epoch in range(epochs)]
        return split, orders, [[split.padded_length(b, plan) for b in o] for o in orders]
    data = all_max if feed == "all_max_length" else split
    batches = [np.arange(i, min(i + FLAGS.batch_size, len(data))) for i in range(0, len(data), FLAGS.batch_size)]
    return data, [batches] * epochs, [[int(data.lengths.max())] * len(batches)] * epochs


def warmup_dataset(feed, data, fed, orders, padded):
    """One batch of every shape `(rows, padded length)` the feed gives in `orders`, with `data`'s element spec."""
    import tensorflow as tf

    batches = {}
    for order, lengths in zip(orders, padded):
        for indices, length in zip(order, lengths):
            batches.setdefault((len(indices), length), indices)

    def generate():
        for (_, length), indices in sorted(batches.items()):
            yield (
                fed.batch(indices, length=length)
                if feed in ("bucketed", *PLANNED)
                else padded_batch(fed, indices, length)
            )

    warmup = tf.data.Dataset.from_generator(generate, output_signature=data.element_spec)
    return warmup.apply(tf.data.experimental.assert_cardinality(len(batches))), len(batches)


def build_model(dropout=0.1, attention_dropout=None):
    """The benchmark's task model (`dropout`: the backbone's and the classifier's, GPT-1's 0.1 by default;
    `attention_dropout`: the attention probabilities', `None` for `dropout`)."""
    keras.utils.set_random_seed(FLAGS.seed)
    backbone = kgpt.GPTBackbone(
        vocabulary_size=FLAGS.vocabulary_size,
        num_layers=FLAGS.num_layers,
        num_heads=FLAGS.num_heads,
        hidden_dim=FLAGS.hidden_dim,
        intermediate_dim=FLAGS.intermediate_dim,
        max_sequence_length=FLAGS.sequence_length,
        dropout=dropout,
        attention_dropout=attention_dropout,
    )
    return kgpt.GPTTaskModel(
        backbone,
        head=kgpt.tasks.heads.ClassificationHead(["a", "b"]),  # compile() defaults
        classifier_dropout=dropout,
    )


class CompileLog:
    """JAX: counts the XLA compilations (and seconds spent tracing, lowering, compiling) as they happen."""

    EVENTS = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )

    def __init__(self):
        self.compiles, self.seconds = 0, 0.0
        if keras.config.backend() == "jax":
            import jax

            jax.monitoring.register_event_duration_secs_listener(self.record)

    def record(self, event, duration, **kwargs):
        if event in self.EVENTS:
            self.seconds += duration
            self.compiles += event == self.EVENTS[-1]


class EpochTimer(keras.callbacks.Callback):
    """Wall seconds, compilations and compile seconds of every epoch."""

    def __init__(self, compile_log):
        super().__init__()
        self.compile_log = compile_log
        self.epochs = []  # (seconds, compiles, compile seconds)

    def on_epoch_begin(self, epoch, logs=None):
        self.start = (time.perf_counter(), self.compile_log.compiles, self.compile_log.seconds)

    def on_epoch_end(self, epoch, logs=None):
        start, compiles, seconds = self.start
        self.epochs.append(
            (time.perf_counter() - start, self.compile_log.compiles - compiles, self.compile_log.seconds - seconds)
        )


def tf_traces(model):
    """TensorFlow: how many times the model's training loop was traced; None when Keras' internals differ."""
    for cell in getattr(model.train_function, "__closure__", None) or ():
        function = cell.cell_contents
        if hasattr(function, "experimental_get_tracing_count"):
            return function.experimental_get_tracing_count()
    return None


class Feed:
    """One feed of the split with its own fresh model, warmed up: every shape it will give traced and compiled."""

    def __init__(self, name, split, all_max, compile_log):
        self.model = build_model()
        self.compile_batches, self.measure_compiles = batching.COMPILE_BATCHES, (0, 0.0)
        self.attention_length, self.measured = None, None
        if name == "bucketed":
            self.data = batching.dataset(split, FLAGS.batch_size, seed=FLAGS.seed)
        elif name in PLANNED:  # as kgpt-train plans: with a compilation's cost measured on this model
            if name == "planned":
                self.attention_length = compile_cost.attention_length(self.model.backbone)
            seconds, compiles = compile_log.seconds, compile_log.compiles
            self.measured = compile_cost.measure_longest(self.model, split, FLAGS.batch_size)
            if self.measured is not None:
                self.compile_batches = batching.compile_batches(
                    *self.measured, split, FLAGS.batch_size, self.attention_length
                )
            # The longest length's compilation, made by the measurement and counted with the warm-up's.
            self.measure_compiles = (compile_log.compiles - compiles, compile_log.seconds - seconds)
            self.data = batching.dataset(
                split,
                FLAGS.batch_size,
                seed=FLAGS.seed,
                epochs=FLAGS.plan_epochs,
                max_lengths=plan_budget(split, self.compile_batches, self.attention_length)[1],
                compile_batches=self.compile_batches,
                attention_length=self.attention_length,
            )
        elif name == "padded_to_longest":
            self.data = padded_dataset(split, FLAGS.batch_size, FLAGS.seed)
        elif name == "all_max_length":
            self.data = padded_dataset(all_max, FLAGS.batch_size, FLAGS.seed)
        else:
            raise ValueError(f"Unknown feed {name!r}.")
        self.name, self.compile_log = name, compile_log
        self.fed, self.orders, self.padded = feed_batches(
            name, split, all_max, FLAGS.epochs, self.compile_batches, self.attention_length
        )
        warmup, self.num_shapes = warmup_dataset(name, self.data, self.fed, self.orders, self.padded)
        self.warmup = EpochTimer(compile_log)
        self.model.fit(warmup, epochs=1, callbacks=[self.warmup], verbose=0)
        self.warmup_traces = tf_traces(self.model) if keras.config.backend() == "tensorflow" else None
        self.timer = EpochTimer(compile_log)

    def epoch(self):
        """One timed epoch (the dataset draws the next epoch's order)."""
        self.model.fit(self.data, epochs=1, callbacks=[self.timer], verbose=0)

    def summary(self):
        seconds = float(np.median([t[0] for t in self.timer.epochs]))
        fed, orders, padded = self.fed, self.orders, self.padded
        computed = [sum(len(b) * fed.num_views * p for b, p in zip(o, ps)) for o, ps in zip(orders, padded)]
        plan = plan_budget(fed, self.compile_batches, self.attention_length)[0] if self.name in PLANNED else None
        shares = (
            [fed.real_share(o, plan) for o in orders] if self.name in ("bucketed", *PLANNED) else [fed.padded_share()]
        )
        view_lengths = fed.view_lengths
        longest = [sum(len(b) * fed.num_views * int(view_lengths[b].max()) for b in o) for o in orders]
        return {
            "feed": self.name,
            "lengths": sorted({p for ps in padded for p in ps}),
            "shapes": self.num_shapes,
            "real_share": float(np.mean(shares)),
            # Of the computed positions: padding up to each batch's longest view, then rounding up to its bucket.
            "batch_padding": float(np.mean([(m - view_lengths.sum()) / c for m, c in zip(longest, computed)])),
            "bucket_padding": float(np.mean([(c - m) / c for m, c in zip(longest, computed)])),
            "seconds": seconds,
            "epoch_seconds": [t[0] for t in self.timer.epochs],
            "warmup_seconds": self.warmup.epochs[0][0],
            "warmup_compiles": self.warmup.epochs[0][1] + self.measure_compiles[0],
            "warmup_compile_seconds": self.warmup.epochs[0][2] + self.measure_compiles[1],
            "compile_batches": self.compile_batches,
            "attention_length": self.attention_length,
            "estimated_seconds": self.estimate(),
            "timed_compiles": sum(t[1] for t in self.timer.epochs),
            "warmup_traces": self.warmup_traces,
            "traces": tf_traces(self.model) if keras.config.backend() == "tensorflow" else None,
            "real_tokens_per_s": int(fed.view_lengths.sum()) / seconds,
            "positions_per_s": float(np.median(computed)) / seconds,
            "jit_compile": self.model.jit_compile,
        }

    def estimate(self):
        """A planned feed's `plan_epochs` run as its plan estimated it: its compilations and its epochs' steps, each
        step the measured one at the longest length scaled by `row_cost` (in seconds; None if not measured)."""
        if self.measured is None:
            return None
        compile_seconds, step_seconds, rows, longest = self.measured
        unit = step_seconds / (rows * self.fed.num_views * batching.row_cost(longest, self.attention_length))
        work = np.median(
            [
                sum(len(b) * self.fed.num_views * batching.row_cost(p, self.attention_length) for b, p in zip(o, ps))
                for o, ps in zip(self.orders, self.padded)
            ]
        )
        lengths = len({p for ps in self.padded for p in ps})
        return lengths * compile_seconds + FLAGS.plan_epochs * unit * float(work)


def main(argv):
    batching.COMPILE_SHARE = FLAGS.compile_share  # read by max_lengths_for and length_plan when they plan
    with run.compilation_cache(FLAGS.compilation_cache):
        if FLAGS.step_curve:
            rng = np.random.default_rng(FLAGS.seed)
            step_curve.measure(
                build_model(),
                lambda lengths: synthetic_split(lengths, FLAGS.vocabulary_size, FLAGS.sequence_length, rng),
                [int(n) for n in FLAGS.step_curve],
                FLAGS.batch_size,
                max(FLAGS.epochs, 1),
            )
        else:
            measure()


def measure():
    logging.set_verbosity(logging.WARNING)
    began = time.perf_counter()
    unknown = [f for f in FLAGS.feeds if f not in FEED_NAMES]
    if unknown:
        raise app.UsageError(f"Unknown feed(s) {', '.join(unknown)}; choose from {', '.join(FEED_NAMES)}.")
    rng = np.random.default_rng(FLAGS.seed)
    limit = FLAGS.sequence_length
    if FLAGS.max_length > limit:
        raise app.UsageError(f"--max_length ({FLAGS.max_length}) exceeds --sequence_length ({limit}).")
    lengths = tsv_lengths(FLAGS.tsv) if FLAGS.tsv else sample_lengths(FLAGS.num_examples, rng)
    split = synthetic_split(lengths, FLAGS.vocabulary_size, limit, rng)
    all_max = synthetic_split(np.full_like(lengths, lengths.max()), FLAGS.vocabulary_size, limit, rng, "all_max")
    compile_log = CompileLog()

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
    source = f"lengths of {FLAGS.tsv} under the GPT-1 BPE" if FLAGS.tsv else "synthetic lengths"
    print(
        f"split ({source}): {len(split):,} one-view examples, {int(lengths.sum()):,} real tokens; view length mean "
        f"{lengths.mean():.1f}, median {np.median(lengths):.0f}, p99 {np.percentile(lengths, 99):.0f}, max "
        f"{lengths.max()} "
        + (
            f"({int((lengths >= limit).sum())} at or cut to --sequence_length {limit})"
            if FLAGS.tsv
            else f"(log-normal, sigma {FLAGS.length_sigma}, clipped to [{FLAGS.min_length}, "
            f"{FLAGS.max_length}]{', longest pinned' if FLAGS.pin_longest else ''}; seed "
            f"{FLAGS.seed})"
        )
    )
    print(
        f"timing: per feed a fresh model and an untimed warm-up fit over one batch of each of its shapes (every "
        f"trace/compile); then {FLAGS.epochs} timed epoch(s) per feed, feeds interleaved; the median"
    )

    feeds = [Feed(name, split, all_max, compile_log) for name in FLAGS.feeds]
    for _ in range(FLAGS.epochs):  # feeds interleaved, so a change in the machine's load hits them alike
        for feed in feeds:
            feed.epoch()
    rows = [feed.summary() for feed in feeds]
    if FLAGS.json:
        with open(FLAGS.json, "w") as f:
            json.dump(
                {"backend": keras.config.backend(), "plan_epochs": FLAGS.plan_epochs, "feeds": rows},
                f,
                default=lambda value: value.item(),
            )  # NumPy scalars
    print(f"jit_compile={rows[0]['jit_compile']}")
    reference = next((r for r in rows if r["feed"] == "all_max_length"), None)
    print()
    print(
        "| feed | padded lengths | shapes | real tokens | epoch s | real tok/s | positions/s | x all-max | warm-up s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['seconds'] / reference['seconds']:.2f}" if reference else "-"
        lengths = r["lengths"]
        lengths = str(lengths[0]) if len(lengths) == 1 else f"{len(lengths)}: {lengths[0]}..{lengths[-1]}"
        warmup = f"{r['warmup_seconds']:.1f}"
        if keras.config.backend() == "jax":
            warmup += f" ({r['warmup_compiles']} compiles, {r['warmup_compile_seconds']:.0f} s)"
        elif r["warmup_traces"] is not None:
            warmup += f" ({r['warmup_traces']} trace{'s' * (r['warmup_traces'] != 1)})"
        print(
            f"| {FEED_NAMES[r['feed']]} | {lengths} | {r['shapes']} | {r['real_share']:.1%} | {r['seconds']:.2f} | "
            f"{r['real_tokens_per_s']:,.0f} | {r['positions_per_s']:,.0f} | {ratio} | {warmup} |"
        )
    print()
    if FLAGS.epochs > 1:
        epochs = (f"{FEED_NAMES[r['feed']]} " + ", ".join(f"{t:.2f}" for t in r["epoch_seconds"]) for r in rows)
        print("epoch seconds: " + "; ".join(epochs))
    bucketed = next((r for r in rows if r["feed"] == "bucketed"), None)
    if bucketed:
        print(
            f"bucketed feed: {len(bucketed['lengths'])} distinct padded lengths {bucketed['lengths']} "
            f"({bucketed['shapes']} batch shapes) over {FLAGS.epochs} epoch(s)"
            + (
                f"; {bucketed['timed_compiles']} XLA compiles in timed epochs"
                if keras.config.backend() == "jax"
                else ""
            )
            + (
                f"; {bucketed['traces'] - bucketed['warmup_traces']} retraces in timed epochs"
                if bucketed["traces"] is not None and bucketed["warmup_traces"] is not None
                else ""
            )
        )
        print(
            f"bucketed positions: {bucketed['real_share']:.2%} real tokens, {bucketed['batch_padding']:.2%} padding "
            f"to each batch's longest view, {bucketed['bucket_padding']:.2%} rounding that up to a bucket length"
        )
        verdict = "met" if bucketed["real_share"] >= REAL_SHARE_TARGET else "MISSED"
        print(f"target real tokens >= {REAL_SHARE_TARGET:.0%}: {bucketed['real_share']:.2%} ({verdict})")
        if reference:
            ratio = bucketed["seconds"] / reference["seconds"]
            verdict = "met" if ratio <= TIME_RATIO_TARGET else "MISSED"
            print(f"target bucketed epoch <= {TIME_RATIO_TARGET}x all-at-max-length epoch: {ratio:.2f}x ({verdict})")
    for planned in (r for r in rows if r["feed"] in PLANNED):
        compiling = planned["warmup_compile_seconds"] if keras.config.backend() == "jax" else 0.0
        whole = compiling + FLAGS.plan_epochs * planned["seconds"]
        jit = keras.config.backend() == "jax"
        attention = planned["attention_length"]
        estimated = planned["estimated_seconds"]
        print(
            f"{FEED_NAMES[planned['feed']]} feed (kgpt-train's plan for {FLAGS.plan_epochs} epochs, jit={jit}, a "
            f"row costing " + (f"L x (1 + L / {attention:.0f})" if attention else "its positions") + "): "
            f"a compilation measured at {planned['compile_batches']} steps; "
            f"{len(planned['lengths'])} padded lengths {planned['lengths']}, {planned['real_share']:.2%} real "
            f"tokens; compiling {compiling:.0f} s of a {whole:.0f} s run (warm-up compiling + {FLAGS.plan_epochs} x "
            f"the epoch; {compiling / max(whole, 1e-9):.0%}; targets >= 85% real, <= 25% compiling; planned with "
            f"compiling <= {FLAGS.compile_share:.0%})"
            + (f"; the plan estimated {estimated:.0f} s" if estimated is not None else "")
            + (f"; {planned['timed_compiles']} XLA compiles in timed epochs" if jit else "")
        )
        if reference:
            print(
                f"{FEED_NAMES[planned['feed']]} epoch / all-at-max-length epoch: "
                f"{planned['seconds'] / reference['seconds']:.2f}x"
            )
    print(f"whole run: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    app.run(main)
