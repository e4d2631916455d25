"""Callbacks both training jobs share: a NaN stop, a run's progress and checkpoints, progress lines, TensorBoard.

A run's "step" is an optimizer update. With gradient accumulation over `K`
micro-batches, `fit` sees `K` batches per step; the callbacks count batches
and act on whole steps only.

None of them makes the host wait for a step. Keras hands a batch's logs to
the callbacks on the main thread, as Python floats (a host-device sync), as
soon as one callback overrides `on_train_batch_end` without being
`async_safe`; otherwise (JAX) it hands them to a thread of its own and the
main thread dispatches the next step at once. So these callbacks read the
logs only where that is safe (`async_safe`), and do what needs the main
thread (checkpoints, SIGTERM) at the next `on_train_batch_begin`, when the
steps before it have been dispatched. They count batches from the `batch`
indices Keras passes, which with `steps_per_execution = N` come once per N
batches.
"""

import bisect
import contextlib
import logging
import math
import signal
import threading
import time

import keras
import numpy as np

from kgpt.errors import NonFiniteLossError, Preempted
from kgpt.parallel import cluster

logger = logging.getLogger(__name__)


# What `catching_signals` noted, how deep it is held, and the handlers it replaced.
_NOTICES = {"sigterm": False, "sigint": False, "depth": 0, "sigterm_handler": None, "sigint_handler": None}


