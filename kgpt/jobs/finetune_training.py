"""Fine-tuning's training loop: compiling, fitting (resumable), the task's metrics per epoch, and `keep`.

`train` compiles a task model with the paper's schedule and fits it on the
training split, scoring the dev split after every epoch (`TaskMetrics`); a
checkpoint is written at every epoch end (`FinetuneProgress`), and a rerun of the
same command resumes from it (`Training`).
"""

import dataclasses
import logging
import math
import os

import keras
import numpy as np

from kgpt import checks
from kgpt.data import batching
from kgpt.errors import ConfigError
from kgpt.jobs import run
from kgpt.jobs.finetune_outputs import evaluate_split
from kgpt.parallel import cluster, distribute
from kgpt.tasks import metrics as metrics_lib
from kgpt.train import callbacks as callbacks_lib
from kgpt.train import checkpoint as checkpoint_lib
from kgpt.train import compile_cost
from kgpt.train.optimizers import gpt_adamw

logger = logging.getLogger(__name__)


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


class FinalOutputs(keras.callbacks.Callback):
    """Without a dev split, runs the model on one batch of training examples at the end of the last epoch.

    Nothing else computes with the final weights before they are saved, and
    weights that grew huge yet stayed finite can give NaN outputs (a
    learning rate far too high): the run then stops as on a NaN loss
    (`kgpt.train.callbacks.StopOnNonFiniteLoss.check_outputs`, through the
    `guard` of the run's `progress`), before the last checkpoint. List it
    before `progress`.
    """

    def __init__(self, split, batch_size, epochs, progress):
        super().__init__()
        self.split, self.batch_size, self.epochs, self.progress = split, batch_size, epochs, progress

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 < self.epochs:
            return
        rows = min(len(self.split), self.batch_size)
        views = self.split.num_views
        first = dataclasses.replace(
            self.split,
            offsets=self.split.offsets[: rows * views + 1],
            targets=None if self.split.targets is None else self.split.targets[:rows],
            uids=self.split.uids[:rows],
        )
        model = self.model  # on JAX, the training state put back into the variables
        outputs = distribute.predict_outputs(model.task_predictor(), first, self.batch_size)
        self.progress.guard.check_outputs(outputs, f"{rows} training examples")


def updates(epochs, rows, batch_size, warn=True):
    """`(steps_per_epoch, total_steps)` of `epochs` over `rows` training examples in batches of `batch_size`;
    a batch larger than the training set is warned of (each epoch is then one update on all of it) unless `warn`
    is false."""
    steps = math.ceil(rows / batch_size)
    if warn and batch_size > rows:
        logger.warning(
            f"Warning: {checks.option('batch_size')} {batch_size:,} is more than the {rows:,} training examples: "
            f"each epoch is one update on all {rows:,} of them."
        )
    return steps, steps * epochs


def train(config, work, task, model, splits, batch_size, origin, settings, baseline=False):
    """Compiles and fits `model` in the `Run` `work` (resuming its checkpoint); returns the results it adds to
    metrics.json.

    `settings` are what the run's outputs depend on (`kgpt.jobs.finetune.run_settings`): a checkpoint made with
    others is refused. A `baseline` run (--scratch_baseline) trains on the batches of the run beside it, whose
    warnings of them it does not repeat.
    """
    train_name = task.splits[0]
    train_split = splits[train_name]
    metrics_lib.check(task, train_split.targets)  # a plugin's broken metric, before the first epoch is spent
    steps_per_epoch, total_steps = updates(config.epochs, len(train_split), batch_size, warn=not baseline)
    model.compile(
        optimizer=gpt_adamw(
            config.learning_rate,
            warmup_steps=math.ceil(config.warmup_fraction * total_steps),
            total_steps=total_steps,
            decay="linear",
            weight_decay=config.weight_decay,
            gradient_accumulation_steps=config.gradient_accumulation_steps,
        ),
        lm_loss_chunk_size=config.lm_loss_chunk_size or None,
    )
    dev_name = dev_split([n for n, s in splits.items() if s.targets is not None], train_name)
    check_keep(config.keep, dev_name, train_name)
    if config.keep == "best" and distribute.spread_over_processes(model):
        raise ConfigError(
            "keep='best' keeps a copy of the best epoch's weights on process 0, which a model split "
            "across processes does not fit in: use keep='last'."
        )
    logger.info(
        f"Task {task.name} ({task.transform.kind}, {task.head.kind} head, metrics "
        f"{', '.join(task.metric_names)}); model from {origin}: {model.count_params():,} weights; "
        f"{config.epochs:,} epoch(s) of {steps_per_epoch:,} steps ({total_steps:,} in all), batch {batch_size:,}, "
        f"{train_split.num_views} "
        f"view(s) of up to {int(train_split.lengths.max())} tokens, lm_coef {config.lm_coef}."
    )
    training = Training(config, work, task, model, splits, train_name, dev_name, batch_size, settings, steps_per_epoch)
    history, kept = training.fit()
    return {"kept_epoch": kept, "history": history, "real_token_share": training.real_token_share}


