"""Discriminative fine-tuning (paper section 3.2) of any registered task.

`finetune(config)` is what `kgpt-train --task NAME` runs; tests call it with
a tiny config. Data flow: `task.read(split, data_dir)` -> examples, streamed
through the `GPTTaskPreprocessor` (the task's input transformation) into real
tokens (`kgpt.batching.EncodedSplit`) -> length-bucketed batches ->
`GPTTaskModel.fit` on task loss + `lm_coef` x LM loss, the task's metrics on
dev after every epoch -> the task's metrics on every other split, a
predictions file per split, `metrics.json` and a preset that predicts on
text (`GPTTaskModel.from_preset`).
"""

import collections
import dataclasses
import json
import math
import os
import tempfile

import keras

from kgpt import batching
from kgpt import metrics as metrics_lib
from kgpt.backbone import GPTBackbone
from kgpt.distribute import training_scope
from kgpt.optimizers import gpt_adamw
from kgpt.pretrained import load_pretrained, with_special_tokens
from kgpt.registry import TaskRegistry
from kgpt.task import DataError
from kgpt.task_model import GPTTaskModel
from kgpt.task_preprocessor import GPTTaskPreprocessor
from kgpt.tokenizer import GPTTokenizer


@dataclasses.dataclass
class FinetuneConfig:
    """Fine-tuning settings; defaults are the paper's (section 4.1)."""

    task: str = "scitail"
    data_dir: str | None = None  # the dataset's files; None = the task's embedded default data
    init: str | None = None  # preset dir (kgpt-train --task lm output), "scratch", or None = demo pre-training
    output_dir: str | None = None  # the preset, metrics.json, predictions/, logs/; None = keep nothing
    transfer_layers: int | None = None  # copy embeddings + the first N blocks only (Figure 2 left); None = all
    distribution: str = "none"  # or "data_parallel": every local GPU/TPU core (kgpt.distribute)
    dtype: str | None = None  # e.g. "mixed_bfloat16"; None = Keras' global policy (float32)
    pretrained_weights: bool = True  # False: init's architecture and tokenizer, fresh weights (Table 5 ablation)
    learning_rate: float = 6.25e-5
    batch_size: int = 32
    epochs: int = 3
    warmup_fraction: float = 0.002  # linear warm-up over 0.2% of the updates, then linear decay to 0
    weight_decay: float = 0.01
    lm_coef: float = 0.5  # lambda of L3 = L2 + lambda * L1; 0 disables the auxiliary LM loss
    classifier_dropout: float = 0.1
    max_length: int | None = None  # tokens per view; None = the model's context
    predict_test: bool = False  # also write the benchmark's submission files (GLUE format) to output_dir/submission
    # Model size for --init scratch (the paper's "no pre-training" ablation); num_heads also for an
    # original-format --init, whose shapes cannot tell the head count.
    num_layers: int = 12
    num_heads: int = 12
    hidden_dim: int = 768
    intermediate_dim: int = 3072
    dropout: float = 0.1
    attention_dropout: float | None = None  # None = dropout (paper); 0 = fused/flash attention in training
    lm_loss_chunk_size: int = 1024  # tokens whose logits the auxiliary LM loss holds at once; 0 = all
    seed: int = 0


# The embedded run: settings for the small demo model, not the paper's 117M one.
DEMO_SETTINGS = dict(learning_rate=5e-4, batch_size=16, epochs=5)


