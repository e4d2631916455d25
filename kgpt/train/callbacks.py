"""Callbacks both training jobs share: a NaN stop, a run's progress and checkpoints, progress lines.

A run's "step" is an optimizer update. With gradient accumulation over `K`
micro-batches, `fit` sees `K` batches per step; the callbacks count batches
and act on whole steps only (`steps_per_batch` below is `1 / K`).
"""

import contextlib
import logging
import math
import signal
import threading
import time

import keras
import numpy as np

from kgpt.parallel import cluster

logger = logging.getLogger(__name__)


class Preempted(Exception):  # noqa: N818 - an outcome, not an error: the command exits 0 with it
    """Training stopped on SIGTERM after writing a checkpoint at the step it reached; the same command resumes."""


_SIGTERM = {"received": False, "depth": 0, "previous": None}


@contextlib.contextmanager
def catching_sigterm():
    """Inside, SIGTERM (a scheduler's notice) is noted instead of ending the process; `Progress` acts on it.

    A job holds it from start to end, so a notice that comes while the corpus
    is tokenized stops the run before it trains, and one during training at
    the end of that step (with a checkpoint); one during the final evaluation
    lets the run finish. Outside the main thread (where Python cannot catch
    signals) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _SIGTERM["depth"] == 0:
        _SIGTERM["received"] = False
        # JAX's runtime may have a handler of its own there (not Python's, so getsignal gives None).
        _SIGTERM["previous"] = signal.signal(signal.SIGTERM, _note_sigterm)
    _SIGTERM["depth"] += 1
    try:
        yield
    finally:
        _SIGTERM["depth"] -= 1
        if _SIGTERM["depth"] == 0:
            previous = _SIGTERM["previous"]
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _note_sigterm(signum, frame):
    _SIGTERM["received"] = True


def sigterm_received():
    """Whether SIGTERM came inside `catching_sigterm` (on this process)."""
    return _SIGTERM["received"]


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

    def __init__(self, hint="", first_step=0, accumulation=1):
        super().__init__()
        self.hint, self.accumulation = hint, accumulation
        self.batches = first_step * accumulation

    @property
    def step(self):
        """The optimizer step the last batch belongs to (from 1)."""
        return -(-self.batches // self.accumulation)

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        value = float(np.asarray(keras.ops.convert_to_numpy(loss)))
        if not math.isfinite(value):
            raise NonFiniteLossError(f"The training loss is {value} at step {self.step}: training stopped and nothing "
                                     f"from this run was saved over earlier outputs. {self.hint}".strip())


class Progress(keras.callbacks.Callback):
    """A run's progress that survives a kill: per-epoch logs, `history.csv`, checkpoints, and SIGTERM.

    Counts optimizer steps itself (reading the model's step would sync JAX's
    state every batch), records each epoch's logs (a resumed epoch replaces
    its row, so no row repeats), rewrites `history_path` from them, and with a
    `directory` writes a checkpoint (`kgpt.train.checkpoint`) at every epoch end and
    every `every` steps. List it after callbacks that add to the epoch's logs.

    A checkpoint also holds the epoch's running loss and metric sums, so an
    epoch interrupted and resumed records the same loss as an uninterrupted one.
    On SIGTERM (a scheduler's preemption notice) it writes a checkpoint at the
    end of the current step and raises `Preempted`; with several processes
    they agree on that step first. Only process 0 writes files.

    Args:
        directory: where checkpoints go, or None for none.
        settings: what the run depends on; a checkpoint of other settings is refused.
        steps_per_epoch: optimizer steps in one epoch (one evaluation period).
        every: steps between checkpoints besides epoch ends; 0 for epoch ends only.
        history_path: the CSV of per-epoch logs, or None.
        state: a restored checkpoint's state (`kgpt.train.checkpoint.restore`), or None.
        accumulation: batches per optimizer step (gradient accumulation).
    """

    keep = ()  # checkpoint folders besides the latest that must survive (see kgpt.train.checkpoint.save)

    def __init__(self, directory, settings, steps_per_epoch, every=0, history_path=None, state=None, accumulation=1):
        super().__init__()
        self.directory, self.settings, self.every = directory, settings, every
        self.steps_per_epoch, self.history_path = steps_per_epoch, history_path
        self.accumulation = accumulation
        state = state or {}
        self.step = state.get("step", 0)
        self.first_step = self.step  # where this process started (a resumed run: the checkpoint's step)
        self.epochs = state.get("epochs", [])  # one dict of logs per finished epoch
        self.metric_state = state.get("metric_state")  # the interrupted epoch's running sums, restored once
        self._batches = 0

    @property
    def history(self):
        """`{name: [value per epoch]}`, like Keras' `History.history`, over the whole run."""
        names = list(dict.fromkeys(k for logs in self.epochs for k in logs))
        return {k: [logs.get(k) for logs in self.epochs] for k in names}

    # --- SIGTERM -------------------------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        if self._preempted():  # before the first step: the last checkpoint (if any) is where the run stands
            raise Preempted(f"stopped by SIGTERM before training from step {self.step:,}; nothing new to keep. Run "
                            f"the same command again to resume.")

    def _preempted(self):
        """Whether any process received SIGTERM (with several processes, they all decide at the same step)."""
        received = sigterm_received()
        return cluster.any_process(received) if cluster.current().several else received

    # --- steps and epochs ------------------------------------------------------------------------------

    def on_train_batch_begin(self, batch, logs=None):
        if self.metric_state is not None:  # a resumed epoch continues the sums of its first part
            from kgpt.train import checkpoint

            # At the first batch, not at the epoch's start: Keras builds the metrics' variables in between.
            if not checkpoint.restore_metric_state(self.model, self.metric_state):
                logger.info("The checkpoint's running loss does not fit this model's metrics: the resumed epoch's "
                            "loss covers its batches after the checkpoint only.")
            self.metric_state = None

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        if self._batches % self.accumulation:
            return  # inside an accumulated step
        self.step += 1
        if self._preempted():
            self.save(epoch_sums=True)
            if self.directory is None:
                raise Preempted(f"stopped by SIGTERM at step {self.step:,}; this run writes no checkpoints (no "
                                f"--output_dir, or --checkpoint_every 0), so a rerun starts over.")
            raise Preempted(f"stopped by SIGTERM at step {self.step:,}; checkpoint written in {self.directory}. Run "
                            f"the same command again to resume.")
        if self.every and self.step % self.every == 0 and self.step % self.steps_per_epoch:
            self.save(epoch_sums=True)

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
        if not self.history_path or not cluster.is_chief():
            return
        from kgpt.io.storage import write_text

        names = list(dict.fromkeys(k for logs in self.epochs for k in logs))
        rows = [",".join(["epoch", *names])]
        rows += [",".join([str(i), *(repr(logs[k]) if k in logs else "" for k in names)])
                 for i, logs in enumerate(self.epochs)]
        write_text(self.history_path, "\n".join(rows) + "\n")

    def save(self, epoch_sums=False):
        """Writes a checkpoint of this step (process 0); `epoch_sums` keeps the running epoch's metric sums."""
        if self.directory is None:
            return
        model = self.model  # on JAX every process puts the training state back into the variables here
        from kgpt.train import checkpoint

        state = {"settings": self.settings, "step": self.step, "epochs": self.epochs, **self.extra_state()}
        if epoch_sums and self.step % self.steps_per_epoch:
            state["metric_state"] = checkpoint.metric_state(model)
        checkpoint.save(model, self.directory, state, keep=self.keep)  # every process: process 0 writes


class ProgressLog(keras.callbacks.Callback):
    """One line every `every` steps or seconds: step, loss, throughput and time left (process 0).

    For a log file or a cluster's log, where Keras' per-epoch line may come
    once an hour. `every` is `"N"` steps, `"Ns"` seconds, or `"0"` for none.

    Args:
        every: when to print.
        total_steps: the run's last step.
        first_step: the step the run starts from (a resumed run).
        tokens_per_step: tokens in one step's batch, or None to count examples.
        examples_per_step: examples in one step's batch.
        accumulation: batches per optimizer step.
    """

    def __init__(self, every, total_steps, first_step=0, tokens_per_step=None, examples_per_step=None,
                 accumulation=1):
        super().__init__()
        self.steps, self.seconds = parse_every(every)
        self.total_steps, self.step, self.accumulation = total_steps, first_step, accumulation
        self.tokens_per_step, self.examples_per_step = tokens_per_step, examples_per_step
        self._batches = 0
        self._since = self._last_step = None

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        if self._batches % self.accumulation:
            return
        self.step += 1
        now = time.monotonic()
        if self._since is None:  # the first step compiles: measure from its end
            self._since, self._last_step = now, self.step
            return
        due = (self.steps and self.step % self.steps == 0) or (self.seconds and now - self._since >= self.seconds)
        if due and cluster.is_chief():
            self._print(now, logs or {})
        if due:
            self._since, self._last_step = now, self.step

    def _print(self, now, logs):
        done = self.step - self._last_step
        rate = done / max(now - self._since, 1e-9)  # steps/s
        parts = [f"step {self.step:,}/{self.total_steps:,}"]
        loss = logs.get("loss")
        if loss is not None:
            parts.append(f"loss {float(np.asarray(keras.ops.convert_to_numpy(loss))):.4f}")
        if self.tokens_per_step:
            parts.append(f"{rate * self.tokens_per_step:,.0f} tokens/s")
        elif self.examples_per_step:
            parts.append(f"{rate * self.examples_per_step:,.1f} examples/s")
        left = (self.total_steps - self.step) / rate if rate > 0 else float("inf")
        parts.append(f"{_duration(left)} left")
        logger.info(", ".join(parts))


def parse_every(every):
    """`"100"` -> `(100, None)` steps; `"30s"` -> `(None, 30.0)` seconds; `"0"` -> `(None, None)`."""
    text = str(every).strip().lower()
    try:
        if text.endswith("s"):
            seconds = float(text[:-1])
            if not math.isfinite(seconds) or seconds < 0:
                raise ValueError
            return None, seconds or None
        steps = int(text)
        if steps < 0:
            raise ValueError
        return steps or None, None
    except ValueError:
        from kgpt.errors import ConfigError

        raise ConfigError(f"log_every must be N steps ('100'), N seconds ('60s') or '0', got {every!r}.") from None


def _duration(seconds):
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
