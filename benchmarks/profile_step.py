"""Where a fine-tuning step's time goes: a profiler trace of a few steps, per class of the model's work.

    KERAS_BACKEND=jax python benchmarks/profile_step.py                 # 2 x 32, vocabulary 1,024, 32 x 256 tokens
    KERAS_BACKEND=tensorflow python benchmarks/profile_step.py
    KERAS_BACKEND=jax python benchmarks/profile_step.py --dropout 0 --trace_dir trace   # keep the trace

The step is `benchmarks/finetune.py`'s: its task model (classification head,
`compile()` defaults: the auxiliary LM loss, chunked, and GPT-1's AdamW),
fitted by `fit` as `kgpt-train` fits it, on one batch of its synthetic
MNLI-like split padded to `--length` (the padded-to-longest feed), repeated.
After `--warmup_steps` (compiling on JAX, tracing on TensorFlow), `--rounds`
untimed-profiler fits of `--steps` steps give the step time (their median),
then one fit of `--steps` steps runs under the backend's profiler
(`jax.profiler` / `tf.profiler`). The trace is read back
(`benchmarks/step_profile.py`): every op's own time (nested ops taken out),
attributed through its name scope to a class (attention, dense matmuls, LM
loss, dropout's random bits, layer norm, gelu, optimizer, data movement),
split into forward, backward and update, in ms per step and share of the
ops' total. On a CPU the ops of one step run on several threads at once, so
the ops' total can exceed the step's wall time. JAX also prints the
compiled module's FLOPs and bytes (XLA's cost analysis), the executions'
span against the step period (what is left is the host between steps:
Python, Keras' loop, dispatch) and the dearest single ops.

`--dropout` sets the model's dropout (0.1 is GPT-1's). kgpt's dropout
layers draw Keras' masks through an unrolled hash on JAX
(`kgpt.layers.dropout`); `--ab` builds a second model, the same but drawing
them with `keras.random.dropout` (JAX's rolled loop), and times the two in
one process, their fits taking turns (`--rounds` each); on JAX each is then
traced in turn (a table each, in `--trace_dir`/kgpt and /keras).
`--dropout_masks keras` makes the second way the first.

`--attention` picks how attention dropout runs: `default` (on JAX on a GPU
or TPU the fused kernel of `kgpt.layers.flash_attention`, elsewhere the
explicit probabilities), `explicit`, `kernel` (on any device; a CPU
interprets it, slowly) or `none` (attention dropout 0: attention through
`keras.ops.dot_product_attention`). `--summary_json` ends with one line of JSON
(step, tokens per step, warm-up, peak device memory) for
`benchmarks/gpu.py`.
"""

import json
import os
import shutil
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import finetune  # the split's and the model's flags and builders (the script's folder is on sys.path)
import keras
import numpy as np
import step_profile
from absl import app, flags, logging

from kgpt.jobs import run
from kgpt.layers import dropout as kgpt_dropout
from kgpt.layers.decoder_block import GPTDecoderBlock
from kgpt.parallel.distribute import DTYPES

