"""Speed and memory of kgpt beside keras-hub's GPT-2 at the same shape, in one run.

    python benchmarks/model.py                      # 6 x 512, 8 heads, 2048, ctx 256, vocab 16384, batch 8
    KERAS_BACKEND=tensorflow python benchmarks/model.py --steps 20
    python benchmarks/model.py --num_layers 12 --hidden_dim 768 --num_heads 12 --intermediate_dim 3072 \
        --sequence_length 512 --vocabulary_size 40481 --batch_size 32 --dtype mixed_bfloat16   # paper shape, GPU

For each model, in its own process (so peak memory is its own): training
tokens/s (one full step: forward, LM loss over every position, backward,
AdamW update), inference tokens/s (forward pass to next-token predictions),
peak memory while training (host RSS; device peak on a GPU; on JAX also the
temporary buffers XLA plans for one training step, which needs no step to
run: `--plan_only` prints just that, e.g. for the paper shape on a CPU) and
model FLOP utilisation: the training FLOPs per second over the
matrix-multiply rate measured on the same device in the same process.
On JAX on a GPU or TPU `kgpt` now runs attention dropout in the fused
kernel (`kgpt.layers.flash_attention`); `kgpt_explicit` is kgpt with the
explicit `[batch, heads, T, T]` probabilities (the default before, and the
CPU's), `kgpt_kernel` kgpt with the kernel on any device (a CPU interprets
it: slow). `kgpt` and `kgpt_fused` train with kgpt's default memory-lean LM loss
(`compile(lm_loss_chunk_size=1024)`); `kgpt_logits` (the same model with
plain logits) and keras-hub hold all the logits. keras-hub's `GPT2Backbone`
(pre-LN plus a final layer norm) with its tied LM head has the same weights
and FLOPs up to one layer norm, so the ratio compares the implementations.
"""

import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging

from kgpt._children import ends_with_this_process

flags.DEFINE_integer("num_layers", 6, "Transformer blocks.")
flags.DEFINE_integer("hidden_dim", 512, "Hidden size.")
flags.DEFINE_integer("num_heads", 8, "Attention heads.")
flags.DEFINE_integer("intermediate_dim", 2048, "Feed-forward inner size.")
flags.DEFINE_integer("sequence_length", 256, "Tokens per sequence.")
flags.DEFINE_integer("vocabulary_size", 16384, "Vocabulary size.")
flags.DEFINE_integer("batch_size", 8, "Sequences per step.")
flags.DEFINE_integer("steps", 10, "Timed steps (after the warm-up steps).")
flags.DEFINE_integer("warmup", 2, "Untimed steps (compilation).")
flags.DEFINE_list(
    "models",
    ["kgpt", "keras_hub_gpt2", "kgpt_logits", "kgpt_fused"],
    "Models to measure; ratios are to the first: kgpt, kgpt_explicit, kgpt_kernel, kgpt_logits, "
    "kgpt_fused, keras_hub_gpt2.",
)
flags.DEFINE_integer("lm_loss_chunk_size", 1024, "Tokens per chunk of the LM loss of kgpt and kgpt_fused.")
flags.DEFINE_bool("plan_only", False, "JAX: only compile each training step and report XLA's planned temporary memory.")
flags.DEFINE_string("dtype", "float32", "Dtype policy of the models (e.g. mixed_bfloat16 on GPUs/TPUs).")
flags.DEFINE_integer(
    "gemm_size",
    0,
    "Side of the square matrix multiply timed as the device's peak rate (0: 8192 on a GPU or TPU, 2048 on a CPU).",
)
flags.DEFINE_bool("inference", True, "Also time inference (a second compilation).")
flags.DEFINE_bool("xla_temp", True, "JAX: also report XLA's planned temporary memory (the train step compiled again).")
flags.DEFINE_string("worker", None, "Internal: measure this one model and print JSON.")
FLAGS = flags.FLAGS

SHAPE_FLAGS = (
    "num_layers",
    "hidden_dim",
    "num_heads",
    "intermediate_dim",
    "sequence_length",
    "vocabulary_size",
    "batch_size",
    "steps",
    "warmup",
    "dtype",
    "gemm_size",
    "lm_loss_chunk_size",
    "plan_only",
    "inference",
    "xla_temp",
)


def training_flops_per_token(length=None):
    """Model FLOPs of one training token (in a sequence of `length`, default the flag's): 6N + attention scores.

    Forward 2 FLOPs per multiply-add, backward twice that (the usual 6N rule,
    as in the PaLM/Megatron MFU definitions), with N the block weights plus the
    tied LM head (vocabulary x hidden), and 12 x layers x context x hidden for
    the attention scores and their use on the values (6 x 2 L T H, causal
    masking not discounted). Embedding lookups and layer norms are not counted.
    """
    h, i, layers = FLAGS.hidden_dim, FLAGS.intermediate_dim, FLAGS.num_layers
    block = 4 * h * h + 2 * h * i
    matmul_weights = layers * block + FLAGS.vocabulary_size * h
    return 6 * matmul_weights + 12 * layers * (length or FLAGS.sequence_length) * h


