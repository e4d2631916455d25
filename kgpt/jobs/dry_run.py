"""`--dry_run`: what a command would do, checked in seconds without training or writing anything.

Each function takes the settings the real job takes, runs the same checks
the job runs before it starts (so a mistake is the same one-line error),
then reads what the job would read only as far as it takes to know it can:

- the flags and settings (`check_config` of the job),
- the data: every corpus file found and the start of each (UTF-8), the
  first `ROWS` rows of each task split through the task's plugin (rows read,
  used, skipped by reason, labels in the task's label set); a fine-tuning
  run's first `TOKENIZED_ROWS` rows of each split go through its own
  tokenizer and truncation (`encode_split`): the rows it would cut, each
  split's label counts and majority share,
- the starting model (`--init`, `--model`, `--lstm_init`): its files checked
  by the loader's own readers (a preset's and the original release's
  weights by their headers), never the model built,
- the tokenizer, the output directory (new, resumed, or refused as the run
  would refuse it), the model's size and the steps the run would take.

It prints what it found through the "kgpt" logger and returns it as a list
of `(what, finding)` pairs. Nothing is trained, no shard is built and no
file is written: a task's embedded data is written to a temporary folder
that is deleted at once.
"""

import contextlib
import dataclasses
import logging
import os
import tempfile

import numpy as np

from kgpt.analysis import zero_shot as zero_shot_lib
from kgpt.data.text import text_chunks
from kgpt.errors import CheckpointError, ConfigError
from kgpt.io import hub, storage
from kgpt.io.presets import MODEL_WEIGHTS_FILE, check_backbone_preset, check_task_preset, file_shapes, read_json
from kgpt.io.run_folder import CHECKPOINTS
from kgpt.jobs import experiments
from kgpt.jobs import finetune as finetune_lib
from kgpt.jobs import pretrain as pretrain_lib
from kgpt.jobs.config import DEMO_PRETRAIN
from kgpt.jobs.finetune_data import encode_split
from kgpt.jobs.finetune_model import (
    check_finetuned_init,
    check_lora_rank,
    check_transfer_layers,
    recorded_task,
    starting_tokenizer,
    untrained_head,
)
from kgpt.jobs.finetune_training import check_keep, dev_split, updates
from kgpt.jobs.rundir import OUTPUTS, RunDirectory
from kgpt.models import pretrained as pretrained_lib
from kgpt.models.converters import original
from kgpt.models.gpt.gpt_backbone import GPT1_CONFIG, NUM_SPECIAL_TOKENS
from kgpt.models.gpt.gpt_task_model import is_task_preset
from kgpt.parallel import placement
from kgpt.parallel.distribute import check_placement
from kgpt.tasks import metrics as metrics_lib
from kgpt.tasks.registry import TaskRegistry
from kgpt.train import checkpoint as checkpoint_lib

logger = logging.getLogger(__name__)

ROWS = 1000  # rows read from each split: enough to meet a format's mistakes, few enough to take a second
TOKENIZED_ROWS = 10_000  # rows tokenized from each fine-tuning split: all of most tasks' splits, in seconds


class Plan:
    """The findings of a dry run, printed as they come: `(what, finding)` pairs."""

    def __init__(self, command):
        self.command, self.items = command, []
        logger.info(f"{command} --dry_run: checking, without training or writing anything.")

    def add(self, what, finding):
        self.items.append((what, finding))
        logger.info(f"  {what + ':':<14} {finding}")

    def done(self):
        logger.info(f"{self.command} --dry_run: no problem found; the same command without --dry_run runs this.")
        return self.items


def settings(config):
    """The config's settings that are not the paper's defaults (`name=value, ...`)."""
    changed = [
        f"{f.name}={getattr(config, f.name)}"
        for f in dataclasses.fields(config)
        if getattr(config, f.name) != f.default and f.name not in ("output_dir", "corpus", "data_dir", "init")
    ]
    return ", ".join(changed) or "the paper's defaults"


