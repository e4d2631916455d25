"""Language-model pre-training on plain text (paper section 3.1).

`pretrain(config)` is what `kgpt-train --task lm` runs; tests call it with a
tiny config. The corpus is tokenized once into token shards on disk
(`kgpt.data.shards`), training samples random contiguous windows from them, the
tail of the token stream is held out for validation perplexity, and with an
`output_dir` a checkpoint is written every `checkpoint_every` steps: a rerun
with the same settings resumes from it.
"""

import dataclasses
import glob
import math
import os
import tempfile
import time
from importlib import resources

import keras
import numpy as np

from kgpt.train import checkpoint as checkpoint_lib
from kgpt.analysis import zero_shot as zero_shot_lib
from kgpt.train.callbacks import Progress, StopOnNonFiniteLoss
from kgpt.errors import ConfigError
from kgpt.jobs.rundir import RunDirectory, save_preset, write_json
from kgpt.models.backbone import GPTBackbone
from kgpt.models.causal_lm import GPTCausalLM
from kgpt.data.causal_lm_preprocessor import GPTCausalLMPreprocessor
from kgpt.train.distribute import training_scope
from kgpt.models.lstm import LSTMBackbone
from kgpt.train.optimizers import gpt_adamw
from kgpt.data.shards import build_shards
from kgpt.data.tokenizer import PRESET_CONFIG, GPTTokenizer


@dataclasses.dataclass
class PretrainConfig:
    """Pre-training settings; defaults are the paper's (section 4.1)."""

    corpus: str | None = None  # glob or folder of UTF-8 .txt files; None = embedded demo text
    tokenizer: str | None = None  # None = the original GPT-1 BPE; "train" = learn one from the corpus; or a folder
    num_merges: int = 40_000  # with tokenizer="train"
    output_dir: str | None = None  # the preset, checkpoints and logs go here; None = keep nothing
    overwrite: bool = False  # replace another run's outputs in output_dir instead of refusing
    architecture: str = "transformer"  # or "lstm": the Table 5 ablation (kgpt.LSTMBackbone)
    num_layers: int = 12  # transformer blocks (LSTM layers with architecture="lstm"; the paper's LSTM has 1)
    num_heads: int = 12
    hidden_dim: int = 768
    intermediate_dim: int = 3072
    lstm_units: int = 2048  # with architecture="lstm"
    dropout: float = 0.1
    attention_dropout: float | None = None  # None = dropout (paper); 0 = fused/flash attention in training
    lm_loss_chunk_size: int = 1024  # tokens whose logits the LM loss holds at once (kgpt.models.lm_loss); 0 = all, as logits
    sequence_length: int = 512  # tokens per window (and the model's context)
    batch_size: int = 64  # windows per update
    learning_rate: float = 2.5e-4  # peak of the warm-up + cosine schedule
    warmup_steps: int = 2000
    weight_decay: float = 0.01
    max_steps: int = 10_000  # total updates; the cosine reaches 0 here
    evaluations: int = 10  # validation passes during training (Keras "epochs")
    validation_fraction: float = 0.1  # tail of the token stream held out ...
    validation_tokens: int = 262_144  # ... but at most this many tokens (512 windows of 512)
    checkpoint_every: int = 500  # steps between checkpoints in output_dir/checkpoint; 0 = none
    shards_dir: str | None = None  # token shards; None = output_dir/shards (or a temporary folder)
    sample_tokens: int = 40  # length of the generated sample printed at the end
    prompt: str | None = None  # sample prompt; None = the first words of the held-out text
    distribution: str = "none"  # or "data_parallel": every local GPU/TPU core (kgpt.train.distribute)
    dtype: str | None = None  # e.g. "mixed_bfloat16"; None = Keras' global policy (float32)
    zero_shot: dict | None = None  # {task: data_dir or None (its embedded data)} evaluated zero-shot (Figure 2 right)
    zero_shot_every: int | None = None  # steps between zero-shot evaluations; None = at each validation
    zero_shot_examples: int | None = None  # examples per split in those evaluations; None = all
    seed: int = 0


