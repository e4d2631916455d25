"""Fine-tuning's data plan: a task's splits read through its plugin, encoded, counted and fingerprinted.

`encode_split` streams one split through a `GPTTaskPreprocessor` into real
tokens (`kgpt.data.batching.EncodedSplit`), counting every row;
`read_splits` reads the splits a run trains and scores on (each split's
`fingerprint` names its data).
"""

import logging
import os

import numpy as np

from kgpt.data import batching
from kgpt.errors import DataError, EmptyTextError

logger = logging.getLogger(__name__)


def encode_split(task, split, data_dir, preprocessor, rows=None):
    """Reads and encodes a split through `preprocessor` into a `kgpt.data.batching.EncodedSplit` (real tokens only).

    Streams the task's reader; every row is counted (read, used, skipped by
    reason, truncated and tokens cut); a malformed row raises `DataError`
    naming its file and line. Example ids are made relative to `data_dir`
    (`dev.tsv:12`), so predictions files do not depend on where the data is.
    `rows` stops after that many rows are read (`--dry_run` counts the start
    of a large split); None reads them all.

    Example:
    ```python
    preprocessor = kgpt.GPTTaskPreprocessor(tokenizer, task.transform, sequence_length=512)
    split = kgpt.jobs.finetune_data.encode_split(task, "dev", "glue/RTE", preprocessor)
    ```
    """
    builder = batching.SplitBuilder(split, task.transform.num_views, preprocessor.sequence_length)
    tally = {}
    truncated = tokens_cut = used = 0
    for item in task.iter_examples(split, data_dir, tally):
        try:
            views, cut = preprocessor.encode(item.segments, item.choices)
        except EmptyTextError:  # counted as the reader counts an empty text
            tally["skipped"]["text with no tokens"] += 1
            continue
        truncated += cut > 0
        tokens_cut += cut
        used += 1
        target = None if item.label is None else task.label_value(item)
        builder.add(views, target, uid=relative_id(item.uid or item.source, data_dir))
        if rows is not None and tally["read"] >= rows:
            break
    if not used:
        raise task.no_examples(split, data_dir, tally)
    counts = {
        "read": tally["read"],
        "used": used,
        "skipped": sum(tally["skipped"].values()),
        "skipped_reasons": dict(tally["skipped"]),
        "truncated": truncated,
        "tokens_cut": tokens_cut,
    }
    seen, repeated = set(), []
    for uid in builder.uids:
        if uid in seen:
            repeated.append(uid)
        seen.add(uid)
    if repeated:  # the predictions file names each row by its id
        plugin = getattr(task, "plugin", "")
        logger.warning(
            f"Warning: {split}: {len(repeated):,} example id(s) repeat an earlier one (first {repeated[0]!r}), as task "
            f"{task.name!r}{f' of {plugin}' if plugin else ''} gives them: its predictions file cannot tell those "
            f"rows apart."
        )
    return builder.build(counts, target_dtype=task.head.target_dtype)


def relative_id(uid, data_dir):
    """`uid` with a leading `data_dir` path taken off: `/data/RTE/dev.tsv:12` -> `dev.tsv:12`."""
    uid = str(uid)
    for prefix in {data_dir, os.path.abspath(data_dir), os.path.realpath(data_dir)}:
        prefix = os.path.join(prefix, "")
        if uid.startswith(prefix):
            return uid[len(prefix) :]
    return uid


def read_splits(task, data_dir, preprocessor, train=True):
    """The task's splits, encoded; the training split (first) only when `train`."""
    train_split, *eval_names = task.splits
    splits = {train_split: encode_split(task, train_split, data_dir, preprocessor)} if train else {}
    for name in eval_names:
        try:
            splits[name] = encode_split(task, name, data_dir, preprocessor)
        except FileNotFoundError as e:
            logger.info(f"Split {name!r} not evaluated: {e}")
    for name, split in splits.items():
        logger.info(describe_counts(name, split.counts))
    if not splits:
        raise DataError(f"Task {task.name!r}: no split besides {train_split!r} was found in {data_dir} to evaluate.")
    if train and splits[train_split].targets is None:
        raise DataError(f"Task {task.name!r}: the training split {train_split!r} has no labels.")
    if train:
        _warn_single_target(task, train_split, splits[train_split].targets)
    return splits


def _warn_single_target(task, split, targets):
    """Warns when every training example has one label: the model could only learn to predict it."""
    values = np.unique(np.asarray(targets))
    if len(values) == 1 and len(targets) > 1:
        logger.warning(
            f"Warning: every one of the {len(targets):,} examples of task {task.name!r}'s training split "
            f"{split!r} has the label {task.prediction_name(values[0].item())!r}: the model can only "
            f"learn to predict it. Check the data (a filtered or sorted file?)."
        )


def describe_counts(name, counts):
    """A split's row counts (`EncodedSplit.counts`) as one line: read, used, skipped by reason, truncated."""
    text = f"{name}: {counts['read']:,} read, {counts['used']:,} used"
    if counts["skipped"]:
        text += (
            f", {counts['skipped']:,} skipped ("
            + ", ".join(f"{r}: {n}" for r, n in counts["skipped_reasons"].items())
            + ")"
        )
    if counts["truncated"]:
        text += f", {counts['truncated']:,} truncated ({counts['tokens_cut']:,} tokens cut)"
    return text + "."
