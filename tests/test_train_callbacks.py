"""The training callbacks without a per-step host sync: NaN stop, checkpoints, progress lines, TensorBoard and
zero-shot evaluations, with `steps_per_execution` 1 and 4 (Keras then calls the batch hooks once per 4 batches).

A one-weight linear model keeps these fast; the jobs' own tests (test_pretrain, test_use_trained,
test_cluster_parts) run the same callbacks inside kgpt-train; test_analysis checks the whole list a
pre-training run with zero-shot tasks passes to Keras.
"""

import glob
import json
import os
import signal
import sys
import threading
from unittest import mock

import keras
import numpy as np
import pytest

from kgpt.analysis.zero_shot import ZeroShotCallback
from kgpt.errors import NonFiniteLossError
from kgpt.train import callbacks


def linear(steps_per_execution):
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=steps_per_execution)
    return model


def data(batches, bad_batch=None):
    """`batches` batches of 2 rows; every row of `bad_batch` (index from 0) NaN, which breaks the loss there."""
    x = np.ones((2 * batches, 1), "float32")
    if bad_batch is not None:
        x[2 * bad_batch : 2 * bad_batch + 2] = np.nan
    return x, np.ones_like(x)


class Threads(keras.callbacks.Callback):
    """Records the thread each batch end runs on (it needs no main thread)."""

    async_safe = True

    def __init__(self):
        super().__init__()
        self.threads = set()

    def on_train_batch_end(self, batch, logs=None):
        self.threads.add(threading.current_thread() is threading.main_thread())


def test_keras_need_not_sync_each_step_for_the_callbacks(tmp_path):
    """With only kgpt's callbacks, Keras may hand batch ends to its own thread (it does on JAX; TensorFlow's
    backend is not thread-safe, so there they run on the main thread, as every callback does)."""
    model, threads = linear(1), Threads()
    progress = callbacks.Progress(str(tmp_path / "ckpt"), {}, steps_per_epoch=4, every=2)
    progress.guard = callbacks.StopOnNonFiniteLoss()
    model.fit(
        *data(4),
        batch_size=2,
        epochs=2,
        verbose=0,
        shuffle=False,
        callbacks=[progress.guard, progress, callbacks.ProgressLog("2", 8), threads],
    )
    assert threads.threads == ({False} if keras.config.backend() == "jax" else {True})
    assert progress.step == 8 and len(progress.epochs) == 2


@pytest.mark.parametrize("steps_per_execution, where", [(1, "at step 6:"), (4, r"at step 8 \(steps 5-8 ran as one")])
def test_a_nan_stops_training_naming_its_step_and_no_checkpoint_after_it_is_written(
    tmp_path, steps_per_execution, where
):
    model = linear(steps_per_execution)
    progress = callbacks.Progress(str(tmp_path / "ckpt"), {}, steps_per_epoch=12, every=1)
    guard = progress.guard = callbacks.StopOnNonFiniteLoss("Lower it.")
    with pytest.raises(NonFiniteLossError, match=f"The training loss is nan {where}.*Lower it."):
        model.fit(*data(12, bad_batch=5), batch_size=2, epochs=1, verbose=0, shuffle=False, callbacks=[guard, progress])
    latest = json.loads((tmp_path / "ckpt" / "latest.json").read_text())["checkpoint"]
    state = json.loads((tmp_path / "ckpt" / latest / "state.json").read_text())
    assert state["step"] == (5 if steps_per_execution == 1 else 4)  # the last step before the NaN one checked
    assert np.isfinite(state["metric_state"]).all()  # its running loss sums: the weights saved were sound


