"""Language-model pre-training on plain text (paper section 3.1).

`pretrain(config)` is what `kgpt-train --task lm` runs; tests call it with a
tiny config. The corpus is tokenized once into token shards on disk
(`kgpt.shards`), training samples random contiguous windows from them, the
tail of the token stream is held out for validation perplexity, and with an
`output_dir` a checkpoint is written every `checkpoint_every` steps: a rerun
with the same settings resumes from it.
"""

import dataclasses
import glob
import json
import math
import os
import tempfile
import time
from importlib import resources

import keras
import numpy as np

from kgpt import zero_shot as zero_shot_lib
from kgpt.backbone import GPTBackbone
from kgpt.causal_lm import GPTCausalLM
from kgpt.causal_lm_preprocessor import GPTCausalLMPreprocessor
from kgpt.distribute import training_scope
from kgpt.lstm import LSTMBackbone
from kgpt.optimizers import gpt_adamw
from kgpt.shards import build_shards
from kgpt.tokenizer import PRESET_CONFIG, GPTTokenizer


@dataclasses.dataclass
class PretrainConfig:
    """Pre-training settings; defaults are the paper's (section 4.1)."""

    corpus: str | None = None  # glob or folder of UTF-8 .txt files; None = embedded demo text
    tokenizer: str | None = None  # None = the original GPT-1 BPE; "train" = learn one from the corpus; or a folder
    num_merges: int = 40_000  # with tokenizer="train"
    output_dir: str | None = None  # the preset, checkpoints and logs go here; None = keep nothing
    architecture: str = "transformer"  # or "lstm": the Table 5 ablation (kgpt.LSTMBackbone)
    num_layers: int = 12  # transformer blocks (LSTM layers with architecture="lstm"; the paper's LSTM has 1)
    num_heads: int = 12
    hidden_dim: int = 768
    intermediate_dim: int = 3072
    lstm_units: int = 2048  # with architecture="lstm"
    dropout: float = 0.1
    attention_dropout: float | None = None  # None = dropout (paper); 0 = fused/flash attention in training
    lm_loss_chunk_size: int = 1024  # tokens whose logits the LM loss holds at once (kgpt.lm_loss); 0 = all, as logits
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
    distribution: str = "none"  # or "data_parallel": every local GPU/TPU core (kgpt.distribute)
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


# Settings a checkpoint must share with the run that resumes it.
_RESUME_KEYS = ("architecture", "lstm_units", "attention_dropout", "num_layers", "num_heads", "hidden_dim", "intermediate_dim", "dropout", "sequence_length",
                "batch_size", "learning_rate", "warmup_steps", "weight_decay", "max_steps", "evaluations", "seed")


class StepCheckpoint(keras.callbacks.Callback):
    """Saves weights + optimizer state every `every` steps, replacing the previous checkpoint.

    The step is the optimizer's own iteration count, saved inside the weights
    file, so a kill at any moment leaves a consistent checkpoint.
    """

    def __init__(self, directory, every, state):
        super().__init__()
        self.directory, self.every, self.state = directory, every, state

    @property
    def weights_path(self):
        return os.path.join(self.directory, "checkpoint.weights.h5")

    def on_train_batch_end(self, batch, logs=None):
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        if step % self.every == 0:
            self.save(step)

    def save(self, step):
        os.makedirs(self.directory, exist_ok=True)
        tmp = os.path.join(self.directory, "partial.weights.h5")
        self.model.save_weights(tmp)
        os.replace(tmp, self.weights_path)  # atomic: the old checkpoint stays valid until here
        _write_json(os.path.join(self.directory, "state.json"), {**self.state, "step": step})


