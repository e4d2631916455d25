"""The skeleton both training jobs share: a run's place (`Run`), set-up, callbacks, resuming, and outputs.

A job (`kgpt.jobs.pretrain`, `kgpt.jobs.finetune`) is a short function on top:

    run_config = config.run_part()                                   # a RunConfig: where and how it runs
    with run.workspace(run_config, "finetune", settings, "kgpt-rte-", batch_size) as work:  # joined, claimed
        with work.scope():                                           # seed, dtype policy, devices
            ...build and compile the model...
            state = work.restore(model, settings)                    # the checkpoint, if any
            progress = Progress(work.checkpoint_dir, settings, ..., work.history_path, state,
                                    publish=work.publish)
            run.fit(model, datasets, work.callbacks(progress, hint)) # resumes mid-epoch
            work.save_outputs(model, metrics, files)                 # preset + metrics.json

The job reads its config; this module takes its `RunConfig` part
(`config.run_part()`: where and how the run executes), and what lies below
gets plain values or the `Run`. With an `output_dir` everything above is
kept, and the same command again resumes from the last checkpoint; without
one, nothing is.

On several processes (`kgpt.parallel.cluster`) every process runs the same
job on its rows of each batch (`workspace` joins them first); process 0 alone claims and
writes the output directory, which every process must see (a shared file
system), or which is remote (`gs://...`): each process then works in its own
local copy (`Run.mirror`, a `kgpt.io.storage.Mirror`) and process 0 copies
its outputs back (`Run.publish`).
"""

import contextlib
import logging
import os
import sys
import tempfile

import keras
import numpy as np

from kgpt import checks
from kgpt.errors import ConfigError
from kgpt.io import storage
from kgpt.io.run_folder import CHECKPOINTS, saving_outputs
from kgpt.io.storage import write_json
from kgpt.jobs.config import RunConfig, check_integers
from kgpt.jobs.rundir import OUTPUTS, RunDirectory
from kgpt.parallel import cluster, placement
from kgpt.parallel.distribute import check_placement, gathered_copy, training_scope, writing
from kgpt.train import callbacks as callbacks_lib
from kgpt.train import checkpoint as checkpoint_lib
from kgpt.train.callbacks import EpochTensorBoard, ProgressLog, StopOnNonFiniteLoss, catching_signals

logger = logging.getLogger(__name__)


