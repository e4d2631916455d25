"""Language-model pre-training on plain text (paper section 3.1).

`pretrain(config)` is what `kgpt-train --task lm` runs; tests call it with a
tiny config. The corpus is tokenized once into token shards on disk
(`kgpt.data.shards`), training samples random contiguous windows from them, the
tail of the token stream is held out for validation perplexity, and with an
`output_dir` a checkpoint is written every `checkpoint_every` steps: a rerun
with the same settings resumes from it (`kgpt.jobs.run` is the skeleton).
"""

import glob
import logging
import math
import os
import time

import numpy as np

from kgpt import checks
from kgpt.analysis import zero_shot as zero_shot_lib
from kgpt.checks import positive_int
from kgpt.data import demo_world
from kgpt.data.shards import Team, build_shards
from kgpt.errors import ConfigError, DataError
from kgpt.io import storage
from kgpt.io.run_folder import saving_outputs
from kgpt.jobs import run
from kgpt.jobs.config import SEEDS, check_integers, check_model_sizes, check_settings, recorded_settings, setting
from kgpt.jobs.rundir import check_inputs_outside
from kgpt.models.gpt.gpt_backbone import GPTBackbone
from kgpt.models.gpt.gpt_causal_lm import GPTCausalLM
from kgpt.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor
from kgpt.models.gpt.gpt_task_preprocessor import MIN_MAX_LENGTH
from kgpt.models.gpt.gpt_tokenizer import GPTTokenizer, read_tokenizer
from kgpt.models.lstm.lstm_backbone import LSTMBackbone
from kgpt.parallel import cluster, distribute
from kgpt.tasks.registry import TaskRegistry
from kgpt.tokenizers.interface import PRESET_CONFIG
from kgpt.train.callbacks import EpochBar, Progress, sigterm_received
from kgpt.train.optimizers import gpt_adamw

logger = logging.getLogger(__name__)


def corpus_files(pattern):
    """Sorted files of a glob (`**` matches folders at any depth) or folder (its `*.txt`); a clear error if there
    are none.

    A match that is a broken or looping symbolic link, or that cannot be
    read, is an error naming it; folders that match are skipped and counted,
    and so is what a folder holds besides its `*.txt` files.
    """
    if os.path.isdir(pattern):
        _unread_in_folder(pattern)
        pattern = os.path.join(pattern, "*.txt")
    files, folders = [], []
    for path in sorted(glob.glob(pattern, recursive=True)):
        try:
            os.stat(path)  # follows symbolic links
        except OSError as e:
            target = f" (a link to {os.readlink(path)!r})" if os.path.islink(path) else ""
            raise OSError(e.errno, f"{path}{target}: {e.strerror}") from e
        if os.path.isdir(path):
            folders.append(path)
        elif not os.path.isfile(path):  # /dev/zero, a pipe: no size to split, and perhaps no end
            raise DataError(
                f"--corpus {path} is not a regular file: the corpus is read in chunks split by size, by "
                f"several workers; write it to a file first."
            )
        elif not os.access(path, os.R_OK):
            raise PermissionError(f"{path}: cannot be read (permission denied).")
        else:
            files.append(path)
    if folders:
        logger.info(
            f"Skipped {len(folders)} folder(s) matching {pattern!r}: {', '.join(folders[:3])}"
            + (" ..." if len(folders) > 3 else "")
        )
    if not files:
        raise FileNotFoundError(f"No corpus files match {pattern!r}.")
    return files


