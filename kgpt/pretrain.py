"""Language-model pre-training on plain text (paper section 3.1).

`pretrain(config)` is what `kgpt-train --task lm` runs; tests call it with a
tiny config. Text is tokenized in memory and trained on random contiguous
windows, as in the paper. The whole corpus is held in memory: streaming
from on-disk token shards is still to come (pre-training issue).
"""

import dataclasses
import glob
import json
import math
import os
from importlib import resources

import keras
import numpy as np

from kgpt.backbone import GPTBackbone
from kgpt.causal_lm import GPTCausalLM
from kgpt.optimizers import gpt_adamw
from kgpt.tokenizer import GPTTokenizer


@dataclasses.dataclass
class PretrainConfig:
    """Pre-training settings; defaults are the paper's (section 4.1)."""

    corpus: str | None = None  # glob or folder of UTF-8 .txt files; None = embedded demo text
    output_dir: str | None = None  # preset + model.keras + logs go here; None = keep nothing
    num_layers: int = 12
    num_heads: int = 12
    hidden_dim: int = 768
    intermediate_dim: int = 3072
    dropout: float = 0.1
    sequence_length: int = 512  # tokens per window (and the model's context)
    batch_size: int = 64  # windows per update
    learning_rate: float = 2.5e-4  # peak of the warm-up + cosine schedule
    warmup_steps: int = 2000
    weight_decay: float = 0.01
    max_steps: int = 10_000  # total updates; the cosine reaches 0 here
    evaluations: int = 10  # validation passes during training (Keras "epochs")
    validation_fraction: float = 0.1  # tail of the token stream held out
    sample_tokens: int = 40  # length of the generated sample printed at the end
    prompt: str | None = None  # sample prompt; None = the first words of the held-out text
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


def corpus_files(pattern):
    """Sorted files of a glob or folder; a clear error if there are none."""
    if os.path.isdir(pattern):
        pattern = os.path.join(pattern, "*.txt")
    files = sorted(f for f in glob.glob(pattern) if os.path.isfile(f))
    if not files:
        raise FileNotFoundError(f"No corpus files match {pattern!r}.")
    return files


def read_corpus(files, log=print):
    """UTF-8 text of each non-empty file; empty files are counted and reported."""
    texts, empty = [], []
    for path in files:
        with open(path, "rb") as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{path}: byte {e.start} (0x{raw[e.start]:02x}) is not valid UTF-8; "
                "re-encode the file as UTF-8."
            ) from None
        if text.strip():
            texts.append(text)
        else:
            empty.append(path)
    if empty:
        log(f"Skipped {len(empty)} empty file(s): {', '.join(empty[:5])}")
    if not texts:
        raise ValueError(f"All {len(files)} corpus file(s) are empty.")
    return texts