flags.DEFINE_integer("length", None, "Padded tokens per example (default: --sequence_length).")
flags.DEFINE_float("dropout", 0.1, "The model's dropout (embeddings, attention, residuals, head).")
flags.DEFINE_integer("steps", 5, "Steps per timed fit, and in the traced fit.")
flags.DEFINE_integer("warmup_steps", 2, "Untimed steps first (compiling / tracing).")
flags.DEFINE_integer("rounds", 3, "Timed fits of --steps steps (the median step is reported).")
flags.DEFINE_string("trace_dir", None, "Where the profiler writes its trace (default: a temporary folder, removed).")
flags.DEFINE_integer("top", 12, "JAX: how many of the dearest single ops to list.")
flags.DEFINE_enum(
    "dropout_masks",
    "kgpt",
    ["kgpt", "keras"],
    "Draw dropout masks with kgpt's unrolled hash "
    "(`kgpt.layers.dropout.Dropout.unrolled`) or with keras.random.dropout (the same masks).",
)
flags.DEFINE_bool("ab", False, "Also time the model with the other --dropout_masks, the two taking turns.")
flags.DEFINE_multi_string(
    "xla_options",
    [],
    "JAX: a set of XLA compiler options to compare, 'name=value,...' "
    "(e.g. xla_cpu_multi_thread_eigen=false); repeat the flag for several sets. The train step "
    "is compiled once per set (and once without) and the executables take turns, --rounds "
    "rounds of --steps steps each, called directly (no Keras loop).",
)
flags.DEFINE_integer(
    "lm_loss_chunk_size",
    None,
    "Tokens per chunk of the LM loss (default: compile()'s, kgpt.train.lm_loss.DEFAULT_CHUNK_SIZE).",
    lower_bound=1,
)
flags.DEFINE_enum(
    "dtype",
    None,
    DTYPES,
    "Dtype policy of the model (e.g. mixed_bfloat16 on a GPU or TPU; default: Keras' global policy, float32).",
)
flags.DEFINE_enum(
    "attention",
    "default",
    ["default", "explicit", "kernel", "none"],
    "How attention dropout runs (see the module's docstring).",
)
flags.DEFINE_bool("summary_json", False, "End with the figures as one line of JSON.")
flags.DEFINE_bool("trace", True, "Capture and read a profiler trace (--notrace: step times only).")
FLAGS = flags.FLAGS

# The shape of docs/performance.md's measurements, not finetune.py's defaults.
for _name, _value in (
    ("hidden_dim", 32),
    ("intermediate_dim", 128),
    ("num_heads", 2),
    ("vocabulary_size", 1024),
    ("sequence_length", 256),
    ("batch_size", 32),
):
    FLAGS.set_default(_name, _value)

JAX = keras.config.backend() == "jax"


def batch():
    """One `(x, y, sample_weight)` batch of the synthetic split, every view padded to --length."""
    length = FLAGS.length or FLAGS.sequence_length
    rng = np.random.default_rng(FLAGS.seed)
    lengths = np.minimum(finetune.sample_lengths(FLAGS.batch_size, rng), length)
    split = finetune.synthetic_split(lengths, FLAGS.vocabulary_size, FLAGS.sequence_length, rng)
    return finetune.padded_batch(split, np.arange(len(split)), length)


def build(masks):
    """The benchmark's task model, its dropout masks drawn the `masks` way ('kgpt' or 'keras')."""
    GPTDecoderBlock.fused_dropout_attention = {"explicit": False, "kernel": True}.get(FLAGS.attention)
    model = finetune.build_model(dropout=FLAGS.dropout, attention_dropout=0.0 if FLAGS.attention == "none" else None)
    if FLAGS.lm_loss_chunk_size is not None:
        model.compile(lm_loss_chunk_size=FLAGS.lm_loss_chunk_size)
    for layer in model._flatten_layers():
        if isinstance(layer, kgpt_dropout.Dropout):
            layer.unrolled = masks == "kgpt"
    return model


def step_seconds(model, data, steps):
    """Wall seconds per step of one `fit` of `steps` steps (the fit's own start and end included)."""
    began = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    return (time.perf_counter() - began) / steps


def train_step_costs(model, example):
    """JAX: XLA's cost analysis and compiled text of the model's train step (already compiled: no new compile)."""
    jitted = next(c.cell_contents for c in model.train_function.__closure__ if hasattr(c.cell_contents, "lower"))
    state = model._get_jax_state(
        trainable_variables=True, non_trainable_variables=True, optimizer_variables=True, metrics_variables=True
    )
    compiled = jitted.lower(state, example).compile()
    costs = compiled.cost_analysis()
    costs = costs[0] if isinstance(costs, (list, tuple)) else costs
    return costs, compiled.as_text()


def parse_options(text):
    """`{option: bool, int, float or str}` from 'name=value,...'."""
    options = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise app.UsageError(f"--xla_options: {item!r} is not name=value.")
        lowered = value.lower()
        if lowered in ("true", "false"):
            options[name] = lowered == "true"
        else:
            try:
                options[name] = int(value)
            except ValueError:
                try:
                    options[name] = float(value)
                except ValueError:
                    options[name] = value
    return options