# The embedded run: a small model a 2-core CPU trains in a couple of minutes.
DEMO_SETTINGS = dict(
    num_layers=2,
    num_heads=4,
    hidden_dim=128,
    intermediate_dim=512,
    sequence_length=64,
    batch_size=8,
    learning_rate=1e-3,
    warmup_steps=20,
    max_steps=200,
    evaluations=5,
)


def demo_corpus_path():
    return str(resources.files("kgpt") / "assets" / "demo_corpus.txt")


def corpus_files(pattern, log=print):
    """Sorted files of a glob or folder (`*.txt` in a folder); a clear error if there are none.

    A match that is a broken or looping symbolic link, or that cannot be
    read, is an error naming it; folders that match are skipped and counted.
    """
    if os.path.isdir(pattern):
        pattern = os.path.join(pattern, "*.txt")
    files, folders = [], []
    for path in sorted(glob.glob(pattern)):
        try:
            os.stat(path)  # follows symbolic links
        except OSError as e:
            target = f" (a link to {os.readlink(path)!r})" if os.path.islink(path) else ""
            raise OSError(e.errno, f"{path}{target}: {e.strerror}") from e
        if os.path.isdir(path):
            folders.append(path)
        elif not os.access(path, os.R_OK):
            raise PermissionError(f"{path}: cannot be read (permission denied).")
        else:
            files.append(path)
    if folders:
        log(f"Skipped {len(folders)} folder(s) matching {pattern!r}: {', '.join(folders[:3])}"
            + (" ..." if len(folders) > 3 else ""))
    if not files:
        raise FileNotFoundError(f"No corpus files match {pattern!r}.")
    return files


def load_tokenizer(config, files, log=print):
    """The run's tokenizer: GPT-1's, one learned from `files` (kept in the output), or one from a folder."""
    if config.tokenizer is None:
        return GPTTokenizer.gpt1()
    if config.tokenizer != "train":
        return GPTTokenizer.from_preset(config.tokenizer)
    saved = config.output_dir and os.path.isfile(os.path.join(config.output_dir, PRESET_CONFIG))
    if saved:  # a resumed run keeps the vocabulary it started with
        log(f"Using the tokenizer learned earlier in {config.output_dir}.")
        return GPTTokenizer.from_preset(config.output_dir)
    log(f"Learning a BPE vocabulary of {config.num_merges:,} merges from the corpus ...")
    tokenizer = GPTTokenizer.train(files, num_merges=config.num_merges, log=log)
    if config.output_dir:
        tokenizer.save_to_preset(config.output_dir)
    log(f"Learned {len(tokenizer.merges):,} merges: vocabulary {tokenizer.vocabulary_size():,} with special tokens.")
    return tokenizer


def split_point(total, config):
    """Index where the held-out tail of a `total`-token stream starts, with checks on its size."""
    n_val = min(int(total * config.validation_fraction), config.validation_tokens)
    train = total - n_val
    if train <= config.sequence_length:
        raise ValueError(
            f"The corpus has {total} tokens ({train} for training): fewer than "
            f"one window of sequence_length={config.sequence_length} + 1. Add text or "
            "lower --sequence_length."
        )
    if n_val and n_val < 2:
        raise ValueError("The validation slice has fewer than 2 tokens; raise validation_fraction.")
    return train


def run_settings(config):
    """What a pre-training run's outputs depend on (`run.json`, checkpoints): the config without its place."""
    settings = dataclasses.asdict(config)
    for key in ("output_dir", "overwrite", "shards_dir", "checkpoint_every"):  # none changes the outputs
        settings.pop(key)
    if settings["corpus"]:
        settings["corpus"] = os.path.abspath(settings["corpus"])
    if settings["tokenizer"] not in (None, "train"):
        settings["tokenizer"] = os.path.abspath(settings["tokenizer"])
    return settings


