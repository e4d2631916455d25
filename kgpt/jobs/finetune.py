"""Discriminative fine-tuning (paper section 3.2) of any registered task.

`finetune(config)` is what `kgpt-train --task NAME` runs; tests call it with
a tiny config. Data flow: `task.read(split, data_dir)` -> examples, streamed
through the `GPTTaskPreprocessor` (the task's input transformation) into real
tokens (`kgpt.data.batching.EncodedSplit`) -> length-bucketed batches ->
`GPTTaskModel.fit` on task loss + `lm_coef` x LM loss, the task's metrics on
dev after every epoch (a checkpoint after each, `kgpt.train.checkpoint`) -> the
task's metrics on every other split, a predictions file per split,
`metrics.json` and a preset that predicts on text
(`GPTTaskModel.from_preset`).

`--init` may also be a fine-tuned preset of the same task: its head is kept,
and `epochs=0` evaluates it without training; `"demo"` pre-trains the small
demo model on the embedded text first. `kgpt.jobs.run` is the skeleton the
job shares with pre-training.
"""

import collections
import dataclasses
import hashlib
import logging
import math
import os

import keras
import numpy as np

from kgpt.data import batching
from kgpt.models.task_preprocessor import MIN_MAX_LENGTH, GPTTaskPreprocessor
from kgpt.models.tokenizer import GPTTokenizer
from kgpt.errors import ConfigError, DataError
from kgpt.io.presets import read_json
from kgpt.models.pretrained import load_pretrained, with_special_tokens
from kgpt.jobs import pretrain as pretrain_lib
from kgpt.jobs import run
from kgpt.jobs.config import DEMO_PRETRAIN, FinetuneConfig, demo_pretrain_config  # noqa: F401 - re-exported
from kgpt.jobs.config import recorded_settings
from kgpt.io.storage import write_text
from kgpt.jobs.rundir import same_path
from kgpt.models import lora
from kgpt.models.backbone import GPTBackbone
from kgpt.models.task_model import GPTTaskModel, is_task_preset
from kgpt.tasks import metrics as metrics_lib
from kgpt.tasks.registry import TaskRegistry
from kgpt.train import callbacks as callbacks_lib
from kgpt.train import checkpoint as checkpoint_lib
from kgpt.parallel import cluster, distribute
from kgpt.models.optimizers import gpt_adamw

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 32


KEEP = ("last", "best")
SPECIAL_INITS = ("scratch", "demo")  # --init values that name no files


def encode_split(task, split, data_dir, preprocessor):
    """Reads and encodes a split through `preprocessor` into a `kgpt.data.batching.EncodedSplit` (real tokens only).

    Streams the task's reader; every row is counted (read, used, skipped by
    reason, truncated and tokens cut); a malformed row raises `DataError`
    naming its file and line. Example ids are made relative to `data_dir`
    (`dev.tsv:12`), so predictions files do not depend on where the data is.

    Example:
    ```python
    preprocessor = kgpt.GPTTaskPreprocessor(tokenizer, task.transform, max_length=512)
    split = kgpt.jobs.finetune.encode_split(task, "dev", "glue/RTE", preprocessor)
    ```
    """
    builder = batching.SplitBuilder(split, task.transform.num_views, preprocessor.max_length)
    tally = {}
    truncated = tokens_cut = used = 0
    for item in task.iter_examples(split, data_dir, tally):
        views, cut = preprocessor.encode(item.segments, item.choices)
        truncated += cut > 0
        tokens_cut += cut
        used += 1
        target = None if item.label is None else task.label_value(item)
        builder.add(views, target, uid=relative_id(item.uid or item.source, data_dir))
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
    return builder.build(counts, target_dtype=task.head.target_dtype)


def relative_id(uid, data_dir):
    """`uid` with a leading `data_dir` path taken off: `/data/RTE/dev.tsv:12` -> `dev.tsv:12`."""
    uid = str(uid)
    for prefix in {data_dir, os.path.abspath(data_dir), os.path.realpath(data_dir)}:
        prefix = os.path.join(prefix, "")
        if uid.startswith(prefix):
            return uid[len(prefix):]
    return uid


