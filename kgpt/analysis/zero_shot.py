"""Zero-shot heuristics: tasks solved by the pre-trained LM alone (paper section 5, Figure 2 right).

A task plugin offers one by setting `Task(zero_shot=...)` to a `Heuristic`;
the built-in ones are the paper's:

- `ThresholdedLogProb` (CoLA): the sentence's average token log-probability,
  thresholded; the threshold is chosen on the training split.
- `NextWordChoice` (SST-2): append "very" and compare the probabilities of
  the next words "positive" and "negative".
- `AnswerLogProb` (RACE): the answer with the highest average token
  log-probability given the document and question.
- `PronounSubstitution` (DPRD, Winograd schemas): put each candidate in place
  of the pronoun and score the rest of the sentence (average log-probability).

`evaluate(lm, tokenizer, task, data_dir)` runs a task's heuristic and returns
its metrics; `ZeroShotCallback` does so every N pre-training steps.
"""

import collections
import csv
import os

import keras
import numpy as np

from kgpt.data import batching
from kgpt.tasks import metrics as metrics_lib


class Scorer:
    """Log-probabilities of continuations given contexts, under a causal LM.

    Texts are encoded with `tokenizer`; every context starts with the
    newline token where the vocabulary has one (a document boundary), so
    the first word is scored too. A pair longer than the model's context
    loses tokens from the start of its context (counted in `truncated`).

    Example:
    ```python
    scorer = kgpt.analysis.zero_shot.Scorer(lm, tokenizer)
    [lp] = scorer.log_probs([("the movie was very", "good")])  # one value per token of "good"
    ```
    """

    def __init__(self, lm, tokenizer, batch_size=32):
        self.lm = lm
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        newline = tokenizer.encoder.get("\n</w>")
        self.prefix = [] if newline is None else [newline]
        self.truncated = 0

    def log_probs(self, pairs):
        """`[(context, continuation)]` texts -> one float array of per-token log-probs per pair."""
        encoded = []
        limit = self.lm.backbone.max_sequence_length
        for context, continuation in pairs:
            ctx = self.prefix + self.tokenizer.encode(context)
            cont = self.tokenizer.encode(continuation)
            if not ctx:  # no newline token in this vocabulary: the first token is only context
                ctx, cont = cont[:1], cont[1:]
            if not cont:
                raise ValueError(f"Nothing to score: {continuation!r} leaves no token to predict.")
            cont = cont[: limit - 1]
            keep = max(1, limit - len(cont))
            if len(ctx) > keep:
                self.truncated += 1
                ctx = ctx[-keep:]
            encoded.append((ctx, cont))
        return self.log_probs_of_ids(encoded)

    def log_probs_of_ids(self, encoded):
        """Like `log_probs`, for `[(context_ids, continuation_ids)]`; contexts must be non-empty.

        Pairs are scored in length-sorted batches padded to a few lengths
        (`kgpt.data.batching`, as in fine-tuning), and returned in input order.
        """
        builder = batching.SplitBuilder("scored", 1, limit=self.lm.backbone.max_sequence_length)
        for context, continuation in encoded:
            builder.add([context + continuation])
        split = builder.build()
        results = [None] * len(encoded)
        for batch in batching.batch_indices(split.lengths, self.batch_size):
            x = split.inputs(batch)
            scores = self.lm.score(x["token_ids"][:, 0], x["padding_mask"][:, 0], batch_size=self.batch_size)
            for row, i in enumerate(batch):
                ctx, cont = encoded[i]
                # Entry t scores token t + 1: the continuation's tokens are entries len(ctx) - 1 ...
                results[i] = scores[row, len(ctx) - 1: len(ctx) - 1 + len(cont)].astype("float64")
        return results


def _mean(values):
    return float(np.mean(values))


class Heuristic:
    """A zero-shot method: predictions for a task's examples from a `Scorer`.

    Subclasses implement `predict`; those that learn something from the
    training split (a threshold) implement `fit` and set `needs_training`.
    Predictions are what the task's metrics take: class indices into
    `task.labels`, or choice indices.
    """

    needs_training = False
    description = ""

    def fit(self, scorer, task, examples):
        """Learns from labelled training examples (nothing by default)."""

    def predict(self, scorer, task, examples):
        raise NotImplementedError