class Training:
    """Runs `model.fit` for a fine-tuning config: resumable, with per-epoch history and `keep`.

    With an output directory, a checkpoint (`kgpt.train.checkpoint`) is written at
    every epoch end and every `checkpoint_every` steps, and a rerun of the
    same command resumes from it: same seed, same data order, same dropout
    masks, so it ends with the weights of an uninterrupted run.
    """

    def __init__(self, config, work, task, model, splits, train_name, dev_name, batch_size, settings, steps):
        self.config, self.work, self.task, self.model = config, work, task, model
        self.train, self.dev = splits[train_name], splits.get(dev_name)
        self.batch_size = batch_size
        self.settings = settings | {"batch_size": batch_size, "train_data": self.train.fingerprint}
        self.directory = work.checkpoint_dir
        self.steps_per_epoch = steps  # `updates`
        self.metric = task.metric_names[0]

    def fit(self):
        """Trains (or resumes) to the end; returns `(history, kept_epoch)` (epochs counted from 1)."""
        state = self._restore()
        self.attention_length = self._attention_length(state)
        self.compile_batches = self._compile_batches(state)
        self._plan()
        progress = FinetuneProgress(self, state)
        if progress.step < self.config.epochs * self.steps_per_epoch:
            if self.dev is not None:
                checks = [TaskMetrics(self.task, self.dev, self.batch_size)]
            else:
                checks = [FinalOutputs(self.train, self.batch_size, self.config.epochs, progress)]
            callbacks = self.work.callbacks(
                progress,
                f"Lower --learning_rate ({self.config.learning_rate:g}) or check the data",
                before=checks,
                total_steps=self.config.epochs * self.steps_per_epoch,
                examples_per_step=self.batch_size,
                after=[callbacks_lib.EpochBar(self.config.epochs)] if cluster.is_chief() else [],
            )
            run.fit(self.model, self._calls(progress.step), callbacks, self._validation())
        return progress.history, progress.finish()

    def _restore(self):
        total = self.config.epochs * self.steps_per_epoch
        state = self.work.restore(self.model, self.settings, total)  # a checkpoint past it is refused
        if state is not None and state["step"] >= total:
            logger.info(
                f"The checkpoint in {self.directory} is at the last step ({total:,}): this run finished "
                f"training; evaluating it."
            )
        elif state is not None:
            epoch, done = divmod(state["step"], self.steps_per_epoch)
            logger.info(
                f"Resuming from the checkpoint at step {state['step']:,} (epoch {epoch + 1}, batch {done}) "
                f"of {total:,} in {self.directory}."
            )
        return state

    def _attention_length(self, state):
        """The length at which a row's attention costs as much as the rest of it (`kgpt.data.batching.row_cost`).

        A resumed run takes its checkpoint's (one from before the figure was
        recorded planned by positions alone: None), so it plans the lengths
        it planned before the interruption.
        """
        if state is not None:
            return state.get("attention_length")
        return compile_cost.attention_length(self.model.backbone, self.config.lm_coef > 0)

    def _compile_batches(self, state):
        """What one compilation costs, in steps (`kgpt.data.batching.length_plan`).

        A resumed run takes the figure its checkpoint holds (the same lengths
        as before the interruption; a checkpoint from before the figure was
        recorded planned with `COMPILE_BATCHES`); a new one measures it
        (`kgpt.train.compile_cost`) when it compiles and has steps to run.
        """
        if state is not None:
            return state.get("compile_batches", batching.COMPILE_BATCHES)
        if not self.model.jit_compile:
            return batching.COMPILE_BATCHES
        measured = compile_cost.compile_batches(
            self.model,
            self.train,
            self.batch_size,
            self.config.lm_coef > 0,
            self.config.gradient_accumulation_steps,
            self.attention_length,
        )
        if measured != batching.COMPILE_BATCHES:
            logger.info(f"One compilation of the train step costs about {measured:g} of its steps (measured).")
        return measured

    def _plan(self):
        epochs, train = self.config.epochs, self.train
        max_lengths = self.model.max_padded_lengths(
            train, self.batch_size, epochs, self.compile_batches, self.attention_length
        )
        plan = batching.length_plan(
            train.lengths,
            self.batch_size,
            self.config.seed,
            train.limit,
            max_lengths,
            self.compile_batches,
            epochs,
            self.attention_length,
        )
        real_share = train.real_share(batching.batch_indices(train.lengths, self.batch_size, self.config.seed), plan)
        logger.info(
            f"Batches by length: {real_share:.1%} of the positions computed in training are real tokens, in "
            f"{len(plan)} padded length(s){' (one XLA compilation each)' if self.model.jit_compile else ''}; "
            f"padding every example to the longest would give {train.padded_share():.1%}."
        )
        self.real_token_share = {
            "train": real_share,
            "train_padded_lengths": list(plan),
            "train_padded_to_longest": train.padded_share(),
        }

    def _calls(self, step):
        """`(dataset, initial_epoch, epochs, None)` fit calls: the rest of an interrupted epoch, then whole ones."""
        epochs = self.config.epochs
        max_lengths = self.model.max_padded_lengths(
            self.train, self.batch_size, epochs, self.compile_batches, self.attention_length
        )
        pad_to, micro = distribute.batch_shards(), self.config.gradient_accumulation_steps
        for first, last, skip in run.segments(step, self.steps_per_epoch, self.config.epochs):

            def make(a, b, total, first=first, skip=skip):
                return batching.dataset(
                    self.train,
                    self.batch_size,
                    seed=self.config.seed,
                    lm=self.config.lm_coef > 0,
                    first_epoch=first,
                    max_lengths=max_lengths,
                    skip=skip,
                    shards=(a, b, total),
                    pad_to=pad_to,
                    micro_batches=micro,
                    epochs=epochs,
                    compile_batches=self.compile_batches,
                    attention_length=self.attention_length,
                )

            yield distribute.feed(make), first, last, None

    def _validation(self):
        if self.dev is None:
            return None
        epochs = self.config.epochs  # one evaluation per epoch
        max_lengths = self.model.max_padded_lengths(
            self.dev, self.batch_size, epochs, self.compile_batches, self.attention_length
        )

        def make(a, b, total):
            return batching.dataset(
                self.dev,
                self.batch_size,
                lm=self.config.lm_coef > 0,
                max_lengths=max_lengths,
                shards=(a, b, total),
                pad_to=distribute.batch_shards(),
                epochs=epochs,
                compile_batches=self.compile_batches,
                attention_length=self.attention_length,
            )

        return distribute.feed(make)