def transfer(pretrained, num_layers):
    """A fresh backbone of the same shape with the embeddings and first `num_layers` blocks copied.

    `num_layers=None` copies everything. The paper's Figure 2 (left) varies this.
    """
    if num_layers is None:
        return pretrained
    if not 0 <= num_layers <= pretrained.num_layers:
        raise ConfigError(f"transfer_layers must be in 0..{pretrained.num_layers}, got {num_layers}.")
    fresh = type(pretrained).from_config(pretrained.get_config())
    for src, dst in zip(pretrained.transferred_layers(num_layers), fresh.transferred_layers(num_layers)):
        dst.set_weights(src.get_weights())
    return fresh


# `initial`: what `initial_model` gave (before special tokens and `pretrained_weights`), for a baseline to reuse.
Start = collections.namedtuple("Start", "backbone tokenizer origin finetuned initial")


def initial_model(config):
    """`(backbone, tokenizer, description)` to fine-tune, from a pre-trained `config.init`."""
    if config.init == "scratch":
        tokenizer = GPTTokenizer.gpt1()
        backbone = GPTBackbone.from_sizes(config, tokenizer.vocabulary_size(), config.max_length or 512)
        return backbone, tokenizer, "random initialisation (no pre-training)"
    if config.init == "demo":
        return _demo_model(config)
    return load_pretrained(config.init, num_heads=config.num_heads, dtype=config.dtype)


def _demo_model(config):
    """`init="demo"`: the demo model pre-trained on the embedded text (kept in output_dir/pretrained, and reused)."""
    out = os.path.join(config.output_dir, "pretrained") if config.output_dir else None
    origin = "the demo model pre-trained on the embedded text"
    if out and os.path.exists(os.path.join(out, "metrics.json")):  # written last: the preset is complete
        logger.info(f"--init demo: using the demo model pre-trained in {out} by an earlier run of this command.")
        backbone, tokenizer, _ = load_pretrained(out, dtype=config.dtype)
        return backbone, tokenizer, origin
    logger.info("--init demo: pre-training the small demo model on the embedded text first "
                f"({', '.join(f'{k}={v}' for k, v in DEMO_PRETRAIN.items())}).")
    lm, tokenizer, _ = pretrain_lib.pretrain(demo_pretrain_config(output_dir=out, seed=config.seed))
    return lm.backbone, tokenizer, origin


def starting_point(config, task, initial=None):
    """What fine-tuning starts from: a `Start(backbone, tokenizer, origin, finetuned, initial)`.

    `finetuned` is the loaded `GPTTaskModel` when `config.init` is a
    fine-tuned preset of `task` (its head is kept), else None. `initial`, an
    earlier `Start.initial`, is used instead of loading (or, for `demo`,
    pre-training) `config.init` again.
    """
    if config.init not in SPECIAL_INITS and is_task_preset(config.init):
        model = _finetuned_init(config, task)
        action = "evaluating it without training" if config.epochs == 0 else f"training it {config.epochs} more epoch(s)"
        logger.info(f"--init {config.init} is fine-tuned for {task.name}: keeping its {model.head.kind} head, "
                    f"{action}.")
        return Start(model.backbone, model.preprocessor.tokenizer, f"the model fine-tuned in {config.init}", model,
                     None)
    if config.epochs == 0:
        raise ConfigError(f"epochs=0 evaluates a fine-tuned model, but --init {config.init} is not one: its {task.name} "
                         f"head would be untrained. Pass --init the --output_dir of a kgpt-train --task {task.name} run.")
    initial = initial or initial_model(config)
    backbone, tokenizer, origin = initial
    if not config.pretrained_weights:  # the "w/o pre-training" ablation: same model and vocabulary, nothing learned
        backbone = type(backbone).from_config(backbone.get_config())
        origin = f"fresh weights (no pre-training) in the shape and vocabulary of {origin}"
        logger.info("Pre-trained weights discarded: fine-tuning a freshly initialised model of the same shape.")
    backbone = with_special_tokens(transfer(backbone, config.transfer_layers), tokenizer, seed=config.seed)
    return Start(backbone, tokenizer, origin, None, initial)


