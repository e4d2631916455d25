"""The skeleton both training jobs share: set-up, callbacks, resuming, and outputs.

A job (`kgpt.jobs.pretrain`, `kgpt.jobs.finetune`) is a short function on top:

    with run.workspace(config, "finetune", settings, "kgpt-rte-") as work:   # claim output_dir, or a temp dir
        with run.scope(config, batch_size):                                   # seed, dtype policy, devices
            ...build and compile the model...
            state = run.restore(model, config, settings)                      # the checkpoint, if any
            progress = Progress(run.checkpoint_dir(config), settings, ..., run.history_path(config), state)
            run.fit(model, datasets, run.callbacks(config, progress, hint))   # resumes mid-epoch
            run.save_outputs(model, config, metrics)                          # preset + metrics.json

With an `output_dir` everything above is kept, and the same command again
resumes from the last checkpoint; without one, nothing is.
"""

import contextlib
import logging
import os
import tempfile

import keras

from kgpt.jobs.rundir import RunDirectory, save_preset, write_json
from kgpt.train import checkpoint as checkpoint_lib
from kgpt.train.callbacks import StopOnNonFiniteLoss
from kgpt.train.distribute import training_scope

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def workspace(config, job, settings, prefix):
    """Yields the folder a run writes to: `config.output_dir` claimed for `job` (`RunDirectory`), or a temporary one.

    The temporary folder (for data a run derives, e.g. token shards or a
    task's embedded data) is deleted at exit: without an output directory
    nothing is kept.
    """
    if config.output_dir:
        with RunDirectory(config.output_dir, job, settings, overwrite=config.overwrite):
            yield config.output_dir
    else:
        with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
            yield scratch


@contextlib.contextmanager
def scope(config, batch_size):
    """Seeds the run and yields the number of replicas under the config's dtype policy and distribution."""
    with training_scope(config.distribution, config.dtype, batch_size) as replicas:
        keras.utils.set_random_seed(config.seed)
        yield replicas


def checkpoint_dir(config):
    return os.path.join(config.output_dir, "checkpoint") if config.output_dir else None


def history_path(config):
    return os.path.join(config.output_dir, "history.csv") if config.output_dir else None


def restore(model, config, settings):
    """The state of the run's last checkpoint, loaded into the compiled `model`; None without one."""
    directory = checkpoint_dir(config)
    return checkpoint_lib.restore(model, directory, settings) if directory else None


def segments(step, steps_per_epoch, epochs):
    """`(first_epoch, last_epoch, skip)` fit calls from optimizer step `step` to the end of `epochs`.

    A resumed run first finishes its interrupted epoch (skipping the `skip`
    batches it trained), so that epochs still end every `steps_per_epoch` steps.
    """
    epoch, done = divmod(step, steps_per_epoch)
    if done:
        yield epoch, epoch + 1, done
        epoch += 1
    if epoch < epochs:
        yield epoch, epochs, 0


def callbacks(config, progress, hint, before=(), after=()):
    """The run's callbacks: stop on a NaN loss, `before`, `progress`, TensorBoard (with an output dir), `after`.

    `before` are callbacks that add to an epoch's logs (progress records
    them); `after` see the checkpoint already written.
    """
    directory = checkpoint_dir(config)
    hint = f"{hint}; the last checkpoint{f' ({directory})' if directory else ''} is kept."
    tensorboard = [keras.callbacks.TensorBoard(os.path.join(config.output_dir, "logs"))] if config.output_dir else []
    return [StopOnNonFiniteLoss(hint, progress.step), *before, progress, *tensorboard, *after]


def fit(model, calls, callbacks, validation=None):
    """`model.fit` once per `(dataset, initial_epoch, epochs, steps_per_epoch)` of `calls`, sharing the callbacks."""
    for dataset, first, last, steps in calls:
        model.fit(dataset, initial_epoch=first, epochs=last, steps_per_epoch=steps, validation_data=validation,
                  callbacks=callbacks, shuffle=False,  # batches are already drawn in the run's own order
                  verbose=1 if os.isatty(1) else 2)


def save_outputs(model, config, metrics, files):
    """Saves `model` as a preset and `metrics.json` (last: the preset is then complete) in `config.output_dir`.

    `files` describes what the output directory then holds, for the closing message.
    """
    if not config.output_dir:
        return
    save_preset(model, config.output_dir)
    write_json(os.path.join(config.output_dir, "metrics.json"), metrics)
    logger.info(f"Saved {files} and metrics.json in {config.output_dir}")
