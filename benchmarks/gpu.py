"""kgpt's attention variants beside keras-hub's GPT-2 on one GPU, pre-training and fine-tuning, in one run.

    bash benchmarks/gpu.sh                 # the paper's shape in bf16; under 8 minutes on one H100 or H200
    KERAS_BACKEND=jax python benchmarks/gpu.py --tiny     # a tiny shape end to end on a CPU (slow kernel: interpreted)

Every figure comes from a process of its own, one after another (so each
peak memory is its own), through the existing benchmarks:

- the pre-training step at `--sequence_length` (`benchmarks/model.py`'s
  worker: tokens/s, the matrix-multiply rate measured in that process, peak
  device memory) of kgpt with explicit attention dropout (`kgpt_explicit`,
  the default before), kgpt with the fused dropout kernel (`kgpt_kernel`,
  the default now on a GPU or TPU), kgpt without attention dropout
  (`kgpt_fused`: `keras.ops.dot_product_attention`) and keras-hub's
  `GPT2Backbone` with its tied head (`keras_hub_gpt2`);
- the fine-tuning step (`benchmarks/profile_step.py --notrace --summary_json`: the
  task model, dropout 0.1, every example padded to the length) of the three
  kgpt variants at each of `--lengths`.

MFU is the model FLOPs per second (6N + attention, `model.py`'s count, at
the step's length; padded tokens count, they are computed) over the
measured matrix-multiply rate (the median of the pre-training processes'
measurements: the fine-tuning processes measure none) and over the device's
nominal dense peak (`--peak_tflops`, else H100 SXM or H200: 989 TFLOP/s in
bf16; none on other devices). `--budget_s` bounds the whole run: what would
start after it is reported as skipped.
"""

import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import model  # its shape flags (this script's folder is on sys.path) and FLOP count
from absl import app, flags

from kgpt._children import ends_with_this_process

flags.DEFINE_bool("tiny", False, "A tiny shape (2 x 32, 64 tokens, batch 2, 2 steps): the whole run on a CPU.")
flags.DEFINE_list("lengths", ["512", "128"], "Fine-tuning lengths (padded tokens per example), measured in this order.")
flags.DEFINE_list(
    "pretrain_models",
    ["kgpt_explicit", "kgpt_kernel", "kgpt_fused", "keras_hub_gpt2"],
    "model.py's models for the pre-training step.",
)
flags.DEFINE_list("finetune_attention", ["explicit", "kernel", "none"], "profile_step.py's --attention variants.")
flags.DEFINE_integer("finetune_steps", 10, "Steps per timed fit of the fine-tuning step (3 fits).")
flags.DEFINE_float("peak_tflops", 0.0, "The device's nominal dense peak in the policy's dtype (0: by its name).")
flags.DEFINE_float(
    "budget_s", 450.0, "Seconds the whole run may take; later measurements are skipped (--tiny: 1800, for a busy CPU)."
)
FLAGS = flags.FLAGS

PAPER = dict(
    num_layers=12,
    hidden_dim=768,
    num_heads=12,
    intermediate_dim=3072,
    sequence_length=512,
    vocabulary_size=40481,
    batch_size=32,
    dtype="mixed_bfloat16",
    steps=10,
    warmup=2,
)
TINY = dict(
    num_layers=2,
    hidden_dim=32,
    num_heads=2,
    intermediate_dim=64,
    sequence_length=64,
    vocabulary_size=128,
    batch_size=2,
    dtype="float32",
    steps=2,
    warmup=1,
    gemm_size=256,
)
NOMINAL_TFLOPS = {"H100": 989.0, "H200": 989.0}  # dense bf16, SXM; an H100 PCIe is lower: give --peak_tflops
LABELS = {
    "kgpt_explicit": "kgpt, explicit attention dropout (before)",
    "explicit": "kgpt, explicit attention dropout",
    "kgpt_kernel": "kgpt, fused dropout kernel (GPU default)",
    "kernel": "kgpt, fused dropout kernel",
    "kgpt_fused": "kgpt, attention_dropout=0",
    "none": "kgpt, attention_dropout=0",
    "keras_hub_gpt2": "keras-hub GPT-2",
    "kgpt": "kgpt (this device's default)",
}
SHAPE = ("num_layers", "hidden_dim", "num_heads", "intermediate_dim", "vocabulary_size", "batch_size", "dtype")


