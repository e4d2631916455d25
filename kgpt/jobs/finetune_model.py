"""What fine-tuning starts from, and the task model it builds on it.

`starting_point` loads `--init` (a pre-trained preset, the original release,
Hugging Face files, `scratch`, `demo`, or a fine-tuned preset of the same
task, whose head is kept), applies `transfer_layers` and
`pretrained_weights`, and adds the special tokens; `build_model` puts the
task's head on it (and LoRA factors with `lora_rank`).
"""

import collections
import dataclasses
import logging
import os

import keras

from kgpt import checks
from kgpt.errors import CheckpointError, ConfigError
from kgpt.io import hub
from kgpt.io.presets import PREPROCESSOR_CONFIG_FILE, TASK_CONFIG_FILE, deserialize, read_json, saved_preprocessor
from kgpt.jobs import pretrain as pretrain_lib
from kgpt.jobs.config import DEMO_PRETRAIN, demo_pretrain_config
from kgpt.jobs.predict import trained_columns
from kgpt.layers import lora
from kgpt.models.converters import original
from kgpt.models.gpt.gpt_backbone import GPTBackbone
from kgpt.models.gpt.gpt_task_model import GPTTaskModel, is_task_preset
from kgpt.models.gpt.gpt_task_preprocessor import GPTTaskPreprocessor, segment_columns
from kgpt.models.gpt.gpt_tokenizer import GPTTokenizer, read_tokenizer
from kgpt.models.pretrained import load_pretrained, with_special_tokens

logger = logging.getLogger(__name__)

SPECIAL_INITS = ("scratch", "demo")  # --init values that name no files


def transfer(pretrained, num_layers):
    """A fresh backbone of the same shape with the embeddings and first `num_layers` blocks copied.

    `num_layers=None` copies everything. The paper's Figure 2 (left) varies this.
    """
    if num_layers is None:
        return pretrained
    check_transfer_layers(num_layers, pretrained.num_layers)
    fresh = type(pretrained).from_config(pretrained.get_config())
    for src, dst in zip(pretrained.transferred_layers(num_layers), fresh.transferred_layers(num_layers)):
        dst.set_weights(src.get_weights())
    return fresh


def check_transfer_layers(num_layers, depth):
    """Raises `ConfigError` unless `num_layers` (None: all) blocks of a model of `depth` blocks can be transferred."""
    if num_layers is not None and not 0 <= num_layers <= depth:
        raise ConfigError(f"transfer_layers must be in 0..{depth}, got {num_layers}.")


# `initial`: what `initial_model` gave (before special tokens and `pretrained_weights`), for a baseline to reuse.
Start = collections.namedtuple("Start", "backbone tokenizer origin finetuned initial")


def with_local_init(config):
    """`config` with a Hub `--init` (`hf://OWNER/REPO`, `gpt1_base_en`) replaced by its local folder: downloaded,
    and converted from openai-gpt files, once per commit (`kgpt.io.hub`)."""
    if not hub.is_hub(config.init):
        return config
    folder = hub.local(config.init, GPTBackbone)
    named = hub.PRESETS[config.init]["uri"] if config.init in hub.PRESETS else None
    logger.info(f"--init {config.init}{f' ({named})' if named else ''}: the kgpt preset in {folder}")
    return dataclasses.replace(config, init=folder)


def initial_model(config, work):
    """`(backbone, tokenizer, description)` to fine-tune, from a pre-trained `config.init` (`work`: the `Run`)."""
    if config.init == "scratch":
        tokenizer = GPTTokenizer.gpt1()
        backbone = GPTBackbone.from_sizes(config, tokenizer.vocabulary_size(), scratch_context(config.max_length))
        return backbone, tokenizer, "random initialisation (no pre-training)"
    if config.init == "demo":
        return _demo_model(work, config.seed, config.dtype)
    return load_pretrained(config.init, num_heads=config.num_heads, dtype=config.dtype)


def scratch_context(max_length):
    """The context of a model `init="scratch"` builds: `max_length`, else 512 (the paper's)."""
    return max_length or 512


