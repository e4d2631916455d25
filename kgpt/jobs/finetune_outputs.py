"""Fine-tuning's evaluation and the files it writes: a task's metrics and predictions on each split.

`evaluate_split` scores a model on one encoded split (`kgpt-predict --data_dir`
uses it too); `evaluate_splits` scores every split a run read and writes
`predictions/SPLIT.tsv` (and, with `predict_test`, the benchmark's submission
files) into the output directory.
"""

import collections
import json
import logging
import os

import numpy as np

from kgpt.io.storage import read_text, write_text
from kgpt.parallel import cluster, distribute
from kgpt.tasks import metrics as metrics_lib

logger = logging.getLogger(__name__)


Evaluation = collections.namedtuple("Evaluation", "predictions probabilities metrics")


def evaluate_split(task, model, split, batch_size):
    """`Evaluation(predictions, probabilities, metrics)` of `model` on `split`, in split order.

    `probabilities` are what `model.predict` gives on text (probabilities or
    values); `metrics` are the task's, when the split is labeled.
    """
    outputs = distribute.predict_outputs(model.task_predictor(), split, batch_size)
    predictions = task.head.decode(outputs)
    metrics = {}
    if split.targets is not None:
        for metric in task.metrics:
            name, fn = metrics_lib.resolve(metric)
            metrics[name] = metrics_lib.score(task, name, fn, split.targets, predictions)
    return Evaluation(predictions, task.head.probabilities(outputs), metrics)


def prediction_columns(head):
    """Column names after `id` and `prediction`: `p_<label>` per class or choice, none for one value."""
    return [f"p_{name}" for name in head.output_names()]


def prediction_rows(head, uids, predictions, probabilities, labels=None):
    """TSV rows: id, prediction (label name, choice or value), one probability per output name[, label]."""
    names = head.output_names()
    # str: a value's shortest text in its own precision (a float32 1234.567 is '1234.567'; 6 digits cut it).
    for i, (uid, value) in enumerate(zip(uids, predictions)):
        row = [str(uid), str(head.prediction_name(value))]
        if names:
            row += [f"{p:.6f}" for p in np.asarray(probabilities[i]).reshape(-1)]
        if labels is not None:
            row.append(str(head.prediction_name(labels[i])))
        yield "\t".join(row)


def predictions_tsv(task, split, evaluation):
    """The text of a predictions file: `id, prediction, p_<label>...[, label]`, one row per example."""
    labeled = split.targets is not None
    header = ["id", "prediction", *prediction_columns(task.head), *(["label"] if labeled else [])]
    rows = prediction_rows(
        task.head, split.uids, evaluation.predictions, evaluation.probabilities, split.targets if labeled else None
    )
    return "\n".join(["\t".join(header), *rows]) + "\n"


def write_predictions(path, task, split, evaluation):
    """Writes `predictions_tsv` atomically; ids are relative to the data directory."""
    write_text(path, predictions_tsv(task, split, evaluation))


def write_submission(path, task, split, predictions):
    """A benchmark submission file: `index` TAB `prediction` (GLUE's format), written atomically."""
    lines = ["index\tprediction"] + [f"{uid}\t{task.prediction_name(v)}" for uid, v in zip(split.uids, predictions)]
    write_text(path, "\n".join(lines) + "\n")


def evaluate_splits(task, model, splits, batch_size, directory=None, predict_test=False):
    """Scores every split but the training one; writes predictions (and, with `predict_test`, submissions) into
    `directory` (process 0), when there is one.

    A labeled split of a task that picks a label or a choice also gets its
    `baselines`, and a scored one its `prediction_counts`.
    """
    results, before = {}, _scored_before(directory)
    for name, split in splits.items():
        found = metrics_lib.baselines(task, split.targets)
        data = split.fingerprint
        if name == task.splits[0]:
            results[name] = {"examples": split.counts, "data": data, **({"baselines": found} if found else {})}
            continue
        evaluation = evaluate_split(task, model, split, batch_size)
        results[name] = {**evaluation.metrics, "examples": split.counts, "data": data}
        earlier = before.get(name) if isinstance(before.get(name), dict) else {}
        if earlier.get("data") not in (None, data):
            # The same command re-evaluates a finished run: a score of other examples would pass for the old one.
            scores = ", ".join(f"{k} {earlier[k]:.4f}" for k in evaluation.metrics if isinstance(earlier.get(k), float))
            logger.warning(
                f"Warning: the {name} examples differ from those this run scored before (metrics.json"
                f"{f': {scores}' if scores else ''}): the file changed; its scores below are of the data as it is now."
            )
        if found:
            results[name]["baselines"] = found
        predicted = np.asarray(evaluation.predictions)
        if task.head.output_names() and predicted.ndim == 1 and np.issubdtype(predicted.dtype, np.integer):
            results[name]["prediction_counts"] = metrics_lib.label_counts(task, predicted)
        if evaluation.metrics:
            logger.info(f"{name}: " + ", ".join(f"{k} {v:.4f}" for k, v in evaluation.metrics.items()))
            undefined = undefined_scores(task, name, split, evaluation)
            if undefined:
                logger.warning(undefined)
        if directory and cluster.is_chief():
            write_predictions(os.path.join(directory, "predictions", f"{name}.tsv"), task, split, evaluation)
            if predict_test and name in (task.submissions or {}):
                path = os.path.join(directory, "submission", task.submissions[name])
                write_submission(path, task, split, evaluation.predictions)
                logger.info(f"{name}: submission file {path}")
    if predict_test and not task.submissions:
        logger.info(f"Task {task.name!r} defines no submission format; predictions/ holds every split's predictions.")
    return results