def gemm_flops_per_s():
    """The device's float32 (or the policy's compute dtype) matrix-multiply rate, measured here.

    The multiplies of a trial are queued and waited for once: waiting for each
    one measured the launch overhead on an H100 (139 TFLOP/s at 2048^2 in
    bf16 against 468 queued, and 790 at 8192^2), which put MFU above 100%.
    """
    import keras
    import numpy as np

    n = FLAGS.gemm_size or (8192 if _accelerated() else 2048)
    dtype = keras.DTypePolicy(FLAGS.dtype).compute_dtype
    a = keras.ops.convert_to_tensor(np.random.default_rng(0).standard_normal((n, n)), dtype=dtype)
    if keras.config.backend() == "jax":
        import jax

        candidates = [(jax.jit(lambda x: x @ x), lambda y: y.block_until_ready())]
    else:
        import tensorflow as tf

        # XLA's and the default kernels (oneDNN on CPU) differ; the faster is the peak.
        candidates = [
            (tf.function(lambda x: tf.matmul(x, x), jit_compile=jit), lambda y: y.numpy()) for jit in (True, False)
        ]
    best = 0.0
    for matmul, finish in candidates:
        for _ in range(3):
            finish(matmul(a))
        for _ in range(5):  # the best of 5 trials: the device's rate, not a noisy moment
            repeats = 5
            start = time.perf_counter()
            outputs = [matmul(a) for _ in range(repeats)]
            finish(outputs[-1])  # one stream: the last ends after the others
            best = max(best, 2 * n**3 * repeats / (time.perf_counter() - start))
    return best


def _accelerated():
    import keras

    if keras.config.backend() == "jax":
        import jax

        return jax.devices()[0].platform != "cpu"
    import tensorflow as tf

    return bool(tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


def build(name):
    """The causal LM `name` at the flags' shape (dropout as in training, 0.1)."""
    import keras_hub

    import kgpt

    shape = dict(
        vocabulary_size=FLAGS.vocabulary_size,
        num_layers=FLAGS.num_layers,
        num_heads=FLAGS.num_heads,
        hidden_dim=FLAGS.hidden_dim,
        intermediate_dim=FLAGS.intermediate_dim,
        max_sequence_length=FLAGS.sequence_length,
        dropout=0.1,
    )
    if name in ("kgpt", "kgpt_logits", "kgpt_explicit", "kgpt_kernel"):  # kgpt_logits: compiled with plain logits
        # Each model has a process of its own, so the class switch is this model's.
        kgpt.GPTDecoderBlock.fused_dropout_attention = {"kgpt_explicit": False, "kgpt_kernel": True}.get(name)
        return kgpt.GPTCausalLM(kgpt.GPTBackbone(**shape))
    if name == "kgpt_fused":  # attention dropout 0: keras.ops.dot_product_attention in training too
        return kgpt.GPTCausalLM(kgpt.GPTBackbone(**shape, attention_dropout=0.0))
    if name == "keras_hub_gpt2":
        return keras_hub.models.GPT2CausalLM(keras_hub.models.GPT2Backbone(**shape), preprocessor=None)
    raise app.UsageError(
        f"Unknown model {name!r}; choose from kgpt, kgpt_explicit, kgpt_kernel, kgpt_logits, "
        "kgpt_fused, keras_hub_gpt2."
    )


def device_peak_bytes():
    """Peak accelerator memory, or None on CPU."""
    import keras

    if keras.config.backend() == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform == "cpu":
            return None
        return device.memory_stats().get("peak_bytes_in_use")
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        return None
    return tf.config.experimental.get_memory_info("GPU:0")["peak"]


def measure(name):
    """Times one model; returns a dict of figures."""
    import keras
    import numpy as np

    import kgpt

    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(FLAGS.dtype)
    gemm = None if FLAGS.plan_only else gemm_flops_per_s()
    lm = build(name)
    # Every model keeps its default loss and next-token accuracy metric.
    options = {}
    if name == "kgpt_logits":  # Keras' own loss and metric on the full logits
        options.update(
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()],
        )
    elif isinstance(lm, kgpt.GPTCausalLM):
        options["lm_loss_chunk_size"] = FLAGS.lm_loss_chunk_size
    lm.compile(optimizer=kgpt.gpt_adamw(warmup_steps=10, total_steps=10_000), **options)
    rng = np.random.default_rng(0)
    shape = (FLAGS.batch_size, FLAGS.sequence_length)
    ids = rng.integers(0, FLAGS.vocabulary_size, (shape[0], shape[1] + 1)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones(shape, "int32")}
    y = ids[:, 1:]
    tokens = shape[0] * shape[1]

    def timed(step):
        for _ in range(FLAGS.warmup):
            step()
        start = time.perf_counter()
        for _ in range(FLAGS.steps):
            step()  # each returns host values, so the device has finished
        return tokens * FLAGS.steps / (time.perf_counter() - start)

    if FLAGS.plan_only:
        return {
            "model": name,
            "weights": int(lm.count_params()),
            "xla_temp_mib": xla_train_temp_bytes(lm, x, y) / 2**20,
        }
    train = timed(lambda: lm.train_on_batch(x, y))
    # Peaks of training, read before inference materialises its own logits.
    train_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak = device_peak_bytes()
    infer = None
    if FLAGS.inference:
        predictor = keras.Model(lm.input, keras.ops.argmax(lm.output, axis=-1))
        infer = timed(lambda: predictor.predict_on_batch(x))
    return {
        "model": name,
        "device": device_kind(),
        "weights": int(lm.count_params()),
        "train_tokens_per_s": train,
        "gemm_tflops": gemm / 1e12,
        "mfu": train * training_flops_per_token() / gemm,
        "inference_tokens_per_s": infer,
        "peak_host_rss_mib": train_rss,
        "peak_device_mib": None if peak is None else peak / 2**20,
        "xla_temp_mib": None
        if keras.config.backend() != "jax" or not FLAGS.xla_temp
        else xla_train_temp_bytes(lm, x, y) / 2**20,
    }