def _unread_in_folder(folder):
    """Warns of what a --corpus folder holds that is not read: files not named *.txt (.TXT, .gz, .md, hidden
    ones), and subfolders."""
    names = sorted(os.listdir(folder))
    read = set(os.path.basename(p) for p in glob.glob(os.path.join(glob.escape(folder), "*.txt")))
    subfolders = [n + "/" for n in names if n not in read and os.path.isdir(os.path.join(folder, n))]
    others = [n for n in names if n not in read and n + "/" not in subfolders]
    if others:
        logger.warning(
            f"Warning: --corpus {folder}: {len(others)} other file(s) not read ({_few(others)}): a folder gives its "
            f"*.txt files, hidden ones excepted; name a file *.txt (a .gz decompressed) to read it."
        )
    if subfolders:
        logger.warning(
            f"Warning: --corpus {folder}: {len(subfolders)} subfolder(s) not read ({_few(subfolders)}): to read "
            f"their *.txt files too, pass a pattern in quotes, such as '{os.path.join(folder, '**', '*.txt')}'."
        )


def _few(names):
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def load_tokenizer(tokenizer, num_merges, files, work):
    """The run's tokenizer, by the `tokenizer` setting: GPT-1's (None), one of `num_merges` merges learned from
    `files` ("train", kept in the `Run`'s output), or the one in a folder."""
    if tokenizer is None:
        return GPTTokenizer.gpt1()
    if tokenizer != "train":
        return read_tokenizer(tokenizer, flag="--tokenizer")
    if work.kept and os.path.isfile(os.path.join(work.directory, PRESET_CONFIG)):
        # A resumed run keeps the vocabulary it started with.
        logger.info(f"Using the tokenizer learned earlier in {work.location}.")
        return GPTTokenizer.from_preset(work.directory)
    logger.info(f"Learning a BPE vocabulary of {num_merges:,} merges from the corpus ...")
    tokenizer = GPTTokenizer.train(files, num_merges=num_merges)
    if work.kept:
        with saving_outputs(work.directory):  # the run's own folder: saves from Python are refused there
            tokenizer.save_to_preset(work.directory)
        work.publish()
    logger.info(
        f"Learned {len(tokenizer.merges):,} merges: vocabulary {tokenizer.vocabulary_size():,} with special tokens."
    )
    return tokenizer


def split_point(total, validation_fraction, validation_tokens, sequence_length):
    """Index where the held-out tail of a `total`-token stream starts (`validation_fraction` of it, at most
    `validation_tokens`), with checks on its size."""
    n_val = min(int(total * validation_fraction), validation_tokens)
    train = total - n_val
    if train <= sequence_length:
        raise ConfigError(
            f"The corpus has {total} tokens ({train} for training): fewer than "
            f"one window of sequence_length={sequence_length} + 1. Add text or "
            "lower --sequence_length."
        )
    if n_val and n_val < 2:
        raise ConfigError("The validation slice has fewer than 2 tokens; raise --validation_fraction.")
    return train


def run_settings(config):
    """What a pre-training run's outputs depend on (`run.json`, checkpoints): the config without its place."""
    # None of these changes the outputs.
    settings = recorded_settings(config, drop=("output_dir", "overwrite", "shards_dir", "checkpoint_every"))
    if settings["corpus"]:
        settings["corpus"] = os.path.abspath(settings["corpus"])
    if settings["tokenizer"] not in (None, "train"):
        settings["tokenizer"] = os.path.abspath(settings["tokenizer"])
    return settings