def output_dir(path, job, settings, overwrite=False):
    """What a run claiming `path` for `job` would find there; raises what `RunDirectory` would raise."""
    if not path:
        return "none: nothing is kept (pass --output_dir to keep the model)"
    storage.check_path(path, "--output_dir")  # the run's own checks (RunDirectory makes them too)
    if storage.is_remote(path):  # reached within a bounded time, read but never written
        there = storage.check_folder(path, create=False)
        return (
            f"{path} (remote, {'exists' if there else 'new'}: the run works in a local copy of its kgpt outputs "
            f"and copies them back after every checkpoint and save)"
        )
    if not os.path.isdir(path):
        return f"{path} (new)"
    claim = RunDirectory(path, job, settings, overwrite=overwrite)
    claim.check_free()
    action, foreign = claim.inspect()  # raises what the run's claim would raise
    if action == "same":
        found = (
            checkpoint_lib.latest(os.path.join(path, CHECKPOINTS))
            if os.path.isdir(os.path.join(path, CHECKPOINTS))
            else None
        )
        step = f"resumes from its checkpoint at step {found[1]['step']:,}" if found else "starts again (no checkpoint)"
        return f"{path}: the same run as before, which {step}"
    if action == "new":
        return f"{path} (empty)"
    replaced = sorted(n for n in foreign if n in OUTPUTS)
    return f"{path}: --overwrite replaces kgpt's outputs there ({', '.join(replaced) or 'none yet'}); other files stay"