def compare_xla_options(model, example):
    """JAX: the train step compiled with each --xla_options set, timed in turns: per set its median step (ms)."""
    import jax

    jitted = next(c.cell_contents for c in model.train_function.__closure__ if hasattr(c.cell_contents, "lower"))
    state = model._get_jax_state(
        trainable_variables=True, non_trainable_variables=True, optimizer_variables=True, metrics_variables=True
    )
    state = jax.tree.map(lambda v: jax.numpy.array(v, copy=True), state)  # the steps donate it: a copy of its own
    sets = [("default", {})] + [(text, parse_options(text)) for text in FLAGS.xla_options]
    executables, kept = [], []
    for name, options in sets:
        began = time.perf_counter()
        try:
            executables.append(jitted.lower(state, example).compile(compiler_options=options or None))
        except Exception as error:  # an option this XLA does not have, or a bad value: XLA's message names it
            print(f"XLA options {name}: not compiled ({str(error).splitlines()[0]}); left out")
            continue
        kept.append((name, options))
        print(f"compiled with {name}: {time.perf_counter() - began:.1f} s")
    sets = kept
    times = [[] for _ in sets]
    for _ in range(FLAGS.rounds):  # the executables take turns: a change in the machine's load hits all alike
        for index, executable in enumerate(executables):
            began = time.perf_counter()
            for _ in range(FLAGS.steps):
                logs, state = executable(state, example)
            jax.block_until_ready((logs, state))
            times[index].append((time.perf_counter() - began) / FLAGS.steps)
    for (name, _), seconds in zip(sets, times):
        paired = np.median([a / b for a, b in zip(seconds, times[0])])
        print(
            f"XLA options {name}: step {np.median(seconds) * 1e3:.1f} ms ("
            + ", ".join(f"{t * 1e3:.0f}" for t in seconds)
            + f" ms), {paired:.2f}x default (median of the per-round ratios)"
        )


def print_table(title, rows, total, step_ms):
    print(f"\n{title}")
    print("| class | forward ms | backward ms | update ms | ms / step | share of ops |")
    print("|---|---|---|---|---|---|")
    for name, forward, backward, update, ms, share in rows:
        print(f"| {name} | {forward:.1f} | {backward:.1f} | {update:.1f} | {ms:.1f} | {share:.1%} |")
    print(f"| all ops (summed over threads) | | | | {total:.1f} | {total / step_ms:.2f}x the step's wall time |")


def profile_jax(model, data, example, trace_dir, step_ms):
    import jax

    costs, text = train_step_costs(model, example)
    instructions = step_profile.hlo_instructions(text)
    print(
        f"XLA cost analysis of the train step: {costs.get('flops', 0) / 1e9:.2f} GFLOP, "
        f"{costs.get('bytes accessed', 0) / 1e9:.2f} GB accessed, {costs.get('transcendentals', 0) / 1e6:.1f} M "
        f"transcendentals; {len(instructions)} instructions compiled"
    )
    with jax.profiler.trace(trace_dir):
        model.fit(data, epochs=1, steps_per_epoch=FLAGS.steps, verbose=0)
    ops, runs = step_profile.xla_ops(step_profile.latest_xplane(trace_dir), "jit_train_step")
    if not ops:
        raise RuntimeError("The trace holds no op of jit_train_step: the profiler recorded no XLA ops.")
    period, span = step_profile.run_stats(runs, FLAGS.steps)
    rows, unknown = [], 0
    for op, ns in ops:
        opcode, path, movement, _ = instructions.get(op, ("?", "", False, ""))
        unknown += op not in instructions
        rows.append((step_profile.classify(path, opcode, movement), step_profile.direction(path), ns))
    table, total = step_profile.table(rows, FLAGS.steps)
    print_table(
        f"JAX: {FLAGS.steps} traced steps, {len(runs)} executions of jit_train_step",
        table,
        total,
        period if len(runs) >= FLAGS.steps else step_ms,
    )
    unknown_note = f"; {unknown} op events not in the compiled text" if unknown else ""
    if len(runs) < FLAGS.steps:  # a GPU's device events carry no execution id: the steps cannot be told apart
        print(
            f"the trace tells {len(runs)} execution(s) of the train step apart, not {FLAGS.steps}: no host gap "
            f"per step is measured here{unknown_note}"
        )
    else:
        print(
            f"step period in the trace (start to start): {period:.1f} ms; one execution spans {span:.1f} ms; "
            f"the host between executions (Python, Keras' loop, dispatch, idle): {period - span:.1f} ms "
            f"({(period - span) / period:.1%})" + unknown_note
        )
    dearest = {}
    for op, ns in ops:
        dearest[op] = dearest.get(op, 0) + ns / 1e6 / FLAGS.steps
    print(f"\nthe {FLAGS.top} dearest ops (ms per step, summed over threads):")
    for op, ms in sorted(dearest.items(), key=lambda kv: -kv[1])[: FLAGS.top]:
        opcode, path, movement, dtype = instructions.get(op, ("?", "", False, ""))
        print(f"  {ms:7.1f}  {op} ({opcode}, {dtype}) {path.removeprefix('jit(train_step)/')}")
    return table


