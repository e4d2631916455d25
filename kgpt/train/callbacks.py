"""Callbacks both training jobs share."""

import math

import keras
import numpy as np


class NonFiniteLossError(ArithmeticError):
    """Training produced a NaN or infinite loss; the run stopped before saving anything from it."""


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Stops training with `NonFiniteLossError` at the first batch whose loss is NaN or infinite.

    Keras' `TerminateOnNaN` only ends `fit`, after which a job would go on to
    save the broken weights over a good preset; raising stops the job itself,
    and the last checkpoint (written before the loss broke) stays the one a
    rerun resumes from.

    Args:
        hint: what the user can change, appended to the message.
        first_step: the optimizer step the run starts from (a resumed run).
    """

    def __init__(self, hint="", first_step=0):
        super().__init__()
        self.hint, self.step = hint, first_step

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        value = float(np.asarray(keras.ops.convert_to_numpy(loss)))
        if not math.isfinite(value):
            raise NonFiniteLossError(f"The training loss is {value} at step {self.step}: training stopped and nothing "
                                     f"from this run was saved over earlier outputs. {self.hint}".strip())


class Progress(keras.callbacks.Callback):
    """A run's progress that survives a kill: per-epoch logs, `history.csv`, and checkpoints.

    Counts optimizer steps itself (reading the model's step would sync JAX's
    state every batch), records each epoch's logs (a resumed epoch replaces
    its row, so no row repeats), rewrites `history_path` from them, and with a
    `directory` writes a checkpoint (`kgpt.train.checkpoint`) at every epoch end and
    every `every` steps. List it after callbacks that add to the epoch's logs.

    Args:
        directory: where checkpoints go, or None for none.
        settings: what the run depends on; a checkpoint of other settings is refused.
        steps_per_epoch: optimizer steps in one epoch (one evaluation period).
        every: steps between checkpoints besides epoch ends; 0 for epoch ends only.
        history_path: the CSV of per-epoch logs, or None.
        state: a restored checkpoint's state (`kgpt.train.checkpoint.restore`), or None.
    """

    keep = ()  # checkpoint folders besides the latest that must survive (see kgpt.train.checkpoint.save)

    def __init__(self, directory, settings, steps_per_epoch, every=0, history_path=None, state=None):
        super().__init__()
        self.directory, self.settings, self.every = directory, settings, every
        self.steps_per_epoch, self.history_path = steps_per_epoch, history_path
        state = state or {}
        self.step = state.get("step", 0)
        self.first_step = self.step  # where this process started (a resumed run: the checkpoint's step)
        self.epochs = state.get("epochs", [])  # one dict of logs per finished epoch

    @property
    def history(self):
        """`{name: [value per epoch]}`, like Keras' `History.history`, over the whole run."""
        names = list(dict.fromkeys(k for logs in self.epochs for k in logs))
        return {k: [logs.get(k) for logs in self.epochs] for k in names}

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.every and self.step % self.every == 0 and self.step % self.steps_per_epoch:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        logs = {k: float(np.asarray(v)) for k, v in (logs or {}).items()}
        del self.epochs[epoch:]
        self.epochs.append(logs)
        self.epoch_done(epoch + 1, logs)
        self.write_history()
        self.save()

    def epoch_done(self, epoch, logs):
        """Called at each epoch end (`epoch` from 1) before the checkpoint; subclasses add to their state."""

    def extra_state(self):
        """What a subclass adds to the checkpoint's state (JSON-able)."""
        return {}

    def write_history(self):
        if not self.history_path:
            return
        from kgpt.jobs.rundir import write_text

        names = list(dict.fromkeys(k for logs in self.epochs for k in logs))
        rows = [",".join(["epoch", *names])]
        rows += [",".join([str(i), *(repr(logs[k]) if k in logs else "" for k in names)])
                 for i, logs in enumerate(self.epochs)]
        write_text(self.history_path, "\n".join(rows) + "\n")

    def save(self):
        if self.directory is None:
            return
        from kgpt.train import checkpoint

        state = {"settings": self.settings, "step": self.step, "epochs": self.epochs, **self.extra_state()}
        checkpoint.save(self.model, self.directory, state, keep=self.keep)