class FinetuneProgress(callbacks_lib.Progress):
    """`kgpt.train.callbacks.Progress` for fine-tuning, which also tracks the best dev epoch for `keep="best"`."""

    keep = ("best",)

    def __init__(self, training, state=None):
        config = training.config
        super().__init__(
            training.directory,
            training.settings,
            training.steps_per_epoch,
            config.checkpoint_every,
            training.work.history_path,
            state,
            accumulation=config.gradient_accumulation_steps,
            publish=training.work.publish,
        )
        self.training = training
        self.best = (state or {}).get("best")  # {"epoch": from 1, "score": value} or None
        self._best_weights = None

    def extra_state(self):
        return {
            "best": self.best,
            "compile_batches": self.training.compile_batches,
            "attention_length": self.training.attention_length,
        }

    def _warn_nan(self):
        """One warning when the dev metric `keep="best"` selects by was NaN in some epoch, naming the kept one."""
        metric = self.training.metric
        scores = [logs.get(f"val_{metric}") for logs in self.epochs]
        nan = [i + 1 for i, v in enumerate(scores) if isinstance(v, float) and math.isnan(v)]
        if not nan:
            return
        kept = (
            f"keeping epoch {self.best['epoch']}, the best of the others"
            if self.best is not None
            else f"keeping the last epoch, {len(self.epochs)}"
        )
        logger.warning(
            f"Warning: --keep best cannot choose by a NaN metric: the dev {metric} was NaN in epoch(s) "
            f"{', '.join(map(str, nan))}; {kept}."
        )

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
                checkpoint_lib.save_weights(self.model, self.directory, "best")  # copied out with the checkpoint

    def finish(self):
        """Applies `keep`: loads the best epoch's weights when asked; returns the kept epoch (from 1)."""
        if self.training.config.keep == "best":
            self._warn_nan()
        if self.training.config.keep != "best" or self.best is None:
            return len(self.epochs) or None
        model = self.training.model
        if len(self.epochs) != self.best["epoch"]:
            if self._best_weights is not None:
                model.set_weights(self._best_weights)
            else:  # resumed after the best epoch: its weights are on disk
                checkpoint_lib.load_weights(
                    model, os.path.join(self.training.directory, "best", checkpoint_lib.WEIGHTS)
                )
        metric = self.training.metric
        logger.info(
            f"Keeping epoch {self.best['epoch']} of {len(self.epochs)}: the best dev {metric} "
            f"({self.best['score']:.4f})."
        )
        return self.best["epoch"]


def dev_split(labeled, train_name):
    """The split each epoch is scored on (and `keep="best"` picks by): the first of the `labeled` split names
    besides `train_name`, never a test split (`test`, `test_matched`, ...), which would then choose the model it
    reports; None when there is none."""
    return next((n for n in labeled if n != train_name and not n.startswith("test")), None)


def check_keep(keep, dev_name, train_name):
    """Raises `ConfigError` for `keep="best"` without a labeled dev split (`dev_name` None) to pick the epoch by."""
    if keep == "best" and dev_name is None:
        raise ConfigError(
            f"keep='best' picks the epoch by dev score, but no labeled split besides {train_name!r} was found "
            f"(a test split is never used to choose the model: give a validation split)."
        )