def processes(config, batch_size):
    """How many processes the run's flags or environment describe (they are not joined), and on one process how
    its batches split over this machine's devices, checked as the run checks it."""
    found = placement.resolve(config.coordinator_address, config.num_processes, config.process_id)
    if found.coordinator == "auto":
        return "found by jax.distributed at start-up (--coordinator_address auto)"
    if found.several:  # the other processes' devices are known once they join
        return f"{found.num_processes} (this one is process {found.process_id}; coordinator {found.coordinator})"
    steps = config.gradient_accumulation_steps
    shards = check_placement(config.distribution, batch_size // steps, config.model_devices, steps)
    if config.distribution == "model_parallel":
        return f"1, each model split over {config.model_devices} device(s), each batch over {shards} such groups"
    return "1" if shards == 1 else f"1, each batch split over {shards} devices"


# Pre-training.


def pretrain(config):
    """Checks a `PretrainConfig` as `kgpt-train --task lm` would run it; returns the findings."""
    plan = Plan("kgpt-train --task lm")
    pretrain_lib.check_config(config)
    registry = TaskRegistry()
    if config.zero_shot:  # the run's check, before its corpus is read
        zero_shot_lib.check_tasks(config.zero_shot, registry)
    plan.add("settings", settings(config))
    plan.add("processes", processes(config, config.batch_size))
    plan.add("output", output_dir(config.output_dir, "pretrain", pretrain_lib.run_settings(config), config.overwrite))
    if config.corpus:
        plan.add("corpus", corpus(config.corpus))
    else:
        plan.add("corpus", "the embedded demo text (kgpt.data.demo_world: 3,000 paragraphs, about 172,000 tokens)")
    vocabulary, loaded = tokenizer(config, plan)
    if loaded is not None:  # the run's check, made once its tokenizer is there
        pretrain_lib.check_prompt(config.prompt, config.sample_tokens, config.sequence_length, loaded)
    plan.add("shards", shards(config))
    if config.architecture == "lstm":
        plan.add(
            "model",
            f"LSTM, {config.num_layers} layer(s) of {config.lstm_units} units, context {config.sequence_length}",
        )
    else:
        count = vocabulary and original.weight_count(
            vocabulary, config.sequence_length, config.hidden_dim, config.intermediate_dim, config.num_layers
        )
        size = f"{count:,} weights" if count else "its weights counted once the vocabulary is learned"
        plan.add(
            "model",
            f"{config.num_layers} x {config.hidden_dim}, {config.num_heads} heads, inner "
            f"{config.intermediate_dim}, context {config.sequence_length}: {size}",
        )
    tokens = config.max_steps * config.batch_size * config.sequence_length
    plan.add(
        "training",
        f"{config.max_steps:,} steps of {config.batch_size} x {config.sequence_length} tokens "
        f"({tokens:,} tokens), peak rate {config.learning_rate:g} after {config.warmup_steps:,} "
        f"warm-up steps, {config.evaluations} validation passes, checkpoint every "
        f"{config.checkpoint_every or 'never'}",
    )
    for name, data_dir in (config.zero_shot or {}).items():
        task = registry.get(name)
        plan.add(
            f"zero-shot {name}",
            task_data(task, data_dir, required=[s for s in zero_shot_lib.splits_read(task) if s]),
        )
    return plan.done()


def corpus(pattern):
    """The corpus files `pattern` names, the start of each decoded as the job decodes it."""
    files = pretrain_lib.corpus_files(pattern)
    sizes = [os.path.getsize(f) for f in files]
    for path in files:
        next(iter(text_chunks(path)), None)  # a file that is not UTF-8 fails here as in the job, naming the byte
    empty = sum(1 for s in sizes if s == 0)
    if empty == len(files):
        raise ConfigError(f"Every file matching {pattern!r} is empty.")
    return (
        f"{len(files):,} file(s) ({sum(sizes):,} bytes)"
        + (f", {empty} empty (skipped)" if empty else "")
        + "; the start of each is UTF-8"
    )


def tokenizer(config, plan):
    """Describes the run's tokenizer; returns `(vocabulary size with special tokens, tokenizer)`, where the
    tokenizer is None before it is learned (and the size too), or when the GPT-1 one is not needed (no --prompt)."""
    from kgpt.models.gpt.gpt_tokenizer import GPTTokenizer, read_tokenizer
    from kgpt.tokenizers.interface import PRESET_CONFIG

    if config.tokenizer is None:
        size = GPT1_CONFIG["vocabulary_size"] + NUM_SPECIAL_TOKENS
        plan.add("tokenizer", f"the original GPT-1 vocabulary ({size:,} tokens with the special ones)")
        return size, GPTTokenizer.gpt1() if config.prompt else None
    if config.tokenizer != "train":
        loaded = read_tokenizer(config.tokenizer, flag="--tokenizer")
        plan.add("tokenizer", f"{config.tokenizer} ({loaded.vocabulary_size():,} tokens)")
        return loaded.vocabulary_size(), loaded
    if config.output_dir and os.path.isfile(os.path.join(config.output_dir, PRESET_CONFIG)):
        loaded = GPTTokenizer.from_preset(config.output_dir)
        plan.add("tokenizer", f"the one learned earlier in {config.output_dir} ({loaded.vocabulary_size():,} tokens)")
        return loaded.vocabulary_size(), loaded
    plan.add(
        "tokenizer",
        f"learned from the corpus first ({config.num_merges:,} merges)"
        + ("; --prompt is measured against --sequence_length once it is" if config.prompt else ""),
    )
    return None, None


def shards(config):
    where = config.shards_dir or (os.path.join(config.output_dir, "shards") if config.output_dir else None)
    if where is None:
        return "built in a temporary folder, deleted at exit"
    if os.path.isfile(os.path.join(where, "index.json")):
        return f"{where}: reused if built from the same files and tokenizer, else rebuilt"
    return f"built in {where}"


# Fine-tuning.


def finetune(config, registry=None):
    """Checks a `FinetuneConfig` as `kgpt-train --task NAME` would run it; returns the findings."""
    plan = Plan(f"kgpt-train --task {config.task}")
    finetune_lib.check_config(config)
    task = finetune_lib.resolve_task(config, registry)
    plan.add(
        "task",
        f"{task.name} ({task.transform.kind} input, {task.head.kind} head"
        + (f", labels {', '.join(task.labels)}" if task.labels else "")
        + ")",
    )
    plan.add("settings", settings(config))
    plan.add("processes", processes(config, finetune_lib.batch_size_of(config)))
    described = None
    if hub.is_hub(config.init):  # the configs and tokenizer files only: no weights are downloaded
        described, folder = hub.check(config.init)
        config = dataclasses.replace(config, init=folder)  # as the run records it, reading the same configs
    plan.add("output", output_dir(config.output_dir, "finetune", finetune_lib.run_settings(config), config.overwrite))
    plan.add("init", described or init(config, task))
    splits = task.splits if config.epochs > 0 else task.splits[1:]
    data_dir = config.data_dir or finetune_lib.files_dir(config.train_file)
    start = starting_tokenizer(
        config.init, config.output_dir, config.max_length
    )  # the run's tokenizer and view length, so the rows it cuts are counted
    preprocessor = finetune_lib.task_preprocessor(task, config.max_length, *start) if start else None
    encoded, labeled = {}, set()
    plan.add(
        "data",
        task_data(
            task,
            data_dir,
            splits,
            required=task.splits[0] if config.epochs else None,
            rows=TOKENIZED_ROWS if start else ROWS,
            preprocessor=preprocessor,
            encoded=encoded,
            labeled=labeled,
        ),
    )
    if config.epochs:
        check_keep(config.keep, dev_split([s for s in splits if s in labeled], task.splits[0]), task.splits[0])
    if preprocessor is None:
        plan.add(
            "tokens",
            "not counted: --init demo learns its tokenizer when it pre-trains the demo model (kept "
            "in OUTPUT_DIR/pretrained, where a later dry run finds it)",
        )
    else:
        plan.add("tokens", tokens(encoded, preprocessor.sequence_length, start[1]))
        plan.add("labels", labels(task, encoded))
        train = encoded.get(task.splits[0])
        if train is not None and train.targets is not None:  # the run's own check, on the rows read here
            metrics_lib.check(task, train.targets)
    batch = finetune_lib.batch_size_of(config)
    train, count = encoded.get(task.splits[0]), ""
    if config.epochs and train is not None:  # the run's count of updates, and its warning of an oversized batch
        steps, total = updates(config.epochs, len(train), batch)
        count = f" of {steps:,} update(s) ({total:,} in all)"
    training = (
        f"{config.epochs:,} epoch(s){count}, batch {batch:,}, peak rate {config.learning_rate:g}, lm_coef "
        f"{config.lm_coef:g}, keep {config.keep}"
        if config.epochs
        else "none (--epochs 0 evaluates --init)"
    )
    plan.add("training", training)
    if finetune_lib.runs_baseline(config):
        plan.add("baseline", "the same fine-tuning from fresh weights beside it (--scratch_baseline)")
    return plan.done()


def init(config, task=None):
    """Describes and checks `config.init` as fine-tuning would start from it, without building the model."""
    found, sizes = _init(config, task)
    if config.lora_rank is not None and sizes.get("hidden_dim"):  # the run's check, once the width is known
        check_lora_rank(config.lora_rank, sizes["hidden_dim"])
    return found


def _init(config, task):
    """`(what config.init is, its backbone's config as far as it is read)`."""
    if config.init == "scratch":
        check_transfer_layers(config.transfer_layers, config.num_layers)
        return "fresh weights (no pre-training), the GPT-1 vocabulary", {"hidden_dim": config.hidden_dim}
    if config.init == "demo":
        check_transfer_layers(config.transfer_layers, DEMO_PRETRAIN["num_layers"])
        kept = os.path.join(config.output_dir, "pretrained") if config.output_dir else None
        if kept and os.path.exists(os.path.join(kept, "metrics.json")):
            return f"the demo model pre-trained earlier in {kept}", DEMO_PRETRAIN
        return (
            "the small demo model, pre-trained on the embedded text first ("
            + ", ".join(f"{k}={v}" for k, v in DEMO_PRETRAIN.items())
            + ")"
        ), DEMO_PRETRAIN
    if task is not None and is_task_preset(config.init):
        check_finetuned_init(
            config.init,
            task,
            *recorded_task(config.init),
            transfer_layers=config.transfer_layers,
            pretrained_weights=config.pretrained_weights,
            train_file=config.train_file,
        )
        found = pretrained(config.init, sizes := {}, finetuned=True)
        return f"{config.init}, fine-tuned for {task.name} ({found}): its head is kept", sizes
    if task is not None and config.epochs == 0:
        raise untrained_head(config.init, task)
    found = pretrained(config.init, sizes := {})
    check_transfer_layers(config.transfer_layers, sizes.get("num_layers", 0))
    return f"{config.init}: {found}", sizes


def pretrained(path, sizes=None, finetuned=False):
    """Checks the files of a pre-trained model (preset, original release, Hugging Face) as loading would,
    without building it; returns what it holds. `sizes` receives the backbone's config. `finetuned`: `path` is
    loaded as a fine-tuned model (its `task.json` checked too)."""
    from keras_hub.models import Backbone

    from kgpt.models.gpt.gpt_task_model import GPTTaskModel

    sizes = {} if sizes is None else sizes
    kind = pretrained_lib.format_of(path)
    if kind == "original":
        return _original_release(path, sizes)
    if kind == "huggingface":
        return _huggingface(path, sizes)
    # The loaders' own checks: the configs' keys and values, and the weights file's arrays read from its header.
    config = check_task_preset(GPTTaskModel, path)[1] if finetuned else check_backbone_preset(Backbone, path)
    weights = os.path.join(path, MODEL_WEIGHTS_FILE)
    count = sum(int(np.prod(s)) for s in file_shapes(weights))
    for name in ("tokenizer.json", os.path.join("assets", "tokenizer")):
        if not os.path.exists(os.path.join(path, name)):
            raise CheckpointError(
                f"Missing {os.path.join(path, name)}: a preset holds its tokenizer (saved with save_to_preset)."
            )
    inner = config["config"]
    sizes.update(inner)
    kind = config.get("registered_name", "?").rsplit(">", 1)[-1]
    shape = f"{inner.get('num_layers')} x {inner.get('hidden_dim', inner.get('lstm_units'))}"
    return f"a {kind} preset, {shape}, vocabulary {inner.get('vocabulary_size'):,}, {count:,} weights"


def _original_release(path, sizes):
    found, shapes = original.read_shapes(path)
    shards = original.open_shards(path, shapes)  # headers only: the numbers are not read
    sizes.update(found)
    return f"the original GPT-1 release format, {len(shards)} shard(s), {original.weight_count(**found):,} weights"


def _huggingface(path, sizes):
    found, _, _ = original.read_huggingface(path)
    sizes.update(found)
    return (
        f"Hugging Face openai-gpt files, {found['num_layers']} x {found['hidden_dim']}, "
        f"{original.weight_count(**found):,} weights"
    )


@contextlib.contextmanager
def _data_dir(task, data_dir):
    """`data_dir`, or the task's embedded data written to a temporary folder deleted at exit."""
    if data_dir is not None:  # a missing folder is the reader's error, as in the run
        yield data_dir
        return
    if task.default_data is None:
        raise ConfigError(f"Task {task.name!r} has no embedded data; pass --data_dir.")
    with tempfile.TemporaryDirectory(prefix="kgpt-dry-run-") as scratch:
        yield task.default_data(os.path.join(scratch, "data"))


def task_data(task, data_dir, splits=None, required=None, rows=ROWS, preprocessor=None, encoded=None, labeled=None):
    """The first `rows` examples of each split read through the task's plugin, counted; labels checked.

    A split that is missing is reported, as the job reports it, unless it is
    `required` (a split name, or several), whose `FileNotFoundError` is
    raised; a malformed row is the job's `DataError`. With `preprocessor`
    (the run's), each split is read and tokenized by the run's own
    `encode_split`, and `encoded` receives each split's `EncodedSplit`.
    `labeled`, a set, receives the names of the splits found with labels.
    """
    found = []
    labeled = set() if labeled is None else labeled
    required = {required} if isinstance(required, str) else set(required or ())
    with _data_dir(task, data_dir) as folder:
        for split in splits or task.splits:
            tally, used = {}, 0
            try:
                if preprocessor is not None:
                    encoded[split] = encode_split(task, split, folder, preprocessor, rows=rows)
                    counts = encoded[split].counts
                    tally, used = {"read": counts["read"], "skipped": counts["skipped_reasons"]}, counts["used"]
                    if encoded[split].targets is not None:
                        labeled.add(split)
                else:
                    for item in task.iter_examples(split, folder, tally):
                        if item.label is not None:
                            task.label_value(item)  # a label outside the label set names its file and line
                            labeled.add(split)
                        used += 1
                        if tally["read"] >= rows:
                            break
            except FileNotFoundError as e:
                if split in required:
                    raise
                found.append(f"{split}: not found ({e})" if data_dir else f"{split}: none (not evaluated)")
                continue
            if not used:
                raise task.no_examples(split, folder, tally)
            more = "+" if tally["read"] >= rows else ""
            skipped = sum(tally["skipped"].values())
            found.append(
                f"{split}: {tally['read']:,}{more} rows read, {used:,} used"
                + (
                    f", {skipped} skipped ({', '.join(f'{r}: {n}' for r, n in tally['skipped'].items())})"
                    if skipped
                    else ""
                )
            )
    where = data_dir or "embedded data"
    checked = "tokenized" if preprocessor is not None else "checked"
    return (
        f"{where}: "
        + "; ".join(found)
        + (f" (the first {rows:,} rows of each split {checked})" if any("+" in f for f in found) else "")
    )


def tokens(encoded, max_length, context):
    """The rows of each encoded split the run cuts to `max_length` tokens a view, as its log counts them."""
    cut = [
        f"{name}: {split.counts['truncated']:,} of {split.counts['used']:,} rows cut"
        + (f" ({split.counts['tokens_cut']:,} tokens)" if split.counts["truncated"] else "")
        for name, split in encoded.items()
    ]
    return f"views of up to {max_length:,} tokens (the model's context: {context:,}): " + "; ".join(cut)


def labels(task, encoded):
    """Each labeled split's label counts and majority share (or its values' range, for a regression)."""
    found = []
    for name, split in encoded.items():
        if split.targets is None:
            continue
        counts = metrics_lib.baselines(task, split.targets)
        if counts is None:
            values = np.asarray(split.targets, "float64")
            found.append(f"{name}: values {values.min():g} to {values.max():g}, mean {values.mean():g}")
            continue
        found.append(
            f"{name}: "
            + ", ".join(f"{k} {v:,}" for k, v in counts["label_counts"].items())
            + f" (majority {counts['majority_label']} {counts['majority_share']:.1%}, chance "
            f"{counts['chance']:.1%})"
        )
    return "; ".join(found) or "none labeled"


# Prediction.


def predict(
    model, output, overwrite=False, input=None, format=None, columns=None, data_dir=None, split="test", registry=None
):
    """Checks what `kgpt-predict` would read and write; returns the findings."""
    from kgpt.jobs import predict as predict_lib
    from kgpt.models.gpt.gpt_task_preprocessor import GPTTaskPreprocessor

    plan = Plan("kgpt-predict")
    predict_lib.check_model(model)
    saved = read_json(os.path.join(model, "task.json"), "a kgpt task config").get("config", {})
    plan.add("model", f"{model}: fine-tuned for {saved.get('task_name')} ({pretrained(model, finetuned=True)})")
    preprocessor = GPTTaskPreprocessor.from_preset(model)
    if input:
        inputs = predict_lib.read_inputs(
            input,
            preprocessor.transform,
            format,
            predict_lib.columns_for(model, input, format, columns),
            trained=predict_lib.trained_columns(model),
        )
        plan.add(
            "input",
            f"{input}: {len(inputs.examples):,} example(s)"
            + (f" from column(s) {', '.join(inputs.columns)}" if inputs.columns else ""),
        )
    else:
        task = (registry or TaskRegistry()).get(saved.get("task_name"))
        plan.add("input", task_data(task, data_dir, [split], required=split))
    predict_lib.check_output(
        output, "text" if not input else format or predict_lib.guess_format(input), overwrite, input, model
    )
    if not input:
        predict_lib.check_output_not_read(output, task, split, data_dir)
    plan.add(
        "output",
        "standard output"
        if output == "-"
        else f"{output}" + (" (replaced: --overwrite)" if storage.exists(output) else ""),
    )
    return plan.done()


# Analyses.


def analyze(
    mode, config, tasks, output, layers=None, rows=None, lstm_init=None, seeds=None, architectures=None, registry=None
):
    """Checks what `kgpt-analyze MODE` would run: its tasks' data, the models, the output directory."""
    registry = registry or TaskRegistry()
    plan = Plan(f"kgpt-analyze {mode}")
    plan.add("output", output_dir(output, "analyze", {}, config.overwrite))
    if mode in ("zero-shot", "zero-shot-curve"):  # the runs' own check: a heuristic and a data folder each
        zero_shot_lib.check_tasks(tasks, registry)
    fine_tunes = mode not in ("zero-shot", "zero-shot-curve")
    for name, data_dir in tasks.items():
        task = registry.get(name)
        required = [task.splits[0]] if fine_tunes else [s for s in zero_shot_lib.splits_read(task) if s]
        plan.add(f"task {name}", task_data(task, data_dir, required=required))
    if mode == "zero-shot-curve":
        pretrain_lib.check_config(config)
        plan.add(
            "pre-training",
            f"{', '.join(architectures)}: {config.max_steps:,} steps each on "
            f"{corpus(config.corpus) if config.corpus else 'the embedded demo text'}",
        )
        return plan.done()
    if mode == "zero-shot":
        plan.add("model", f"{config.init}: {pretrained(config.init)}")
        return plan.done()
    finetune_lib.check_config(config)
    if config.init == "demo":
        plan.add("model", "none given: the small demo models are pre-trained on the embedded text first")
    else:
        plan.add("model", init(config))
    if mode == "transfer":
        sizes = {}
        if config.init != "demo":
            pretrained(config.init, sizes)
        depth = sizes.get("num_layers", DEMO_PRETRAIN["num_layers"])
        wanted = layers if layers is not None else list(range(depth + 1))
        if any(n > depth for n in wanted):
            raise ConfigError(f"--layers {','.join(map(str, wanted))}: the model has {depth} blocks.")
        plan.add(
            "runs",
            f"{len(wanted)} fine-tuning run(s) of {next(iter(tasks))}, transferring "
            f"{', '.join(map(str, wanted))} block(s)",
        )
    else:
        experiments.check_starts(rows, config.init, lstm_init)
        if "lstm" in rows:
            plan.add(
                "LSTM",
                f"{lstm_init}: {pretrained(lstm_init)}"
                if lstm_init
                else "none given: pre-trained on the embedded text first",
            )
        plan.add("runs", f"{len(rows)} row(s) ({', '.join(rows)}) x {len(tasks)} task(s) x {len(seeds or [0])} seed(s)")
    return plan.done()
