"""JAX beside TensorFlow from one run: the fine-tuning epoch, compiling, pre-training tokens/s, kgpt beside keras-hub.

    python benchmarks/backends.py                                             # ~25 min on 2 CPU cores
    python benchmarks/backends.py --finetune_args="--tsv RTE/train.tsv --num_examples 960 --hidden_dim 32 \
        --num_heads 2 --intermediate_dim 128" --pretrain_args="--num_layers 2 --hidden_dim 64 --num_heads 2 \
        --intermediate_dim 256 --vocabulary_size 1024 --steps 5"
    python benchmarks/backends.py --rounds 3 --parts finetune                 # medians of 3 rounds

Every measurement runs in its own process, under `KERAS_BACKEND=jax` or
`tensorflow`, the two backends taking turns (the first backend alternates
between rounds, so a change in the machine's load hits both alike):

- fine-tuning: `benchmarks/finetune.py` with `--finetune_args` (default: the
  planned feed, `kgpt-train`'s compile-aware lengths, and every batch padded
  to the longest), one timed epoch after an untimed warm-up that compiles
  (JAX) or traces (TensorFlow) every shape; the warm-up's compile seconds and
  an epoch's give the compiling share of an estimated `--plan_epochs` run;
- pre-training: `benchmarks/model.py`'s workers for kgpt and keras-hub's GPT-2
  at `--pretrain_args` (default: 6 x 512, context 256, vocabulary 16,384,
  batch 8), training tokens/s.

It prints each figure per backend, the medians' JAX / TensorFlow ratios, and
the issue's targets: JAX's fine-tuning epoch (planned lengths) <= 1.25x
TensorFlow's, JAX's pre-training >= 0.9x TensorFlow's, >= 85% real tokens on
JAX with <= 25% of the run compiling, and kgpt >= 1.2x keras-hub on
TensorFlow.
"""

import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

from kgpt._children import ends_with_this_process

flags.DEFINE_string(
    "finetune_args", "", "Arguments for benchmarks/finetune.py (its --feeds default here: planned,padded_to_longest)."
)
flags.DEFINE_string("pretrain_args", "", "Arguments for benchmarks/model.py's workers (its shape flags, --steps).")
flags.DEFINE_list("parts", ["finetune", "pretrain"], "What to measure: finetune, pretrain or both.")
flags.DEFINE_list("backends", ["jax", "tensorflow"], "The backends, the first one first in the first round.")
flags.DEFINE_integer("rounds", 1, "Rounds; each figure is the median over them.")
FLAGS = flags.FLAGS

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = {"finetune_epoch": 1.25, "pretrain": 0.9, "real_share": 0.85, "compile_share": 0.25, "keras_hub": 1.2}


def measure(script, args, backend):
    """Runs `benchmarks/SCRIPT ARGS` under `backend`; returns its last stdout line (JSON) or the JSON file it wrote."""
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, script), *args],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=ends_with_this_process(),
    )
    if result.returncode:
        raise RuntimeError(f"{script} {shlex.join(args)} failed on {backend}:\n{result.stderr[-4000:]}")
    return result.stdout


def finetune(backend):
    """`{feed: figures}` and the plan's epochs from one `benchmarks/finetune.py` run."""
    args = shlex.split(FLAGS.finetune_args)
    if not any(a.startswith("--feeds") for a in args):
        args.append("--feeds=planned,padded_to_longest")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "figures.json")
        measure("finetune.py", [*args, f"--json={path}"], backend)
        with open(path) as f:
            figures = json.load(f)
    return {row["feed"]: row for row in figures["feeds"]}, figures["plan_epochs"]


def pretrain(backend, model):
    """`benchmarks/model.py`'s figures of one model (kgpt, keras_hub_gpt2) on `backend`."""
    output = measure("model.py", [f"--worker={model}", *shlex.split(FLAGS.pretrain_args)], backend)
    return json.loads(output.strip().splitlines()[-1])


def run_round(order, figures):
    for backend in order:
        found = figures.setdefault(backend, {})
        if "finetune" in FLAGS.parts:
            feeds, plan_epochs = finetune(backend)
            for feed, row in feeds.items():
                found.setdefault(f"epoch_s:{feed}", []).append(row["seconds"])
                found.setdefault(f"real_share:{feed}", []).append(row["real_share"])
                found.setdefault(f"warmup_compile_s:{feed}", []).append(row["warmup_compile_seconds"])
                found.setdefault(f"warmup_s:{feed}", []).append(row["warmup_seconds"])
                whole = row["warmup_compile_seconds"] + plan_epochs * row["seconds"]
                found.setdefault(f"compile_share:{feed}", []).append(row["warmup_compile_seconds"] / max(whole, 1e-9))
                found.setdefault(f"lengths:{feed}", []).append(len(row["lengths"]))
        if "pretrain" in FLAGS.parts:
            for model in ("kgpt", "keras_hub_gpt2"):
                found.setdefault(f"train_tokens_per_s:{model}", []).append(
                    pretrain(backend, model)["train_tokens_per_s"]
                )
        print(
            f"round done on {backend}: " + ", ".join(f"{k} {v[-1]:.4g}" for k, v in sorted(found.items())), flush=True
        )


