"""Fine-tuning's evaluation and the files it writes: a task's metrics and predictions on each split.

`evaluate_split` scores a model on one encoded split (`kgpt-predict --data_dir`
uses it too); `evaluate_splits` scores every split a run read and writes
`predictions/SPLIT.tsv` (and, with `predict_test`, the benchmark's submission
files) into the output directory.
"""

import collections
import logging
import os

import numpy as np

from kgpt.io.storage import write_text
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
            metrics[name] = fn(split.targets, predictions)
    return Evaluation(predictions, task.head.probabilities(outputs), metrics)


def _format(value, digits=6):
    return f"{value:.{digits}g}" if isinstance(value, (float, np.floating)) else str(value)


def prediction_columns(head):
    """Column names after `id` and `prediction`: `p_<label>` per class or choice, none for one value."""
    return [f"p_{name}" for name in head.output_names()]


def prediction_rows(head, uids, predictions, probabilities, labels=None):
    """TSV rows: id, prediction (label name, choice or value), one probability per output name[, label]."""
    names = head.output_names()
    for i, (uid, value) in enumerate(zip(uids, predictions)):
        row = [str(uid), _format(head.prediction_name(value))]
        if names:
            row += [f"{p:.6f}" for p in np.asarray(probabilities[i]).reshape(-1)]
        if labels is not None:
            row.append(_format(head.prediction_name(labels[i])))
        yield "\t".join(row)


def predictions_tsv(task, split, evaluation):
    """The text of a predictions file: `id, prediction, p_<label>...[, label]`, one row per example."""
    labeled = split.targets is not None
    header = ["id", "prediction", *prediction_columns(task.head), *(["label"] if labeled else [])]
    rows = prediction_rows(task.head, split.uids, evaluation.predictions, evaluation.probabilities,
                           split.targets if labeled else None)
    return "\n".join(["\t".join(header), *rows]) + "\n"


def write_predictions(path, task, split, evaluation):
    """Writes `predictions_tsv` atomically; ids are relative to the data directory."""
    write_text(path, predictions_tsv(task, split, evaluation))


def write_submission(path, task, split, predictions):
    """A benchmark submission file: `index` TAB `prediction` (GLUE's format), written atomically."""
    lines = ["index\tprediction"] + [f"{uid}\t{task.prediction_name(v)}" for uid, v in zip(split.uids, predictions)]
    write_text(path, "\n".join(lines) + "\n")


def evaluate_splits(config, task, model, splits, batch_size):
    """Scores every split but the training one; writes predictions (and submissions) with an output dir."""
    results = {}
    for name, split in splits.items():
        if name == task.splits[0]:
            results[name] = {"examples": split.counts}
            continue
        evaluation = evaluate_split(task, model, split, batch_size)
        results[name] = {**evaluation.metrics, "examples": split.counts}
        if evaluation.metrics:
            logger.info(f"{name}: " + ", ".join(f"{k} {v:.4f}" for k, v in evaluation.metrics.items()))
        if config.output_dir and cluster.is_chief():
            write_predictions(os.path.join(config.output_dir, "predictions", f"{name}.tsv"), task, split, evaluation)
            if config.predict_test and name in (task.submissions or {}):
                path = os.path.join(config.output_dir, "submission", task.submissions[name])
                write_submission(path, task, split, evaluation.predictions)
                logger.info(f"{name}: submission file {path}")
    if config.predict_test and not task.submissions:
        logger.info(f"Task {task.name!r} defines no submission format; predictions/ holds every split's predictions.")
    return results