class ThresholdedLogProb(Heuristic):
    """Average token log-probability of the text, above a threshold = `positive` (CoLA).

    The threshold maximises the task's headline metric on the training split,
    searched over `candidates` quantiles of the training scores.
    """

    needs_training = True
    description = "average token log-probability, thresholded (threshold fit on train)"

    def __init__(self, positive="1", candidates=512):
        self.positive = positive
        self.candidates = candidates
        self.threshold = None

    def scores(self, scorer, examples):
        texts = [" ".join(e.segments) for e in examples]
        return np.array([_mean(lp) for lp in scorer.log_probs([("", t) for t in texts])])

    def decide(self, task, scores, threshold):
        positive = task.labels.index(self.positive)
        negative = 1 - positive if len(task.labels) == 2 else None
        if negative is None:
            raise ValueError(f"Task {task.name!r}: ThresholdedLogProb needs exactly 2 labels.")
        return np.where(scores > threshold, positive, negative)

    def choose_threshold(self, task, scores, labels):
        """The threshold (a midpoint between training scores) with the best headline metric."""
        name, metric = metrics_lib.resolve(task.metrics[0])
        values = np.unique(scores)
        if len(values) > self.candidates:
            values = np.unique(np.quantile(values, np.linspace(0, 1, self.candidates)))
        cuts = np.concatenate([[values[0] - 1.0], (values[:-1] + values[1:]) / 2, [values[-1] + 1.0]])
        best = max(cuts, key=lambda t: metric(labels, self.decide(task, scores, t)))
        return float(best)

    def fit(self, scorer, task, examples):
        labels = np.array([task.label_value(e) for e in examples])
        self.threshold = self.choose_threshold(task, self.scores(scorer, examples), labels)

    def predict(self, scorer, task, examples):
        if self.threshold is None:
            raise RuntimeError("ThresholdedLogProb.predict before fit: the threshold comes from training data.")
        return self.decide(task, self.scores(scorer, examples), self.threshold)


class NextWordChoice(Heuristic):
    """Append `suffix`, pick the label whose word is the likelier continuation (SST-2).

    Args:
        words: `{label: word}`, e.g. `{"1": "positive", "0": "negative"}`; a
            word of several BPE tokens scores the sum of their log-probs
            (the log-probability of the whole word).
        suffix: text appended to the example, e.g. `"very"`.
    """

    description = "append 'very', compare P(positive) and P(negative)"

    def __init__(self, words, suffix="very"):
        self.words = dict(words)
        self.suffix = suffix

    def predict(self, scorer, task, examples):
        labels = list(self.words)
        pairs = [(f"{' '.join(e.segments)} {self.suffix}", self.words[label]) for e in examples for label in labels]
        scores = np.array([float(np.sum(lp)) for lp in scorer.log_probs(pairs)]).reshape(len(examples), len(labels))
        return np.array([task.labels.index(labels[i]) for i in scores.argmax(axis=1)])


class AnswerLogProb(Heuristic):
    """The choice with the highest average token log-probability given the segments (RACE)."""

    description = "answer with the highest average token log-probability given document and question"

    def predict(self, scorer, task, examples):
        pairs = [(" ".join(e.segments), choice) for e in examples for choice in e.choices]
        scores = [_mean(lp) for lp in scorer.log_probs(pairs)]
        return _argmax_per_example(examples, scores)


class PronounSubstitution(Heuristic):
    """Put each candidate in place of the pronoun; score the rest of the sentence (DPRD/Winograd).

    Examples carry `segments=(text before the pronoun, text after it)` and the
    candidates as `choices`; the score is the average log-probability of the
    text after the pronoun given the text before plus the candidate.
    """

    description = "substitute each candidate for the pronoun, average log-probability of the rest"

    def predict(self, scorer, task, examples):
        pairs = [(f"{e.segments[0]} {choice}", e.segments[1]) for e in examples for choice in e.choices]
        scores = [_mean(lp) for lp in scorer.log_probs(pairs)]
        return _argmax_per_example(examples, scores)


def _argmax_per_example(examples, scores):
    predictions, offset = [], 0
    for e in examples:
        predictions.append(int(np.argmax(scores[offset: offset + len(e.choices)])))
        offset += len(e.choices)
    return np.array(predictions)


def zero_shot_tasks(registry):
    """Names of the registered tasks that offer a zero-shot heuristic."""
    return [name for name in registry.names() if registry.get(name).zero_shot is not None]