def _finetuned_init(config, task):
    kwargs = {"dtype": config.dtype} if config.dtype else {}
    model = GPTTaskModel.from_preset(config.init, **kwargs)
    if model.task_name != task.name:
        source = _recorded_init(config.init)
        raise ConfigError(f"--init {config.init} is fine-tuned for task {model.task_name!r}, not {task.name!r}: pass "
                         f"--task {model.task_name} to evaluate or train it further, or --init the pre-trained model "
                         f"to fine-tune for {task.name!r}" + (f" (it was fine-tuned from {source})." if source else "."))
    if keras.saving.serialize_keras_object(model.head) != keras.saving.serialize_keras_object(task.head):
        raise ConfigError(f"--init {config.init}: its head ({model.head.get_config()}) differs from task "
                         f"{task.name!r}'s ({task.head.get_config()}); the task plugin changed since it was saved.")
    if config.transfer_layers is not None or not config.pretrained_weights:
        raise ConfigError(f"--transfer_layers and --nopretrained_weights start from a pre-trained model; --init "
                         f"{config.init} is fine-tuned.")
    return model


def _recorded_init(preset):
    path = os.path.join(preset, "metrics.json")
    try:
        return read_json(path, "").get("init_dir") if os.path.exists(path) else None
    except ValueError:
        return None


Finetuned = collections.namedtuple("Finetuned", "model tokenizer task")


def load_finetuned(preset, registry=None):
    """Reads a fine-tuned preset back: `Finetuned(model, tokenizer, task)`.

    The task is found by the name saved with the model, so its plugin must be
    installed; `registry` defaults to every installed plugin. To predict on
    text, `kgpt.GPTTaskModel.from_preset(preset)` needs no plugin.

    Example:
    ```python
    model, tokenizer, task = kgpt.load_finetuned("runs/rte")
    split = kgpt.jobs.finetune.encode_split(task, "dev", "glue/RTE", model.preprocessor)
    evaluation = kgpt.jobs.finetune.evaluate_split(task, model, split, batch_size=32)
    ```
    """
    model = GPTTaskModel.from_preset(preset)
    if not model.task_name:
        raise ValueError(f"{preset}/task.json names no task (task_name): it was not saved by kgpt fine-tuning.")
    task = (registry or TaskRegistry()).get(model.task_name)
    return Finetuned(model, model.preprocessor.tokenizer, task)


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


class TaskMetrics(keras.callbacks.Callback):
    """Scores the task's own metrics (F1, Matthews, Pearson, ...) on a split after every epoch.

    They join the epoch's logs as `val_<metric>`, so the progress line,
    `history.csv`, TensorBoard and `History` show them. List it before the
    loggers.
    """

    def __init__(self, task, split, batch_size):
        super().__init__()
        self.task, self.split, self.batch_size = task, split, batch_size

    def on_epoch_end(self, epoch, logs=None):
        scores = evaluate_split(self.task, self.model, self.split, self.batch_size).metrics
        if logs is not None:
            logs.update({f"val_{name}": value for name, value in scores.items()})


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


def _describe_counts(name, counts):
    text = f"{name}: {counts['read']:,} read, {counts['used']:,} used"
    if counts["skipped"]:
        text += f", {counts['skipped']:,} skipped (" + ", ".join(f"{r}: {n}" for r, n in counts["skipped_reasons"].items()) + ")"
    if counts["truncated"]:
        text += f", {counts['truncated']:,} truncated ({counts['tokens_cut']:,} tokens cut)"
    return text + "."


def run_settings(config):
    """What a fine-tuning run's outputs depend on (`run.json`, checkpoints): the config without its place."""
    # None of these changes the outputs.
    settings = recorded_settings(config, drop=("output_dir", "overwrite", "checkpoint_every", "scratch_baseline"))
    for key in ("data_dir", "init"):
        if settings[key] not in (None, *SPECIAL_INITS):
            settings[key] = os.path.abspath(settings[key])
    for key in ("train_file", "validation_file", "test_file"):
        if settings.get(key) is not None:
            settings[key] = os.path.abspath(os.path.join(config.data_dir or "", settings[key]))
    return settings


