"""Discriminative fine-tuning (paper section 3.2) of any registered task.

`finetune(config)` is what `kgpt-train --task NAME` runs; tests call it with
a tiny config. Data flow: `task.read(split, data_dir)` -> examples -> the
task's input transformation -> packed `[examples, views, length]` arrays ->
`GPTTaskModel.fit` on task loss + `lm_coef` x LM loss -> the task's metrics on
every other split, a predictions file per split and `metrics.json`.
"""

import collections
import dataclasses
import json
import math
import os
import tempfile

import keras
import numpy as np

from kgpt import metrics as metrics_lib
from kgpt import original, transforms
from kgpt.backbone import NUM_SPECIAL_TOKENS, GPTBackbone
from kgpt.distribute import training_scope
from kgpt.optimizers import gpt_adamw
from kgpt.presets import load_any_backbone
from kgpt.registry import TaskRegistry
from kgpt.task import DataError
from kgpt.task_model import GPTTaskModel
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


@dataclasses.dataclass
class EncodedSplit:
    """A split as model inputs, with what happened to its rows."""

    name: str
    token_ids: np.ndarray  # [examples, views, length] int32, right-padded
    padding_mask: np.ndarray  # [examples, views, length] int32
    labels: np.ndarray | None  # [examples]; None when the split is unlabeled
    uids: list
    counts: dict  # read, used, skipped (+ reasons), truncated, tokens_cut

    @property
    def x(self):
        return {"token_ids": self.token_ids, "padding_mask": self.padding_mask}


def encode_split(task, split, data_dir, tokenizer, max_length):
    """Reads a split and applies the task's transformation; errors name file and line.

    Views longer than `max_length` are truncated by the policy of
    `kgpt.transforms` and counted; `Skipped` rows are counted by reason.
    """
    layout = transforms.Layout.from_tokenizer(tokenizer)
    examples, skipped, read = task.examples(split, data_dir)
    views, labels, uids = [], [], []
    truncated = tokens_cut = 0
    for item in examples:
        segments = [tokenizer.encode(s) for s in item.segments]
        choices = [tokenizer.encode(c) for c in item.choices]
        example_views, cut = transforms.build_views(task.transform, segments, choices, layout, max_length)
        truncated += cut > 0
        tokens_cut += cut
        views.append(example_views)
        labels.append(None if item.label is None else task.label_value(item))
        uids.append(item.uid or item.source)
    length = max(len(v) for example in views for v in example)
    token_ids, padding_mask = transforms.pack(views, length)
    labelled = [label is not None for label in labels]
    if any(labelled) and not all(labelled):
        first = labelled.index(False)
        raise DataError(f"{uids[first]}: unlabeled example in the labeled split {split!r}.")
    dtype = "float32" if task.head == "regression" else "int32"
    counts = {
        "read": read,
        "used": len(views),
        "skipped": sum(skipped.values()),
        "skipped_reasons": dict(skipped),
        "truncated": truncated,
        "tokens_cut": tokens_cut,
    }
    return EncodedSplit(split, token_ids, padding_mask, np.asarray(labels, dtype) if all(labelled) else None,
                        uids, counts)


def model_targets(split):
    """`(y, sample_weight)` dicts for `GPTTaskModel.fit`: task labels and next tokens."""
    y = {"task": split.labels, "lm": split.token_ids[..., 1:]}
    sample_weight = {
        "task": np.ones(len(split.labels), "float32"),
        "lm": split.padding_mask[..., 1:].astype("float32"),  # real tokens only
    }
    return y, sample_weight


def _dataset(split, lm, batch_size, shuffle_seed=None):
    import tensorflow as tf

    y, sample_weight = model_targets(split)
    if not lm:
        y, sample_weight = {"task": y["task"]}, {"task": sample_weight["task"]}
    data = tf.data.Dataset.from_tensor_slices((split.x, y, sample_weight))
    if shuffle_seed is not None:
        data = data.shuffle(len(split.labels), seed=shuffle_seed, reshuffle_each_iteration=True)
    return data.batch(batch_size).prefetch(tf.data.AUTOTUNE)


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


def with_special_tokens(backbone, tokenizer, seed=None):
    """The backbone, grown by the 3 special tokens when its vocabulary lacks them."""
    if backbone.vocabulary_size == tokenizer.vocabulary_size():
        return backbone
    if backbone.vocabulary_size == tokenizer.vocabulary_size() - NUM_SPECIAL_TOKENS:
        return backbone.with_added_tokens(NUM_SPECIAL_TOKENS, seed=seed)
    raise ValueError(
        f"The backbone has {backbone.vocabulary_size} token embeddings but the tokenizer "
        f"{tokenizer.vocabulary_size()} ids (with start/delimiter/extract); they do not belong together."
    )


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