def run_child(args, deadline):
    """The child's last stdout line as JSON, or a string saying why there is none."""
    left = deadline - time.monotonic()
    if left < 30:
        return "skipped: over --budget_s"
    try:
        done = subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, timeout=left, preexec_fn=ends_with_this_process()
        )
    except subprocess.TimeoutExpired:
        return "stopped: over --budget_s"
    if done.returncode:
        return "failed: " + (done.stderr.strip().splitlines() or ["no message"])[-1][-300:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def nominal_tflops(device):
    if FLAGS.peak_tflops:
        return FLAGS.peak_tflops
    return next((value for name, value in NOMINAL_TFLOPS.items() if name in (device or "")), None)


def percent(value):
    return "-" if value is None else f"{value:.1%}"


def pretraining(deadline):
    here = os.path.dirname(os.path.abspath(__file__))
    shape = [f"--{f}={FLAGS[f].value}" for f in model.SHAPE_FLAGS if f not in ("inference", "xla_temp")]
    return {
        name: run_child(
            [os.path.join(here, "model.py"), f"--worker={name}", *shape, "--noinference", "--noxla_temp"], deadline
        )
        for name in FLAGS.pretrain_models
    }


def finetuning(deadline):
    here = os.path.dirname(os.path.abspath(__file__))
    shape = [f"--{f}={FLAGS[f].value}" for f in SHAPE] + [f"--sequence_length={FLAGS.sequence_length}"]
    steps = [f"--steps={FLAGS.finetune_steps}", f"--warmup_steps={FLAGS.warmup}", "--rounds=3"]
    return {
        (int(length), attention): run_child(
            [
                os.path.join(here, "profile_step.py"),
                *shape,
                *steps,
                f"--length={length}",
                f"--attention={attention}",
                "--notrace",
                "--summary_json",
            ],
            deadline,
        )
        for length in FLAGS.lengths
        for attention in FLAGS.finetune_attention
    }


def report(pre, fine, started):
    measured = [r for r in pre.values() if isinstance(r, dict)]
    device = measured[0]["device"] if measured else None
    gemm = statistics.median(r["gemm_tflops"] for r in measured) if measured else None
    nominal = nominal_tflops(device)
    print(
        f"device: {device}; matmul rate measured: {'-' if gemm is None else f'{gemm:.1f}'} TFLOP/s "
        f"({FLAGS.dtype}); nominal peak: {'-' if nominal is None else f'{nominal:.0f}'} TFLOP/s"
    )
    print("shape: " + ", ".join(f"{f}={FLAGS[f].value}" for f in SHAPE))
    head = "| {:<42} | {:>11} | {:>9} | {:>13} | {:>12} | {:>15} |"
    row = "| {:<42} | {:>11,.0f} | {:>9.1f} | {:>13} | {:>12} | {:>15} |"

    def line(label, tokens_per_s, step_ms, flops_per_token, peak_mib, end=""):
        rate = tokens_per_s * flops_per_token / 1e12
        print(
            row.format(
                label,
                tokens_per_s,
                step_ms,
                percent(rate / gemm if gemm else None),
                percent(rate / nominal if nominal else None),
                "-" if peak_mib is None else f"{peak_mib:,.0f}",
            )
            + end
        )

    titles = ("tokens/s", "step ms", "MFU measured", "MFU nominal", "peak device MiB")
    print(f"\npre-training step, {FLAGS.batch_size} x {FLAGS.sequence_length} tokens (benchmarks/model.py):")
    print(head.format("model", *titles))
    tokens = FLAGS.batch_size * FLAGS.sequence_length
    for name, r in pre.items():
        if isinstance(r, dict):
            line(
                LABELS.get(name, name),
                r["train_tokens_per_s"],
                tokens / r["train_tokens_per_s"] * 1e3,
                model.training_flops_per_token(),
                r["peak_device_mib"],
            )
        else:
            print(f"| {LABELS.get(name, name):<42} | {r}")
    for length in FLAGS.lengths:
        print(
            f"\nfine-tuning step, {FLAGS.batch_size} examples padded to {length} tokens (benchmarks/profile_step.py):"
        )
        print(head.format("variant", *titles) + " warm-up s |")
        for (at, attention), r in fine.items():
            if at != int(length):
                continue
            if isinstance(r, dict):
                line(
                    LABELS[attention],
                    r["tokens_per_step"] / r["step_ms"] * 1e3,
                    r["step_ms"],
                    model.training_flops_per_token(at),
                    r["peak_device_mib"],
                    f" {r['warmup_s']:>9.1f} |",
                )
            else:
                print(f"| {LABELS[attention]:<42} | {r}")
    print(
        f"\nMFU: {model.training_flops_per_token():,} training FLOPs per token at {FLAGS.sequence_length} tokens "
        f"(6N + attention), over the measured rate and the nominal peak. Wall time {time.monotonic() - started:.0f} s."
    )


def main(argv):
    started = time.monotonic()
    for name, value in (TINY if FLAGS.tiny else PAPER).items():
        if not FLAGS[name].present:
            FLAGS[name].value = value
    if FLAGS.tiny and not FLAGS["lengths"].present:
        FLAGS.lengths = ["32", "64"]
    if FLAGS.tiny and not FLAGS["finetune_steps"].present:
        FLAGS.finetune_steps = 2
    if FLAGS.tiny and not FLAGS["budget_s"].present:
        FLAGS.budget_s = 1800.0
    if any(int(length) > FLAGS.sequence_length for length in FLAGS.lengths):
        raise app.UsageError(f"--lengths may not exceed --sequence_length ({FLAGS.sequence_length}).")
    deadline = started + FLAGS.budget_s
    pre = pretraining(deadline)
    fine = finetuning(deadline)
    report(pre, fine, started)
    failed = [k for k, r in {**pre, **fine}.items() if not isinstance(r, dict)]
    if failed:
        print(f"not measured: {failed}")
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