def check_config(config):
    """Raises `ConfigError` for settings that cannot run, before anything is built or read."""
    positive = {"batch_size": config.batch_size, "max_length": config.max_length}
    for name, value in positive.items():
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be positive, got {value}.")
    if config.max_length is not None and config.max_length < MIN_MAX_LENGTH:
        raise ConfigError(f"max_length must be >= {MIN_MAX_LENGTH} (the start, delimiter and extract tokens and one "
                          f"of text), got {config.max_length}.")
    if config.epochs < 0 or config.checkpoint_every < 0:
        raise ConfigError(f"epochs and checkpoint_every must be >= 0, got {config.epochs} and {config.checkpoint_every}.")
    run.check_run(config, config.batch_size or DEFAULT_BATCH_SIZE)
    if config.keep not in KEEP:
        raise ConfigError(f"keep must be one of {', '.join(KEEP)}, got {config.keep!r}.")
    for name in ("learning_rate", "weight_decay", "lm_coef", "warmup_fraction", "classifier_dropout"):
        value = getattr(config, name)
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a finite number >= 0, got {value}.")
    if config.init is None:
        raise ConfigError("init is required: a pre-trained preset directory, the original release or Hugging Face "
                          "files, a fine-tuned preset of the task, 'scratch' (no pre-training), or 'demo' (pre-train "
                          "the small demo model on the embedded text first).")
    if config.init not in SPECIAL_INITS and not os.path.exists(config.init):
        raise ConfigError(f"--init {config.init}: no such preset, release folder or file.")
    if config.scratch_baseline:
        why = ("--init scratch has no pre-training to compare" if config.init == "scratch" else
               "--nopretrained_weights is the baseline itself" if not config.pretrained_weights else
               "epochs=0 trains nothing" if config.epochs == 0 else
               f"--init {config.init} is already fine-tuned" if config.init not in SPECIAL_INITS
               and is_task_preset(config.init) else None)
        if why:
            raise ConfigError(f"scratch_baseline fine-tunes the same model from fresh weights beside a pre-trained "
                              f"one, but {why}.")
    if config.output_dir and config.init not in SPECIAL_INITS and same_path(config.output_dir, config.init):
        raise ConfigError(f"output_dir {config.output_dir} is the --init model: fine-tuning would overwrite it. Pass "
                         f"another --output_dir.")


def finetune(config, registry=None):
    """Fine-tunes on `config.task`; returns `(model, metrics)`.

    `registry` (a `kgpt.TaskRegistry`) finds the task; default: every installed plugin.
    """
    check_config(config)
    task = resolve_task(config, registry)
    run.join(config, "finetune", run_settings(config), config.batch_size or DEFAULT_BATCH_SIZE)
    with run.workspace(config, "finetune", run_settings(config), f"kgpt-{task.name}-") as work:
        with run.scope(config, config.batch_size or DEFAULT_BATCH_SIZE):
            data_dir = config.data_dir or files_dir(config) or run.for_all(
                config, lambda: _embedded_data(task, os.path.join(work, "data")), f"writing {task.name}'s embedded data")
            model, results, start = _finetune(config, task, data_dir)
        if runs_baseline(config) and start.finetuned is None:
            _baseline(config, task, data_dir, start, results)
        return model, results


def resolve_task(config, registry=None):
    """The task `config` fine-tunes on (on its files, with `train_file` and the like), checked against `config`."""
    task = with_files((registry or TaskRegistry()).get(config.task), config)
    if config.data_dir is None and config.train_file is None and task.default_data is None:
        raise ConfigError(f"Task {task.name!r} has no embedded data; pass --data_dir.")
    if config.keep == "best" and not any(s != task.splits[0] for s in task.splits):
        raise ConfigError(f"keep='best' picks the epoch by dev score, but task {task.name!r} has no split besides "
                          f"{task.splits[0]!r}.")
    return task


# Options of the tasks that read your own table files (`kgpt_tasks.generic`: docs/your-data.md).
FILE_OPTIONS = ("train_file", "validation_file", "test_file", "text_columns", "label_column", "choice_columns",
                "metrics")


