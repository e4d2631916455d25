"""The training callbacks without a per-step host sync: NaN stop, checkpoints and progress lines, with
`steps_per_execution` 1 and 4 (Keras then calls the batch hooks once per 4 batches).

A one-weight linear model keeps these fast; the jobs' own tests (test_pretrain, test_use_trained,
test_cluster_parts) run the same callbacks inside kgpt-train.
"""

import json
import threading

import keras
import numpy as np
import pytest

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
    model.fit(*data(4), batch_size=2, epochs=2, verbose=0, shuffle=False,
              callbacks=[callbacks.StopOnNonFiniteLoss(), progress, callbacks.ProgressLog("2", 8), threads])
    assert threads.threads == ({False} if keras.config.backend() == "jax" else {True})
    assert progress.step == 8 and len(progress.epochs) == 2


@pytest.mark.parametrize("steps_per_execution, where", [(1, "at step 6:"), (4, r"at step 8 \(steps 5-8 ran as one")])
def test_a_nan_stops_training_naming_its_step_and_no_checkpoint_after_it_is_written(tmp_path, steps_per_execution,
                                                                                       where):
    model = linear(steps_per_execution)
    progress = callbacks.Progress(str(tmp_path / "ckpt"), {}, steps_per_epoch=12, every=1)
    guard = callbacks.StopOnNonFiniteLoss("Lower it.")
    with pytest.raises(callbacks.NonFiniteLossError, match=f"The training loss is nan {where}.*Lower it."):
        model.fit(*data(12, bad_batch=5), batch_size=2, epochs=1, verbose=0, shuffle=False,
                  callbacks=[guard, progress])
    latest = json.loads((tmp_path / "ckpt" / "latest.json").read_text())["checkpoint"]
    state = json.loads((tmp_path / "ckpt" / latest / "state.json").read_text())
    assert state["step"] == (5 if steps_per_execution == 1 else 4)  # the last step before the NaN one checked
    assert np.isfinite(state["metric_state"]).all()  # its running loss sums: the weights saved were sound


def test_a_resumed_run_counts_its_steps_from_the_checkpoint_and_over_accumulation():
    model = linear(4)
    guard = callbacks.StopOnNonFiniteLoss(first_step=10, accumulation=2)
    with pytest.raises(callbacks.NonFiniteLossError, match=r"at step 14 \(steps 13-14 ran as one"):
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