def starting_tokenizer(init, output_dir=None, max_length=None):
    """`(tokenizer, context, saved_length)` fine-tuning from `init` encodes with, read without building a model
    (`--dry_run`): the tokenizer, and `starting_sizes`.

    None for `init="demo"` until the demo model is pre-trained (in `output_dir`): its tokenizer is learned then.
    """
    if init == "scratch":
        return GPTTokenizer.gpt1(), *starting_sizes(init, max_length)
    path = os.path.join(output_dir, "pretrained") if init == "demo" and output_dir else init
    if init == "demo" and (path == init or not os.path.exists(os.path.join(path, "metrics.json"))):
        return None
    kind = _files_kind(path)
    if kind is None:
        read_json(os.path.join(path, "config.json"), "a model config")  # raises: it is missing
    sizes = starting_sizes(init, max_length)
    if sizes is None:
        raise CheckpointError(f"{path}: its config gives no context length (a positive integer); it is damaged.")
    if kind in ("original", "openai-gpt"):
        return GPTTokenizer.from_original(path), *sizes
    if kind == "task":
        try:
            return GPTTaskPreprocessor.from_preset(path).tokenizer, *sizes
        except (TypeError, ValueError) as e:  # a damaged preprocessor.json: its own check says what is wrong
            raise CheckpointError(f"{os.path.join(path, PREPROCESSOR_CONFIG_FILE)}: {e}") from None
    return read_tokenizer(path), *sizes


def starting_sizes(init, max_length=None):
    """`(context, saved_length)` of what fine-tuning from `init` starts from, read from its config files alone:
    the model's context and a fine-tuned `--init`'s view length (else None). None when `init` names no folder
    of model files (loading it says why)."""
    if init == "scratch":
        return scratch_context(max_length), None
    if init == "demo":
        return DEMO_PRETRAIN["sequence_length"], None
    kind = _files_kind(init) if isinstance(init, str) and os.path.isdir(init) else None
    if kind is None:
        return None
    if kind == "original":  # positions [n_ctx, H] come first
        shapes = read_json(os.path.join(init, original.SHAPES_FILE), "the release's list of array shapes")
        context, length = _size(shapes, 0, 0), None
    else:
        saved = read_json(os.path.join(init, "config.json"), "a model config")
        context = _size(saved, "n_positions") if kind == "openai-gpt" else _size(saved, "config", "max_sequence_length")
        length = None
        if kind == "task":
            preprocessor = saved_preprocessor(init) or {}
            length = _size(preprocessor, "sequence_length")
    return (context, length) if context else None


def _size(saved, *keys):
    """`saved[k1][k2]...` when it is a positive integer, else None (a damaged file, which loading names)."""
    for key in keys:
        try:
            saved = saved[key]
        except (KeyError, IndexError, TypeError):
            return None
    return saved if isinstance(saved, int) and not isinstance(saved, bool) and saved > 0 else None


def _files_kind(path):
    """What `path` holds: `"original"` (the release's .npy files), `"openai-gpt"` (Hugging Face's), `"task"` (a
    fine-tuned preset), `"backbone"` (a pre-trained one), or None (no model config)."""
    if os.path.isfile(os.path.join(path, original.SHAPES_FILE)):
        return "original"
    if not os.path.isfile(os.path.join(path, "config.json")):
        return None
    saved = read_json(os.path.join(path, "config.json"), "a model config")
    if isinstance(saved, dict) and "n_positions" in saved:
        return "openai-gpt"
    return "task" if is_task_preset(path) else "backbone"


def _demo_model(work, seed, dtype):
    """`init="demo"`: the demo model pre-trained on the embedded text (kept in the `Run`'s pretrained/, and reused);
    `seed` is the fine-tuning's, `dtype` the policy it is loaded back with."""
    out = os.path.join(work.directory, "pretrained") if work.kept else None
    origin = "the demo model pre-trained on the embedded text"
    if out and os.path.exists(os.path.join(out, "metrics.json")):  # written last: the preset is complete
        logger.info(
            f"--init demo: using the demo model pre-trained in {work.location}/pretrained by an earlier run "
            f"of this command."
        )
        backbone, tokenizer, _ = load_pretrained(out, dtype=dtype)
        return backbone, tokenizer, origin
    logger.info(
        "--init demo: pre-training the small demo model on the embedded text first "
        f"({', '.join(f'{k}={v}' for k, v in DEMO_PRETRAIN.items())})."
    )
    lm, tokenizer, _ = pretrain_lib.pretrain(demo_pretrain_config(output_dir=out, seed=seed), within=work)
    return lm.backbone, tokenizer, origin