def with_files(task, config):
    """`task` on the files and columns `config` names (`train_file`, ...), when it names any.

    Such a task has `with_files(**options)`; any other refuses them (it reads
    `data_dir` in its own format).
    """
    options = {k: getattr(config, k) for k in FILE_OPTIONS if getattr(config, k) not in (None, [], ())}
    if not options:
        return task
    if not hasattr(task, "with_files"):
        raise ConfigError(f"--{', --'.join(options)}: task {task.name!r} reads --data_dir in its own format; your "
                          f"own tables go with --task text-classification, text-regression or multiple-choice.")
    return task.with_files(data_dir=config.data_dir, **options)


def files_dir(config):
    """Without `data_dir`, the training file's folder: prediction ids are relative to it (`dev.csv:12`)."""
    return os.path.dirname(os.path.abspath(config.train_file)) if config.train_file else None


def runs_baseline(config):
    """Whether `config` also fine-tunes without pre-training: `scratch_baseline`, by default only for `init="demo"`."""
    if config.scratch_baseline is not None:
        return config.scratch_baseline
    return config.init == "demo" and config.pretrained_weights and config.epochs > 0


def _baseline(config, task, data_dir, start, results):
    """Fine-tunes the same model from fresh weights (in OUTPUT_DIR/no_pretraining) and logs both results."""
    output_dir = os.path.join(config.output_dir, "no_pretraining") if config.output_dir else None
    # With your own files, data_dir stays as given: their relative paths are under it.
    base = dataclasses.replace(config, pretrained_weights=False, scratch_baseline=False, output_dir=output_dir,
                               data_dir=config.data_dir if config.train_file else data_dir)
    logger.info(f"The same fine-tuning without pre-training (--scratch_baseline), for comparison"
                f"{f', in {output_dir}' if output_dir else ''}:")
    with run.workspace(base, "finetune", run_settings(base), f"kgpt-{task.name}-"):
        with run.scope(base, base.batch_size or DEFAULT_BATCH_SIZE):
            _, baseline, _ = _finetune(base, task, data_dir, initial=start.initial)
    logger.info(comparison(task, results, baseline))


def comparison(task, pretrained, baseline):
    """A table of each scored split's metrics with and without pre-training (`metrics.json` results)."""
    lines = [f"Pre-training's effect on {task.name}: the same fine-tuning from the pre-trained model and from "
             f"fresh weights.", f"  {'split':<8}{'metric':<12}{'pre-trained':>12}{'no pre-training':>17}"
             f"{'difference':>12}"]
    for split, scores in pretrained["splits"].items():
        for metric, value in scores.items():
            other = baseline["splits"].get(split, {}).get(metric)
            if metric == "examples" or not isinstance(value, (int, float)) or not isinstance(other, (int, float)):
                continue
            lines.append(f"  {split:<8}{metric:<12}{value:>12.4f}{other:>17.4f}{value - other:>+12.4f}")
    return "\n".join(lines)


def _embedded_data(task, target):
    data_dir = task.write_default_data(target)
    logger.info(f"No --data_dir: using the embedded {task.name} data written to {data_dir}.")
    return data_dir


def _read_splits(task, data_dir, preprocessor, train=True):
    """The task's splits, encoded; the training split (first) only when `train`."""
    train_split, *eval_names = task.splits
    splits = {train_split: encode_split(task, train_split, data_dir, preprocessor)} if train else {}
    for name in eval_names:
        try:
            splits[name] = encode_split(task, name, data_dir, preprocessor)
        except FileNotFoundError as e:
            logger.info(f"Split {name!r} not evaluated: {e}")
    for name, split in splits.items():
        logger.info(_describe_counts(name, split.counts))
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
        logger.warning(f"Warning: every one of the {len(targets):,} examples of task {task.name!r}'s training split "
                       f"{split!r} has the label {task.prediction_name(values[0].item())!r}: the model can only "
                       f"learn to predict it. Check the data (a filtered or sorted file?).")


