"""Training tokens/s of a run on 2 processes against 1, at the same global batch, on each backend.

    python benchmarks/processes.py                                  # both backends, 4 x 256 model, ~6 min on 2 cores
    python benchmarks/processes.py --backends jax --processes 1,2,4 --batch_size 32

Each run is `kgpt-train --task lm` on a generated corpus, the processes on
127.0.0.1 (one CPU device each, or the GPUs each process sees), with
`--log_every`: its progress lines give tokens/s over every interval after the
first (which compiles); the figure is their median. The processes of one run
share this machine's cores, so on a CPU this measures the cost of the
collectives rather than a gain: the gain comes from processes on hosts of
their own.
"""

import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from kgpt._children import ends_with_this_process

flags.DEFINE_list("backends", ["jax", "tensorflow"], "Keras backends to measure.")
flags.DEFINE_list("processes", ["1", "2"], "Process counts to run; ratios are to the first.")
flags.DEFINE_integer("num_layers", 4, "Transformer blocks.")
flags.DEFINE_integer("hidden_dim", 256, "Hidden size.")
flags.DEFINE_integer("num_heads", 4, "Attention heads.")
flags.DEFINE_integer("sequence_length", 128, "Tokens per window.")
flags.DEFINE_integer("batch_size", 16, "Global batch (windows per step), the same for every process count.")
flags.DEFINE_integer("steps", 60, "Training steps of each run.")
flags.DEFINE_integer("log_every", 10, "Steps per measured interval.")
flags.DEFINE_integer("timeout", 1200, "Seconds a run may take.")
FLAGS = flags.FLAGS

WORDS = "the keeper of the lighthouse wrote the date in the log every night while the sea rose".split()


def free_port(count):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1] if probe.getsockname()[1] + count < 65536 else free_port(count)


def run(backend, count, corpus, work):
    out = os.path.join(work, f"{backend}-{count}")
    args = [
        "--task=lm",
        f"--corpus={corpus}",
        f"--output_dir={out}",
        "--tokenizer=train",
        "--num_merges=200",
        f"--num_layers={FLAGS.num_layers}",
        f"--hidden_dim={FLAGS.hidden_dim}",
        f"--num_heads={FLAGS.num_heads}",
        f"--intermediate_dim={4 * FLAGS.hidden_dim}",
        f"--sequence_length={FLAGS.sequence_length}",
        f"--batch_size={FLAGS.batch_size}",
        f"--max_steps={FLAGS.steps}",
        "--evaluations=1",
        "--warmup_steps=5",
        "--validation_tokens=0",
        "--validation_fraction=0",
        "--checkpoint_every=0",
        f"--log_every={FLAGS.log_every}",
    ]
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    port = free_port(count)
    logs, processes = [], []
    for index in range(count):
        extra = [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={count}", f"--process_id={index}"]
        logs.append(os.path.join(work, f"{backend}-{count}-{index}.log"))
        with open(logs[-1], "w") as log:
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "kgpt.cli.train", *args, *(extra if count > 1 else [])],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    preexec_fn=ends_with_this_process(),
                )
            )
    began = time.monotonic()
    try:
        codes = [p.wait(timeout=FLAGS.timeout) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
    text = open(logs[0]).read()
    if any(codes):
        raise RuntimeError(f"{backend} on {count} process(es) failed:\n{text[-3000:]}")
    rates = [
        float(r.replace(",", ""))
        for r in re.findall(r"^step [\d,]+/[\d,]+, loss [\d.]+, ([\d,]+) tokens/s", text, re.M)
    ]
    if not rates:
        raise RuntimeError(f"no progress lines in {logs[0]}")
    return statistics.median(rates), len(rates), time.monotonic() - began


def main(argv):
    del argv
    counts = [int(c) for c in FLAGS.processes]
    with tempfile.TemporaryDirectory(prefix="kgpt-processes-") as work:
        corpus = os.path.join(work, "corpus.txt")
        rng = random.Random(0)
        with open(corpus, "w") as f:
            f.write("\n".join(" ".join(rng.choice(WORDS) for _ in range(16)) for _ in range(20_000)))
        print(
            f"{FLAGS.num_layers} x {FLAGS.hidden_dim} model, {FLAGS.batch_size} x {FLAGS.sequence_length} tokens "
            f"a step, {FLAGS.steps} steps; tokens/s = median of {FLAGS.log_every}-step intervals after the first "
            f"(process 0's progress lines); {os.cpu_count()} CPU cores."
        )
        print(f"{'backend':<11}{'processes':>10}{'tokens/s':>12}{'intervals':>11}{'wall s':>9}{'ratio':>8}")
        for backend in FLAGS.backends:
            first = None
            for count in counts:
                rate, intervals, seconds = run(backend, count, corpus, work)
                first = first or rate
                print(
                    f"{backend:<11}{count:>10}{rate:>12,.0f}{intervals:>11}{seconds:>9.0f}{rate / first:>8.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    app.run(main)