def starting_point(config, task, initial=None, work=None):
    """What fine-tuning starts from: a `Start(backbone, tokenizer, origin, finetuned, initial)`.

    `finetuned` is the loaded `GPTTaskModel` when `config.init` is a
    fine-tuned preset of `task` (its head is kept), else None. `initial`, an
    earlier `Start.initial`, is used instead of loading (or, for `demo`,
    pre-training in the `Run` `work`) `config.init` again.
    """
    if config.init not in SPECIAL_INITS and is_task_preset(config.init):
        check_finetuned_init(  # before the model is loaded: what task.json records is enough
            config.init,
            task,
            *recorded_task(config.init),
            transfer_layers=config.transfer_layers,
            pretrained_weights=config.pretrained_weights,
            train_file=config.train_file,
        )
        model = _finetuned_init(config.init, config.dtype)
        action = (
            "evaluating it without training" if config.epochs == 0 else f"training it {config.epochs} more epoch(s)"
        )
        logger.info(
            f"--init {config.init} is fine-tuned for {task.name}: keeping its {model.head.kind} head, {action}."
        )
        return Start(
            model.backbone, model.preprocessor.tokenizer, f"the model fine-tuned in {config.init}", model, None
        )
    if config.epochs == 0:
        raise untrained_head(config.init, task)
    initial = initial or initial_model(config, work)
    backbone, tokenizer, origin = initial
    if not config.pretrained_weights:  # the "w/o pre-training" ablation: same model and vocabulary, nothing learned
        backbone = type(backbone).from_config(backbone.get_config())
        origin = f"fresh weights (no pre-training) in the shape and vocabulary of {origin}"
        logger.info("Pre-trained weights discarded: fine-tuning a freshly initialised model of the same shape.")
    backbone = with_special_tokens(transfer(backbone, config.transfer_layers), tokenizer, seed=config.seed)
    return Start(backbone, tokenizer, origin, None, initial)


def _finetuned_init(init, dtype=None):
    """The fine-tuned `GPTTaskModel` in the preset `init`, under the run's `dtype` policy (None: the saved one)."""
    kwargs = {"dtype": dtype} if dtype else {}
    return GPTTaskModel.from_preset(init, **kwargs)


def recorded_task(init):
    """`(task_name, head)` that the fine-tuned preset `init` records in its `task.json`, read without building
    the model (the head is a small Python object); None for either that it lacks."""
    path = os.path.join(init, TASK_CONFIG_FILE)
    saved = read_json(path, "a kgpt task config").get("config")
    saved = saved if isinstance(saved, dict) else {}
    head = saved.get("head")
    return saved.get("task_name"), deserialize(head, path, "a task head") if isinstance(head, dict) else None