def overflowing(steps_per_execution=1):
    """A linear model whose first update (SGD at 1e38 on a loss of about 1e4) overflows its weights to infinity."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(1e38), loss="mse", steps_per_execution=steps_per_execution)
    return model


@pytest.mark.parametrize("with_checkpoints", [True, False])
def test_weights_broken_by_the_last_update_stop_the_run_before_any_checkpoint_of_them(tmp_path, with_checkpoints):
    """The loss of the run's last step is computed before its update, and is finite: the weights are not."""
    model = overflowing()
    guard = callbacks.StopOnNonFiniteLoss("Lower it.")
    progress = callbacks.Progress(str(tmp_path / "ckpt"), {}, steps_per_epoch=1) if with_checkpoints else None
    if progress is not None:
        progress.guard = guard
    x, y = np.ones((2, 1), "float32"), np.full((2, 1), 100.0, "float32")
    with pytest.raises(NonFiniteLossError, match=r"The weights are no longer finite after step 1 \(.*Lower it\."):
        model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[guard, *([progress] if progress else [])])
    assert not (tmp_path / "ckpt" / "latest.json").exists()


def test_a_non_finite_validation_loss_stops_the_run_before_the_epochs_checkpoint(tmp_path):
    model = linear(1)
    guard = callbacks.StopOnNonFiniteLoss("Lower it.")
    progress = callbacks.Progress(str(tmp_path / "ckpt"), {}, steps_per_epoch=2)
    progress.guard = guard
    with pytest.raises(NonFiniteLossError, match=r"The validation loss is nan after step 2 \(the end of epoch 1\)"):
        model.fit(
            *data(2),
            validation_data=data(1, bad_batch=0),
            batch_size=2,
            epochs=2,
            verbose=0,
            callbacks=[guard, progress],
        )
    assert not (tmp_path / "ckpt" / "latest.json").exists()


def test_a_resumed_run_counts_its_steps_from_the_checkpoint_and_over_accumulation():
    model = linear(4)
    guard = callbacks.StopOnNonFiniteLoss(first_step=10, accumulation=2)
    with pytest.raises(NonFiniteLossError, match=r"at step 14 \(steps 13-14 ran as one"):
        model.fit(*data(8, bad_batch=6), batch_size=2, epochs=1, verbose=0, shuffle=False, callbacks=[guard])


class Synced(keras.callbacks.Callback):
    """A batch end on the main thread: Keras then runs every callback's there, in order."""

    def on_train_batch_end(self, batch, logs=None):
        pass


def test_progress_lines_with_several_steps_per_execution(capsys, progress):
    model = linear(4)
    line = callbacks.ProgressLog("6", total_steps=24, examples_per_step=2)
    # In order (on JAX, Keras' thread may take two executions' ends out of order: a line then comes later).
    model.fit(*data(12), batch_size=2, epochs=2, verbose=0, shuffle=False, callbacks=[line, Synced()])
    steps = [m.split(",")[0] for m in capsys.readouterr().out.splitlines() if m.startswith("step ")]
    # Keras reports every 4th step; a line comes at the first report past each multiple of 6 (the first
    # report, step 4, only starts the clock).
    assert steps == ["step 8/24", "step 12/24", "step 20/24", "step 24/24"]


def async_dispatch(callback_list):
    """Whether Keras would hand `callback_list`'s batch ends to its own thread (no sync per step). TensorFlow's
    backend is not thread-safe, so Keras never does there: its rule is then asked as if it were."""
    from keras.src import backend

    with mock.patch.object(backend, "IS_THREAD_SAFE", True):
        return keras.callbacks.CallbackList(callback_list)._async_train


def events(log_dir):
    """`{subfolder: [(tag, step, value), ...]}` of the TensorBoard event files under `log_dir`, in order."""
    import tensorflow as tf

    found = {}
    for path in sorted(glob.glob(os.path.join(log_dir, "**", "events.*"), recursive=True)):
        rows = found.setdefault(os.path.relpath(os.path.dirname(path), log_dir), [])
        for event in tf.compat.v1.train.summary_iterator(path):
            rows += [(v.tag, event.step, tf.make_ndarray(v.tensor).tolist()) for v in event.summary.value]
            if event.graph_def:
                rows.append(("graph", event.step, None))
    return found


