"""LoRA against full fine-tuning, and int8 against float32 prediction, on a real task: one table each.

    KERAS_BACKEND=jax python benchmarks/lora_int8.py --init lm --data_dir glue/CoLA --output_dir bench
    KERAS_BACKEND=tensorflow python benchmarks/lora_int8.py --init lm --data_dir glue/CoLA --output_dir bench \
        --phases int8                          # int8 on the other backend, from the models fine-tuned above
    python benchmarks/lora_int8.py --init lm --data_dir glue/CoLA --output_dir bench --seeds 0,1,2 --epochs 6

`--init` is a pre-trained preset (`kgpt-train --task lm --output_dir lm`).

Fine-tuning (`--phases finetune`): for every seed, `kgpt-train --task TASK
--init INIT --epochs E --seed S` is run twice, in full and with
`--lora_rank R`, each in its own process (the order alternates between
seeds, so a change in the machine's load hits both alike), through
`kgpt.jobs.finetune.finetune` (what the CLI runs) with a callback that times
every training step. Reported per run: the dev score (the task's first
metric), the weights the optimizer updates, the median step time (the
first 5 steps of each epoch, which include tracing or XLA compiling, left
out) and the process's peak resident memory (`resource.getrusage`:
loading, training and evaluating; the Python, TensorFlow and JAX runtimes
included).

int8 (`--phases int8`): each fine-tuned model (`OUTPUT_DIR/{full,lora}-sS`)
is loaded twice, once as saved (float32) and once quantized
(`model.quantize("int8")`, saved to a preset and loaded back from it).
Reported: the bytes of the model's arrays in the weight files (the
optimizer state a fine-tuned preset also holds left out), the dev score of each, and the seconds to
predict the dev split (median of `--repeats` passes after an untimed one,
the two models taking turns).
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

from kgpt._children import ends_with_this_process

flags.DEFINE_string("init", None, "The pre-trained preset to fine-tune (kgpt-train --task lm --output_dir).")
flags.DEFINE_string("task", "cola", "The task to fine-tune.")
flags.DEFINE_string("data_dir", None, "The task's data (default: its embedded data).")
flags.DEFINE_string("output_dir", None, "Where the fine-tuned models and the results go.")
flags.DEFINE_list("seeds", ["0", "1"], "Fine-tuning seeds (each one runs full and LoRA).")
flags.DEFINE_integer("epochs", 2, "Fine-tuning epochs.")
flags.DEFINE_integer("rank", 8, "LoRA rank.")
flags.DEFINE_float("learning_rate", 1e-3, "Peak learning rate of both (the cpu-small recipe's).")
flags.DEFINE_integer("batch_size", 32, "Examples per update.")
flags.DEFINE_list("phases", ["finetune", "int8"], "finetune, int8 or both.")
flags.DEFINE_integer("repeats", 3, "Timed prediction passes per model (int8 phase).")
flags.DEFINE_string("child", None, "Internal: run one fine-tuning from this JSON config and write its figures.")
FLAGS = flags.FLAGS

SKIPPED_STEPS = 5  # per epoch: tracing (TensorFlow) and XLA compiling (JAX) happen there


def child(spec):
    """One fine-tuning run in this process; writes `{score, trainable, weights, step_s, peak_rss_mb}`."""
    import keras

    from kgpt import log
    from kgpt.jobs import finetune, run
    from kgpt.jobs.config import FinetuneConfig
    from kgpt.layers import lora

    log.to_stdout()  # the run's progress lines, as kgpt-train prints them

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times, self._last, self._step = [], None, 0

        def on_epoch_begin(self, epoch, logs=None):
            self._last, self._step = None, 0

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self._last is not None and self._step >= SKIPPED_STEPS:
                self.times.append(now - self._last)
            self._last, self._step = now, self._step + 1

    timer = StepTimer()
    original = run.Run.callbacks
    run.Run.callbacks = lambda self, *args, **kwargs: [*original(self, *args, **kwargs), timer]
    config = FinetuneConfig(**spec["config"])
    model, results = finetune.finetune(config)
    task_metric = next(k for k in results["splits"]["dev"] if k != "examples")
    figures = {
        "score": results["splits"]["dev"][task_metric],
        "metric": task_metric,
        "trainable": lora.count_trainable(model),
        "weights": int(model.count_params()),
        "step_s": statistics.median(timer.times) if timer.times else float("nan"),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    with open(spec["result"], "w") as f:
        json.dump(figures, f)


def finetune_runs():
    """Runs full and LoRA fine-tuning for every seed, interleaved; returns `{(mode, seed): figures}`."""
    results = {}
    for i, seed in enumerate(int(s) for s in FLAGS.seeds):
        modes = ("full", "lora") if i % 2 == 0 else ("lora", "full")
        for mode in modes:
            out = os.path.join(FLAGS.output_dir, f"{mode}-s{seed}")
            result = out + ".json"
            if os.path.exists(result):  # a rerun keeps what an interrupted benchmark finished
                with open(result) as f:
                    results[(mode, seed)] = json.load(f)
                continue
            config = dict(
                task=FLAGS.task,
                init=FLAGS.init,
                data_dir=FLAGS.data_dir,
                output_dir=out,
                overwrite=True,
                epochs=FLAGS.epochs,
                seed=seed,
                learning_rate=FLAGS.learning_rate,
                batch_size=FLAGS.batch_size,
                lora_rank=FLAGS.rank if mode == "lora" else None,
                log_every="0",
            )
            spec = json.dumps({"config": config, "result": result})
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, os.path.abspath(__file__), f"--child={spec}"],
                check=True,
                preexec_fn=ends_with_this_process(),
            )
            with open(result) as f:
                results[(mode, seed)] = json.load(f)
            print(f"{mode} seed {seed}: {results[(mode, seed)]} ({time.perf_counter() - started:.0f} s)", flush=True)
    return results


def finetune_table(results):
    seeds = sorted({seed for _, seed in results})
    metric = next(iter(results.values()))["metric"]
    lines = [
        f"| run | dev {metric} x 100 (per seed) | mean | trainable weights | step time (s, median) | peak RSS (MB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    means = {}
    for mode, name in (("full", "full fine-tuning"), ("lora", f"LoRA rank {FLAGS.rank}")):
        runs = [results[(mode, s)] for s in seeds if (mode, s) in results]
        if not runs:
            continue
        scores = [100 * r["score"] for r in runs]
        means[mode] = {k: statistics.mean(r[k] for r in runs) for k in ("step_s", "peak_rss_mb")}
        lines.append(
            f"| {name} | {' / '.join(f'{s:.1f}' for s in scores)} | {statistics.mean(scores):.1f} | "
            f"{runs[0]['trainable']:,} of {runs[0]['weights']:,} | "
            f"{' / '.join(format(r['step_s'], '.3f') for r in runs)} | "
            f"{' / '.join(format(r['peak_rss_mb'], '.0f') for r in runs)} |"
        )
    if len(means) == 2:
        lines.append(
            f"\nLoRA / full: step time x{means['lora']['step_s'] / means['full']['step_s']:.2f}, "
            f"peak RSS x{means['lora']['peak_rss_mb'] / means['full']['peak_rss_mb']:.2f} (means over seeds)."
        )
    return "\n".join(lines)


def weights_size(preset):
    """Bytes of the model's arrays in a preset's weight files (a fine-tuned preset's optimizer state left out)."""
    import h5py

    total = 0
    for name in os.listdir(preset):
        if name.endswith(".weights.h5"):
            with h5py.File(os.path.join(preset, name), "r") as f:

                def add(path, item):
                    nonlocal total
                    if isinstance(item, h5py.Dataset) and not path.startswith("optimizer/"):
                        total += item.size * item.dtype.itemsize

                f.visititems(add)
    return total


def int8_rows():
    """The int8 comparison for every fine-tuned model in OUTPUT_DIR: a list of table rows."""
    import keras
    import numpy as np

    import kgpt
    from kgpt.jobs import finetune, finetune_data, finetune_outputs
    from kgpt.layers import int8

    rows = []
    for name in sorted(os.listdir(FLAGS.output_dir)):
        preset = os.path.join(FLAGS.output_dir, name)
        if not (name.startswith(("full-", "lora-")) and os.path.isfile(os.path.join(preset, "metrics.json"))):
            continue
        model, _, task = finetune.load_finetuned(preset)
        quantized_dir = os.path.join(FLAGS.output_dir, "int8", name)
        int8.quantize(finetune.load_finetuned(preset).model).save_to_preset(quantized_dir)
        quantized = kgpt.GPTTaskModel.from_preset(quantized_dir)
        split = finetune_data.encode_split(task, "dev", FLAGS.data_dir, model.preprocessor)
        times = {"float32": [], "int8": []}
        scores = {}
        for repeat in range(FLAGS.repeats + 1):
            for label, m in (
                (("float32", model), ("int8", quantized))
                if repeat % 2 == 0
                else (("int8", quantized), ("float32", model))
            ):
                started = time.perf_counter()
                evaluation = finetune_outputs.evaluate_split(task, m, split, FLAGS.batch_size)
                if repeat:  # the first pass traces / compiles
                    times[label].append(time.perf_counter() - started)
                scores[label] = next(iter(evaluation.metrics.values()))
        a, b = (finetune_outputs.evaluate_split(task, m, split, FLAGS.batch_size) for m in (model, quantized))
        agree = float(np.mean(a.predictions == b.predictions))
        change = float(np.max(np.abs(np.asarray(a.probabilities) - np.asarray(b.probabilities))))
        t_float, t_int8 = statistics.median(times["float32"]), statistics.median(times["int8"])
        rows.append(
            f"| {name} | {keras.config.backend()} | {weights_size(preset) / 1e6:.1f} -> "
            f"{weights_size(quantized_dir) / 1e6:.1f} MB | {100 * scores['float32']:.1f} -> "
            f"{100 * scores['int8']:.1f} | {agree:.1%} | {change:.4f} | {t_float:.2f} -> {t_int8:.2f} s "
            f"(x{t_int8 / t_float:.2f}) |"
        )
        print(rows[-1], flush=True)
    return rows


def main(argv):
    del argv
    if FLAGS.child:
        child(json.loads(FLAGS.child))
        return
    if not FLAGS.output_dir or not FLAGS.init and "finetune" in FLAGS.phases:
        raise app.UsageError("--output_dir and --init (a pre-trained preset) are required.")
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    if "finetune" in FLAGS.phases:
        print(finetune_table(finetune_runs()), flush=True)
    if "int8" in FLAGS.phases:
        rows = int8_rows()
        print(
            "| model | backend | model arrays | dev score x 100 (float32 -> int8) | same predictions | "
            "largest probability change | dev prediction time |\n| --- | --- | --- | --- | --- | --- | --- |"
        )
        print("\n".join(rows))


if __name__ == "__main__":
    app.run(main)