def _write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def resume(lm, directory, state, log=print):
    """Loads the checkpoint in `directory` into `lm`; returns the step to continue from (0 if none)."""
    weights = os.path.join(directory, "checkpoint.weights.h5")
    state_path = os.path.join(directory, "state.json")
    if not os.path.exists(weights) or not os.path.exists(state_path):
        return 0
    with open(state_path, encoding="utf-8") as f:
        saved = json.load(f)
    different = {k: (saved.get(k), v) for k, v in state.items() if saved.get(k) != v}
    if different:
        raise ValueError(
            f"{directory} holds a checkpoint of a run with other settings ("
            + ", ".join(f"{k}: {old} there, {new} now" for k, (old, new) in different.items())
            + "). Use another --output_dir, or delete the checkpoint folder to start over."
        )
    lm.optimizer.build(lm.trainable_variables)
    try:
        lm.load_weights(weights)
    except Exception as e:  # h5py/Keras raise many types for a damaged file
        raise ValueError(f"{weights}: the checkpoint cannot be read ({type(e).__name__}: {e}); "
                         "delete it to start over.") from e
    step = int(keras.ops.convert_to_numpy(lm.optimizer.iterations))
    log(f"Resuming from the checkpoint at step {step:,} of {state['max_steps']:,} ({directory}).")
    return step


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
    if config.shards_dir or config.output_dir:
        index, _ = _prepare(config, config.shards_dir or os.path.join(config.output_dir, "shards"), log)
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
    if config.shards_dir or config.output_dir:
        return _prepare_and_train(config, config.shards_dir or os.path.join(config.output_dir, "shards"), log)
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

    state = {k: getattr(config, k) for k in _RESUME_KEYS} | {"corpus_tokens": total,
                                                            "tokenizer": tokenizer.fingerprint()}
    callbacks, start = [], 0
    if config.output_dir:
        os.makedirs(config.output_dir, exist_ok=True)
        checkpoint_dir = os.path.join(config.output_dir, "checkpoint")
        start = resume(lm, checkpoint_dir, state, log=log)
        callbacks += [
            keras.callbacks.CSVLogger(os.path.join(config.output_dir, "history.csv"), append=start > 0),
            keras.callbacks.TensorBoard(os.path.join(config.output_dir, "logs")),
        ]
        if config.checkpoint_every:
            callbacks.append(StepCheckpoint(checkpoint_dir, config.checkpoint_every, state))
    zero_shot = zero_shot_callback(config, tokenizer, steps_per_eval, index.directory, log)
    if zero_shot is not None:
        callbacks.append(zero_shot)

    history = {}
    # A resumed run first finishes the interrupted evaluation period, so that
    # validation still falls every steps_per_eval steps.
    segments = []
    if start % steps_per_eval:
        segments.append((start // steps_per_eval, 1 + start // steps_per_eval, steps_per_eval - start % steps_per_eval))
    first_full = math.ceil(start / steps_per_eval)
    if first_full < evaluations:
        segments.append((first_full, evaluations, steps_per_eval))
    step = start
    for initial_epoch, epochs, steps in segments:
        train = index.windows(config.sequence_length, config.batch_size, config.seed, stop=train_end,
                              first_batch=step)
        run = lm.fit(
            train,
            initial_epoch=initial_epoch,
            epochs=epochs,
            steps_per_epoch=steps,
            validation_data=validation,
            callbacks=callbacks,
            shuffle=False,  # windows are already drawn at random
            verbose=1 if os.isatty(1) else 2,
        )
        step += (epochs - initial_epoch) * steps
        for key, values in run.history.items():
            history.setdefault(key, []).extend(values)
    metrics = {"train_loss": [float(v) for v in history.get("loss", [])], "tokens": int(total),
               "resumed_from_step": start, "optimizer_steps": int(keras.ops.convert_to_numpy(lm.optimizer.iterations))}
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
        lm.save_to_preset(config.output_dir)
        with open(os.path.join(config.output_dir, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=2)
        log(f"Saved the preset (config.json, model.weights.h5, task.json, preprocessor.json, tokenizer.json, assets/), "
            f"history.csv, logs/ and metrics.json in {config.output_dir}")
    return lm, tokenizer, metrics