def main(argv):
    unknown = set(FLAGS.parts) - {"finetune", "pretrain"}
    if unknown:
        raise app.UsageError(f"--parts takes finetune and pretrain, not {', '.join(sorted(unknown))}.")
    figures = {}
    for i in range(FLAGS.rounds):
        order = FLAGS.backends if i % 2 == 0 else FLAGS.backends[::-1]
        run_round(order, figures)
    median = {b: {k: statistics.median(v) for k, v in found.items()} for b, found in figures.items()}
    jax, tf = median.get("jax", {}), median.get("tensorflow", {})
    rows = [
        ("fine-tuning epoch, planned lengths (s)", "epoch_s:planned"),
        ("fine-tuning epoch, padded to the longest (s)", "epoch_s:padded_to_longest"),
        ("planned: padded lengths", "lengths:planned"),
        ("planned: real tokens", "real_share:planned"),
        ("planned warm-up: compiling (s)", "warmup_compile_s:planned"),
        ("planned: compiling, share of the estimated run", "compile_share:planned"),
        ("pre-training tokens/s, kgpt", "train_tokens_per_s:kgpt"),
        ("pre-training tokens/s, keras-hub GPT-2", "train_tokens_per_s:keras_hub_gpt2"),
    ]
    print(
        f"\nmedians of {FLAGS.rounds} round(s); finetune.py {FLAGS.finetune_args or '(defaults)'}; model.py "
        f"{FLAGS.pretrain_args or '(defaults)'}\n"
    )
    print("| figure | JAX | TensorFlow | JAX / TF |")
    print("|---|---|---|---|")
    for name, key in rows:
        if key in jax or key in tf:
            a, b = jax.get(key), tf.get(key)
            ratio = f"{a / b:.2f}" if a is not None and b else "-"

            def show(v):
                return "-" if v is None else f"{v:.1%}" if "share" in key else f"{v:,.4g}"  # noqa: B023 - called at once, in this iteration

            print(f"| {name} | {show(a)} | {show(b)} | {ratio} |")
    for backend, found in median.items():
        if "train_tokens_per_s:kgpt" in found:
            ratio = found["train_tokens_per_s:kgpt"] / found["train_tokens_per_s:keras_hub_gpt2"]
            print(f"| pre-training, kgpt / keras-hub on {backend} | | | {ratio:.2f} |")
    print()
    verdict = lambda ok: "met" if ok else "MISSED"  # noqa: E731
    if "epoch_s:planned" in jax and "epoch_s:planned" in tf:
        ratio = jax["epoch_s:planned"] / tf["epoch_s:planned"]
        print(
            f"target JAX fine-tuning epoch <= {TARGETS['finetune_epoch']}x TensorFlow's: {ratio:.2f}x "
            f"({verdict(ratio <= TARGETS['finetune_epoch'])})"
        )
    if "real_share:planned" in jax:
        real, share = jax["real_share:planned"], jax["compile_share:planned"]
        print(
            f"target JAX >= {TARGETS['real_share']:.0%} real tokens with <= {TARGETS['compile_share']:.0%} "
            f"compiling: {real:.1%} real, {share:.0%} compiling "
            f"({verdict(real >= TARGETS['real_share'] and share <= TARGETS['compile_share'])})"
        )
    if "train_tokens_per_s:kgpt" in jax and "train_tokens_per_s:kgpt" in tf:
        ratio = jax["train_tokens_per_s:kgpt"] / tf["train_tokens_per_s:kgpt"]
        print(
            f"target JAX pre-training >= {TARGETS['pretrain']}x TensorFlow's: {ratio:.2f}x "
            f"({verdict(ratio >= TARGETS['pretrain'])})"
        )
    if "train_tokens_per_s:kgpt" in tf:
        ratio = tf["train_tokens_per_s:kgpt"] / tf["train_tokens_per_s:keras_hub_gpt2"]
        print(
            f"target TensorFlow kgpt >= {TARGETS['keras_hub']}x keras-hub: {ratio:.2f}x "
            f"({verdict(ratio >= TARGETS['keras_hub'])})"
        )


if __name__ == "__main__":
    app.run(main)
