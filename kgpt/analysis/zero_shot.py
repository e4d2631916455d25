"""Zero-shot evaluation: a task's heuristic run on its data, once or during pre-training.

`evaluate(lm, tokenizer, task, data_dir)` runs a task's `zero_shot` heuristic
(`kgpt.tasks.heuristics`) and returns its metrics; `ZeroShotCallback` does
so every N pre-training steps. Both take `kgpt.Task` objects: finding a task
by name is the caller's (`resolve_tasks` with the caller's registry).
"""

import collections
import csv
import logging
import os

import keras
import numpy as np

from kgpt import checks
from kgpt.errors import ConfigError, DataError
from kgpt.io.storage import write_text
from kgpt.tasks import metrics as metrics_lib
from kgpt.tasks.heuristics import Scorer
from kgpt.train.callbacks import BatchCount

logger = logging.getLogger(__name__)


def zero_shot_tasks(registry):
    """Names of the registered tasks that offer a zero-shot heuristic."""
    return [name for name in registry.names() if registry.get(name).zero_shot is not None]


def check_tasks(tasks, registry, directories=True):
    """Raises `ConfigError` (or the registry's `RegistryError`) unless every task of `tasks` (`{name: data_dir or
    None}`) is registered, offers a heuristic, and has embedded data or (with `directories`) an existing data
    directory; reads nothing, so that commands check their flags before they build or load a model. A task's
    metric that returns no number is named here too (`kgpt.tasks.metrics.check`)."""
    for name, data_dir in tasks.items():
        task = registry.get(name)
        if task.zero_shot is None:
            raise ConfigError(
                f"Task {name!r} offers no zero-shot heuristic; tasks that do: {', '.join(zero_shot_tasks(registry))}."
            )
        if data_dir is None and task.default_data is None:
            raise ConfigError(f"Task {name!r} has no embedded data; give its data directory ({name}=DIR).")
        if directories and data_dir is not None and not os.path.isdir(data_dir):
            raise ConfigError(f"{name}={data_dir}: no such directory (the task's data directory).")
        metrics_lib.check(task)


def resolve_tasks(tasks, scratch_dir, registry):
    """`{name: data_dir or None}` -> `{name: (task, data_dir)}` for tasks that offer a heuristic.

    Tasks are looked up in `registry` (a `kgpt.TaskRegistry`: anything with
    `get(name)` and `names()`). `None` for a data directory writes the task's
    embedded data to `scratch_dir/zero_shot_data/NAME`.
    """
    resolved = {}
    check_tasks(tasks, registry, directories=False)  # a missing directory is the reader's FileNotFoundError
    for name, data_dir in tasks.items():
        task = registry.get(name)
        if data_dir is None:
            data_dir = task.write_default_data(os.path.join(scratch_dir, "zero_shot_data", name))
            logger.info(f"{name}: using its embedded data ({data_dir}).")
        resolved[name] = (task, data_dir)
    return resolved


def splits_read(task):
    """`(split, train_split)` that `evaluate` reads by default: the dev split (the only one if there is one), and
    the training split a heuristic is fit on (None when `task`'s heuristic needs no training)."""
    split = task.splits[1] if len(task.splits) > 1 else task.splits[0]
    return split, task.splits[0] if task.zero_shot is not None and task.zero_shot.needs_training else None


def evaluate(lm, tokenizer, task, data_dir, split=None, train_split=None, batch_size=32, max_examples=None):
    """Runs `task.zero_shot` on one split; returns its metrics and counts.

    Args:
        lm: a `GPTCausalLM` (pre-trained; the special tokens are not used).
        tokenizer: the LM's `GPTTokenizer`.
        task: a `kgpt.Task` whose `zero_shot` is a `Heuristic`.
        data_dir: the task's files.
        split: evaluated split (default: the task's second split, e.g. dev).
        train_split: for heuristics that fit (default: the task's first split).
        max_examples: evaluate only the first N examples of each split (for
            quick checks during pre-training); the counts say so.

    Returns:
        `{metric: value, ..., "examples": {"read", "used", "skipped", ...}}`, with
        `"baselines"` (`kgpt.tasks.metrics.baselines`: the majority label's
        scores, and chance) for a task of classes or choices.

    Example:
    ```python
    lm = kgpt.GPTCausalLM.from_preset("out")
    kgpt.analysis.zero_shot.evaluate(lm, kgpt.GPTTokenizer.from_preset("out"), registry.get("sst2"), "glue/SST-2")
    ```
    """
    max_examples = checks.positive_int(max_examples, "max_examples", allow_none=True)
    heuristic = task.zero_shot
    if heuristic is None:
        raise ConfigError(f"Task {task.name!r} offers no zero-shot heuristic.")
    default_split, default_train = splits_read(task)
    split = split or default_split
    scorer = Scorer(lm, tokenizer, batch_size=batch_size)
    if heuristic.needs_training:  # a fitted copy: the task's own heuristic stays as the plugin made it
        train, _, _ = task.examples(train_split or default_train, data_dir)
        heuristic = heuristic.fit(scorer, task, train[:max_examples])
    examples, skipped, read = task.examples(split, data_dir)
    examples = examples[:max_examples]
    labels = [task.label_value(e) for e in examples if e.label is not None]
    if len(labels) != len(examples):
        raise DataError(
            f"Task {task.name!r}: split {split!r} in {data_dir} is unlabeled; zero-shot evaluation needs labels."
        )
    predictions = heuristic.predict(scorer, task, examples)
    results = {
        name: metrics_lib.score(task, name, fn, np.array(labels), predictions)
        for name, fn in map(metrics_lib.resolve, task.metrics)
    }
    found = metrics_lib.baselines(task, np.array(labels))
    if found:  # what predicting the majority label, or by chance, scores: the heuristic is read against it
        results["baselines"] = found
    results["examples"] = {
        "read": read,
        "used": len(examples),
        "skipped": sum(skipped.values()),
        "skipped_reasons": dict(skipped),
        "context_truncated": scorer.truncated,
    }
    return results