def device_kind():
    """The first device's name as the backend reports it (e.g. 'NVIDIA H100 80GB HBM3'; 'cpu')."""
    import keras

    if keras.config.backend() == "jax":
        import jax

        return jax.devices()[0].device_kind
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else "cpu"


def xla_train_temp_bytes(lm, x, y):
    """Temporary memory (activations, logits, gradients in flight) XLA plans for one JAX training step."""
    import jax

    lm.make_train_function()
    if not lm.optimizer.built:
        lm.optimizer.build(lm.trainable_variables)
    state = tuple(
        [v.value for v in group]
        for group in (lm.trainable_variables, lm.non_trainable_variables, lm.optimizer.variables, lm.metrics_variables)
    )
    compiled = jax.jit(lm.train_step).lower(state, (x, y, None)).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def run_worker(name):
    args = [sys.executable, os.path.abspath(__file__), f"--worker={name}"]
    args += [f"--{f}={FLAGS[f].value}" for f in SHAPE_FLAGS]
    result = subprocess.run(args, capture_output=True, text=True, preexec_fn=ends_with_this_process())
    if result.returncode:
        raise RuntimeError(f"Benchmark of {name} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv):
    logging.set_verbosity(logging.WARNING)
    if FLAGS.worker:
        print(json.dumps(measure(FLAGS.worker)))
        return
    import keras

    shape = ", ".join(f"{f}={FLAGS[f].value}" for f in SHAPE_FLAGS)
    print(f"backend={keras.config.backend()} keras={keras.__version__} {shape}")
    rows = [run_worker(name) for name in FLAGS.models]
    if FLAGS.plan_only:
        for r in rows:
            print(
                f"{r['model']:<16}{r['weights']:>14,} weights{r['xla_temp_mib']:>12,.0f} MiB XLA temp per training step"
            )
        for b in rows[1:]:
            print(f"ratio {rows[0]['model']}/{b['model']}: XLA temp x{rows[0]['xla_temp_mib'] / b['xla_temp_mib']:.2f}")
        return
    header = (
        f"{'model':<16}{'weights':>12}{'train tok/s':>14}{'MFU':>8}{'GEMM TFLOP/s':>14}{'infer tok/s':>14}"
        f"{'peak RSS MiB':>14}{'peak dev MiB':>14}{'XLA temp MiB':>14}"
    )
    print(header)
    for r in rows:
        dev = "-" if r["peak_device_mib"] is None else f"{r['peak_device_mib']:.0f}"
        temp = "-" if r["xla_temp_mib"] is None else f"{r['xla_temp_mib']:,.0f}"
        print(
            f"{r['model']:<16}{r['weights']:>12,}{r['train_tokens_per_s']:>14,.0f}{r['mfu']:>8.1%}"
            f"{r['gemm_tflops']:>14.3f}{r['inference_tokens_per_s'] or 0:>14,.0f}{r['peak_host_rss_mib']:>14,.0f}{dev:>14}"
            f"{temp:>14}"
        )
    size = FLAGS.gemm_size or "8192 (GPU/TPU) or 2048 (CPU)"
    print(
        f"MFU: training FLOPs ({training_flops_per_token():,} per token, 6N + attention) / the {size}^2 "
        f"{FLAGS.dtype} matmul rate measured in the same process (5 queued, timed together)."
    )
    a = rows[0]
    for b in rows[1:]:
        print(
            f"ratio {a['model']}/{b['model']}: train x{a['train_tokens_per_s'] / b['train_tokens_per_s']:.2f}, "
            + (
                f"inference x{a['inference_tokens_per_s'] / b['inference_tokens_per_s']:.2f}, "
                if a["inference_tokens_per_s"]
                else ""
            )
            + f"peak RSS x{a['peak_host_rss_mib'] / b['peak_host_rss_mib']:.2f}"
            + (f", XLA temp x{a['xla_temp_mib'] / b['xla_temp_mib']:.2f}" if a["xla_temp_mib"] else "")
        )


if __name__ == "__main__":
    app.run(main)