def test_a_resumed_run_shows_its_own_count_of_epochs(capsys):
    # The rest of interrupted epoch 3, then epochs 4 and 5: two fit calls, one bar counting 5.
    model, bar = linear(1), callbacks.EpochBar(5)
    model.fit(*data(3), batch_size=2, initial_epoch=2, epochs=3, callbacks=[bar], verbose=2)
    model.fit(*data(3), batch_size=2, initial_epoch=3, epochs=5, callbacks=[bar], verbose=2)
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Epoch ")]
    assert shown == ["Epoch 3/5", "Epoch 4/5", "Epoch 5/5"]
    assert async_dispatch([bar])  # as Keras' own bar: no host sync per step


def test_epoch_tensorboard_writes_what_keras_tensorboard_writes_with_no_batch_hook(tmp_path):
    model = linear(1)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])
    board = callbacks.EpochTensorBoard(str(tmp_path / "kgpt"))
    assert async_dispatch([board]) and not async_dispatch([keras.callbacks.TensorBoard("x")])
    x, y = data(4)
    model.fit(
        x,
        y,
        batch_size=2,
        epochs=2,
        verbose=0,
        shuffle=False,
        validation_data=(x, y),
        callbacks=[keras.callbacks.TensorBoard(str(tmp_path / "keras")), board],
    )
    written = events(str(tmp_path / "kgpt"))
    assert written == events(str(tmp_path / "keras"))  # tags, steps and values, in the same order
    assert [(tag, step) for tag, step, _ in written["train"]] == [("keras", 0)] + [  # a Sequential's summary
        (f"epoch_{name}", epoch) for epoch in (0, 1) for name in ("loss", "mae", "learning_rate")
    ]
    assert [(tag, step) for tag, step, _ in written["validation"]] == [
        (tag, step)
        for epoch in (0, 1)
        for tag, step in [
            ("evaluation_loss_vs_iterations", 4 * epoch + 4),
            ("evaluation_mae_vs_iterations", 4 * epoch + 4),
            ("epoch_loss", epoch),
            ("epoch_mae", epoch),
        ]
    ]
    with pytest.raises(ValueError, match="update_freq must be 'epoch', got 'batch'"):
        callbacks.EpochTensorBoard(str(tmp_path), update_freq="batch")


class Evaluations(ZeroShotCallback):
    """A zero-shot callback without tasks that records where it evaluates: (step, on the main thread)."""

    def __init__(self, every):
        super().__init__({}, tokenizer=None, every=every)
        self.at = []

    def evaluate_now(self, step):
        if step != self._last:
            self.at.append((step, threading.current_thread() is threading.main_thread()))
        super().evaluate_now(step)


@pytest.mark.parametrize(
    "steps_per_execution, accumulation, expected",
    [
        (1, None, [3, 6, 9, 12]),  # every 3 steps, at each epoch end (6 and 12) too, and at the end (12 again: once)
        (4, None, [4, 8, 12]),  # Keras reports steps 4, 8, 12: the first report past each multiple of 3
        (1, 2, [3, 6]),  # 12 batches, 6 optimizer steps
    ],
)
def test_zero_shot_evaluates_on_the_main_thread_at_its_steps(steps_per_execution, accumulation, expected):
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, gradient_accumulation_steps=accumulation),
        loss="mse",
        steps_per_execution=steps_per_execution,
    )
    zero_shot = Evaluations(every=3)
    assert async_dispatch([zero_shot])
    model.fit(
        *data(12),
        batch_size=2,
        epochs=2 if steps_per_execution == 1 and accumulation is None else 1,
        steps_per_epoch=6 if steps_per_execution == 1 and accumulation is None else None,
        verbose=0,
        shuffle=False,
        callbacks=[zero_shot],
    )
    assert zero_shot.at == [(step, True) for step in expected]