def check_run(run_config, batch_size):
    """Raises `ConfigError` for run settings (a `RunConfig`) that cannot work together, before anything starts."""
    # batch_size is each job's (None in fine-tuning); model_parallel distribute.check_placement's, which every
    # run it splits passes.
    check_integers(
        run_config, "gradient_accumulation_steps", "startup_timeout", "checkpoint_every", "lm_loss_chunk_size"
    )
    steps = run_config.gradient_accumulation_steps
    if batch_size % steps:
        raise ConfigError(
            f"batch_size {batch_size} must be a multiple of gradient_accumulation_steps {steps}: each "
            f"update is accumulated over {steps} equal micro-batches."
        )
    if run_config.output_dir:  # before a demo model is pre-trained or data is read
        storage.check_path(run_config.output_dir, "--output_dir")
    if run_config.log_every != "auto":
        callbacks_lib.parse_every(run_config.log_every)
    if keras.config.backend() == "jax":
        compilation_cache_dir(run_config.compilation_cache)  # a folder that cannot be made, before anything starts
    if run_config.model_parallel is not None and run_config.distribution != "model_parallel":
        raise ConfigError(
            f"{checks.option('model_parallel')} {run_config.model_parallel} splits each model with "
            f"{checks.option('distribution')} model_parallel, not {run_config.distribution}: add it, or leave "
            f"{checks.option('model_parallel')} out."
        )
    if run_config.distribution == "model_parallel" and keras.config.backend() != "jax":
        raise ConfigError(
            "distribution model_parallel runs on the jax backend (keras.distribution.ModelParallel); on "
            "TensorFlow use data_parallel."
        )
    count = run_config.num_processes or 1
    if count > 1 and (batch_size // steps) % count:
        raise ConfigError(
            f"batch_size {batch_size}{f' / gradient_accumulation_steps {steps}' if steps > 1 else ''} "
            f"must split evenly over the {count} processes (and their devices)."
        )


CACHE_ENV = "KGPT_COMPILATION_CACHE"
CACHE_MAX_BYTES = 4 << 30  # JAX then evicts the least recently used programs, under a file lock
CACHE_MIN_COMPILE_SECS = 0.1  # JAX's default, 1 s, recompiles the many short programs of a small model's run


def compilation_cache_dir(value=None, environ=None):
    """The folder for compiled XLA programs: `value` ('none': None), else `$KGPT_COMPILATION_CACHE`,
    `$JAX_COMPILATION_CACHE_DIR`, `$XDG_CACHE_HOME/kgpt/xla` (`~/.cache/kgpt/xla`). Raises `ConfigError` for a
    folder that cannot be made, naming the flag or variable."""
    environ = os.environ if environ is None else environ
    if value is not None:
        origin = "--compilation_cache"
    elif environ.get(CACHE_ENV) is not None:
        value, origin = environ[CACHE_ENV], f"${CACHE_ENV}"
    elif environ.get("JAX_COMPILATION_CACHE_DIR"):
        return environ["JAX_COMPILATION_CACHE_DIR"]  # JAX's own setting, as JAX would read it
    else:
        base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        value, origin = os.path.join(base, "kgpt", "xla"), "the compilation cache (default folder)"
    if not str(value).strip():
        raise ConfigError(f"{origin} is empty: give a folder, or 'none' to compile without a cache.")
    if str(value).strip().lower() == "none":
        return None
    path = os.path.abspath(os.path.expanduser(value))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{origin} {value}: not a folder.")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"{origin} {value}: cannot make the folder ({e.strerror or e}); give another, or 'none'."
        ) from None
    return path


@contextlib.contextmanager
def compilation_cache(value=None):
    """Inside, JAX keeps the XLA programs it compiles in `compilation_cache_dir(value)` and loads them from there.

    A second run of the same shapes then loads its train step instead of
    compiling it. JAX's settings are restored at exit (a library call changes
    no global state for long). Nothing on other backends: Keras does not
    XLA-compile TensorFlow's steps on a CPU, and TensorFlow keeps no such cache.
    """
    if keras.config.backend() != "jax":
        yield None
        return
    import jax
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    path = compilation_cache_dir(value)
    wanted = {"jax_enable_compilation_cache": path is not None, "jax_compilation_cache_dir": path}
    if path is not None and path != os.environ.get("JAX_COMPILATION_CACHE_DIR") and _evictable(path):
        wanted["jax_compilation_cache_max_size"] = CACHE_MAX_BYTES  # JAX's own folder keeps JAX's settings
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        wanted["jax_persistent_cache_min_compile_time_secs"] = CACHE_MIN_COMPILE_SECS
    if path is None:
        del wanted["jax_compilation_cache_dir"]
    before = {name: getattr(jax.config, name) for name in wanted}
    changed = {name: v for name, v in wanted.items() if before[name] != v}

    def apply(values):
        for name, v in values.items():
            jax.config.update(name, v)
        if values:
            quiet = logging.getLogger("jax._src.compilation_cache")  # it logs each reset at INFO
            level = quiet.level
            quiet.setLevel(logging.WARNING)
            try:
                jax_cache.reset_cache()  # JAX opens its cache once: the next compilation opens it with these settings
            finally:
                quiet.setLevel(level)

    apply(changed)
    try:
        yield path
    finally:
        apply({name: before[name] for name in changed})


def _evictable(path):
    """Whether JAX can bound the cache in `path`: every program there has its access time (a folder written
    without a bound has none, and JAX's eviction then fails on every write)."""
    names = set(os.listdir(path))
    return all(name[: -len("-cache")] + "-atime" in names for name in names if name.endswith("-cache"))