def _scored_before(directory):
    """The `splits` of the `metrics.json` an earlier run of the same command wrote in `directory`; {} without one."""
    path = os.path.join(directory, "metrics.json") if directory else None
    if not path or not os.path.exists(path):
        return {}
    try:
        splits = json.loads(read_text(path)).get("splits")
    except (OSError, ValueError, AttributeError):  # unreadable: it is replaced at the end as it is
        return {}
    return splits if isinstance(splits, dict) else {}


# The metrics that are NaN exactly when the labels or the predictions are one value.
CORRELATIONS = {"pearson", "spearman"}


def undefined_scores(task, name, split, evaluation):
    """The warning for split `name`'s metrics that are NaN (`metrics.json` holds them as null), with why; else None.

    A correlation is undefined when the labels or the predictions are one
    value: a split that cannot show learning, or a model that learned nothing.
    """
    undefined = [k for k, v in evaluation.metrics.items() if isinstance(v, float) and np.isnan(v)]
    if not undefined:
        return None
    text = f"Warning: {', '.join(undefined)} on {name} is undefined (NaN; null in metrics.json)"
    if not set(undefined) <= CORRELATIONS:  # a plugin's metric: why it gave NaN is its own
        return text + "."
    for values, what in ((split.targets, "labels"), (evaluation.predictions, "predictions")):
        values = np.asarray(values) if values is not None else None
        if values is not None and values.size and values.ndim == 1 and (values == values.flat[0]).all():
            shown = task.prediction_name(values.flat[0].item())
            why = "its score cannot show learning" if what == "labels" else "the model learned nothing measurable"
            return f"{text}: every one of its {values.size} {what} is {shown}, so {why}."
    return text + "."


# The warning a run ends with when it did no better than what learns nothing (`kgpt.tasks.metrics.baselines`).


def baseline_check(task, results):
    """How the first scored labeled split's score compares with its majority baseline (`metrics.json`), or None.

    The score is accuracy when the task has it (the majority share is its
    baseline), else the task's first metric beside that metric of always
    predicting the majority label. `learned` is False when the score is at or
    below that baseline or one label was predicted for every example.
    """
    split = next(
        (n for n in task.splits[1:] if "baselines" in results.get(n, {}) and "prediction_counts" in results[n]), None
    )
    if split is None:
        return None
    scores, found = results[split], results[split]["baselines"]
    metric = "accuracy" if "accuracy" in scores else task.metric_names[0]
    majority = found["majority_scores"].get(metric)
    score = scores.get(metric)
    predicted = scores["prediction_counts"]
    one_label = next(iter(predicted)) if len(predicted) == 1 and sum(predicted.values()) > 1 else None
    below = isinstance(score, float) and isinstance(majority, float) and score <= majority + 1e-9
    return {
        "split": split,
        "metric": metric,
        "score": score,
        "majority": majority,
        "majority_label": found["majority_label"],
        "majority_share": found["majority_share"],
        "chance": found["chance"],
        "one_label_predicted": one_label,
        "learned": not (below or one_label),
    }


def _label(task, name):
    return f"choice {name}" if task.head.kind == "multiple_choice" else repr(str(name))


def _number(value):
    return f"{value:.4f}" if isinstance(value, float) else "none"


def learned_nothing(task, check, init, epochs, learning_rate, pretrained_weights=True):
    """The lines a run ends with when `check` (`baseline_check`) says it learned nothing measurable; else None.

    They give the score beside its majority-class and chance baselines, and
    what to try: the learning rate, the epochs, a pre-trained start (from the
    run's `init`, `epochs`, `learning_rate` and `pretrained_weights`).
    """
    if check is None or check["learned"]:
        return None
    split = check["split"]
    text = (
        f"Warning: this fine-tuning learned nothing measurable. On {split}: {check['metric']} "
        f"{_number(check['score'])}, the majority-class baseline {_number(check['majority'])} (always predicting "
        f"{_label(task, check['majority_label'])}, {check['majority_share']:.1%} of {split}), chance "
        f"{check['chance']:.4f}"
    )
    if check["one_label_predicted"] is not None:
        text += f"; the model predicts {_label(task, check['one_label_predicted'])} for every example"
    if check["majority_share"] == 1.0:
        text += f"; {split} holds one label only, so its score cannot show learning"
    rate = learning_rate  # short: it is written three times below
    if epochs == 0:
        tries = [f"--init {init} was evaluated without training (--epochs 0): fine-tune it (--epochs N)"]
    else:
        tries = [
            "--learning_rate is 0, so no weight changed: give one, such as 6.25e-05"
            if rate == 0
            else f"another --learning_rate (this run {rate:g}: try {rate * 3:.3g} or {rate / 3:.3g})",
            f"more --epochs (this run {epochs})",
            "a pre-trained start instead of fresh weights: --init PRESET (the --output_dir of kgpt-train --task lm)"
            if init == "scratch" or not pretrained_weights
            else f"a larger pre-trained model than --init {init} (the --output_dir of kgpt-train --task lm)",
        ]
    return f"{text}.\n  To try: {'; '.join(tries)}; and check that the labels follow from the texts."
