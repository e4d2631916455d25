"""Benchmark of the pre-training input path: tokenizer, shards, window stream.

    python benchmarks/input_pipeline.py                       # 20 MB generated corpus
    python benchmarks/input_pipeline.py --megabytes 100 --train_steps 20

Prints (1) GPT-1 tokenizer throughput, shard build time and
`GPTTokenizer.train` time on a generated corpus (sentences drawn from the
~500 distinct words of the embedded demo text, so BPE caches are hotter and
merges fewer than on real text), (2) peak anonymous memory while streaming windows from
shards of a corpus and of one four times larger (flat means streaming), and
(3) training steps/s at the foundation benchmark's model shape with windows
read from shards versus the very same windows held in memory (target: the
ratio is >= 0.95). Parts run in subprocesses so their memory is their own.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

from absl import app, flags

from kgpt._children import ends_with_this_process

flags.DEFINE_integer("megabytes", 20, "Size of the generated corpus.")
flags.DEFINE_integer("num_merges", 40000, "Merges for the tokenizer-training timing.")
flags.DEFINE_integer("stream_batches", 300, "Batches read per memory measurement.")
flags.DEFINE_integer("train_steps", 10, "Timed training steps per input path.")
flags.DEFINE_integer("num_layers", 6, "Model shape (the foundation benchmark's).")
flags.DEFINE_integer("hidden_dim", 512, "")
flags.DEFINE_integer("num_heads", 8, "")
flags.DEFINE_integer("intermediate_dim", 2048, "")
flags.DEFINE_integer("sequence_length", 256, "")
flags.DEFINE_integer("batch_size", 8, "")
flags.DEFINE_string("worker", None, "Internal: run one part and print JSON.")
flags.DEFINE_string("directory", None, "Internal: shards folder for a worker.")
FLAGS = flags.FLAGS


def generate_corpus(path, megabytes, seed=0):
    """Writes `megabytes` of sentences drawn from the embedded demo text's words."""
    import numpy as np

    from kgpt.data import demo_world

    words = sorted(set(re.findall(r"[A-Za-z']+", demo_world.corpus())))
    rng = np.random.default_rng(seed)
    target = megabytes * 1_000_000
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            lengths = rng.integers(5, 20, 2000)
            picks = rng.integers(0, len(words), lengths.sum())
            text, i = [], 0
            for n in lengths:
                sentence = " ".join(words[j] for j in picks[i : i + n])
                text.append(sentence[0].upper() + sentence[1:] + ".")
                i += n
            block = " ".join(text) + "\n\n"
            f.write(block)
            written += len(block)


class PeakAnon:
    """Samples RssAnon (anonymous memory, excluding memory-mapped file pages)."""

    def __enter__(self):
        self.peak, self._stop = 0, False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        self.peak = max(self.peak, int(line.split()[1]) * 1024)
            time.sleep(0.01)

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join()


def worker_stream(directory):
    from kgpt.data.shard_index import ShardIndex

    index = ShardIndex.load(directory)
    data = index.windows(FLAGS.sequence_length, 64, seed=0)
    iterator = iter(data)
    next(iterator)  # start-up allocations are not the corpus
    with PeakAnon() as memory:
        for _ in range(FLAGS.stream_batches):
            next(iterator)
    return {"tokens": index.total_tokens, "peak_anon_bytes": memory.peak}


def worker_train(directory, in_memory):
    import keras
    import numpy as np
    import tensorflow as tf

    import kgpt
    from kgpt.data.shard_index import ShardIndex

    index = ShardIndex.load(directory)
    shards = index.windows(FLAGS.sequence_length, FLAGS.batch_size, seed=0)
    steps = FLAGS.train_steps + 2  # 2 warm-up steps
    if in_memory:
        batches = list(shards.take(steps).as_numpy_iterator())
        x = {k: np.concatenate([b[0][k] for b in batches]) for k in batches[0][0]}
        y = np.concatenate([b[1] for b in batches])
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(FLAGS.batch_size).cache().prefetch(2)
    else:
        data = shards
    backbone = kgpt.GPTBackbone(
        vocabulary_size=kgpt.GPTTokenizer.gpt1().vocabulary_size(),
        num_layers=FLAGS.num_layers,
        num_heads=FLAGS.num_heads,
        hidden_dim=FLAGS.hidden_dim,
        intermediate_dim=FLAGS.intermediate_dim,
        max_sequence_length=FLAGS.sequence_length,
    )
    lm = kgpt.GPTCausalLM(backbone)
    lm.compile(optimizer=kgpt.gpt_adamw(warmup_steps=1, total_steps=steps))
    times = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter())

    lm.fit(data, steps_per_epoch=steps, epochs=1, callbacks=[Clock()], verbose=0, shuffle=False)
    timed = times[2:]
    return {"steps_per_second": (len(timed) - 1) / (timed[-1] - timed[0])}


