"""Discriminative fine-tuning (paper section 3.2) of any registered task.

`finetune(config)` is what `kgpt-train --task NAME` runs; tests call it with
a tiny config. Data flow: `task.read(split, data_dir)` -> examples, streamed
through the `GPTTaskPreprocessor` (the task's input transformation) into real
tokens (`kgpt.jobs.finetune_data`) -> length-bucketed batches ->
`GPTTaskModel.fit` on task loss + `lm_coef` x LM loss, the task's metrics on
dev after every epoch (a checkpoint after each: `kgpt.jobs.finetune_training`)
-> the task's metrics on every other split, a predictions file per split
(`kgpt.jobs.finetune_outputs`), `metrics.json` and a preset that predicts on
text (`GPTTaskModel.from_preset`). A run that scores no better on dev than
always predicting its majority label, or predicts one label for all of it,
ends with a warning that says so (`finetune_outputs.learned_nothing`).

`--init` may also be a fine-tuned preset of the same task: its head is kept,
and `epochs=0` evaluates it without training; `"demo"` pre-trains the small
demo model on the embedded text first (`kgpt.jobs.finetune_model`).
`kgpt.jobs.run` is the skeleton the job shares with pre-training.
"""

import collections
import dataclasses
import logging
import os

from kgpt import checks
from kgpt.errors import ConfigError
from kgpt.io import hub, storage
from kgpt.jobs import run
from kgpt.jobs.config import (
    KEEP,
    SEEDS,
    check_integers,
    check_model_sizes,
    check_settings,
    recorded_settings,
    setting,
)
from kgpt.jobs.finetune_data import read_splits
from kgpt.jobs.finetune_model import (
    SPECIAL_INITS,
    build_model,
    recorded,
    starting_point,
    starting_sizes,
    with_local_init,
)
from kgpt.jobs.finetune_outputs import baseline_check, evaluate_splits, learned_nothing
from kgpt.jobs.finetune_training import train
from kgpt.jobs.rundir import check_inputs_outside
from kgpt.models.gpt.gpt_task_model import GPTTaskModel, is_task_preset
from kgpt.models.gpt.gpt_task_preprocessor import MIN_MAX_LENGTH, GPTTaskPreprocessor, cut_to_context, segment_columns
from kgpt.parallel import cluster
from kgpt.tasks.registry import TaskRegistry

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 32


Finetuned = collections.namedtuple("Finetuned", "model tokenizer task")


def load_finetuned(preset, registry=None):
    """Reads a fine-tuned preset back: `Finetuned(model, tokenizer, task)`.

    The task is found by the name saved with the model, so its plugin must be
    installed; `registry` defaults to every installed plugin. To predict on
    text, `kgpt.GPTTaskModel.from_preset(preset)` needs no plugin.

    Example:
    ```python
    model, tokenizer, task = kgpt.load_finetuned("runs/rte")
    split = kgpt.jobs.finetune_data.encode_split(task, "dev", "glue/RTE", model.preprocessor)
    evaluation = kgpt.jobs.finetune_outputs.evaluate_split(task, model, split, batch_size=32)
    ```
    """
    model = GPTTaskModel.from_preset(preset)
    if not model.task_name:
        raise ValueError(f"{preset}/task.json names no task (task_name): it was not saved by kgpt fine-tuning.")
    task = (registry or TaskRegistry()).get(model.task_name)
    return Finetuned(model, model.preprocessor.tokenizer, task)


def run_settings(config):
    """What a fine-tuning run's outputs depend on (`run.json`, checkpoints): the config without its place."""
    # None of these changes the outputs.
    settings = recorded_settings(config, drop=("output_dir", "overwrite", "checkpoint_every", "scratch_baseline"))
    sizes = starting_sizes(config.init, config.max_length)
    if sizes is not None:  # an unset --max_length as what it stands for: giving that value is the same run
        settings["max_length"] = view_length(config.max_length, *sizes)
    for key in ("data_dir", "init"):
        if settings[key] not in (None, *SPECIAL_INITS):
            settings[key] = os.path.abspath(settings[key])
    for key in ("train_file", "validation_file", "test_file"):
        if settings.get(key) is not None:
            settings[key] = os.path.abspath(os.path.join(config.data_dir or "", settings[key]))
    return settings