def profile_tf(model, data, trace_dir, step_ms):
    import tensorflow as tf

    tf.profiler.experimental.start(trace_dir)
    try:
        model.fit(data, epochs=1, steps_per_epoch=FLAGS.steps, verbose=0)
    finally:
        tf.profiler.experimental.stop()
    ops = step_profile.tf_ops(step_profile.latest_xplane(trace_dir))
    if not ops:
        raise RuntimeError("The trace holds no TensorFlow op: the profiler recorded no executor ops.")
    rows = [
        (
            step_profile.classify(
                name,
                op_type,
                op_type in ("Transpose", "Identity", "Reshape", "ConcatV2", "Slice", "StridedSlice", "Pack", "Tile"),
            ),
            step_profile.direction(name),
            ns,
        )
        for name, op_type, ns in ops
    ]
    table, total = step_profile.table(rows, FLAGS.steps)
    print_table(f"TensorFlow: {FLAGS.steps} traced steps (op events of TF's executors)", table, total, step_ms)
    return table


def main(argv):
    logging.set_verbosity(logging.WARNING)
    if FLAGS.trace and "xla_gpu_enable_command_buffer" not in os.environ.get("XLA_FLAGS", ""):
        # On a GPU, XLA records a step's kernels into CUDA graphs, whose trace events name the graph, not
        # the ops in it: without them, each op is its own event (the step's time hardly changes: 62 ms
        # either way at the paper's shape on one H200). Set before JAX starts its GPU backend.
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=").strip()
    if FLAGS.steps < 2 or FLAGS.rounds < 1 or FLAGS.warmup_steps < 1:
        raise app.UsageError("--steps must be at least 2, --rounds and --warmup_steps at least 1.")
    length = FLAGS.length or FLAGS.sequence_length
    if length > FLAGS.sequence_length:
        raise app.UsageError(f"--length ({length}) exceeds --sequence_length ({FLAGS.sequence_length}).")
    if FLAGS.dtype:
        keras.config.set_dtype_policy(FLAGS.dtype)
    example = batch()
    with run.compilation_cache(FLAGS.compilation_cache):
        measure(example, length)


class Repeated(keras.utils.PyDataset):
    """One batch, `count` times (as many as a `fit` of this script takes), with no `tf.data`: TensorFlow need
    not be installed on JAX (e.g. a JAX-only install on an accelerator)."""

    def __init__(self, example, count):
        super().__init__()
        self.example, self.count = example, count

    def __len__(self):
        return self.count  # not "endless": Keras' adapter makes an index array of this length

    def __getitem__(self, index):
        return self.example


def repeated(example):
    """The one batch, forever, as `fit` takes it: `Repeated` on JAX, a `tf.data` dataset on TensorFlow."""
    if JAX:
        return Repeated(example, max(FLAGS.steps, FLAGS.warmup_steps))
    import tensorflow as tf

    return tf.data.Dataset.from_tensors(example).repeat()