def check_finetuned_init(
    init, task, saved_task, saved_head=None, transfer_layers=None, pretrained_weights=True, train_file=None
):
    """Raises `ConfigError` when the fine-tuned `init` (of task `saved_task`, with `saved_head`: `recorded_task(init)`)
    cannot go on as asked: it is another task's, its head is not `task`'s now (another label set in `train_file`,
    or the plugin changed), or `transfer_layers` / `pretrained_weights=False` ask for a pre-trained model. The run
    and `--dry_run` both check with it before any model is built."""
    source = recorded(init, "init_dir")
    origin = f" (it was fine-tuned from {source})" if source else ""
    if saved_task != task.name:
        raise ConfigError(
            f"--init {init} is fine-tuned for task {saved_task!r}, not {task.name!r}: pass "
            f"--task {saved_task} to evaluate or train it further, or --init the pre-trained model "
            f"to fine-tune for {task.name!r}{origin}."
        )
    saved_columns, columns = trained_columns(init), segment_columns(task.inputs()) if hasattr(task, "inputs") else None
    if saved_columns and columns and len(saved_columns) != len(columns):
        # A one-text model given pairs: evaluated on inputs it never saw ("its scores are reproduced"), or
        # trained on them, without a word.
        raise ConfigError(
            f"--init {init} was fine-tuned on {len(saved_columns)} column(s) ({', '.join(saved_columns)}), "
            f"{train_file or 'the task'} gives {len(columns)} ({', '.join(columns)}): it goes on only with inputs "
            f"of its shape. To fine-tune on these, --init the pre-trained model{origin}."
        )
    if saved_head is not None and keras.saving.serialize_keras_object(
        saved_head
    ) != keras.saving.serialize_keras_object(task.head):
        saved_labels, labels = getattr(saved_head, "labels", None), getattr(task.head, "labels", None)
        if type(saved_head) is type(task.head) and saved_labels is not None and labels is not None:
            now = f"{train_file} has" if train_file else f"task {task.name!r}'s plugin now has"
            raise ConfigError(
                f"--init {init} was fine-tuned on the labels {', '.join(saved_labels)}, but {now} "
                f"{', '.join(labels)}: it goes on only with the labels it learned. To fine-tune for these, "
                f"--init the pre-trained model{origin}."
            )
        raise ConfigError(
            f"--init {init}: its head ({saved_head.get_config()}) differs from the one task {task.name!r} builds "
            f"now ({task.head.get_config()}; from its plugin and {train_file or 'data'}): it goes on only with the "
            f"head it was trained with. To fine-tune a new one, --init the pre-trained model{origin}."
        )
    if transfer_layers is not None or not pretrained_weights:
        raise ConfigError(
            f"--transfer_layers and --nopretrained_weights start from a pre-trained model; --init {init} is fine-tuned."
        )


def untrained_head(init, task):
    """The `ConfigError` of `epochs=0` (evaluate without training) with an `--init` that is not fine-tuned."""
    return ConfigError(
        f"epochs=0 evaluates a fine-tuned model, but --init {init} is not one: its {task.name} "
        f"head would be untrained. Pass --init the --output_dir of a kgpt-train --task {task.name} run."
    )


def recorded(preset, key):
    """What a fine-tuned preset's `metrics.json` records under `key` (`init_dir`, `batch_size`); None without one."""
    path = os.path.join(preset, "metrics.json")
    try:
        return read_json(path, "").get(key) if os.path.exists(path) else None
    except ValueError:
        return None


def build_model(task, start, preprocessor, lm_coef, classifier_dropout, lora_rank=None):
    """The `GPTTaskModel` (uncompiled) on `start`'s backbone, with a fine-tuned `--init`'s head weights and, with
    `lora_rank`, LoRA."""
    model = GPTTaskModel(
        start.backbone,
        head=task.head,
        num_views=task.transform.num_views,
        lm_coef=lm_coef,
        classifier_dropout=classifier_dropout,
        task_name=task.name,
        preprocessor=preprocessor,
        compile=False,
    )
    if start.finetuned is not None:
        model.classifier.set_weights(start.finetuned.classifier.get_weights())
    if lora_rank is not None:
        enable_lora(model, lora_rank)
    return model


def check_lora_rank(rank, width):
    """`--lora_rank` against the width of the model it adapts (`lora.check_rank`), as a `ConfigError`."""
    try:
        return lora.check_rank(rank, width, checks.option("lora_rank"))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def enable_lora(model, rank):
    """`--lora_rank` (checked by `check_config`): only the LoRA factors and the task head train."""
    if not isinstance(model.backbone, lora.LoraMixin):
        raise ConfigError(f"--lora_rank adapts attention layers; the {type(model.backbone).__name__} has none.")
    check_lora_rank(rank, model.backbone.hidden_dim)
    model.backbone.enable_lora(rank)
    logger.info(
        f"LoRA rank {rank} on the query and value projections: {lora.count_trainable(model):,} of "
        f"{model.count_params():,} weights train (the factors and the task head)."
    )