def test_a_checkpoint_whose_step_was_altered_or_lies_past_the_run_is_refused(tmp_path):
    from kgpt.errors import CheckpointError
    from kgpt.jobs.run import Run
    from kgpt.train import checkpoint

    model = linear(1)
    model.fit(*data(1), batch_size=2, epochs=1, verbose=0)
    run = Run(str(tmp_path), str(tmp_path))
    checkpoint.save(model, run.checkpoint_dir, {"settings": {"max_steps": 300}, "step": 100, "epochs": [{}]})
    assert run.restore(model, {"max_steps": 300})["step"] == 100
    state_path = tmp_path / "checkpoint" / "step-000000100" / "state.json"
    state = json.loads(state_path.read_text())
    state_path.write_text(json.dumps({**state, "step": 5000}))
    with pytest.raises(CheckpointError, match=r"step-000000100.state\.json says step 5,000, its folder step-000000100"):
        run.restore(model, {"max_steps": 300})
    # A step that fits its folder, past the run's end (pre-training's max_steps, fine-tuning's epochs).
    checkpoint.save(model, run.checkpoint_dir, {"settings": {"max_steps": 50}, "step": 100, "epochs": [{}]})
    with pytest.raises(CheckpointError, match=r"state\.json says step 100, past this run's 50 steps"):
        run.restore(model, {"max_steps": 50})
    checkpoint.save(model, run.checkpoint_dir, {"settings": {"epochs": 1}, "step": 100, "epochs": [{}, {}]})
    with pytest.raises(CheckpointError, match=r"state\.json records 2 finished epochs, past this run's 1"):
        run.restore(model, {"epochs": 1})


def test_a_runs_callbacks_hand_their_nan_stop_to_progress_which_consults_it_before_a_checkpoint(tmp_path):
    from kgpt.jobs.config import RunConfig
    from kgpt.jobs.run import Run

    progress = callbacks.Progress(str(tmp_path / "ckpt"), {}, steps_per_epoch=2)
    listed = Run(str(tmp_path), str(tmp_path), config=RunConfig(log_every="0")).callbacks(progress, "Lower it")
    assert isinstance(listed[0], callbacks.StopOnNonFiniteLoss) and progress.guard is listed[0]


def test_a_sigterm_notice_ends_with_the_job_that_caught_it():
    # A notice left standing would stop the next run of the same process (a notebook's) before its first step.
    with callbacks.catching_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        assert callbacks.sigterm_received()
    assert not callbacks.sigterm_received()
    with callbacks.catching_signals():
        assert not callbacks.sigterm_received()


class _SignalsInFinalizer(keras.callbacks.Callback):
    """Sends Ctrl-C to this process from inside a finalizer at batch `at`'s end, where Python drops the
    KeyboardInterrupt its handler raises ("Exception ignored in ..."); counts the batches begun."""

    def __init__(self, at):
        super().__init__()
        self.at, self.begun = at, 0

    def on_train_batch_begin(self, batch, logs=None):
        self.begun += 1

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.at:

            class Garbage:
                def __del__(self):
                    os.kill(os.getpid(), signal.SIGINT)
                    for _ in range(1000):  # the handler runs between two bytecodes here
                        pass

            Garbage()


def test_a_ctrl_c_dropped_inside_a_finalizer_stops_the_run_at_the_next_step(tmp_path, monkeypatch):
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)  # where Python reports what it drops
    # As from a terminal: a suite started in the background (`cmd &` in a script) has Ctrl-C ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    model, sender = linear(1), _SignalsInFinalizer(at=1)
    progress = callbacks.Progress(str(tmp_path / "ckpt"), {}, steps_per_epoch=8)
    with callbacks.catching_signals():
        with pytest.raises(KeyboardInterrupt):
            # The sender runs on the main thread (it is not async_safe), as Keras runs every callback there
            # on TensorFlow; then Progress's next batch start is the batch after the one that dropped it.
            model.fit(*data(8), batch_size=2, epochs=1, verbose=0, shuffle=False, callbacks=[sender, progress])
    assert sender.begun == 3, sender.begun
    assert [type(d.exc_value) for d in dropped] == [KeyboardInterrupt]  # the first one was dropped
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signal.signal(signal.SIGINT, previous)