def check_config(config):
    """Raises `ConfigError` for settings that cannot run, before anything is built or read."""
    # max_length's minimum is no lower_bound: it is the preprocessor's, and config.py imports no Keras (--help).
    check_integers(config, "batch_size", "epochs", "lora_rank", max_length=MIN_MAX_LENGTH, seed=SEEDS)
    check_model_sizes(config, built=config.init == "scratch")  # the sizes of the model --init scratch builds
    run.check_run(config.run_part(), batch_size_of(config))
    setting(checks.one_of, config.keep, "keep", KEEP)
    check_settings(config, checks.nonnegative, "learning_rate", "weight_decay", "lm_coef")
    check_settings(config, checks.fraction, "warmup_fraction")
    check_settings(config, checks.positive, "initializer_range")
    setting(checks.rate, config.attention_dropout, "attention_dropout", allow_none=True)
    check_settings(config, checks.rate, "dropout", "classifier_dropout")
    for flag in ("data_dir", "train_file", "validation_file", "test_file"):
        storage.check_local(getattr(config, flag), f"--{flag}")
    if config.init is None:
        raise ConfigError(
            "init is required: a pre-trained preset directory, the original release or Hugging Face "
            "files, a fine-tuned preset of the task, 'scratch' (no pre-training), or 'demo' (pre-train "
            "the small demo model on the embedded text first)."
        )
    if config.init not in SPECIAL_INITS and not hub.is_hub(config.init):
        storage.check_local(config.init, "--init")
    if config.init not in SPECIAL_INITS and not hub.is_hub(config.init) and not os.path.exists(config.init):
        raise ConfigError(f"--init {config.init}: no such preset, release folder or file.")
    if config.scratch_baseline:
        why = (
            "--init scratch has no pre-training to compare"
            if config.init == "scratch"
            else "--nopretrained_weights is the baseline itself"
            if not config.pretrained_weights
            else "epochs=0 trains nothing"
            if config.epochs == 0
            else f"--init {config.init} is already fine-tuned"
            if config.init not in SPECIAL_INITS and is_task_preset(config.init)
            else None
        )
        if why:
            raise ConfigError(
                f"scratch_baseline fine-tunes the same model from fresh weights beside a pre-trained one, but {why}."
            )
    inputs = {"--data_dir": config.data_dir}
    for name in TABLE_FILES:  # read relative to --data_dir
        if getattr(config, name):
            inputs[f"--{name}"] = os.path.join(config.data_dir or "", getattr(config, name))
    if config.init not in SPECIAL_INITS:
        inputs["--init"] = config.init
    check_inputs_outside(config.output_dir, inputs, beside=("--data_dir",))


def finetune(config, registry=None):
    """Fine-tunes on `config.task`; returns `(model, metrics)`.

    `registry` (a `kgpt.TaskRegistry`) finds the task; default: every installed plugin.
    """
    check_config(config)
    task = resolve_task(config, registry)
    config = with_local_init(config)
    run_config, settings = config.run_part(), run_settings(config)
    with run.workspace(run_config, "finetune", settings, f"kgpt-{task.name}-", batch_size_of(config)) as work:
        with work.scope():
            data_dir = (
                config.data_dir
                or files_dir(config.train_file)
                or work.for_all(
                    lambda: _embedded_data(task, os.path.join(work.directory, "data")),
                    f"writing {task.name}'s embedded data",
                )
            )
            model, results, start = _finetune(config, work, task, data_dir)
        if runs_baseline(config) and start.finetuned is None:
            _baseline(config, work, task, data_dir, start, results)
    warning = learned_nothing(
        task, results.get("baseline_check"), config.init, config.epochs, config.learning_rate, config.pretrained_weights
    )
    if warning:  # last, so that it is what the run's log ends with
        logger.warning(warning)
    return model, results


def resolve_task(config, registry=None):
    """The task `config` fine-tunes on (on its files, with `train_file` and the like), checked against `config`."""
    task = with_files((registry or TaskRegistry()).get(config.task), config)
    if config.data_dir is None and config.train_file is None and task.default_data is None:
        raise ConfigError(f"Task {task.name!r} has no embedded data; pass --data_dir.")
    if config.keep == "best" and not any(s != task.splits[0] for s in task.splits):
        raise ConfigError(
            f"keep='best' picks the epoch by dev score, but task {task.name!r} has no split besides {task.splits[0]!r}."
        )
    return task


# Options of the tasks that read your own table files (`kgpt_tasks.generic`: docs/your-data.md).
TABLE_FILES = ("train_file", "validation_file", "test_file")
FILE_OPTIONS = (
    *TABLE_FILES,
    "text_columns",
    "label_column",
    "choice_columns",
    "metrics",
)