class ZeroShotCallback(keras.callbacks.Callback):
    """Evaluates zero-shot tasks every `every` training steps (paper Figure 2, right).

    Reads the optimizer's step once per `fit` and counts steps after that
    from the batch indices Keras passes (`kgpt.train.callbacks.BatchCount`):
    on JAX, touching the model in a callback syncs the whole training state.
    It evaluates on the main thread when the next execution begins (nothing
    has trained since: the weights of the step it names) or at the epoch's
    end, and once more at the end of training; its batch end only counts, so
    it is `async_safe` and Keras need not sync each step for it. Steps are
    optimizer updates (gradient accumulation's micro-batches count as one);
    with `steps_per_execution = N` Keras reports every Nth batch, and it
    evaluates at the first report past each multiple of `every`. List it
    before a callback that checkpoints its `rows()` (kgpt-train's progress),
    so that a checkpoint holds the evaluation of its own step.

    Args:
        tasks: `{name: (task, data_dir)}`.
        tokenizer: the LM's tokenizer.
        every: steps between evaluations (also at the end of training).
        csv_path: optional CSV of `step, task, metric, value` rows (appended).
        log_dir: optional TensorBoard directory (`zero_shot/{task}/{metric}`).
        max_examples: examples per split, to keep the evaluations quick.
    """

    def __init__(self, tasks, tokenizer, every, csv_path=None, log_dir=None, max_examples=None):
        super().__init__()
        self.tasks = dict(tasks)
        self.tokenizer = tokenizer
        self.every = checks.positive_int(every, "every")
        self.csv_path = csv_path
        self.log_dir = log_dir
        self.max_examples = checks.positive_int(max_examples, "max_examples", allow_none=True)
        self.history = collections.defaultdict(list)  # (task, metric) -> [(step, value)]
        self.step = None  # the optimizer's step, counted from the start of each fit()
        self._last = None

    def evaluate_now(self, step):
        if step == self._last:
            return
        self._last = step
        rows = []
        for name, (task, data_dir) in self.tasks.items():
            result = evaluate(self.model, self.tokenizer, task, data_dir, max_examples=self.max_examples)
            values = {m: result[m] for m in task.metric_names}
            for metric, value in values.items():
                self.history[(name, metric)].append((step, value))
                rows.append((step, name, metric, value))
            logger.info(f"Zero-shot at step {step}: {name} " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()))
        if self.csv_path:
            new = not os.path.exists(self.csv_path)
            with open(self.csv_path, "a", newline="") as f:
                writer = csv.writer(f)
                if new:
                    writer.writerow(["step", "task", "metric", "value"])
                writer.writerows(rows)
        if self.log_dir:
            import tensorflow as tf

            with tf.summary.create_file_writer(os.path.join(self.log_dir, "zero_shot")).as_default():
                for step_, name, metric, value in rows:
                    tf.summary.scalar(f"zero_shot/{name}/{metric}", value, step=step_)

    def rows(self):
        """Every evaluation so far as `[step, task, metric, value]` rows (a checkpoint keeps them)."""
        return sorted(
            [step, name, metric, value] for (name, metric), points in self.history.items() for step, value in points
        )

    def restore(self, rows):
        """Continues a resumed run: its evaluations before the checkpoint, and the CSV rewritten to hold only those."""
        self.history = collections.defaultdict(list)
        for step, name, metric, value in rows:
            self.history[(name, metric)].append((step, value))
        if self.csv_path:
            lines = ["step,task,metric,value"] + [
                f"{step},{name},{metric},{value!r}" for step, name, metric, value in rows
            ]
            write_text(self.csv_path, "\n".join(lines) + "\n")

    async_safe = True  # its on_train_batch_end only counts (in Keras' callback thread on JAX)

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        self._accumulation = getattr(optimizer, "gradient_accumulation_steps", None) or 1
        self.step = int(keras.ops.convert_to_numpy(optimizer.iterations))  # optimizer steps (not micro-batches)
        self._count = BatchCount(self.step * self._accumulation)

    def on_epoch_begin(self, epoch, logs=None):
        self._count.epoch_begin()

    def on_train_batch_begin(self, batch, logs=None):
        if batch:  # the epoch's earlier executions are dispatched (the first's steps were seen at the last epoch end)
            self._reached(self._count.begun(batch) // self._accumulation)

    def on_train_batch_end(self, batch, logs=None):
        self._count.end(batch)

    def on_epoch_end(self, epoch, logs=None):
        self._reached(self._count.ended // self._accumulation)  # Keras has waited for the epoch's batch ends

    def _reached(self, step):
        """On the main thread: training has gone through `step`; evaluates if it passed a multiple of `every`."""
        previous, self.step = self.step, step
        if step // self.every > previous // self.every:
            self.evaluate_now(step)

    def on_train_end(self, logs=None):
        self.evaluate_now(self.step)