def load_pretrained(path, num_heads=12, dtype=None):
    """`(backbone, tokenizer, description)` from a kgpt preset, the original GPT-1 release or Hugging Face
    openai-gpt files (`num_heads` is only used by the original format, whose shapes cannot tell it).
    `dtype` overrides the saved dtype policy (e.g. `"mixed_bfloat16"`)."""
    if os.path.isfile(os.path.join(path, original.SHAPES_FILE)):
        backbone = GPTBackbone.from_original(path, num_heads=num_heads, dtype=dtype)
        return backbone, GPTTokenizer.from_original(path), f"original checkpoint {path}"
    if os.path.isfile(os.path.join(path, original.HF_WEIGHTS_FILE)):
        backbone = GPTBackbone.from_original(path, dtype=dtype)
        return backbone, GPTTokenizer.from_original(path), f"Hugging Face checkpoint {path}"
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(
            f"--init {path!r} is neither a kgpt preset (config.json; the --output_dir of kgpt-train --task lm) nor "
            f"an original GPT-1 checkpoint ({original.SHAPES_FILE}) nor Hugging Face openai-gpt files "
            f"({original.HF_WEIGHTS_FILE}); or pass 'scratch'."
        )
    backbone = load_any_backbone(path, **({"dtype": dtype} if dtype else {}))
    return backbone, GPTTokenizer.from_preset(path), f"preset {path}"


Finetuned = collections.namedtuple("Finetuned", "model tokenizer task")


def load_finetuned(preset, registry=None):
    """Reads a fine-tuned preset back: `Finetuned(model, tokenizer, task)`.

    The task is found by the name saved with the model, so its plugin must be
    installed; `registry` defaults to every installed plugin.

    Example:
    ```python
    model, tokenizer, task = kgpt.load_finetuned("runs/rte")
    split = kgpt.finetune.encode_split(task, "dev", "glue/RTE", tokenizer, model.backbone.max_sequence_length)
    predictions, scores = kgpt.finetune.evaluate_split(task, model, split, batch_size=32)
    ```
    """
    model = GPTTaskModel.from_preset(preset)
    if not model.task_name:
        raise ValueError(f"{preset}/task.json names no task (task_name): it was not saved by kgpt fine-tuning.")
    task = (registry or TaskRegistry()).get(model.task_name)
    return Finetuned(model, GPTTokenizer.from_preset(preset), task)


def evaluate_split(task, model, split, batch_size):
    """`(predictions, metrics)`: class/choice indices or values, and the task's metrics if labeled."""
    outputs = model.predict_task(split.x, batch_size=batch_size)
    predictions = outputs if task.head == "regression" else np.argmax(outputs, axis=-1)
    metrics = {}
    if split.labels is not None:
        for metric in task.metrics:
            name, fn = metrics_lib.resolve(metric)
            metrics[name] = fn(split.labels, predictions)
    return predictions, metrics


def write_predictions(path, task, split, predictions):
    """TSV `id, prediction[, label]` with label names (classification), indices or values."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("id\tprediction" + ("\tlabel" if split.labels is not None else "") + "\n")
        for i, (uid, value) in enumerate(zip(split.uids, predictions)):
            row = [str(uid), str(task.prediction_name(value))]
            if split.labels is not None:
                row.append(str(task.prediction_name(split.labels[i])))
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

    train_split, *eval_names = task.splits
    splits = {train_split: encode_split(task, train_split, data_dir, tokenizer, max_length)}
    for name in eval_names:
        try:
            splits[name] = encode_split(task, name, data_dir, tokenizer, max_length)
        except FileNotFoundError as e:
            log(f"Split {name!r} not evaluated: {e}")
    for name, split in splits.items():
        log(_describe_counts(name, split.counts))
    train = splits[train_split]
    if train.labels is None:
        raise DataError(f"Task {task.name!r}: the training split {train_split!r} has no labels.")

    model = GPTTaskModel(
        backbone,
        head=task.head,
        num_outputs=task.num_outputs,
        num_views=task.transform.num_views,
        pooling=task.transform.pooling,
        lm_coef=config.lm_coef,
        classifier_dropout=config.classifier_dropout,
        task_name=task.name,
        compile=False,
    )
    steps_per_epoch = math.ceil(len(train.labels) / config.batch_size)
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
    log(f"Task {task.name} ({task.transform.kind}, {task.head} head, metrics {', '.join(task.metric_names)}); "
        f"model from {origin}: {model.count_params():,} weights; {config.epochs} epoch(s) of {steps_per_epoch} "
        f"steps, batch {config.batch_size}, {train.token_ids.shape[1]} view(s) of up to {train.token_ids.shape[2]} "
        f"tokens, lm_coef {config.lm_coef}.")

    lm = config.lm_coef > 0
    dev = next((s for n, s in splits.items() if n != train_split and s.labels is not None), None)
    callbacks = []
    if config.output_dir:
        os.makedirs(config.output_dir, exist_ok=True)
        callbacks += [
            keras.callbacks.CSVLogger(os.path.join(config.output_dir, "history.csv")),
            keras.callbacks.TensorBoard(os.path.join(config.output_dir, "logs")),
        ]
    history = model.fit(
        _dataset(train, lm, config.batch_size, shuffle_seed=config.seed),
        epochs=config.epochs,
        validation_data=_dataset(dev, lm, config.batch_size) if dev is not None else None,
        callbacks=callbacks,
        shuffle=False,  # the dataset reshuffles every epoch itself
        verbose=1 if os.isatty(1) else 2,
    )

    results = {"task": task.name, "init": origin, "lm_coef": config.lm_coef,
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
        model.save_to_preset(config.output_dir)  # kgpt.load_finetuned(dir) reads it back
        tokenizer.save_to_preset(config.output_dir)
        with open(os.path.join(config.output_dir, "metrics.json"), "w") as f:
            json.dump(results, f, indent=2)
        log(f"Saved the preset (task.json, task.weights.h5, config.json, model.weights.h5, tokenizer.json, "
            f"assets/), predictions/, logs/, history.csv and metrics.json in {config.output_dir}")
    return model, results