@contextlib.contextmanager
def catching_signals():
    """Inside, SIGTERM (a scheduler's notice) is noted instead of ending the process; `Progress` acts on it.

    A job holds it from start to end, so a notice that comes while the corpus
    is tokenized stops the run before it trains, and one during training at
    the end of that step (with a checkpoint); one during the final evaluation
    lets the run finish. Ctrl-C still raises `KeyboardInterrupt` at once, and
    is noted too: Python drops an exception raised inside a finalizer
    (`__del__`, a weakref callback), so one that lands there would leave the
    run training; `Progress` raises it again at the next step. Outside the
    main thread (where Python cannot catch signals) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _NOTICES["depth"] == 0:
        _NOTICES["sigterm"] = _NOTICES["sigint"] = False
        # JAX's runtime may have a handler of its own there (not Python's, so getsignal gives None).
        _NOTICES["sigterm_handler"] = signal.signal(signal.SIGTERM, _note_sigterm)
        # Only over Python's own: an ignored Ctrl-C (a background job's) or an application's handler stays.
        _NOTICES["sigint_handler"] = signal.getsignal(signal.SIGINT)
        if _NOTICES["sigint_handler"] is signal.default_int_handler:
            signal.signal(signal.SIGINT, _note_sigint)
    _NOTICES["depth"] += 1
    try:
        yield
    finally:
        _NOTICES["depth"] -= 1
        if _NOTICES["depth"] == 0:
            previous = _NOTICES["sigterm_handler"]
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            if signal.getsignal(signal.SIGINT) is _note_sigint:
                signal.signal(signal.SIGINT, _NOTICES["sigint_handler"])
            # The notices were this job's: a later one in the process starts afresh.
            _NOTICES["sigterm"] = _NOTICES["sigint"] = False


def _note_sigterm(signum, frame):
    _NOTICES["sigterm"] = True


def _note_sigint(signum, frame):
    _NOTICES["sigint"] = True
    signal.default_int_handler(signum, frame)


def sigterm_received():
    """Whether SIGTERM came inside `catching_signals` (on this process)."""
    return _NOTICES["sigterm"]


def _raise_dropped_interrupt():
    """Raises `KeyboardInterrupt` if Ctrl-C came inside `catching_signals` and the run still goes on.

    Called where the run would have ended had the first one not been dropped
    (see `catching_signals`); the notice is then spent.
    """
    if _NOTICES["sigint"]:
        _NOTICES["sigint"] = False
        raise KeyboardInterrupt


class BatchCount:
    """The batches a run has finished, from the indices Keras passes (one call per execution of N batches).

    `on_train_batch_end` may run in Keras' callback thread, several at once and
    in any order: it only raises `ended` (under a lock). Keras waits for them
    all before `on_epoch_end`, so at `on_epoch_begin` (main thread) `ended` is
    the count before the epoch. `begun(batch)` on the main thread is the count
    before the execution starting at `batch`, all of them dispatched.
    """

    def __init__(self, first_batches):
        self.ended = self.epoch_start = first_batches
        self._lock = threading.Lock()

    def epoch_begin(self):
        self.epoch_start = self.ended

    def begun(self, batch):
        return self.epoch_start + batch

    def end(self, batch):
        """Records the execution that ended at the epoch's `batch`; returns the run's batches through it."""
        batches = self.epoch_start + batch + 1
        with self._lock:
            self.ended = max(self.ended, batches)
        return batches


def _finite_here(variable):
    """Whether `variable` holds no NaN or infinity, computed on its device; a JAX array split across processes
    (a model-parallel run) is checked shard by shard where it lives, so no process waits on another."""
    value = variable.value
    if not getattr(value, "is_fully_addressable", True):
        return keras.ops.convert_to_tensor(all(np.isfinite(np.asarray(s.data)).all() for s in value.addressable_shards))
    return keras.ops.all(keras.ops.isfinite(keras.ops.convert_to_tensor(value)))


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Stops training with `NonFiniteLossError` at the first step whose loss is NaN or infinite, or whose update
    left a weight so (checked before each checkpoint and at the end of `fit`), or at an epoch whose validation
    loss is; a job may also ask it to check the model's outputs (`check_outputs`).

    Keras' `TerminateOnNaN` only ends `fit`, after which a job would go on to
    save the broken weights over a good preset; raising stops the job itself,
    and the last checkpoint (written before the loss broke) stays the one a
    rerun resumes from: `Progress` asks this callback before it writes one.

    It reads the loss Keras logs, the epoch's running mean, so a step that
    breaks it leaves every later logged loss of the epoch non-finite too. It is
    `async_safe`: on JAX, Keras reads each execution's loss in its callback
    thread while the next steps run, and the error reaches the main thread at
    Keras' next batch end after that (or at the epoch's end), a few steps
    later, whose weights nothing saves. The step it names is exact with
    `steps_per_execution=1`; with N, the loss is seen once per N batches and
    the message names the steps of that execution.

    Args:
        hint: what the user can change, appended to the message.
        first_step: the optimizer step the run starts from (a resumed run).
        accumulation: batches per optimizer step.
    """

    async_safe = True

    def __init__(self, hint="", first_step=0, accumulation=1):
        super().__init__()
        self.hint, self.accumulation = hint, accumulation
        self._count = BatchCount(first_step * accumulation)
        self._condition = threading.Condition()
        self._checked = self._count.ended  # every batch through this one had a finite loss
        self._begins = []  # the epoch's execution starts (batch indices), in order
        self.error = None  # the NonFiniteLossError raised, once one was

    def on_epoch_begin(self, epoch, logs=None):
        self._count.epoch_begin()
        self._begins = []

    def on_train_batch_begin(self, batch, logs=None):
        self._begins.append(batch)  # main thread, before the execution is dispatched

    def on_train_batch_end(self, batch, logs=None):
        starts = bisect.bisect_right(self._begins, batch)
        first = self._begins[starts - 1] if starts else batch  # this execution's first batch
        batches = self._count.end(batch)
        loss = (logs or {}).get("loss")
        try:
            if loss is not None:
                value = float(np.asarray(keras.ops.convert_to_numpy(loss)))
                if not math.isfinite(value):
                    self._fail(value, batches - (batch - first), batches)
        finally:
            with self._condition:
                if self.error is None:  # a finite running mean: every batch of the epoch so far was finite
                    self._checked = max(self._checked, batches)
                self._condition.notify_all()

    def _fail(self, value, first, last):
        step, since = -(-last // self.accumulation), -(-first // self.accumulation)
        where = f"at step {step}" + (
            f" (steps {since}-{step} ran as one execution; the loss broke in one of them)" if since < step else ""
        )
        self._raise(f"The training loss is {value} {where}")

    def on_epoch_end(self, epoch, logs=None):
        """A non-finite validation loss stops the run too, before `Progress` writes the epoch's checkpoint."""
        value = (logs or {}).get("val_loss")
        if value is not None and not math.isfinite(float(np.asarray(value))):
            step = -(-self._count.ended // self.accumulation)
            self._raise(
                f"The validation loss is {float(np.asarray(value))} after step {step} (the end of epoch {epoch + 1})"
            )

    def on_train_end(self, logs=None):
        """Checks the weights after the last update, whose loss was computed before it (and found finite)."""
        if self.error is None:
            self.check_weights(-(-self._count.ended // self.accumulation))

    def check_weights(self, step, model=None):
        """Raises `NonFiniteLossError` when a trainable weight of `model` (the fitted one) is NaN or infinite.

        The training loss of a step is computed before its update, so an
        update that breaks the weights shows in no loss when it is the run's
        last. One reduction per weight, on its device (a weight split across
        processes is never gathered): every process calls it.
        """
        model = model if model is not None else self.model
        weights = [v for v in model.trainable_weights if "float" in str(v.dtype)]
        if not weights:
            return
        finite = [_finite_here(v) for v in weights]
        if bool(np.asarray(keras.ops.convert_to_numpy(keras.ops.all(keras.ops.stack(finite))))):
            return
        broken = next(v.path for v, ok in zip(weights, finite) if not bool(np.asarray(keras.ops.convert_to_numpy(ok))))
        self._raise(f"The weights are no longer finite after step {step} ({broken} holds NaN or infinity)")

    def check_outputs(self, outputs, what):
        """Raises `NonFiniteLossError` when `outputs`, the fitted model's on `what`, hold NaN or infinity.

        Weights can grow huge and stay finite while what they compute
        overflows: the loss of the last step, computed before its update,
        does not show it, and a run without a validation split computes
        nothing else with the final weights before saving them.
        """
        if np.isfinite(np.asarray(outputs, dtype="float64")).all():
            return
        step = -(-self._count.ended // self.accumulation)
        self._raise(f"The model's outputs on {what} are NaN or infinite after step {step}, its weights finite")

    def _raise(self, what):
        error = NonFiniteLossError(
            f"{what}: training stopped and nothing from this run was saved over earlier outputs. {self.hint}".strip()
        )
        with self._condition:
            self.error = self.error or error
            self._condition.notify_all()
        raise self.error

    def check_through(self, batches, timeout=600.0):
        """Waits until the losses through the run's batch `batches` are checked; raises the error if one broke.

        Called on the main thread before a checkpoint: by then those batches
        have been dispatched, and so have their checks (Keras' thread runs them).
        """
        with self._condition:
            if not self._condition.wait_for(lambda: self.error is not None or self._checked >= batches, timeout):
                raise RuntimeError(f"the loss of batch {batches} was not checked within {timeout:.0f} s")
            if self.error is not None:
                raise self.error


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

    What follows a step runs on the main thread when the next execution
    begins (or at the epoch's end), so Keras need not sync each step's logs
    for it; a checkpoint waits there for its `guard` to have checked the
    losses through its step, and is not written if one broke.

    Args:
        directory: where checkpoints go, or None for none.
        settings: what the run depends on; a checkpoint of other settings is refused.
        steps_per_epoch: optimizer steps in one epoch (one evaluation period).
        every: steps between checkpoints besides epoch ends; 0 for epoch ends only.
        history_path: the CSV of per-epoch logs, or None.
        state: a restored checkpoint's state (`kgpt.train.checkpoint.restore`), or None.
        accumulation: batches per optimizer step (gradient accumulation).
        publish: called after each checkpoint is written (a remote run copies it out of its mirror), or None.

    Attributes:
        guard: the `StopOnNonFiniteLoss` fitting the same model, consulted before each checkpoint; whoever
            lists both sets it (`kgpt.jobs.run.Run.callbacks`). None: checkpoints are written unchecked.
    """

    keep = ()  # checkpoint folders besides the latest that must survive (see kgpt.train.checkpoint.save)

    def __init__(
        self, directory, settings, steps_per_epoch, every=0, history_path=None, state=None, accumulation=1, publish=None
    ):
        super().__init__()
        self.publish, self.guard = publish, None
        self.directory, self.settings, self.every = directory, settings, every
        self.steps_per_epoch, self.history_path = steps_per_epoch, history_path
        self.accumulation = accumulation
        state = state or {}
        self.step = state.get("step", 0)
        self.first_step = self.step  # where this process started (a resumed run: the checkpoint's step)
        self.epochs = state.get("epochs", [])  # one dict of logs per finished epoch
        self.metric_state = state.get("metric_state")  # the interrupted epoch's running sums, restored once
        self._count = BatchCount(self.step * accumulation)

    @property
    def history(self):
        """`{name: [value per epoch]}`, like Keras' `History.history`, over the whole run."""
        names = list(dict.fromkeys(k for logs in self.epochs for k in logs))
        return {k: [logs.get(k) for logs in self.epochs] for k in names}

    # --- SIGTERM -------------------------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        if self._preempted():  # before the first step: the last checkpoint (if any) is where the run stands
            raise Preempted(
                f"stopped by SIGTERM before training from step {self.step:,}; nothing new to keep. Run "
                f"the same command again to resume."
            )

    def _preempted(self):
        """Whether any process received SIGTERM (with several processes, they all decide at the same step)."""
        received = sigterm_received()
        return cluster.any_process(received) if cluster.current().several else received

    # --- steps and epochs ------------------------------------------------------------------------------

    async_safe = True  # its on_train_batch_end only counts (in Keras' callback thread on JAX)

    def on_epoch_begin(self, epoch, logs=None):
        self._count.epoch_begin()

    def on_train_batch_begin(self, batch, logs=None):
        _raise_dropped_interrupt()
        if batch:  # this epoch's earlier executions are dispatched: act on the steps they finished
            self._steps_done(self._count.begun(batch) // self.accumulation)
        if self.metric_state is not None:  # a resumed epoch continues the sums of its first part
            from kgpt.train import checkpoint

            # At the first batch, not at the epoch's start: Keras builds the metrics' variables in between.
            if not checkpoint.restore_metric_state(self.model, self.metric_state):
                logger.info(
                    "The checkpoint's running loss does not fit this model's metrics: the resumed epoch's "
                    "loss covers its batches after the checkpoint only."
                )
            self.metric_state = None

    def on_train_batch_end(self, batch, logs=None):
        self._count.end(batch)

    def _steps_done(self, step):
        """Steps through `step` are dispatched (mid-epoch): checkpoints every `every` steps, and SIGTERM."""
        if step == self.step:
            return  # inside an accumulated step
        previous, self.step = self.step, step
        if self._preempted():
            self.save(epoch_sums=True)
            self._stop_preempted()
        if self.every and step // self.every > previous // self.every and step % self.steps_per_epoch:
            self.save(epoch_sums=True)

    def _stop_preempted(self):
        if self.directory is None:
            raise Preempted(
                f"stopped by SIGTERM at step {self.step:,}; this run writes no checkpoints (no "
                f"--output_dir, or --checkpoint_every 0), so a rerun starts over."
            )
        raise Preempted(
            f"stopped by SIGTERM at step {self.step:,}; checkpoint written in {self.directory}. Run "
            f"the same command again to resume."
        )

    def on_epoch_end(self, epoch, logs=None):
        self.step = self._count.ended // self.accumulation  # Keras has waited for every batch end of the epoch
        logs = {k: float(np.asarray(v)) for k, v in (logs or {}).items()}
        del self.epochs[epoch:]
        self.epochs.append(logs)
        self.epoch_done(epoch + 1, logs)
        self.write_history()
        self.save()
        # A notice during the epoch's last step: after that epoch's checkpoint, unless it was this fit's last
        # epoch (the next fit's on_train_begin stops then, and after the run's last one the run finishes).
        if epoch + 1 < (self.params or {}).get("epochs", 0) and self._preempted():
            self._stop_preempted()  # the checkpoint just written is this step's

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
        rows += [
            ",".join([str(i), *(repr(logs[k]) if k in logs else "" for k in names)])
            for i, logs in enumerate(self.epochs)
        ]
        write_text(self.history_path, "\n".join(rows) + "\n")

    def save(self, epoch_sums=False):
        """Writes a checkpoint of this step (process 0); `epoch_sums` keeps the running epoch's metric sums.

        Raises `NonFiniteLossError` instead when a loss through this step broke.
        """
        if self.directory is None:
            return
        if self.guard is not None:
            self.guard.check_through(self.step * self.accumulation)
        model = self.model  # on JAX every process puts the training state back into the variables here
        if self.guard is not None:  # a step's loss is computed before its update: the update may have broken them
            self.guard.check_weights(self.step, model)
        from kgpt.train import checkpoint

        state = {"settings": self.settings, "step": self.step, "epochs": self.epochs, **self.extra_state()}
        if epoch_sums and self.step % self.steps_per_epoch:
            state["metric_state"] = checkpoint.metric_state(model)
        checkpoint.save(model, self.directory, state, keep=self.keep)  # every process: process 0 writes
        if self.publish is not None:
            self.publish()


class ProgressLog(keras.callbacks.Callback):
    """One line every `every` steps or seconds: step, loss, throughput and time left (process 0).

    For a log file or a cluster's log, where Keras' per-epoch line may come
    once an hour. `every` is `"N"` steps, `"Ns"` seconds, or `"0"` for none.
    With `steps_per_execution > 1` Keras reports every execution's last step:
    a line comes at the first report past each multiple of N.

    Args:
        every: when to print.
        total_steps: the run's last step.
        first_step: the step the run starts from (a resumed run).
        tokens_per_step: tokens in one step's batch, or None to count examples.
        examples_per_step: examples in one step's batch.
        accumulation: batches per optimizer step.
    """

    async_safe = True  # on JAX it runs in Keras' callback thread, which waits for the loss it prints

    def __init__(self, every, total_steps, first_step=0, tokens_per_step=None, examples_per_step=None, accumulation=1):
        super().__init__()
        self.steps, self.seconds = parse_every(every)
        self.total_steps, self.step, self.accumulation = total_steps, first_step, accumulation
        self.tokens_per_step, self.examples_per_step = tokens_per_step, examples_per_step
        self._count = BatchCount(first_step * accumulation)
        self._lock = threading.Lock()
        self._since = self._last_step = None

    def on_epoch_begin(self, epoch, logs=None):
        self._count.epoch_begin()

    def on_train_batch_end(self, batch, logs=None):
        batches = self._count.end(batch)
        if batches % self.accumulation:
            return  # inside an accumulated step
        step, now = batches // self.accumulation, time.monotonic()
        with self._lock:  # executions' ends may come in any order, several at once
            if self._since is None:  # the first step compiles: measure from its end
                self.step, self._since, self._last_step = step, now, step
                return
            if step <= self._last_step:
                return  # a later step has been handled already
            self.step = step
            due = (self.steps and step // self.steps > self._last_step // self.steps) or (
                self.seconds and now - self._since >= self.seconds
            )
            if not due:
                return
            done, seconds = step - self._last_step, now - self._since
            self._since, self._last_step = now, step
        if cluster.is_chief():
            self._print(step, done / max(seconds, 1e-9), logs or {})

    def _print(self, step, rate, logs):
        """One line at `step`, `rate` steps/s since the last one."""
        parts = [f"step {step:,}/{self.total_steps:,}"]
        loss = logs.get("loss")
        if loss is not None:
            parts.append(f"loss {float(np.asarray(keras.ops.convert_to_numpy(loss))):.4f}")
        if self.tokens_per_step:
            parts.append(f"{rate * self.tokens_per_step:,.0f} tokens/s")
        elif self.examples_per_step:
            parts.append(f"{rate * self.examples_per_step:,.1f} examples/s")
        left = (self.total_steps - step) / rate if rate > 0 else float("inf")
        parts.append(f"{_duration(left)} left")
        logger.info(", ".join(parts))


class EpochBar(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, counting the run's `epochs`: a resumed run's first `fit` ends with the epoch it
    finishes, which Keras' own bar would show as the last (`Epoch 3/3` before `Epoch 4/5`)."""

    # Keras adds its own bar after choosing whether batch ends go to its callback thread, so its bar never
    # forces a host sync per step; this one, passed in by kgpt, says so to keep that.
    async_safe = True

    def __init__(self, epochs):
        super().__init__()
        self.run_epochs = epochs

    def set_params(self, params):
        super().set_params({**params, "epochs": self.run_epochs})


class EpochTensorBoard(keras.callbacks.TensorBoard):
    """Keras' `TensorBoard` callback per epoch only: the same event files, and no hook on any batch.

    With its default `update_freq="epoch"` Keras' callback writes per epoch
    only (`epoch_*` scalars and the learning rate in `train/`, validation's
    `epoch_*` and `evaluation_*_vs_iterations` in `validation/`), yet it
    overrides `on_train_batch_end`, and one such callback makes Keras hand
    every step's logs to the callbacks on the main thread as Python floats (a
    host sync per step on JAX). This one leaves Keras' batch hooks at their
    defaults and writes what Keras' writes at the epoch's end; the training
    graph, which Keras writes at the first batch's end where it can (for a
    `tf.function` train step; Keras 3's trainers pass a Python function, so
    none is written), comes at the first epoch's end. Nothing of it runs in
    Keras' callback thread. Batch summaries and profiling (`update_freq`,
    `profile_batch`) need Keras' own callback.
    """

    # Keras' defaults (`utils.default`), which it recognizes as no hook at all.
    on_train_batch_begin = keras.callbacks.Callback.on_train_batch_begin
    on_train_batch_end = keras.callbacks.Callback.on_train_batch_end
    on_test_batch_begin = keras.callbacks.Callback.on_test_batch_begin

    def __init__(self, log_dir="logs", **kwargs):
        for name, only in (("update_freq", "epoch"), ("profile_batch", 0)):
            if kwargs.get(name, only) != only:
                raise ValueError(
                    f"EpochTensorBoard writes per epoch only: {name} must be {only!r}, got "
                    f"{kwargs[name]!r}; keras.callbacks.TensorBoard writes batches and profiles."
                )
        super().__init__(log_dir, **kwargs)

    def on_epoch_end(self, epoch, logs=None):
        if self._should_write_train_graph:  # the train step has run by now
            self._write_keras_model_train_graph()
            self._should_write_train_graph = False
        super().on_epoch_end(epoch, logs)


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