def join(run_config, job, settings, batch_size=None):
    """Joins the run's other processes, if any, and checks that they run this job with these settings.

    `run_config` is the job's `RunConfig` (`config.run_part()`). Returns the
    `kgpt.parallel.placement.Cluster`. `workspace` calls it before anything
    is read or written, so a process started with another flag stops every
    process first; with `batch_size`, so does a distribution the run's
    devices cannot hold. Call it alone to join once for several jobs
    (kgpt-analyze); joining again is a check only.
    """
    here = cluster.start(
        placement.resolve(run_config.coordinator_address, run_config.num_processes, run_config.process_id),
        timeout=run_config.startup_timeout,
    )
    if here.several:
        if (
            run_config.output_dir
            and storage.is_remote(run_config.output_dir)
            and run_config.distribution == "model_parallel"
        ):
            raise ConfigError(
                f"--output_dir {run_config.output_dir}: a model split across processes is checkpointed by "
                f"every process into one folder, which kgpt writes on a local file system only: mount "
                f"the bucket (e.g. GCS FUSE) and pass the mount's path, or use data_parallel."
            )
        if not run_config.output_dir:
            raise ConfigError(
                "A run on several processes needs --output_dir: a folder every process can read "
                "(token shards, the tokenizer, checkpoints), which process 0 writes."
            )
        cluster.check_agreement(
            {
                "job": job,
                "settings": settings,
                "output_dir": run_config.output_dir,
                "placement": {"model_parallel": run_config.model_devices},
            }
        )
    if batch_size is not None:
        distribution = (
            "data_parallel" if run_config.distribution == "none" and here.several else run_config.distribution
        )
        steps = run_config.gradient_accumulation_steps
        check_placement(distribution, batch_size // steps, run_config.model_devices, steps)
    return here


class Run:
    """Where one run writes, and what it does there around `fit`: `workspace` makes it.

    `output_dir` is the output directory as given (None: nothing is kept),
    `directory` the local folder the run writes: `output_dir` itself, the
    local folder of its `mirror` (a `kgpt.io.storage.Mirror`, when it is
    remote), or a temporary folder. Write there with the usual local calls,
    and `publish()` after a write that must survive a kill. `config` is the
    run's `RunConfig` and `batch_size` its batch (what `scope` splits).
    """

    def __init__(self, output_dir, directory, mirror=None, config=None, batch_size=None):
        self.output_dir, self.directory, self.mirror = output_dir, directory, mirror
        self.config, self.batch_size = config if config is not None else RunConfig(), batch_size
        self.log_every, self.accumulation = self.config.log_every, self.config.gradient_accumulation_steps

    def scope(self):
        """`scope(config, batch_size)` of this run: its seed, dtype policy and devices; yields the batch shards."""
        return scope(self.config, self.batch_size)

    @property
    def kept(self):
        """Whether the run keeps its outputs (it has an output directory)."""
        return self.output_dir is not None

    @property
    def checkpoint_dir(self):
        """The folder of the run's checkpoints (`kgpt.train.checkpoint`); None when nothing is kept."""
        return os.path.join(self.directory, CHECKPOINTS) if self.kept else None

    @property
    def history_path(self):
        """The run's `history.csv` (a line per epoch); None when nothing is kept."""
        return os.path.join(self.directory, "history.csv") if self.kept else None

    @property
    def location(self):
        """Where the outputs end up, for messages: the remote folder a mirror stands for, else `directory`."""
        return self.mirror.remote_path(self.directory) if self.mirror is not None else self.directory

    def publish(self):
        """Copies what process 0 wrote so far to a remote output directory (nothing for a local one)."""
        if self.mirror is not None:
            self.mirror.push()

    def fetch(self, names):
        """On processes other than 0 with a remote output directory: copies `names` that process 0 wrote there."""
        if self.mirror is not None and not self.mirror.writer:
            folder = os.path.relpath(self.directory, self.mirror.local).replace(os.sep, "/")
            self.mirror.pull([name if folder == "." else f"{folder}/{name}" for name in names])

    def for_all(self, fn, what):
        """`cluster.on_chief(fn, what)`, or `fn()` on every process when each has its own copy of the output
        directory.

        For files a job derives and reads back (the demo text, a task's
        embedded data): on a shared folder process 0 writes them once for all.
        """
        return fn() if self.mirror is not None else cluster.on_chief(fn, what)

    def restore(self, model, settings, total_steps=None):
        """The state of the run's last checkpoint, loaded into the compiled `model`; None without one.

        A checkpoint past the run's end is refused (`CheckpointError`): past
        `total_steps`, else past the settings' `max_steps` (pre-training), or
        with more finished epochs than their `epochs` (fine-tuning).
        """
        if not self.kept:
            return None
        if total_steps is None and isinstance(settings.get("max_steps"), int):
            total_steps = settings["max_steps"]
        epochs = settings.get("epochs") if isinstance(settings.get("epochs"), int) else None
        state = checkpoint_lib.restore(model, self.checkpoint_dir, settings, total_steps, epochs)
        if state is None and os.path.exists(os.path.join(self.directory, "metrics.json")):
            # A finished run whose checkpoints were deleted (to free the disk): the same command trains again.
            logger.warning(
                f"Warning: {self.location} holds a finished run's outputs but no checkpoint in "
                f"{os.path.join(self.location, CHECKPOINTS)}: training again from the start; its model and "
                f"metrics.json are replaced when the run ends."
            )
        return state

    def callbacks(
        self, progress, hint, before=(), after=(), total_steps=None, tokens_per_step=None, examples_per_step=None
    ):
        """The run's callbacks: stop on a NaN loss, `before`, `progress`, progress lines, TensorBoard, `after`.

        `before` are callbacks that add to an epoch's logs or to a checkpoint's
        state (progress records and saves them after theirs have run); `after`
        see the checkpoint already written. Progress lines (`log_every`) need
        `total_steps`; TensorBoard (per epoch, `EpochTensorBoard`) needs an
        output directory and process 0.
        """
        directory = self.checkpoint_dir
        hint = f"{hint}; the last checkpoint{f' ({directory})' if directory else ''} is kept."
        lines = []
        every = log_every(self.log_every)
        if total_steps and every != "0":
            lines = [
                ProgressLog(every, total_steps, progress.step, tokens_per_step, examples_per_step, self.accumulation)
            ]
        tensorboard = (
            [EpochTensorBoard(os.path.join(self.directory, "logs"))] if self.kept and cluster.is_chief() else []
        )
        progress.guard = StopOnNonFiniteLoss(hint, progress.step, self.accumulation)  # checks its checkpoints
        return [
            progress.guard,
            *before,
            progress,
            *lines,
            *tensorboard,
            *after,
        ]

    def save_outputs(self, model, metrics, files):
        """Saves `model` as a preset and `metrics.json` (last: the preset is then complete) in the run's folder.

        `files` describes what the output directory then holds, for the
        closing message. Process 0 writes; the others wait until it has, so
        none exits while the run's files are incomplete.
        """
        if not self.kept:
            return
        model = gathered_copy(model)  # a model split across processes, whole (every process takes part)
        try:
            with writing(self.directory) as directory:
                if directory is not None:
                    with saving_outputs(directory):  # a model saved from Python is refused there
                        model.save_to_preset(directory)  # whole, or the old preset
                    write_json(os.path.join(directory, "metrics.json"), metrics)
                    self.publish()
        finally:
            if cluster.current().several:
                cluster.barrier()  # no process ends while the run's files are incomplete
        logger.info(f"Saved {files} and metrics.json in {self.location}")


@contextlib.contextmanager
def workspace(run_config, job, settings, prefix, batch_size=None, within=None, one_process=None):
    """Yields the `Run` of `run_config` (a `RunConfig`) with batches of `batch_size`, its processes joined
    (`join`): its `output_dir` claimed for `job` (`RunDirectory`), or a temporary folder.

    `one_process` says why the job cannot run on several processes (None: it
    can); it is refused with that message once they have joined, before the
    claim.

    The temporary folder (for data a run derives, e.g. token shards or a
    task's embedded data) is deleted at exit: without an output directory
    nothing is kept. A remote `output_dir` is written through a local mirror
    (`kgpt.io.storage.Mirror`): every process reads its own copy (taken after
    process 0's claim), and process 0 alone writes it back. A run inside
    another (`within`: the demo model a fine-tuning pre-trains, its
    baseline) has its `output_dir` in that run's folder and publishes
    through its mirror. With several processes, process 0 claims the
    directory and the others go on only if it could.
    """
    if join(run_config, job, settings, batch_size).several and one_process:
        raise ConfigError(one_process)
    options = dict(config=run_config, batch_size=batch_size)
    with catching_signals():  # a scheduler's notice stops the run at a step boundary (callbacks.Progress)
        if not run_config.output_dir:
            with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
                yield Run(None, scratch, **options)
            return
        with claimed(RunDirectory(run_config.output_dir, job, settings, overwrite=run_config.overwrite)) as claim:
            if storage.is_remote(run_config.output_dir):
                with storage.Mirror(
                    run_config.output_dir, names=OUTPUTS, lock=claim.remote_lock, writer=cluster.is_chief()
                ) as mirror:
                    yield Run(run_config.output_dir, mirror.local, mirror, **options)
            else:
                yield Run(run_config.output_dir, run_config.output_dir, within.mirror if within else None, **options)


@contextlib.contextmanager
def claimed(claim):
    """Holds `claim` (a `RunDirectory`), taken and released by process 0 alone; yields it.

    The other processes go on only if process 0 could claim the directory;
    a body that stops with an error hands the claim that error, so a run
    that wrote nothing gives the claim back (`RunDirectory.__exit__`).
    """
    cluster.on_chief(claim.__enter__, f"claiming {claim.path}")
    try:
        yield claim
    except BaseException as e:
        if cluster.is_chief():
            claim.__exit__(type(e), e, e.__traceback__)
        raise
    if cluster.is_chief():
        claim.__exit__(None, None, None)


@contextlib.contextmanager
def scope(run_config, batch_size):
    """Seeds the run and yields the number of batch shards under `run_config`'s (a `RunConfig`) dtype policy and
    distribution.

    Each micro-batch (`batch_size / gradient_accumulation_steps` rows) splits
    evenly over the shards. JAX compiles through the run's compilation
    cache (`compilation_cache`).
    """
    steps = run_config.gradient_accumulation_steps  # batch_size splits into them: check_run
    with (
        compilation_cache(run_config.compilation_cache),
        training_scope(
            run_config.distribution,
            run_config.dtype,
            batch_size // steps,
            run_config.model_devices,
            accumulation=steps,
        ) as shards,
    ):
        seed_keras(run_config.seed)
        yield shards


def seed_keras(seed):
    """Seeds what Keras draws its own random numbers from, so that a run's weights and dropout masks repeat.

    kgpt's own draws (batch order, pre-training windows, new token
    embeddings) come from generators seeded from the config
    (`np.random.default_rng`); Keras' do not take one: every initializer and
    dropout layer built without a seed draws it from Python's global `random`
    (`keras.random.make_default_seed`), and unseeded `keras.random` ops use
    Keras' global `SeedGenerator`. `keras.utils.set_random_seed` seeds both
    (and TensorFlow's global seed); NumPy's global generator, which it seeds
    too, is put back as it was: kgpt draws nothing from it, and it belongs
    to the application.
    """
    state = np.random.get_state()
    keras.utils.set_random_seed(seed)
    np.random.set_state(state)


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


def log_every(value):
    """`--log_every` with "auto" decided: every 60 s without a terminal (a log file), else none."""
    if value != "auto":
        return value
    return "0" if sys.stdout.isatty() else "60s"


def fit(model, calls, callbacks, validation=None):
    """`model.fit` once per `(dataset, initial_epoch, epochs, steps_per_epoch)` of `calls`, sharing the callbacks.

    Keras prints a progress bar on a terminal, a line per epoch otherwise,
    and nothing on processes other than 0.
    """
    verbose = (1 if os.isatty(1) else 2) if cluster.is_chief() else 0
    for dataset, first, last, steps in calls:
        model.fit(
            dataset,
            initial_epoch=first,
            epochs=last,
            steps_per_epoch=steps,
            validation_data=validation,
            callbacks=callbacks,
            shuffle=False,  # batches are already drawn in the run's own order
            verbose=verbose,
        )