def check_config(config):
    """Raises `ConfigError` for settings that cannot run, before anything is read or built."""
    at_least = {"batch_size": 1, "sequence_length": 1, "max_steps": 1, "evaluations": 1, "num_layers": 1,
                "num_heads": 1, "hidden_dim": 1, "intermediate_dim": 1, "num_merges": 0, "warmup_steps": 0,
                "checkpoint_every": 0, "validation_tokens": 0, "sample_tokens": 0, "lm_loss_chunk_size": 0}
    for name, low in at_least.items():
        value = getattr(config, name, low)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}.")
    for name in ("learning_rate", "weight_decay"):
        value = getattr(config, name)
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a finite number >= 0, got {value}.")
    for name in ("dropout", "validation_fraction"):
        value = getattr(config, name)
        if not 0 <= value < 1:
            raise ConfigError(f"{name} must be in [0, 1), got {value}.")


class PretrainProgress(Progress):
    """`kgpt.train.callbacks.Progress` that also keeps the zero-shot evaluations in the checkpoint."""

    def __init__(self, *args, zero_shot=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.zero_shot = zero_shot

    def extra_state(self):
        return {"zero_shot": self.zero_shot.rows()} if self.zero_shot is not None else {}


def _progress(config, lm, steps_per_eval, total, tokenizer, zero_shot, log):
    """`(progress callback, step to start from)`, restoring the run's checkpoint when there is one."""
    settings = run_settings(config) | {"corpus_tokens": int(total), "tokenizer": tokenizer.fingerprint()}
    directory = os.path.join(config.output_dir, "checkpoint") if config.output_dir else None
    state = checkpoint_lib.restore(lm, directory, settings) if directory else None
    if state is not None:
        log(f"Resuming from the checkpoint at step {state['step']:,} of {config.max_steps:,} ({directory}).")
        if zero_shot is not None:
            zero_shot.restore([row for row in state.get("zero_shot", []) if row[0] <= state["step"]])
    history = os.path.join(config.output_dir, "history.csv") if config.output_dir else None
    every = config.checkpoint_every if directory else 0
    progress = PretrainProgress(directory if config.checkpoint_every else None, settings, steps_per_eval, every,
                                history, state, zero_shot=zero_shot)
    return progress, progress.step


def _segments(start, steps_per_eval, evaluations):
    """`(initial_epoch, epochs, steps_per_epoch, first_batch)` fit calls from step `start`.

    A resumed run first finishes its interrupted evaluation period, so that
    validation still falls every `steps_per_eval` steps.
    """
    epoch, done = divmod(start, steps_per_eval)
    if done:
        yield epoch, epoch + 1, steps_per_eval - done, start
        epoch += 1
    if epoch < evaluations:
        yield epoch, evaluations, steps_per_eval, epoch * steps_per_eval


def validation_windows(val, sequence_length):
    """Non-overlapping windows covering the held-out tokens (last one shorter is dropped and counted)."""
    length = min(sequence_length, len(val) - 1)
    count = (len(val) - 1) // length
    windows = np.stack([val[i * length : i * length + length + 1] for i in range(count)])
    x = {"token_ids": windows[:, :-1], "padding_mask": np.ones_like(windows[:, :-1])}
    return x, windows[:, 1:], (len(val) - 1) - count * length


def evaluation_count(max_steps, wanted):
    """The largest count <= `wanted` that divides `max_steps` (Keras epochs are equal)."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}.")
    return max(d for d in range(1, max(1, min(wanted, max_steps)) + 1) if max_steps % d == 0)


def build_backbone(config, vocabulary_size):
    """A fresh backbone of `config.architecture` and sizes."""
    if config.architecture == "transformer":
        return GPTBackbone.from_sizes(config, vocabulary_size, config.sequence_length)
    if config.architecture == "lstm":
        return LSTMBackbone(vocabulary_size, hidden_dim=config.hidden_dim, lstm_units=config.lstm_units,
                            num_layers=config.num_layers, max_sequence_length=config.sequence_length,
                            dropout=config.dropout)
    raise ValueError(f"architecture must be 'transformer' or 'lstm', got {config.architecture!r}.")


def zero_shot_callback(config, tokenizer, steps_per_eval, scratch_dir, log):
    """The `ZeroShotCallback` for `config.zero_shot`, or None; writes embedded data where no dir is given."""
    if not config.zero_shot:
        return None
    tasks = zero_shot_lib.resolve_tasks(config.zero_shot, config.output_dir or scratch_dir, log=log)
    every = config.zero_shot_every or steps_per_eval
    log(f"Zero-shot evaluation of {', '.join(tasks)} every {every} steps.")
    out = config.output_dir
    return zero_shot_lib.ZeroShotCallback(
        tasks, tokenizer, every,
        csv_path=os.path.join(out, "zero_shot.csv") if out else None,
        log_dir=os.path.join(out, "logs") if out else None,
        max_examples=config.zero_shot_examples, log=log,
    )


def prepare(config, log=print):
    """Learns or loads the tokenizer and builds the token shards, then stops (`kgpt-train --prepare_only`).

    Returns the `ShardIndex`. Without `shards_dir` or `output_dir` the shards
    go to a temporary folder that is deleted (a measure of speed only).
    """
    start = time.perf_counter()
    check_config(config)
    if config.output_dir:
        with RunDirectory(config.output_dir, "pretrain", run_settings(config), overwrite=config.overwrite):
            index, _ = _prepare(config, config.shards_dir or os.path.join(config.output_dir, "shards"), log)
    elif config.shards_dir:
        index, _ = _prepare(config, config.shards_dir, log)
    else:
        log("No --output_dir or --shards_dir: the shards are deleted at exit.")
        with tempfile.TemporaryDirectory(prefix="kgpt-shards-") as shards_dir:
            index, _ = _prepare(config, shards_dir, log)
    log(f"Prepared {index.total_tokens:,} tokens (tokenizer and shards) in {time.perf_counter() - start:.1f} s.")
    return index


def _prepare(config, shards_dir, log):
    """`(ShardIndex, tokenizer)` of the run's corpus."""
    files = corpus_files(config.corpus, log=log) if config.corpus else [demo_corpus_path()]
    tokenizer = load_tokenizer(config, files, log=log)
    index = build_shards(files, tokenizer, shards_dir, log=log)
    log(f"Corpus: {len(files)} file(s), {index.total_tokens:,} tokens (vocabulary {tokenizer.vocabulary_size():,}).")
    return index, tokenizer


def pretrain(config, log=print):
    """Trains a GPT language model; returns `(causal_lm, tokenizer, metrics)`."""
    check_config(config)
    if config.output_dir:
        with RunDirectory(config.output_dir, "pretrain", run_settings(config), overwrite=config.overwrite):
            return _prepare_and_train(config, config.shards_dir or os.path.join(config.output_dir, "shards"), log)
    if config.shards_dir:
        return _prepare_and_train(config, config.shards_dir, log)
    with tempfile.TemporaryDirectory(prefix="kgpt-shards-") as shards_dir:  # nothing kept without output_dir
        return _prepare_and_train(config, shards_dir, log)


def _prepare_and_train(config, shards_dir, log):
    # The shards first: their worker processes are forked before JAX or
    # TensorFlow start threads for the devices.
    index, tokenizer = _prepare(config, shards_dir, log)
    with training_scope(config.distribution, config.dtype, config.batch_size, log=log) as replicas:
        return _pretrain(config, index, tokenizer, replicas, log)


def _pretrain(config, index, tokenizer, replicas, log):
    keras.utils.set_random_seed(config.seed)
    total = index.total_tokens
    train_end = split_point(total, config)

    backbone = build_backbone(config, tokenizer.vocabulary_size())
    lm = GPTCausalLM(backbone)
    lm.compile(
        optimizer=gpt_adamw(
            config.learning_rate,
            warmup_steps=config.warmup_steps,
            total_steps=config.max_steps,
            weight_decay=config.weight_decay,
        ),
        sampler="top_k",
        lm_loss_chunk_size=config.lm_loss_chunk_size or None,
    )
    log(f"Model: {backbone.count_params():,} weights; {config.max_steps} steps of "
        f"{config.batch_size} x {config.sequence_length} tokens.")

    evaluations = evaluation_count(config.max_steps, config.evaluations)
    if evaluations != config.evaluations:
        log(f"Evaluating {evaluations} times (every {config.max_steps // evaluations} steps) so that "
            f"exactly max_steps={config.max_steps} steps are trained.")
    steps_per_eval = config.max_steps // evaluations
    validation = None
    val_ids = index.tokens(train_end, total)
    if len(val_ids):
        val_x, val_y, dropped = validation_windows(val_ids, config.sequence_length)
        uneven = len(val_y) % replicas if len(val_y) >= replicas else 0
        if uneven:  # every batch must split evenly over the devices
            val_x = {k: v[: len(val_y) - uneven] for k, v in val_x.items()}
            val_y = val_y[: len(val_y) - uneven]
            dropped += uneven * val_y.shape[1]
        validation = (val_x, val_y)
        log(f"Validation: {len(val_y)} window(s) of {val_y.shape[1]} tokens"
            + (f" ({dropped} trailing token(s) not scored)." if dropped else "."))

    zero_shot = zero_shot_callback(config, tokenizer, steps_per_eval, index.directory, log)
    progress, start = _progress(config, lm, steps_per_eval, total, tokenizer, zero_shot, log)
    callbacks = [StopOnNonFiniteLoss(f"Lower --learning_rate ({config.learning_rate:g}); the last checkpoint is "
                                     f"kept.", start), progress]
    if config.output_dir:
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(config.output_dir, "logs")))
    if zero_shot is not None:
        callbacks.append(zero_shot)
    for initial_epoch, epochs, steps, first_batch in _segments(start, steps_per_eval, evaluations):
        train = index.windows(config.sequence_length, config.batch_size, config.seed, stop=train_end,
                              first_batch=first_batch)
        lm.fit(train, initial_epoch=initial_epoch, epochs=epochs, steps_per_epoch=steps, validation_data=validation,
               callbacks=callbacks, shuffle=False,  # windows are already drawn at random
               verbose=1 if os.isatty(1) else 2)
    history = progress.history
    metrics = {"train_loss": [float(v) for v in history.get("loss", [])], "tokens": int(total),
               "resumed_from_step": start, "optimizer_steps": progress.step}
    if zero_shot is not None:
        metrics["zero_shot"] = {f"{task}/{metric}": points for (task, metric), points in zero_shot.history.items()}
    if validation and "val_loss" in history:
        val_losses = history["val_loss"]
        metrics["validation_loss"] = [float(v) for v in val_losses]
        metrics["validation_perplexity"] = [float(math.exp(min(v, 50))) for v in val_losses]
        log("Validation perplexity: " + " -> ".join(f"{p:,.1f}" for p in metrics["validation_perplexity"]))
    if metrics["train_loss"]:
        log("Training loss: " + " -> ".join(f"{v:.3f}" for v in metrics["train_loss"]))

    held_out = val_ids if len(val_ids) >= 4 else index.tokens(0, 4)
    prompt = tokenizer.encode(config.prompt) if config.prompt else [int(i) for i in held_out[:4]]
    length = min(config.sequence_length, len(prompt) + config.sample_tokens)
    # One prompt per device: a data-parallel model splits every batch evenly.
    sample = lm.generate([prompt] * replicas, max_length=length)["token_ids"][0]
    metrics["sample"] = tokenizer.decode(sample)
    log(f"Sample: {metrics['sample']}")

    # Text in, text out from here on (and in the preset): lm.generate("..."), lm.score("...").
    lm.preprocessor = GPTCausalLMPreprocessor(tokenizer, sequence_length=config.sequence_length)
    if config.output_dir:
        # A keras-hub preset: GPTCausalLM/GPTBackbone/GPTTokenizer.from_preset(dir)
        # load it (the preprocessor saves the tokenizer); fine-tuning takes --init dir.
        save_preset(lm, config.output_dir)
        write_json(os.path.join(config.output_dir, "metrics.json"), metrics)  # last: the preset is complete
        log(f"Saved the preset (config.json, model.weights.h5, task.json, preprocessor.json, tokenizer.json, assets/), "
            f"history.csv, logs/ and metrics.json in {config.output_dir}")
    return lm, tokenizer, metrics