def check_config(config):
    """Raises `ConfigError` for settings that cannot run, before anything is read or built."""
    check_integers(
        config,
        "batch_size",
        sequence_length=1,
        max_steps=1,
        evaluations=1,
        lstm_units=1,
        num_merges=0,
        warmup_steps=0,
        validation_tokens=0,
        sample_tokens=0,
        zero_shot_every=1,
        zero_shot_examples=1,
        seed=SEEDS,
    )
    check_settings(config, checks.nonnegative, "learning_rate", "weight_decay")
    check_settings(config, checks.rate, "dropout", "validation_fraction")
    check_settings(config, checks.positive, "initializer_range")
    setting(checks.rate, config.attention_dropout, "attention_dropout", allow_none=True)
    check_model_sizes(config, built=config.architecture != "lstm")
    if config.warmup_steps > config.max_steps:
        raise ConfigError(
            f"warmup_steps {config.warmup_steps} is more than max_steps {config.max_steps}: the run would "
            f"end inside the learning-rate warm-up. Pass warmup_steps {max(1, config.max_steps // 10)} "
            f"(a tenth) or more steps."
        )
    if config.architecture != "lstm" and config.sequence_length < MIN_MAX_LENGTH:
        logger.warning(
            f"Warning: --sequence_length {config.sequence_length} gives a model that no task can be fine-tuned "
            f"from (fine-tuning needs a context of {MIN_MAX_LENGTH} tokens or more)."
        )
    storage.check_local(config.corpus, "--corpus")
    if config.tokenizer != "train":
        storage.check_local(config.tokenizer, "--tokenizer")
    inputs = {"--corpus": config.corpus, "--tokenizer": config.tokenizer if config.tokenizer != "train" else None}
    check_inputs_outside(config.output_dir, inputs)
    if config.shards_dir and "://" in config.shards_dir:
        raise ConfigError(
            f"shards_dir {config.shards_dir}: shards are memory-mapped from a local folder (a remote "
            f"--output_dir keeps them, copied there and back)."
        )
    if config.shards_dir:  # a file in the way, before the corpus is read (and in --dry_run)
        storage.check_path(config.shards_dir, "--shards_dir")
    run.check_run(config.run_part(), config.batch_size)