def random_windows(ids, sequence_length, batch_size, seed):
    """Endless `tf.data` stream of `(x, y)` batches of random contiguous windows."""
    import tensorflow as tf

    tokens = tf.constant(ids, tf.int32)
    starts = len(ids) - sequence_length  # valid starts: 0 .. starts - 1

    def window(r):
        w = tf.slice(tokens, [r % starts], [sequence_length + 1])
        return {"token_ids": w[:-1], "padding_mask": tf.ones([sequence_length], tf.int32)}, w[1:]

    return (
        tf.data.Dataset.random(seed=seed)
        .map(window, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(batch_size, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def split_tokens(ids, config):
    """Train/validation split of the token stream, with checks on its size."""
    n_val = int(len(ids) * config.validation_fraction)
    train, val = ids[: len(ids) - n_val], ids[len(ids) - n_val :]
    if len(train) <= config.sequence_length:
        raise ValueError(
            f"The corpus has {len(ids)} tokens ({len(train)} for training): fewer than "
            f"one window of sequence_length={config.sequence_length} + 1. Add text or "
            "lower --sequence_length."
        )
    if n_val and len(val) < 2:
        raise ValueError("The validation slice has fewer than 2 tokens; raise validation_fraction.")
    return train, val


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


def pretrain(config, log=print):
    """Trains a GPT language model; returns `(causal_lm, tokenizer, metrics)`."""
    keras.utils.set_random_seed(config.seed)
    files = corpus_files(config.corpus) if config.corpus else [demo_corpus_path()]
    tokenizer = GPTTokenizer.gpt1()
    texts = read_corpus(files, log=log)
    ids = np.concatenate([np.asarray(tokenizer.encode(t), "int32") for t in texts])
    log(f"Corpus: {len(files)} file(s), {len(ids):,} tokens (GPT-1 BPE, vocabulary {tokenizer.vocabulary_size:,}).")
    train_ids, val_ids = split_tokens(ids, config)

    backbone = GPTBackbone.from_sizes(config, tokenizer.vocabulary_size, config.sequence_length)
    lm = GPTCausalLM(backbone)
    lm.compile(
        optimizer=gpt_adamw(
            config.learning_rate,
            warmup_steps=config.warmup_steps,
            total_steps=config.max_steps,
            weight_decay=config.weight_decay,
        ),
        sampler="top_k",
    )
    log(f"Model: {backbone.count_params():,} weights; {config.max_steps} steps of "
        f"{config.batch_size} x {config.sequence_length} tokens.")

    evaluations = evaluation_count(config.max_steps, config.evaluations)
    if evaluations != config.evaluations:
        log(f"Evaluating {evaluations} times (every {config.max_steps // evaluations} steps) so that "
            f"exactly max_steps={config.max_steps} steps are trained.")
    steps_per_eval = config.max_steps // evaluations
    train = random_windows(train_ids, config.sequence_length, config.batch_size, config.seed)
    validation = None
    if len(val_ids):
        val_x, val_y, dropped = validation_windows(val_ids, config.sequence_length)
        validation = (val_x, val_y)
        log(f"Validation: {len(val_y)} window(s) of {val_y.shape[1]} tokens"
            + (f" ({dropped} trailing token(s) not scored)." if dropped else "."))

    callbacks = []
    if config.output_dir:
        os.makedirs(config.output_dir, exist_ok=True)
        callbacks.append(keras.callbacks.CSVLogger(os.path.join(config.output_dir, "history.csv")))
    history = lm.fit(
        train,
        epochs=evaluations,
        steps_per_epoch=steps_per_eval,
        validation_data=validation,
        callbacks=callbacks,
        shuffle=False,  # windows are already drawn at random
        verbose=1 if os.isatty(1) else 2,
    )
    metrics = {"train_loss": [float(v) for v in history.history["loss"]], "tokens": int(len(ids))}
    if validation:
        val_losses = history.history["val_loss"]
        metrics["validation_loss"] = [float(v) for v in val_losses]
        metrics["validation_perplexity"] = [float(math.exp(min(v, 50))) for v in val_losses]
        log("Validation perplexity: " + " -> ".join(f"{p:,.1f}" for p in metrics["validation_perplexity"]))
    log("Training loss: " + " -> ".join(f"{v:.3f}" for v in metrics["train_loss"]))

    held_out = val_ids if len(val_ids) >= 4 else train_ids
    prompt = tokenizer.encode(config.prompt) if config.prompt else [int(i) for i in held_out[:4]]
    length = min(config.sequence_length, len(prompt) + config.sample_tokens)
    sample = lm.generate([prompt], max_length=length)["token_ids"][0]
    metrics["sample"] = tokenizer.decode(sample)
    log(f"Sample: {metrics['sample']}")

    if config.output_dir:
        lm.save(os.path.join(config.output_dir, "model.keras"))
        # A keras-hub preset: GPTBackbone.from_preset(dir) and
        # GPTTokenizer.from_preset(dir) load it; fine-tuning takes --init dir.
        lm.backbone.save_to_preset(config.output_dir)
        tokenizer.save(os.path.join(config.output_dir, "tokenizer"))
        with open(os.path.join(config.output_dir, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=2)
        log(f"Saved the preset (config.json, model.weights.h5, tokenizer/), model.keras, history.csv "
            f"and metrics.json in {config.output_dir}")
    return lm, tokenizer, metrics