def encode_split(task, split, data_dir, preprocessor):
    """Reads and encodes a split through `preprocessor` into a `kgpt.batching.EncodedSplit` (real tokens only).

    Streams the task's reader; every row is counted (read, used, skipped by
    reason, truncated and tokens cut); a malformed row raises `DataError`
    naming its file and line.

    Example:
    ```python
    preprocessor = kgpt.GPTTaskPreprocessor(tokenizer, task.transform, max_length=512)
    split = kgpt.finetune.encode_split(task, "dev", "glue/RTE", preprocessor)
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
        builder.add(views, None if item.label is None else task.label_value(item), uid=item.uid or item.source)
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


def transfer(pretrained, num_layers):
    """A fresh backbone of the same shape with the embeddings and first `num_layers` blocks copied.

    `num_layers=None` copies everything. The paper's Figure 2 (left) varies this.
    """
    if num_layers is None:
        return pretrained
    if not 0 <= num_layers <= pretrained.num_layers:
        raise ValueError(f"transfer_layers must be in 0..{pretrained.num_layers}, got {num_layers}.")
    fresh = type(pretrained).from_config(pretrained.get_config())
    for src, dst in zip(pretrained.transferred_layers(num_layers), fresh.transferred_layers(num_layers)):
        dst.set_weights(src.get_weights())
    return fresh


def initial_model(config, log=print):
    """`(backbone, tokenizer, description)` to fine-tune, from `config.init`."""
    if config.init == "scratch":
        tokenizer = GPTTokenizer.gpt1()
        backbone = GPTBackbone.from_sizes(config, tokenizer.vocabulary_size(), config.max_length or 512)
        return backbone, tokenizer, "random initialisation (no pre-training)"
    if config.init is None:
        from kgpt import pretrain as pretrain_lib

        out = os.path.join(config.output_dir, "pretrained") if config.output_dir else None
        log("No --init: pre-training the small demo model on the embedded text first "
            f"({', '.join(f'{k}={v}' for k, v in pretrain_lib.DEMO_SETTINGS.items())}).")
        pre = pretrain_lib.PretrainConfig(**pretrain_lib.DEMO_SETTINGS, output_dir=out, seed=config.seed)
        lm, tokenizer, _ = pretrain_lib.pretrain(pre, log=log)
        return lm.backbone, tokenizer, "the demo model pre-trained on the embedded text"
    return load_pretrained(config.init, num_heads=config.num_heads, dtype=config.dtype)


Finetuned = collections.namedtuple("Finetuned", "model tokenizer task")


def load_finetuned(preset, registry=None):
    """Reads a fine-tuned preset back: `Finetuned(model, tokenizer, task)`.

    The task is found by the name saved with the model, so its plugin must be
    installed; `registry` defaults to every installed plugin. To predict on
    text, `kgpt.GPTTaskModel.from_preset(preset)` needs no plugin.

    Example:
    ```python
    model, tokenizer, task = kgpt.load_finetuned("runs/rte")
    split = kgpt.finetune.encode_split(task, "dev", "glue/RTE", model.preprocessor)
    predictions, scores = kgpt.finetune.evaluate_split(task, model, split, batch_size=32)
    ```
    """
    model = GPTTaskModel.from_preset(preset)
    if not model.task_name:
        raise ValueError(f"{preset}/task.json names no task (task_name): it was not saved by kgpt fine-tuning.")
    task = (registry or TaskRegistry()).get(model.task_name)
    return Finetuned(model, model.preprocessor.tokenizer, task)


def evaluate_split(task, model, split, batch_size):
    """`(predictions, metrics)`: decoded predictions in split order, and the task's metrics if labeled."""
    outputs = batching.predict_outputs(model.task_predictor(), split, batch_size)
    predictions = task.head.decode(outputs)
    metrics = {}
    if split.targets is not None:
        for metric in task.metrics:
            name, fn = metrics_lib.resolve(metric)
            metrics[name] = fn(split.targets, predictions)
    return predictions, metrics


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
        _, scores = evaluate_split(self.task, self.model, self.split, self.batch_size)
        if logs is not None:
            logs.update({f"val_{name}": value for name, value in scores.items()})