def _batch_size(config, start):
    if config.batch_size is not None:
        return config.batch_size
    if start.finetuned is not None:
        saved = _recorded_batch_size(config.init)
        if saved:
            logger.info(f"Batch size {saved}, as {config.init} was fine-tuned with (so its scores are reproduced "
                        f"exactly).")
            return saved
    return DEFAULT_BATCH_SIZE


def _recorded_batch_size(preset):
    path = os.path.join(preset, "metrics.json")
    try:
        value = read_json(path, "").get("batch_size") if os.path.exists(path) else None
    except ValueError:
        return None
    return value if isinstance(value, int) and value > 0 else None


def _build_model(config, task, start, preprocessor):
    model = GPTTaskModel(start.backbone, head=task.head, num_views=task.transform.num_views, lm_coef=config.lm_coef,
                         classifier_dropout=config.classifier_dropout, task_name=task.name,
                         preprocessor=preprocessor, compile=False)
    if start.finetuned is not None:
        model.classifier.set_weights(start.finetuned.classifier.get_weights())
    if config.lora_rank is not None:
        _enable_lora(model, config.lora_rank)
    return model


def _enable_lora(model, rank):
    """`--lora_rank`: only the LoRA factors and the task head train."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ConfigError(f"lora_rank must be an integer >= 1 (or None: every weight trains), got {rank!r}.")
    if not isinstance(model.backbone, lora.LoraMixin):
        raise ConfigError(f"--lora_rank adapts attention layers; the {type(model.backbone).__name__} has none.")
    model.backbone.enable_lora(rank)
    logger.info(f"LoRA rank {rank} on the query and value projections: {lora.count_trainable(model):,} of "
                f"{model.count_params():,} weights train (the factors and the task head).")


def _finetune(config, task, data_dir, initial=None):
    """Fine-tunes from `config.init` (or `initial`, a `Start.initial`); returns `(model, results, start)`."""
    keras.utils.set_random_seed(config.seed)  # as run.scope did: the embedded data above drew no random numbers
    start = starting_point(config, task, initial)
    keras.utils.set_random_seed(config.seed)  # the head starts the same whether or not the demo model was trained
    limit = start.backbone.max_sequence_length
    default_length = start.finetuned.preprocessor.max_length if start.finetuned is not None else limit
    if config.max_length and config.max_length > limit:
        logger.warning(f"Warning: max_length {config.max_length} is longer than the model's context ({limit} tokens, "
                       f"{start.origin}): views are cut to {limit} tokens.")
    preprocessor = GPTTaskPreprocessor(start.tokenizer, task.transform,
                                       max_length=min(config.max_length or default_length, limit))
    splits = _read_splits(task, data_dir, preprocessor, train=config.epochs > 0)
    # Every process must read the same examples: each feeds its rows of the same batches.
    cluster.check_agreement({"data": {name: split_fingerprint(split) for name, split in splits.items()}},
                            hint=f"Every process must read the same data ({data_dir}).")
    batch_size = _batch_size(config, start)
    model = _build_model(config, task, start, preprocessor)
    results = {"task": task.name, "init": start.origin, "init_dir": run_settings(config)["init"],
               "lm_coef": config.lm_coef, "batch_size": batch_size, "keep": config.keep}
    if hasattr(task, "inputs"):  # the columns kgpt-predict reads by default
        results["inputs"] = task.inputs()
    if config.epochs > 0:
        results.update(_train(config, task, model, splits, batch_size, start.origin))
    else:
        model.compile(lm_loss_chunk_size=config.lm_loss_chunk_size or None)
    results["splits"] = _evaluate_splits(config, task, model, splits, batch_size)
    # GPTTaskModel.from_preset(output_dir) predicts on text again.
    run.save_outputs(model, config, results, "the preset (task.json, task.weights.h5, config.json, model.weights.h5, "
                     "preprocessor.json, tokenizer.json, assets/), predictions/, logs/, history.csv")
    return model, results, start


def _train(config, task, model, splits, batch_size, origin):
    """Compiles and fits `model` (resuming a checkpoint); returns the results it adds to metrics.json."""
    train_name = task.splits[0]
    train = splits[train_name]
    steps_per_epoch = math.ceil(len(train) / batch_size)
    total_steps = steps_per_epoch * config.epochs
    model.compile(
        optimizer=gpt_adamw(config.learning_rate, warmup_steps=math.ceil(config.warmup_fraction * total_steps),
                            total_steps=total_steps, decay="linear", weight_decay=config.weight_decay,
                            gradient_accumulation_steps=config.gradient_accumulation_steps),
        lm_loss_chunk_size=config.lm_loss_chunk_size or None,
    )
    dev_name = next((n for n, s in splits.items() if n != train_name and s.targets is not None), None)
    if config.keep == "best" and dev_name is None:
        raise ConfigError(f"keep='best' picks the epoch by dev score, but no labeled split besides {train_name!r} "
                         f"was found.")
    if config.keep == "best" and distribute.spread_over_processes(model):
        raise ConfigError("keep='best' keeps a copy of the best epoch's weights on process 0, which a model split "
                          "across processes does not fit in: use keep='last'.")
    plan = batching.length_plan(train.lengths, batch_size, config.seed, train.limit,
                                max_padded_lengths(model, train, batch_size, config.epochs), epochs=config.epochs)
    real_share = train.real_share(batching.batch_indices(train.lengths, batch_size, config.seed), plan)
    logger.info(f"Task {task.name} ({task.transform.kind}, {task.head.kind} head, metrics "
                f"{', '.join(task.metric_names)}); model from {origin}: {model.count_params():,} weights; "
                f"{config.epochs} epoch(s) of {steps_per_epoch} steps, batch {batch_size}, {train.num_views} view(s) "
                f"of up to {int(train.lengths.max())} tokens, lm_coef {config.lm_coef}.")
    logger.info(f"Batches by length: {real_share:.1%} of the positions computed in training are real tokens, in "
                f"{len(plan)} padded length(s){' (one XLA compilation each)' if model.jit_compile else ''}; padding "
                f"every example to the longest would give {train.padded_share():.1%}.")
    history, kept = Training(config, task, model, splits, train_name, dev_name, batch_size).fit()
    return {"kept_epoch": kept, "history": history,
            "real_token_share": {"train": real_share, "train_padded_lengths": list(plan),
                                 "train_padded_to_longest": train.padded_share()}}


def max_padded_lengths(model, split, batch_size, epochs):
    """The padded lengths `split` may use in a run of `epochs` (`kgpt.data.batching.max_lengths_for`)."""
    return batching.max_lengths_for(model.jit_compile, math.ceil(len(split) / batch_size), epochs)


def _evaluate_splits(config, task, model, splits, batch_size):
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


def split_fingerprint(split):
    """A hash of a split's tokens and targets: a checkpoint is refused when the training data changed."""
    digest = hashlib.sha256()
    for array in (split.tokens, split.offsets, split.targets):
        if array is not None:
            digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


