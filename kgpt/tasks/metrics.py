"""The paper's task metrics (section 4.2), computed exactly over a whole split.

Each metric is `fn(labels, predictions) -> float` on NumPy arrays: class
indices for classification and multiple choice, floats for regression. F1 is
binary with class index 1 as the positive class (e.g. "paraphrase" in MRPC
and QQP). Tasks name metrics by these keys or pass their own callables.
"""

import numbers

import numpy as np

from kgpt.checks import shown
from kgpt.errors import MetricError, RegistryError


def accuracy(labels, predictions):
    """Share of exact matches."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    return float(np.mean(labels == predictions)) if labels.size else float("nan")


def f1(labels, predictions):
    """Binary F1 of the positive class (index 1); 0 when it is never predicted or present."""
    labels, predictions = np.asarray(labels) == 1, np.asarray(predictions) == 1
    tp = np.sum(labels & predictions)
    denominator = np.sum(labels) + np.sum(predictions)
    return float(2 * tp / denominator) if denominator else 0.0


def matthews(labels, predictions):
    """Matthews correlation (CoLA), multi-class form; 0 when undefined."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    classes = np.union1d(labels, predictions)
    confusion = np.zeros((len(classes), len(classes)))
    np.add.at(confusion, (np.searchsorted(classes, labels), np.searchsorted(classes, predictions)), 1)
    t, p, c, s = confusion.sum(1), confusion.sum(0), np.trace(confusion), confusion.sum()
    denominator = np.sqrt((s * s - p @ p) * (s * s - t @ t))
    return float((c * s - t @ p) / denominator) if denominator else 0.0


def pearson(labels, predictions):
    """Pearson correlation; NaN when either side is constant."""
    x, y = np.asarray(labels, "float64"), np.asarray(predictions, "float64")
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / denominator) if denominator else float("nan")


def _ranks(values):
    """Ranks from 1, ties given their average rank (as scipy.stats.rankdata)."""
    values = np.asarray(values, "float64")
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    first = np.r_[True, sorted_values[1:] != sorted_values[:-1]]
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values))
    ranks[order] = ((starts + ends + 1) / 2.0)[group]
    return ranks


def spearman(labels, predictions):
    """Spearman rank correlation (Pearson on tie-averaged ranks)."""
    return pearson(_ranks(labels), _ranks(predictions))


METRICS = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews": matthews,
    "pearson": pearson,
    "spearman": spearman,
}


def resolve(metric):
    """`(name, fn)` for a metric key or a callable (named by its `__name__`)."""
    if callable(metric):
        return getattr(metric, "__name__", "metric"), metric
    try:
        return metric, METRICS[metric]
    except (KeyError, TypeError):
        raise ValueError(f"Unknown metric {metric!r}. Built-in metrics: {', '.join(METRICS)}.") from None


def score(task, name, fn, labels, predictions):
    """`fn(labels, predictions)` as a float: a task's metric `name` must return a number (NaN allowed).

    Anything else (a string, an array, None), or an exception inside the
    metric, raises `RegistryError` naming the task, its plugin, the metric and
    what it returned or raised, in one line (`check` makes that call before
    any work).
    """
    try:
        value = fn(labels, predictions)
    except Exception as e:  # noqa: BLE001 - a plugin's code: named as the plugin's, the traceback kept as the cause
        raise MetricError(
            f"{_owner(task)}: its metric {name!r} raised {type(e).__name__}: {' '.join(str(e).split())[:200]} "
            f"(on {len(labels):,} labels; KGPT_TRACEBACK=1 shows where)."
        ) from e
    return _number(task, name, value)


def check(task, labels=None):
    """Scores each of `task`'s metrics on `labels`: one that returns no number, or that raises on every try,
    raises `score`'s `RegistryError` before a run spends any work on the task.

    `labels` are a run's training targets (every class a metric may want is
    there), scored against themselves and, if the metric raises on that,
    against themselves shifted by one (a metric undefined for a perfect
    prediction); by default four targets of the task's head (0, 1, 1, 0), on
    which a metric that raises (one wanting every class, say) is left to its
    first real call.
    """
    few = labels is None
    labels = np.asarray([0, 1, 1, 0] if few else labels, dtype=getattr(task.head, "target_dtype", None))
    for metric in task.metrics:
        name, fn = resolve(metric)
        try:
            score(task, name, fn, labels, labels.copy())
        except MetricError:
            if not few:
                score(task, name, fn, labels, np.roll(labels, 1))


def _owner(task):
    plugin = getattr(task, "plugin", "")
    return f"Task {getattr(task, 'name', task)!r}{f' of {plugin}' if plugin else ''}"


def _number(task, name, value):
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    got = (
        f"an array of shape {value.shape}"
        if isinstance(value, np.ndarray)
        else f"{type(value).__name__} {shown(value, 60)}"
    )
    raise RegistryError(
        f"{_owner(task)}: its metric {name!r} returned "
        f"{got}, not a number; a metric returns one float (kgpt.testing.check_task checks a task's metrics)."
    )


# What a model that learned nothing scores: a fine-tuning's warning and a zero-shot table compare with it.


def label_counts(task, values):
    """`{label name: count}` of class or choice indices, in index order."""
    found, counts = np.unique(np.asarray(values), return_counts=True)
    return {str(task.prediction_name(v.item())): int(c) for v, c in zip(found, counts)}


def baselines(task, targets):
    """What a model that learned nothing scores on `targets` (class or choice indices); None for values.

    `{"label_counts", "majority_label", "majority_share", "majority_scores",
    "chance"}`: the majority label is the split's most frequent one,
    `majority_scores` the task's metrics when it is predicted for every
    example, `chance` one over the number of classes (or choices).
    """
    names = task.head.output_names()
    targets = None if targets is None else np.asarray(targets)
    if (
        not names
        or targets is None
        or targets.ndim != 1
        or not targets.size
        or not np.issubdtype(targets.dtype, np.integer)
    ):
        return None
    values, counts = np.unique(targets, return_counts=True)
    majority = values[np.argmax(counts)]
    scores = {}
    for metric in task.metrics:
        name, fn = resolve(metric)
        try:
            scores[name] = score(task, name, fn, targets, np.full_like(targets, majority))
        except Exception:  # noqa: BLE001 - a plugin's metric may refuse one class; the run's own scores stand
            scores[name] = None
    return {
        "label_counts": label_counts(task, targets),
        "majority_label": task.prediction_name(majority.item()),
        "majority_share": float(counts.max() / targets.size),
        "majority_scores": scores,
        "chance": 1.0 / len(names),
    }
