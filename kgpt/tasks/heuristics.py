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

A heuristic sees a `Scorer` (log-probabilities under the LM), the task and
its examples; it knows nothing of the task registry or of how it is run
(`kgpt.analysis.zero_shot` evaluates them).
"""

import copy

import numpy as np

from kgpt.checks import shown
from kgpt.data import batching
from kgpt.errors import DataError
from kgpt.tasks import metrics as metrics_lib


class Scorer:
    """Log-probabilities of continuations given contexts, under a causal LM.

    Texts are encoded with `tokenizer`; every context starts with the
    newline token where the vocabulary has one (a document boundary), so
    the first word is scored too. A pair longer than the model's context
    loses tokens from the start of its context (counted in `truncated`).

    Example:
    ```python
    scorer = kgpt.tasks.heuristics.Scorer(lm, tokenizer)
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

    def log_probs(self, pairs, sources=None):
        """`[(context, continuation)]` texts -> one float array of per-token log-probs per pair.

        `sources[i]` (an example's `file:line`) names pair `i` in the error a
        continuation with no tokens raises.
        """
        encoded = []
        limit = self.lm.backbone.max_sequence_length
        for i, (context, continuation) in enumerate(pairs):
            ctx = self.prefix + self.tokenizer.encode(context)
            cont = self.tokenizer.encode(continuation)
            moved = not ctx and bool(cont)
            if moved:  # no newline token in this vocabulary: the first token is only context
                ctx, cont = cont[:1], cont[1:]
            if not cont:
                where = f"{sources[i]}: " if sources is not None and sources[i] else ""
                why = (
                    "is one token, the context of an empty one here (the vocabulary has no newline to start it)"
                    if moved
                    else "has no tokens"
                )
                raise DataError(f"{where}nothing to score: {shown(continuation)} {why}.")
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
                results[i] = scores[row, len(ctx) - 1 : len(ctx) - 1 + len(cont)].astype("float64")
        return results


def _mean(values):
    return float(np.mean(values))


class Heuristic:
    """A zero-shot method: predictions for a task's examples from a `Scorer`.

    Subclasses implement `predict`; those that learn something from the
    training split (a threshold) implement `fit` and set `needs_training`.
    Predictions are what the task's metrics take: class indices into
    `task.labels`, or choice indices.

    A heuristic given to `kgpt.Task(zero_shot=...)` lives as long as the
    plugin's module and is shared by every evaluation, so `fit` never changes
    it: it returns a fitted copy.
    """

    needs_training = False
    description = ""

    def fit(self, scorer, task, examples):
        """The heuristic fitted to labelled training examples: a new object, or `self` if there is nothing to learn."""
        return self

    def predict(self, scorer, task, examples):
        raise NotImplementedError


class ThresholdedLogProb(Heuristic):
    """Average token log-probability of the text, above a threshold = `positive` (CoLA).

    The threshold maximises the task's headline metric on the training split,
    searched over `candidates` quantiles of the training scores; `fit` returns
    a copy that holds it (or give `threshold` to skip fitting).
    """

    needs_training = True
    description = "average token log-probability, thresholded (threshold fit on train)"

    def __init__(self, positive="1", candidates=512, threshold=None):
        self.positive = positive
        self.candidates = candidates
        self.threshold = threshold

    def scores(self, scorer, examples):
        texts = [" ".join(e.segments) for e in examples]
        return np.array([_mean(lp) for lp in scorer.log_probs([("", t) for t in texts], [e.source for e in examples])])

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
        fitted = copy.copy(self)
        fitted.threshold = self.choose_threshold(task, self.scores(scorer, examples), labels)
        return fitted

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
        sources = [e.source for e in examples for _ in labels]
        scores = np.array([float(np.sum(lp)) for lp in scorer.log_probs(pairs, sources)]).reshape(
            len(examples), len(labels)
        )
        return np.array([task.labels.index(labels[i]) for i in scores.argmax(axis=1)])


class AnswerLogProb(Heuristic):
    """The choice with the highest average token log-probability given the segments (RACE)."""

    description = "answer with the highest average token log-probability given document and question"

    def predict(self, scorer, task, examples):
        pairs = [(" ".join(e.segments), choice) for e in examples for choice in e.choices]
        scores = [_mean(lp) for lp in scorer.log_probs(pairs, _choice_sources(examples))]
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
        sources = [f"{e.source} (the text after the pronoun)".lstrip() for e in examples for _ in e.choices]
        scores = [_mean(lp) for lp in scorer.log_probs(pairs, sources)]
        return _argmax_per_example(examples, scores)


def _choice_sources(examples):
    return [f"{e.source} (choice {i})".lstrip() for e in examples for i in range(len(e.choices))]


def _argmax_per_example(examples, scores):
    predictions, offset = [], 0
    for e in examples:
        predictions.append(int(np.argmax(scores[offset : offset + len(e.choices)])))
        offset += len(e.choices)
    return np.array(predictions)