class Training:
    """Runs `model.fit` for a fine-tuning config: resumable, with per-epoch history and `keep`.

    With an output directory, a checkpoint (`kgpt.train.checkpoint`) is written at
    every epoch end and every `checkpoint_every` steps, and a rerun of the
    same command resumes from it: same seed, same data order, same dropout
    masks, so it ends with the weights of an uninterrupted run.
    """

    def __init__(self, config, task, model, splits, train_name, dev_name, batch_size):
        self.config, self.task, self.model = config, task, model
        self.train, self.dev = splits[train_name], splits.get(dev_name)
        self.batch_size = batch_size
        self.settings = run_settings(config) | {"batch_size": batch_size,
                                                "train_data": split_fingerprint(self.train)}
        self.directory = run.checkpoint_dir(config)
        self.steps_per_epoch = math.ceil(len(self.train) / batch_size)
        self.metric = task.metric_names[0]

    def fit(self):
        """Trains (or resumes) to the end; returns `(history, kept_epoch)` (epochs counted from 1)."""
        progress = Progress(self, self._restore())
        if progress.step < self.config.epochs * self.steps_per_epoch:
            metrics = [TaskMetrics(self.task, self.dev, self.batch_size)] if self.dev is not None else []
            callbacks = run.callbacks(self.config, progress, f"Lower --learning_rate ({self.config.learning_rate:g}) "
                                      "or check the data", before=metrics,
                                      total_steps=self.config.epochs * self.steps_per_epoch,
                                      examples_per_step=self.batch_size)
            run.fit(self.model, self._calls(progress.step), callbacks, self._validation())
        return progress.history, progress.finish()

    def _restore(self):
        state = run.restore(self.model, self.config, self.settings)
        total = self.config.epochs * self.steps_per_epoch
        if state is not None and state["step"] >= total:
            logger.info(f"The checkpoint in {self.directory} is at the last step ({total:,}): this run finished "
                        f"training; evaluating it.")
        elif state is not None:
            epoch, done = divmod(state["step"], self.steps_per_epoch)
            logger.info(f"Resuming from the checkpoint at step {state['step']:,} (epoch {epoch + 1}, batch {done}) "
                        f"of {total:,} in {self.directory}.")
        return state

    def _calls(self, step):
        """`(dataset, initial_epoch, epochs, None)` fit calls: the rest of an interrupted epoch, then whole ones."""
        epochs = self.config.epochs
        max_lengths = max_padded_lengths(self.model, self.train, self.batch_size, epochs)
        pad_to, micro = distribute.batch_shards(), self.config.gradient_accumulation_steps
        for first, last, skip in run.segments(step, self.steps_per_epoch, self.config.epochs):
            def make(a, b, total, first=first, skip=skip):
                return batching.dataset(self.train, self.batch_size, seed=self.config.seed,
                                        lm=self.config.lm_coef > 0, first_epoch=first, max_lengths=max_lengths,
                                        skip=skip, shards=(a, b, total), pad_to=pad_to, micro_batches=micro,
                                        epochs=epochs)

            yield distribute.feed(make), first, last, None

    def _validation(self):
        if self.dev is None:
            return None
        epochs = self.config.epochs  # one evaluation per epoch
        max_lengths = max_padded_lengths(self.model, self.dev, self.batch_size, epochs)

        def make(a, b, total):
            return batching.dataset(self.dev, self.batch_size, lm=self.config.lm_coef > 0, max_lengths=max_lengths,
                                    shards=(a, b, total), pad_to=distribute.batch_shards(), epochs=epochs)

        return distribute.feed(make)