class PretrainProgress(Progress):
    """`kgpt.train.callbacks.Progress` that also keeps the zero-shot evaluations in the checkpoint."""

    def __init__(self, *args, zero_shot=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.zero_shot = zero_shot

    def extra_state(self):
        return {"zero_shot": self.zero_shot.rows()} if self.zero_shot is not None else {}


def validation_windows(val, sequence_length):
    """Non-overlapping windows covering the held-out tokens (last one shorter is dropped and counted)."""
    length = min(sequence_length, len(val) - 1)
    count = (len(val) - 1) // length
    windows = np.stack([val[i * length : i * length + length + 1] for i in range(count)])
    x = {"token_ids": windows[:, :-1], "padding_mask": np.ones_like(windows[:, :-1])}
    return x, windows[:, 1:], (len(val) - 1) - count * length


def evaluation_count(max_steps, wanted):
    """The largest count <= `wanted` that divides `max_steps` (Keras epochs are equal)."""
    positive_int(max_steps, "max_steps")
    return max(d for d in range(1, max(1, min(wanted, max_steps)) + 1) if max_steps % d == 0)


def build_backbone(config, vocabulary_size):
    """A fresh backbone of `config.architecture` and sizes."""
    if config.architecture == "transformer":
        return GPTBackbone.from_sizes(config, vocabulary_size, config.sequence_length)
    if config.architecture == "lstm":
        return LSTMBackbone(
            vocabulary_size,
            hidden_dim=config.hidden_dim,
            lstm_units=config.lstm_units,
            num_layers=config.num_layers,
            max_sequence_length=config.sequence_length,
            dropout=config.dropout,
        )
    raise ValueError(f"architecture must be 'transformer' or 'lstm', got {config.architecture!r}.")


def zero_shot_callback(zero_shot, tokenizer, every, work, max_examples=None, registry=None):
    """The `ZeroShotCallback` scoring the `zero_shot` tasks (`{name: data_dir}`) every `every` steps, on at most
    `max_examples` per split, or None; writes embedded data where no dir is given (in the `Run`'s folder)."""
    if not zero_shot:
        return None
    tasks = zero_shot_lib.resolve_tasks(zero_shot, work.directory, registry or TaskRegistry())
    logger.info(f"Zero-shot evaluation of {', '.join(tasks)} every {every} steps.")
    out = work.directory if work.kept else None
    return zero_shot_lib.ZeroShotCallback(
        tasks,
        tokenizer,
        every,
        csv_path=os.path.join(out, "zero_shot.csv") if out else None,
        log_dir=os.path.join(out, "logs") if out else None,
        max_examples=max_examples,
    )


def prepare(config):
    """Learns or loads the tokenizer and builds the token shards, then stops (`kgpt-train --prepare_only`).

    Returns the `ShardIndex`. Without `shards_dir` or `output_dir` the shards
    go to a temporary folder that is deleted (a measure of speed only).
    """
    start = time.perf_counter()
    check_config(config)
    run_config, settings = config.run_part(), run_settings(config)
    if not (config.output_dir or config.shards_dir):
        logger.info("No --output_dir or --shards_dir: the shards are deleted at exit.")
    with run.workspace(run_config, "pretrain", settings, "kgpt-shards-") as work:
        index, _ = _prepare(config, work)
    logger.info(
        f"Prepared {index.total_tokens:,} tokens (tokenizer and shards) in {time.perf_counter() - start:.1f} s."
    )
    return index


def _prepare(config, work):
    """`(ShardIndex, tokenizer)` of the run's corpus, its shards in `config.shards_dir` or the `Run`'s `shards/`.

    With several processes, process 0 writes the demo text and learns the
    tokenizer, and every process tokenizes its share of the corpus
    (`kgpt.data.shards.Team`).
    """
    if config.corpus:
        files = corpus_files(config.corpus)
    else:
        files = [work.for_all(lambda: demo_world.write_corpus(work.directory), "writing the demo text")]
        logger.info(
            f"No --corpus: pre-training on the embedded demo text (kgpt.data.demo_world), written to {files[0]}."
        )
    tokenizer = None
    if config.tokenizer == "train" and cluster.current().several:
        # Process 0 keeps the one it learned (reading it back would say so a second time); the others read it.
        tokenizer = cluster.on_chief(
            lambda: load_tokenizer(config.tokenizer, config.num_merges, files, work), "learning the tokenizer"
        )
        work.fetch((PRESET_CONFIG, "assets"))
    if not isinstance(tokenizer, GPTTokenizer):
        tokenizer = load_tokenizer(config.tokenizer, config.num_merges, files, work)
    here = cluster.current()
    # Processes that each have their own copy of a remote output directory build its shards alone.
    alone = work.mirror is not None and not config.shards_dir
    team = Team() if alone else Team(here.process_id, here.num_processes, lambda ok: not cluster.any_process(not ok))
    # One process alone stops at a SIGTERM between chunks; several finish and stop together before training.
    stop = None if here.several else sigterm_received
    index = build_shards(
        files, tokenizer, config.shards_dir or os.path.join(work.directory, "shards"), team=team, stop=stop
    )
    logger.info(
        f"Corpus: {len(files)} file(s), {index.total_tokens:,} tokens (vocabulary {tokenizer.vocabulary_size():,})."
    )
    return index, tokenizer


def pretrain(config, registry=None, within=None):
    """Trains a GPT language model; returns `(causal_lm, tokenizer, metrics)`.

    `registry` (a `kgpt.TaskRegistry`) finds the `config.zero_shot` tasks;
    default: every installed plugin. `within`: the `kgpt.jobs.run.Run` whose
    folder holds `config.output_dir` (fine-tuning's demo model).
    """
    check_config(config)
    run_config, settings = config.run_part(), run_settings(config)
    one_process = None
    if config.zero_shot:  # before the corpus is tokenized and the model built
        registry = registry or TaskRegistry()
        zero_shot_lib.check_tasks(config.zero_shot, registry)
        one_process = (
            "--zero_shot scores tasks with the model's predictions during training, which kgpt runs on "
            "one process only: evaluate the saved model with kgpt-analyze zero-shot instead."
        )
    with run.workspace(
        run_config, "pretrain", settings, "kgpt-shards-", config.batch_size, within, one_process
    ) as work:
        # The shards first: their worker processes are forked before JAX or
        # TensorFlow start threads for the devices.
        index, tokenizer = _prepare(config, work)
        check_prompt(
            config.prompt, config.sample_tokens, config.sequence_length, tokenizer
        )  # before training: the sample comes after it, before the preset is saved
        train_end = split_point(
            index.total_tokens, config.validation_fraction, config.validation_tokens, config.sequence_length
        )
        with work.scope() as shards:
            lm = _compiled_lm(config, tokenizer)
            evaluations = evaluation_count(config.max_steps, config.evaluations)
            if evaluations != config.evaluations:
                logger.info(
                    f"Evaluating {evaluations} times (every {config.max_steps // evaluations} steps) so "
                    f"that exactly max_steps={config.max_steps} steps are trained."
                )
            val_ids = index.tokens(train_end, index.total_tokens)
            micro = config.batch_size // config.gradient_accumulation_steps
            validation = _validation(val_ids, config.sequence_length, shards, micro)
            zero_shot = zero_shot_callback(
                config.zero_shot,
                tokenizer,
                config.zero_shot_every or config.max_steps // evaluations,
                work,
                config.zero_shot_examples,
                registry,
            )
            progress = _progress(config, work, lm, evaluations, index, tokenizer, zero_shot)
            _fit(config, work, lm, index, train_end, evaluations, validation, progress, zero_shot)
            metrics = _metrics(index.total_tokens, progress, zero_shot, validation)
            metrics["unigram_loss"] = unigram_loss(index, train_end)
            _warn_if_learned_nothing(metrics)
            # Generation runs on one process: the saved preset generates (GPTCausalLM.from_preset).
            if cluster.current().several:
                logger.info(
                    "No sample on several processes: GPTCausalLM.from_preset(output_dir).generate(...) writes one."
                )
            elif config.sample_tokens:
                held_out = val_ids if len(val_ids) >= 4 else index.tokens(0, 4)
                metrics["sample"] = _sample(
                    lm, tokenizer, config.prompt, held_out, config.sequence_length, config.sample_tokens, shards
                )
            # Text in, text out from here on (and in the preset): lm.generate("..."), lm.score("...").
            lm.preprocessor = GPTCausalLMPreprocessor(tokenizer, sequence_length=config.sequence_length)
            # A keras-hub preset: GPTCausalLM/GPTBackbone/GPTTokenizer.from_preset(dir) load it (the
            # preprocessor saves the tokenizer); fine-tuning takes --init dir.
            work.save_outputs(
                lm,
                metrics,
                "the preset (config.json, model.weights.h5, task.json, "
                "preprocessor.json, tokenizer.json, assets/), history.csv, logs/",
            )
    return lm, tokenizer, metrics


def _compiled_lm(config, tokenizer):
    lm = GPTCausalLM(build_backbone(config, tokenizer.vocabulary_size()))
    lm.compile(
        optimizer=gpt_adamw(
            config.learning_rate,
            warmup_steps=config.warmup_steps,
            total_steps=config.max_steps,
            weight_decay=config.weight_decay,
            gradient_accumulation_steps=config.gradient_accumulation_steps,
        ),
        sampler="top_k",
        lm_loss_chunk_size=config.lm_loss_chunk_size or None,
    )
    steps = config.gradient_accumulation_steps
    logger.info(
        f"Model: {lm.backbone.count_params():,} weights; {config.max_steps} steps of "
        f"{config.batch_size} x {config.sequence_length} tokens"
        + (f", each accumulated over {steps} micro-batches of {config.batch_size // steps}." if steps > 1 else ".")
    )
    return lm


def _validation(val_ids, sequence_length, shards, batch_size):
    """A dataset of `(x, y, sample_weight)` batches of every held-out window; None without any.

    Batches of `batch_size` windows, each process feeding its rows
    (`kgpt.parallel.distribute.feed`). The last batch, when shorter, is filled
    to split evenly over the `shards` devices with rows that weigh 0, so any
    number of processes scores the same windows; its real rows weigh
    `filled / real`, so Keras' loss (the mean over all of a batch's positions)
    is the mean over its windows, and the running loss counts those windows
    only (`kgpt.train.loss_trackers`).
    """
    if not len(val_ids):
        return None
    val_x, val_y, dropped = validation_windows(val_ids, sequence_length)
    logger.info(
        f"Validation: {len(val_y)} window(s) of {val_y.shape[1]} tokens"
        + (f" ({dropped} trailing token(s) not scored)." if dropped else ".")
    )
    batch_size = min(batch_size, len(val_y))
    starts = list(range(0, len(val_y), batch_size))

    def rows_of(first, stop, total):
        import tensorflow as tf

        def batches():
            for begin in starts:
                real = min(batch_size, len(val_y) - begin)
                size = -(-real // shards) * shards
                rows = np.minimum(np.arange(begin, begin + size), begin + real - 1)  # filler: the last window again
                weight = np.where(np.arange(size) < real, size / real, 0.0).astype("float32")
                a, b = distribute.local_rows(size, (first, stop, total))
                yield (
                    {k: v[rows[a:b]] for k, v in val_x.items()},
                    val_y[rows[a:b]],
                    np.repeat(weight[a:b, None], val_y.shape[1], axis=1),
                )

        spec = tf.TensorSpec((None, val_y.shape[1]), tf.int32)
        data = tf.data.Dataset.from_generator(
            batches,
            output_signature=(
                {"token_ids": spec, "padding_mask": spec},
                spec,
                tf.TensorSpec((None, val_y.shape[1]), tf.float32),
            ),
        )
        return data.apply(tf.data.experimental.assert_cardinality(len(starts)))

    return distribute.feed(rows_of)


def _progress(config, work, lm, evaluations, index, tokenizer, zero_shot):
    """The progress callback, from the `Run`'s checkpoint when there is one."""
    settings = run_settings(config) | {
        "corpus_tokens": int(index.total_tokens),
        "corpus_crc32": index.content_crc32(),
        "tokenizer": tokenizer.fingerprint(),
    }
    state = work.restore(lm, settings)
    if state is not None:
        logger.info(
            f"Resuming from the checkpoint at step {state['step']:,} of {config.max_steps:,} ({work.checkpoint_dir})."
        )
        if zero_shot is not None:
            zero_shot.restore([row for row in state.get("zero_shot", []) if row[0] <= state["step"]])
    every = config.checkpoint_every if work.kept else 0
    return PretrainProgress(
        work.checkpoint_dir if config.checkpoint_every else None,
        settings,
        config.max_steps // evaluations,
        every,
        work.history_path,
        state,
        accumulation=config.gradient_accumulation_steps,
        zero_shot=zero_shot,
        publish=work.publish,
    )


def _fit(config, work, lm, index, train_end, evaluations, validation, progress, zero_shot):
    """Trains from the progress' step to `max_steps`, in `evaluations` Keras epochs."""
    steps_per_eval = config.max_steps // evaluations
    micro = config.gradient_accumulation_steps  # batches fit sees per optimizer step

    def windows(first_batch):
        def rows_of(first, stop, total):
            rows = distribute.local_rows(config.batch_size // micro, (first, stop, total))
            return index.windows(
                config.sequence_length,
                config.batch_size,
                config.seed,
                stop=train_end,
                first_batch=first_batch * micro,
                rows=rows,
                micro_batches=micro,
            )

        return distribute.feed(rows_of)

    calls = (
        (windows(first * steps_per_eval + skip), first, last, (steps_per_eval - skip) * micro)
        for first, last, skip in run.segments(progress.step, steps_per_eval, evaluations)
    )
    callbacks = work.callbacks(
        progress,
        f"Lower --learning_rate ({config.learning_rate:g})",
        before=[zero_shot] if zero_shot is not None else [],
        total_steps=config.max_steps,
        tokens_per_step=config.batch_size * config.sequence_length,
        after=[EpochBar(evaluations)] if cluster.is_chief() else [],
    )
    run.fit(lm, calls, callbacks, validation)


def _metrics(total, progress, zero_shot, validation):
    history = progress.history
    metrics = {
        "train_loss": [float(v) for v in history.get("loss", [])],
        "tokens": int(total),
        "resumed_from_step": progress.first_step,
        "optimizer_steps": progress.step,
    }
    if zero_shot is not None:
        metrics["zero_shot"] = {f"{task}/{metric}": points for (task, metric), points in zero_shot.history.items()}
    if validation and "val_loss" in history:
        val_losses = history["val_loss"]
        metrics["validation_loss"] = [float(v) for v in val_losses]
        metrics["validation_perplexity"] = [float(math.exp(min(v, 50))) for v in val_losses]
        logger.info("Validation perplexity: " + " -> ".join(f"{p:,.1f}" for p in metrics["validation_perplexity"]))
    if metrics["train_loss"]:
        logger.info("Training loss: " + " -> ".join(f"{v:.3f}" for v in metrics["train_loss"]))
    return metrics


def unigram_loss(index, train_end, sample=10_000_000):
    """The loss of predicting every token by its frequency in the training tokens (add-one smoothed), measured
    on the held-out ones (or the training ones without any): what a model that learned no context reaches.

    Counted on at most `sample` tokens of each part, spread over it.
    """

    def spread(start, stop):
        step = max(1, (stop - start) // sample)
        return np.concatenate([index.tokens(i, min(i + 1000, stop)) for i in range(start, stop, 1000 * step)])

    train = spread(0, train_end)
    held_out = spread(train_end, index.total_tokens) if index.total_tokens > train_end else train
    size = int(max(train.max(initial=0), held_out.max(initial=0))) + 1
    counts = np.bincount(train, minlength=size) + 1.0
    return float(-np.mean(np.log(counts[held_out] / counts.sum())))


def _warn_if_learned_nothing(metrics):
    """Warns when the last loss is no better than `unigram_loss`: the model learned no context."""
    losses = metrics.get("validation_loss") or metrics["train_loss"]
    if losses and not losses[-1] < metrics["unigram_loss"] and cluster.is_chief():  # one process tells the run
        what = "validation" if metrics.get("validation_loss") else "training"
        logger.warning(
            f"The model learned nothing beyond token frequencies: its last {what} loss {losses[-1]:.3f} is no "
            f"lower than {metrics['unigram_loss']:.3f}, the loss of predicting each token by its frequency. "
            f"Train longer (--max_steps) or with a higher --learning_rate."
        )


def check_prompt(prompt, sample_tokens, sequence_length, tokenizer):
    """Refuses a `--prompt` that is blank, or leaves a sample of `sample_tokens` no room in the context."""
    if prompt is not None and sample_tokens:
        length = len(tokenizer.encode(prompt))
        if not length:
            raise ConfigError(
                f"--prompt {prompt!r} gives no token: give it some text, or leave it out to sample from the first "
                f"words of the held-out text."
            )
        if length >= sequence_length:
            raise ConfigError(
                f"--prompt is {length} tokens, which leaves no room in --sequence_length="
                f"{sequence_length} for the sample: shorten it, or --sample_tokens 0 for none."
            )


def _sample(lm, tokenizer, prompt, held_out, sequence_length, sample_tokens, replicas):
    """A sample of `sample_tokens` from `prompt` (text), or from the first held-out tokens, in the context."""
    # The default prompt leaves room for at least one token, even in a context of 4 or fewer.
    prompt = tokenizer.encode(prompt) if prompt is not None else [int(i) for i in held_out[:4]][: sequence_length - 1]
    if not prompt:
        logger.info(f"No sample: sequence_length={sequence_length} leaves no room for a prompt.")
        return None
    length = min(sequence_length, len(prompt) + sample_tokens)
    # One prompt per device: a data-parallel model splits every batch evenly.
    sample = tokenizer.decode(lm.generate([prompt] * replicas, max_length=length)["token_ids"][0])
    cut = len(prompt) + sample_tokens - length
    logger.info(
        f"Sample: {sample}"
        + (
            f"\n  ({sample_tokens - cut} of --sample_tokens {sample_tokens}: the context is {length} tokens)"
            if cut
            else ""
        )
    )
    return sample