def resolve_tasks(tasks, scratch_dir, registry=None, log=print):
    """`{name: data_dir or None}` -> `{name: (task, data_dir)}` for tasks that offer a heuristic.

    `None` writes the task's embedded data to `scratch_dir/zero_shot_data/NAME`.
    """
    from kgpt.tasks.registry import TaskRegistry

    registry = registry or TaskRegistry()
    resolved = {}
    for name, data_dir in tasks.items():
        task = registry.get(name)
        if task.zero_shot is None:
            raise ValueError(f"Task {name!r} offers no zero-shot heuristic; tasks that do: "
                             f"{', '.join(zero_shot_tasks(registry))}.")
        if data_dir is None:
            if task.default_data is None:
                raise ValueError(f"Task {name!r} has no embedded data; give its data directory ({name}=DIR).")
            data_dir = task.default_data(os.path.join(scratch_dir, "zero_shot_data", name))
            log(f"{name}: using its embedded data ({data_dir}).")
        resolved[name] = (task, data_dir)
    return resolved


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
        `{metric: value, ..., "examples": {"read", "used", "skipped", ...}}`.

    Example:
    ```python
    lm = kgpt.GPTCausalLM.from_preset("out")
    kgpt.analysis.zero_shot.evaluate(lm, kgpt.GPTTokenizer.from_preset("out"), registry.get("sst2"), "glue/SST-2")
    ```
    """
    heuristic = task.zero_shot
    if heuristic is None:
        raise ValueError(f"Task {task.name!r} offers no zero-shot heuristic.")
    split = split or (task.splits[1] if len(task.splits) > 1 else task.splits[0])
    scorer = Scorer(lm, tokenizer, batch_size=batch_size)
    if heuristic.needs_training:
        train, _, _ = task.examples(train_split or task.splits[0], data_dir)
        heuristic.fit(scorer, task, train[:max_examples])
    examples, skipped, read = task.examples(split, data_dir)
    examples = examples[:max_examples]
    labels = [task.label_value(e) for e in examples if e.label is not None]
    if len(labels) != len(examples):
        raise ValueError(f"Task {task.name!r}: split {split!r} is unlabeled; zero-shot evaluation needs labels.")
    predictions = heuristic.predict(scorer, task, examples)
    results = {name: float(fn(np.array(labels), predictions)) for name, fn in map(metrics_lib.resolve, task.metrics)}
    results["examples"] = {"read": read, "used": len(examples), "skipped": sum(skipped.values()),
                           "skipped_reasons": dict(skipped), "context_truncated": scorer.truncated}
    return results


class ZeroShotCallback(keras.callbacks.Callback):
    """Evaluates zero-shot tasks every `every` training steps (paper Figure 2, right).

    Args:
        tasks: `{name: (task, data_dir)}`.
        tokenizer: the LM's tokenizer.
        every: steps between evaluations (also at the end of training).
        csv_path: optional CSV of `step, task, metric, value` rows (appended).
        log_dir: optional TensorBoard directory (`zero_shot/{task}/{metric}`).
        max_examples: examples per split, to keep the evaluations quick.
        log: printer.
    """

    def __init__(self, tasks, tokenizer, every, csv_path=None, log_dir=None, max_examples=None, log=print):
        super().__init__()
        self.tasks = dict(tasks)
        self.tokenizer = tokenizer
        self.every = every
        self.csv_path = csv_path
        self.log_dir = log_dir
        self.max_examples = max_examples
        self.log = log
        self.history = collections.defaultdict(list)  # (task, metric) -> [(step, value)]
        self._last = None

    def evaluate_now(self, step):
        if step == self._last:
            return
        self._last = step
        rows = []
        for name, (task, data_dir) in self.tasks.items():
            result = evaluate(self.model, self.tokenizer, task, data_dir, max_examples=self.max_examples)
            values = {k: v for k, v in result.items() if k != "examples"}
            for metric, value in values.items():
                self.history[(name, metric)].append((step, value))
                rows.append((step, name, metric, value))
            self.log(f"Zero-shot at step {step}: {name} " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()))
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
        return sorted([step, name, metric, value] for (name, metric), points in self.history.items()
                      for step, value in points)

    def restore(self, rows):
        """Continues a resumed run: its evaluations before the checkpoint, and the CSV rewritten to hold only those."""
        self.history = collections.defaultdict(list)
        for step, name, metric, value in rows:
            self.history[(name, metric)].append((step, value))
        if self.csv_path:
            from kgpt.jobs.rundir import write_text

            lines = ["step,task,metric,value"] + [f"{step},{name},{metric},{value!r}" for step, name, metric, value in rows]
            write_text(self.csv_path, "\n".join(lines) + "\n")

    def on_train_batch_end(self, batch, logs=None):
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        if step % self.every == 0:
            self.evaluate_now(step)

    def on_train_end(self, logs=None):
        self.evaluate_now(int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)))