class Progress(callbacks_lib.Progress):
    """`kgpt.train.callbacks.Progress` for fine-tuning, which also tracks the best dev epoch for `keep="best"`."""

    keep = ("best",)

    def __init__(self, training, state=None):
        config = training.config
        super().__init__(training.directory, training.settings, training.steps_per_epoch, config.checkpoint_every,
                         os.path.join(config.output_dir, "history.csv") if config.output_dir else None, state,
                         accumulation=config.gradient_accumulation_steps)
        self.training = training
        self.best = (state or {}).get("best")  # {"epoch": from 1, "score": value} or None
        self._best_weights = None

    def extra_state(self):
        return {"best": self.best}

    def epoch_done(self, epoch, logs):
        if self.training.config.keep != "best":
            return
        score = logs.get(f"val_{self.training.metric}")
        if score is None or not math.isfinite(score):
            return
        if self.best is None or score > self.best["score"]:
            self.best = {"epoch": epoch, "score": score}
            self._best_weights = [np.array(v) for v in self.model.get_weights()]
            if self.directory:
                checkpoint_lib.save_weights(self.model, self.directory, "best")

    def finish(self):
        """Applies `keep`: loads the best epoch's weights when asked; returns the kept epoch (from 1)."""
        if self.training.config.keep != "best" or self.best is None:
            return len(self.epochs) or None
        model = self.training.model
        if len(self.epochs) != self.best["epoch"]:
            if self._best_weights is not None:
                model.set_weights(self._best_weights)
            else:  # resumed after the best epoch: its weights are on disk
                lora.load_weights(model, os.path.join(self.training.directory, "best", checkpoint_lib.WEIGHTS))
        metric = self.training.metric
        logger.info(f"Keeping epoch {self.best['epoch']} of {len(self.epochs)}: the best dev {metric} "
                    f"({self.best['score']:.4f}).")
        return self.best["epoch"]