def peak_device_mib():
    """The first accelerator's peak memory in use so far (JAX: its allocator's; TensorFlow: GPU:0's), or None."""
    if JAX:
        import jax

        device = jax.devices()[0]
        stats = device.memory_stats() if device.platform != "cpu" else None
        return None if not stats or "peak_bytes_in_use" not in stats else stats["peak_bytes_in_use"] / 2**20
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20 if gpus else None


def measure(example, length):
    data = repeated(example)
    models = {FLAGS.dropout_masks: build(FLAGS.dropout_masks)}
    if FLAGS.ab:
        other = "keras" if FLAGS.dropout_masks == "kgpt" else "kgpt"
        models[other] = build(other)
    model = models[FLAGS.dropout_masks]
    config = ", ".join(
        f"{f}={FLAGS[f].value}"
        for f in (
            "num_layers",
            "hidden_dim",
            "num_heads",
            "intermediate_dim",
            "vocabulary_size",
            "batch_size",
            "dropout",
            "dtype",
            "lm_loss_chunk_size",
        )
    )
    print(
        f"backend={keras.config.backend()} keras={keras.__version__} {config}, length={length}, "
        f"jit_compile={model.jit_compile}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    warmup = {}
    for masks, each in models.items():
        began = time.perf_counter()
        each.fit(data, epochs=1, steps_per_epoch=FLAGS.warmup_steps, verbose=0)
        warmup[masks] = time.perf_counter() - began
        print(f"warm-up, dropout masks {masks} ({FLAGS.warmup_steps} steps, compiling/tracing): {warmup[masks]:.1f} s")
    seconds = {masks: [] for masks in models}
    for _ in range(FLAGS.rounds):  # the models take turns, so a change in the machine's load hits them alike
        for masks, each in models.items():
            seconds[masks].append(step_seconds(each, data, FLAGS.steps))
    for masks, times in seconds.items():
        print(
            f"step, dropout masks {masks}: {np.median(times) * 1e3:.1f} ms (median of {FLAGS.rounds} fits of "
            f"{FLAGS.steps} steps: " + ", ".join(f"{t * 1e3:.0f}" for t in times) + " ms)"
        )
    if FLAGS.ab:
        first, second = seconds[FLAGS.dropout_masks], seconds[other]
        paired = np.median([a / b for a, b in zip(first, second)])
        print(
            f"A/B: masks {FLAGS.dropout_masks} / masks {other}, median of the per-round ratios: {paired:.2f}x"
            + ("" if JAX else " (TensorFlow: both draw with keras.random.dropout, so this is the noise)")
        )
    step_ms = float(np.median(seconds[FLAGS.dropout_masks])) * 1e3
    if FLAGS.summary_json:
        print(
            json.dumps(
                {
                    "step_ms": step_ms,
                    "tokens_per_step": int(np.size(example[0]["token_ids"])),
                    "warmup_s": warmup[FLAGS.dropout_masks],
                    "peak_device_mib": peak_device_mib(),
                }
            )
        )
    if FLAGS.xla_options:
        if not JAX:
            raise app.UsageError("--xla_options compares XLA compilations of JAX's step: use KERAS_BACKEND=jax.")
        compare_xla_options(model, example)
    if not FLAGS.trace:
        return
    trace_dir = FLAGS.trace_dir or tempfile.mkdtemp(prefix="kgpt-profile-")
    try:
        # With --ab on JAX each model gets its trace and table (in its own folder), the first's first.
        traced = models if FLAGS.ab and JAX else {FLAGS.dropout_masks: model}
        for masks, each in traced.items():
            folder = os.path.join(trace_dir, masks) if len(traced) > 1 else trace_dir
            if len(traced) > 1:
                print(f"\n--- dropout masks {masks} ---")
            if JAX:
                profile_jax(each, data, example, folder, step_ms)
            else:
                profile_tf(each, data, folder, step_ms)
    finally:
        if not FLAGS.trace_dir:
            shutil.rmtree(trace_dir, ignore_errors=True)
    print(f"trace: {FLAGS.trace_dir}" if FLAGS.trace_dir else "trace: removed (--trace_dir keeps it)")


if __name__ == "__main__":
    app.run(main)