def with_files(task, config):
    """`task` on the files and columns `config` names (`train_file`, ...), when it names any.

    Such a task has `with_files(**options)`; any other refuses them (it reads
    `data_dir` in its own format).
    """
    options = {k: getattr(config, k) for k in FILE_OPTIONS if getattr(config, k) not in (None, [], ())}
    if not options:
        return task
    if not hasattr(task, "with_files"):
        raise ConfigError(
            f"--{', --'.join(options)}: task {task.name!r} reads --data_dir in its own format; your "
            f"own tables go with --task text-classification, text-regression or multiple-choice."
        )
    return task.with_files(data_dir=config.data_dir, **options)


def files_dir(train_file):
    """Without `data_dir`, the folder of `train_file` (None without one): prediction ids are relative to it
    (`dev.csv:12`)."""
    return os.path.dirname(os.path.abspath(train_file)) if train_file else None


def runs_baseline(config):
    """Whether `config` also fine-tunes without pre-training: `scratch_baseline`, by default only for `init="demo"`."""
    if config.scratch_baseline is not None:
        return config.scratch_baseline
    return config.init == "demo" and config.pretrained_weights and config.epochs > 0


def _baseline(config, work, task, data_dir, start, results):
    """Fine-tunes the same model from fresh weights (in the `Run`'s no_pretraining/) and logs both results."""
    output_dir = os.path.join(work.directory, "no_pretraining") if work.kept else None
    # With your own files, data_dir stays as given: their relative paths are under it.
    base = dataclasses.replace(
        config,
        pretrained_weights=False,
        scratch_baseline=False,
        output_dir=output_dir,
        data_dir=config.data_dir if config.train_file else data_dir,
    )
    with run.workspace(
        base.run_part(), "finetune", run_settings(base), f"kgpt-{task.name}-", batch_size_of(base), work
    ) as inner:
        logger.info(
            f"The same fine-tuning without pre-training (--scratch_baseline), for comparison"
            f"{f', in {inner.location}' if inner.kept else ''}:"
        )
        with inner.scope():
            _, baseline, _ = _finetune(base, inner, task, data_dir, initial=start.initial)
    logger.info(comparison(task, results, baseline))


def comparison(task, pretrained, baseline):
    """A table of each scored split's metrics with and without pre-training (`metrics.json` results)."""
    rows = [
        (split, metric, value, baseline["splits"].get(split, {}).get(metric))
        for split, scores in pretrained["splits"].items()
        for metric, value in scores.items()
    ]
    rows = [r for r in rows if r[1] != "examples" and all(isinstance(v, (int, float)) for v in r[2:])]
    # Columns as wide as their longest name, and a space between: a split called "validation" ran into its metric.
    split_width = max([len("split"), *(len(r[0]) for r in rows)]) + 2
    metric_width = max([len("metric"), *(len(r[1]) for r in rows)]) + 2
    lines = [
        f"Pre-training's effect on {task.name}: the same fine-tuning from the pre-trained model and from "
        f"fresh weights.",
        f"  {'split':<{split_width}}{'metric':<{metric_width}}{'pre-trained':>12}"
        f"{'no pre-training':>17}{'difference':>12}",
    ]
    for split, metric, value, other in rows:
        lines.append(
            f"  {split:<{split_width}}{metric:<{metric_width}}{value:>12.4f}{other:>17.4f}{value - other:>+12.4f}"
        )
    return "\n".join(lines)


def _embedded_data(task, target):
    """Writes the task's embedded data under `target` for a run without `data_dir`; returns its folder."""
    data_dir = task.write_default_data(target)
    logger.info(f"No --data_dir: using the embedded {task.name} data written to {data_dir}.")
    return data_dir


def batch_size_of(config):
    """The batch a run of `config` uses, from its files alone (the dry run reads the same): `batch_size`, else
    what a fine-tuned `init` was trained with (so its scores are reproduced exactly), else `DEFAULT_BATCH_SIZE`."""
    if config.batch_size is not None:
        return config.batch_size
    if config.init not in SPECIAL_INITS and is_task_preset(config.init):
        saved = recorded(config.init, "batch_size")
        if isinstance(saved, int) and not isinstance(saved, bool) and saved > 0:
            return saved
    return DEFAULT_BATCH_SIZE