def _run_worker(part, directory):
    command = [sys.executable, os.path.abspath(__file__), f"--worker={part}", f"--directory={directory}"]
    command += [
        f"--{name}={FLAGS[name].value}"
        for name in (
            "stream_batches",
            "train_steps",
            "num_layers",
            "hidden_dim",
            "num_heads",
            "intermediate_dim",
            "sequence_length",
            "batch_size",
        )
    ]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        preexec_fn=ends_with_this_process(),
    )
    if result.returncode:
        raise RuntimeError(f"worker {part} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv):
    if FLAGS.worker:
        part = {
            "stream": lambda: worker_stream(FLAGS.directory),
            "train_shards": lambda: worker_train(FLAGS.directory, False),
            "train_memory": lambda: worker_train(FLAGS.directory, True),
        }[FLAGS.worker]
        print(json.dumps(part()))
        return
    if FLAGS.train_steps < 2:
        raise app.UsageError("--train_steps must be >= 2 to time an interval.")
    import keras

    import kgpt
    from kgpt.data.shards import build_shards

    print(f"kgpt input-pipeline benchmark, Keras {keras.__version__}, backend {keras.config.backend()}")
    tokenizer = kgpt.GPTTokenizer.gpt1()
    work = tempfile.mkdtemp(prefix="kgpt-bench-")
    sizes = {"small": FLAGS.megabytes, "large": 4 * FLAGS.megabytes}
    stream = {}
    for name, megabytes in sizes.items():
        corpus = os.path.join(work, f"{name}.txt")
        start = time.perf_counter()
        generate_corpus(corpus, megabytes)
        generated = time.perf_counter() - start
        directory = os.path.join(work, f"{name}_shards")
        start = time.perf_counter()
        index = build_shards([corpus], tokenizer, directory)
        seconds = time.perf_counter() - start
        print(
            f"{name}: {megabytes} MB generated in {generated:.1f} s; tokenized into {index.total_tokens:,} tokens "
            f"and {len(index.shards)} shard(s) in {seconds:.1f} s = {index.total_tokens / seconds:,.0f} tokens/s "
            f"({megabytes / seconds:.2f} MB/s)"
        )
        stream[name] = _run_worker("stream", directory)
        if name == "large":
            start = time.perf_counter()
            trained = kgpt.GPTTokenizer.train([corpus], num_merges=FLAGS.num_merges)
            print(
                f"GPTTokenizer.train on {megabytes} MB: {len(trained.merges):,} merges in "
                f"{time.perf_counter() - start:.1f} s"
            )
        os.remove(corpus)
    small, large = stream["small"], stream["large"]
    print(
        f"streaming {FLAGS.stream_batches} batches of 64 x {FLAGS.sequence_length}: peak anonymous memory "
        f"{small['peak_anon_bytes'] / 2**20:,.0f} MiB ({small['tokens']:,} tokens) vs "
        f"{large['peak_anon_bytes'] / 2**20:,.0f} MiB ({large['tokens']:,} tokens): "
        f"ratio x{large['peak_anon_bytes'] / small['peak_anon_bytes']:.2f} for x{large['tokens'] / small['tokens']:.1f} "
        "the corpus"
    )
    directory = os.path.join(work, "small_shards")
    memory = _run_worker("train_memory", directory)["steps_per_second"]
    shards = _run_worker("train_shards", directory)["steps_per_second"]
    print(
        f"training {FLAGS.num_layers} x {FLAGS.hidden_dim}, batch {FLAGS.batch_size} x {FLAGS.sequence_length}: "
        f"{shards:.3f} steps/s from shards vs {memory:.3f} steps/s in memory: ratio x{shards / memory:.3f} "
        "(target >= 0.95)"
    )


if __name__ == "__main__":
    app.run(main)