def write_predictions(path, task, split, predictions):
    """TSV `id, prediction[, label]` with label names (classification), indices or values."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("id\tprediction" + ("\tlabel" if split.targets is not None else "") + "\n")
        for i, (uid, value) in enumerate(zip(split.uids, predictions)):
            row = [str(uid), str(task.prediction_name(value))]
            if split.targets is not None:
                row.append(str(task.prediction_name(split.targets[i])))
            f.write("\t".join(row) + "\n")


def write_submission(path, task, split, predictions):
    """A benchmark submission file: `index` TAB `prediction` (GLUE's format)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("index\tprediction\n")
        for uid, value in zip(split.uids, predictions):
            f.write(f"{uid}\t{task.prediction_name(value)}\n")


def _describe_counts(name, counts):
    text = f"{name}: {counts['read']:,} read, {counts['used']:,} used"
    if counts["skipped"]:
        text += f", {counts['skipped']:,} skipped (" + ", ".join(f"{r}: {n}" for r, n in counts["skipped_reasons"].items()) + ")"
    if counts["truncated"]:
        text += f", {counts['truncated']:,} truncated ({counts['tokens_cut']:,} tokens cut)"
    return text + "."


def finetune(config, registry=None, log=print):
    """Fine-tunes on `config.task`; returns `(model, metrics)`."""
    registry = registry or TaskRegistry()
    task = registry.get(config.task)
    if config.data_dir is None and task.default_data is None:
        raise ValueError(f"Task {task.name!r} has no embedded data; pass --data_dir.")
    with training_scope(config.distribution, config.dtype, config.batch_size, log=log):
        if config.data_dir is not None:
            return _finetune(config, task, config.data_dir, log)
        if config.output_dir:
            return _finetune(config, task, _embedded_data(task, os.path.join(config.output_dir, "data"), log), log)
        with tempfile.TemporaryDirectory(prefix=f"kgpt-{task.name}-") as target:  # nothing kept without output_dir
            return _finetune(config, task, _embedded_data(task, target, log), log)


def _embedded_data(task, target, log):
    data_dir = task.default_data(target)
    log(f"No --data_dir: using the embedded {task.name} data written to {data_dir}.")
    return data_dir


def _finetune(config, task, data_dir, log):
    keras.utils.set_random_seed(config.seed)

    backbone, tokenizer, origin = initial_model(config, log=log)
    if not config.pretrained_weights:  # the "w/o pre-training" ablation: same model and vocabulary, nothing learned
        backbone = type(backbone).from_config(backbone.get_config())
        log("Pre-trained weights discarded: fine-tuning a freshly initialised model of the same shape.")
    backbone = with_special_tokens(transfer(backbone, config.transfer_layers), tokenizer, seed=config.seed)
    max_length = min(config.max_length or backbone.max_sequence_length, backbone.max_sequence_length)
    preprocessor = GPTTaskPreprocessor(tokenizer, task.transform, max_length=max_length)

    train_split, *eval_names = task.splits
    splits = {train_split: encode_split(task, train_split, data_dir, preprocessor)}
    for name in eval_names:
        try:
            splits[name] = encode_split(task, name, data_dir, preprocessor)
        except FileNotFoundError as e:
            log(f"Split {name!r} not evaluated: {e}")
    for name, split in splits.items():
        log(_describe_counts(name, split.counts))
    train = splits[train_split]
    if train.targets is None:
        raise DataError(f"Task {task.name!r}: the training split {train_split!r} has no labels.")

    model = GPTTaskModel(
        backbone,
        head=task.head,
        num_views=task.transform.num_views,
        lm_coef=config.lm_coef,
        classifier_dropout=config.classifier_dropout,
        task_name=task.name,
        preprocessor=preprocessor,
        compile=False,
    )
    steps_per_epoch = math.ceil(len(train) / config.batch_size)
    total_steps = steps_per_epoch * config.epochs
    model.compile(
        optimizer=gpt_adamw(
            config.learning_rate,
            warmup_steps=math.ceil(config.warmup_fraction * total_steps),
            total_steps=total_steps,
            decay="linear",
            weight_decay=config.weight_decay,
        ),
        lm_loss_chunk_size=config.lm_loss_chunk_size or None,
    )
    max_lengths = model.max_padded_lengths(train, config.batch_size)
    plan = batching.length_plan(train.lengths, config.batch_size, config.seed, train.limit, max_lengths)
    real_share = train.real_share(batching.batch_indices(train.lengths, config.batch_size, config.seed), plan)
    log(f"Task {task.name} ({task.transform.kind}, {task.head.kind} head, metrics {', '.join(task.metric_names)}); "
        f"model from {origin}: {model.count_params():,} weights; {config.epochs} epoch(s) of {steps_per_epoch} "
        f"steps, batch {config.batch_size}, {train.num_views} view(s) of up to {int(train.lengths.max())} tokens, "
        f"lm_coef {config.lm_coef}.")
    log(f"Batches by length: {real_share:.1%} of the positions computed in training are real tokens, in "
        f"{len(plan)} padded length(s){' (one XLA compilation each)' if max_lengths else ''}; padding every "
        f"example to the longest would give {train.padded_share():.1%}.")

    lm = config.lm_coef > 0
    dev_name = next((n for n, s in splits.items() if n != train_split and s.targets is not None), None)
    callbacks = []
    if dev_name is not None:
        callbacks.append(TaskMetrics(task, splits[dev_name], config.batch_size))
    if config.output_dir:
        os.makedirs(config.output_dir, exist_ok=True)
        callbacks += [
            keras.callbacks.CSVLogger(os.path.join(config.output_dir, "history.csv")),
            keras.callbacks.TensorBoard(os.path.join(config.output_dir, "logs")),
        ]
    dev = splits[dev_name] if dev_name else None
    history = model.fit(
        batching.dataset(train, config.batch_size, seed=config.seed, lm=lm, max_lengths=max_lengths),
        epochs=config.epochs,
        validation_data=None if dev is None else batching.dataset(
            dev, config.batch_size, lm=lm, max_lengths=model.max_padded_lengths(dev, config.batch_size)),
        callbacks=callbacks,
        shuffle=False,  # the dataset draws each epoch's order itself
        verbose=1 if os.isatty(1) else 2,
    )

    results = {"task": task.name, "init": origin, "lm_coef": config.lm_coef,
               "real_token_share": {"train": real_share, "train_padded_lengths": list(plan),
                                    "train_padded_to_longest": train.padded_share()},
               "history": {k: [float(v) for v in vs] for k, vs in history.history.items()}, "splits": {}}
    for name, split in splits.items():
        if name == train_split:
            results["splits"][name] = {"examples": split.counts}
            continue
        predictions, scores = evaluate_split(task, model, split, config.batch_size)
        results["splits"][name] = {**scores, "examples": split.counts}
        if scores:
            log(f"{name}: " + ", ".join(f"{k} {v:.4f}" for k, v in scores.items()))
        if config.output_dir:
            write_predictions(os.path.join(config.output_dir, "predictions", f"{name}.tsv"), task, split, predictions)
            if config.predict_test and name in (task.submissions or {}):
                path = os.path.join(config.output_dir, "submission", task.submissions[name])
                write_submission(path, task, split, predictions)
                log(f"{name}: submission file {path}")
    if config.predict_test and not task.submissions:
        log(f"Task {task.name!r} defines no submission format; predictions/ holds every split's predictions.")

    if config.output_dir:
        model.save_to_preset(config.output_dir)  # GPTTaskModel.from_preset(dir) predicts on text again
        with open(os.path.join(config.output_dir, "metrics.json"), "w") as f:
            json.dump(results, f, indent=2)
        log(f"Saved the preset (task.json, task.weights.h5, config.json, model.weights.h5, preprocessor.json, "
            f"tokenizer.json, assets/), predictions/, logs/, history.csv and metrics.json in {config.output_dir}")
    return model, results