def task_preprocessor(task, max_length, tokenizer, context, saved_length=None, origin="the model"):
    """The `GPTTaskPreprocessor` a run encodes with: views of `max_length` tokens, else a fine-tuned `--init`'s
    `saved_length`, else the model's `context`, and never more than `context` (`--dry_run` counts the rows it cuts
    with it too)."""
    if context < MIN_MAX_LENGTH:
        raise ConfigError(
            f"The model's context is {context} token(s); fine-tuning needs at least {MIN_MAX_LENGTH} (the start, "
            f"delimiter and extract tokens and one of text): start from a model pre-trained with --sequence_length "
            f"{MIN_MAX_LENGTH} or more."
        )
    typed = max_length or None
    max_length = cut_to_context(typed, context, origin)
    length, shortest = view_length(max_length, context, saved_length), task.transform.min_length
    if length < shortest:
        if typed is not None and typed == length:
            what = f"{checks.option('max_length')} {typed}"
        elif typed is not None:
            what = f"{checks.option('max_length')} {typed}, cut to the model's context of {context} tokens ({origin}),"
        elif saved_length is not None and saved_length == length:
            what = f"The length the fine-tuned model was trained with ({length} tokens, {origin})"
        else:
            what = f"The model's context of {context} tokens ({origin})"
        raise ConfigError(
            f"{what} leaves no room for text in each {task.transform.kind} view: its start, delimiter and extract "
            f"tokens and a token of each part take {shortest}."
        )
    columns = segment_columns(task.inputs()) if hasattr(task, "inputs") else None  # kept for kgpt-predict
    return GPTTaskPreprocessor(tokenizer, task.transform, sequence_length=length, columns=columns)


def view_length(max_length, context, saved_length=None):
    """The tokens per view a run encodes with: `max_length`, else a fine-tuned `--init`'s `saved_length`, else the
    model's `context`; never more than `context`."""
    return min(max_length or saved_length or context, context)


def _finetune(config, work, task, data_dir, initial=None):
    """Fine-tunes from `config.init` (or `initial`, a `Start.initial`: the baseline of a run) in the `Run` `work`;
    returns `(model, results, start)`."""
    run.seed_keras(config.seed)  # as work.scope did: the embedded data above drew no random numbers
    start = starting_point(config, task, initial, work)
    run.seed_keras(config.seed)  # the head starts the same whether or not the demo model was trained
    saved_length = start.finetuned.preprocessor.sequence_length if start.finetuned is not None else None
    preprocessor = task_preprocessor(
        task, config.max_length, start.tokenizer, start.backbone.max_sequence_length, saved_length, start.origin
    )
    splits = read_splits(task, data_dir, preprocessor, train=config.epochs > 0)
    # Every process must read the same examples: each feeds its rows of the same batches.
    cluster.check_agreement(
        {"data": {name: split.fingerprint for name, split in splits.items()}},
        hint=f"Every process must read the same data ({data_dir}).",
    )
    batch_size = batch_size_of(config)
    if config.batch_size is None and start.finetuned is not None and recorded(config.init, "batch_size") == batch_size:
        logger.info(
            f"Batch size {batch_size}, as {config.init} was fine-tuned with (so its scores are reproduced exactly)."
        )
    model = build_model(task, start, preprocessor, config.lm_coef, config.classifier_dropout, config.lora_rank)
    settings = run_settings(config)
    results = {
        "task": task.name,
        "init": start.origin,
        "init_dir": settings["init"],
        "lm_coef": config.lm_coef,
        "batch_size": batch_size,
        "keep": config.keep,
    }
    if hasattr(task, "inputs"):  # the columns kgpt-predict reads by default
        results["inputs"] = task.inputs()
    if config.epochs > 0:
        results.update(
            train(config, work, task, model, splits, batch_size, start.origin, settings, baseline=initial is not None)
        )
    else:
        model.compile(lm_loss_chunk_size=config.lm_loss_chunk_size or None)
    results["splits"] = evaluate_splits(
        task, model, splits, batch_size, work.directory if work.kept else None, config.predict_test
    )
    check = baseline_check(task, results["splits"])
    if check is not None:
        results["baseline_check"] = check
    # GPTTaskModel.from_preset(output_dir) predicts on text again.
    predicted = work.kept and os.path.isdir(os.path.join(work.directory, "predictions"))  # none without a split
    work.save_outputs(
        model,
        results,
        "the preset (task.json, task.weights.h5, config.json, model.weights.h5, "
        f"preprocessor.json, tokenizer.json, assets/), {'predictions/, ' if predicted else ''}logs/, history.csv",
    )
    return model, results, start
