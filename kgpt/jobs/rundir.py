"""Output directories that a crash, a second run or a typo cannot corrupt.

A job's `--output_dir` is claimed with `RunDirectory`: an exclusive lock
(`.lock`, released by the OS when the process dies, even by SIGKILL, and
never held by a process it forks), and a
`run.json` naming the job and the settings its outputs depend on. Running
the same command again in the directory continues (or re-evaluates) that
run; a directory holding another run's outputs, or files kgpt did not
write, is refused unless `overwrite=True`, which clears kgpt's own outputs
first. A run that stops before writing anything but its claim (a check that
fails after it) gives the claim back, so the corrected command is a new run.
Every output is written under a temporary name and moved into place
with `os.replace`, so a file is always either the old one or the new one.

A remote directory (`gs://...`, any path with a scheme: `kgpt.io.storage`)
is checked the same way through `tf.io.gfile`; its lock is a lock object
naming the holder's host and pid (`kgpt.io.remote_lock.RemoteLock`), since an
object store has no lock that dies with its process.
"""

import json
import logging
import os

from kgpt import checks
from kgpt.errors import ConfigError, OutputDirError
from kgpt.io import remote_lock, run_folder, storage
from kgpt.io.run_folder import CHECKPOINTS, LOCK_FILE, RUN_FILE

logger = logging.getLogger(__name__)

# Everything a kgpt job writes into its output directory: what --overwrite clears.
OUTPUTS = (
    "config.json",
    "model.weights.h5",
    "task.json",
    "task.weights.h5",
    "preprocessor.json",
    "tokenizer.json",
    "metadata.json",
    "assets",
    "metrics.json",
    "history.csv",
    "logs",
    "predictions",
    "submission",
    CHECKPOINTS,
    "shards",
    "data",
    "pretrained",
    "zero_shot.csv",
    ".preset.partial",
    RUN_FILE,
    # kgpt-analyze's: its experiments' runs and data, its tables and plots
    "runs",
    "zero_shot_data",
    "zero_shot.md",
    "zero_shot.json",
    "transfer_depth.csv",
    "transfer_depth.md",
    "transfer_depth.png",
    "zero_shot_curve.csv",
    "zero_shot_curve.md",
    "zero_shot_curve.png",
    "ablations.csv",
    "ablations.md",
)

# What a run writes first from its task's embedded data, in a moment: a run that stopped before writing anything
# else leaves its directory without them (`RunDirectory`).
REWRITTEN = ("data", "zero_shot_data")


def same_path(a, b):
    """Whether two paths name the same existing directory (or the same path, when neither exists); a
    `file://` path is its local path, another remote one equal only to itself."""
    if a is None or b is None:
        return False
    if storage.local_form(a) is None or storage.local_form(b) is None:
        return os.fspath(a).rstrip("/") == os.fspath(b).rstrip("/")
    a, b = storage.local_form(a), storage.local_form(b)
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def written_by_run(path, directory):
    """The name in `directory` that a run there writes (and `--overwrite` clears) which is or holds the
    existing `path` (`"."` for `directory` itself), or None."""
    if path is None or directory is None or same_path(path, directory):
        return None if path is None or directory is None else "."
    local, folder = storage.local_form(path), storage.local_form(directory)
    if local is None or folder is None or not os.path.exists(local):
        return None
    relative = os.path.relpath(os.path.realpath(local), os.path.realpath(folder))
    top = relative.split(os.sep)[0]
    return top if top in OUTPUTS else None


def check_inputs_outside(directory, inputs, beside=()):
    """Raises `ConfigError` when an input of `inputs` (`{flag: path}`) is the output `directory` or lies in
    what a run there writes, which the run replaces and `--overwrite` clears; the flags in `beside` may be
    `directory` itself (a data folder whose files a run leaves alone)."""
    for flag, path in inputs.items():
        inside = written_by_run(path, directory)
        if inside is None or (inside == "." and flag in beside):
            continue
        where = "is" if inside == "." else f"is in {inside} of"
        raise ConfigError(
            f"{flag} {path} {where} the output directory {directory}, which the run writes (--overwrite clears "
            f"it): pass another output directory, or move it out first."
        )


class RunDirectory:
    """Claims `path` for one run of `job` with `settings` (a JSON-able dict); use as a context manager.

    Args:
        path: the output directory (created if missing).
        job: the job's name, e.g. `"finetune"` or `"pretrain"`.
        settings: what the outputs depend on; a rerun with other settings is
            refused, listing the differences.
        overwrite: replace another run's outputs (kgpt's `OUTPUTS`; other
            files stay) instead of refusing.

    Example:
    ```python
    with RunDirectory("out", "finetune", {"task": "rte", "seed": 0}) as run:
        storage.write_json(os.path.join(run.path, "metrics.json"), {"accuracy": 0.5})
    ```
    """

    def __init__(self, path, job, settings, overwrite=False):
        self.path, self.job, self.settings, self.overwrite = path, job, settings, overwrite
        self._lock = None
        self.remote_lock = None  # the claim of a remote directory (`kgpt.io.remote_lock.RemoteLock`)
        self._wrote_claim = False  # whether this claim wrote run.json (the directory was new, or overwritten)

    def __enter__(self):
        storage.check_path(self.path, "--output_dir")
        if storage.is_remote(self.path):
            storage.check_folder(self.path)
            self.remote_lock = remote_lock.RemoteLock(self.path)
            self.remote_lock.acquire()
        else:
            os.makedirs(self.path, exist_ok=True)
            self._acquire()
        try:
            self._check()
        except BaseException:
            self._release()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is not None and self._wrote_claim:
                try:
                    self._unclaim_if_empty()
                except Exception as e:  # noqa: BLE001 - the run's own error is the one to see
                    logger.warning(f"Warning: {self.path}: its run.json could not be removed ({e}).")
        finally:
            self._release()

    def _unclaim_if_empty(self):
        """Removes the run.json this claim wrote when the run stopped before writing anything else.

        A run refused after its claim (a wrong --init, a bad data file) then
        leaves the directory as it found it, so the corrected command is not
        refused as "a run with other settings". What it wrote from a task's
        embedded data (`REWRITTEN`) goes too: the next run writes it again.
        """
        names = storage.listdir(self.path)
        if all(n in (LOCK_FILE, RUN_FILE, *REWRITTEN) for n in names):
            for name in (*REWRITTEN, RUN_FILE):  # this claim's: it was new, or cleared OUTPUTS
                storage.remove(storage.join(self.path, name))

    def _acquire(self):
        self._lock, holder = run_folder.take_lock(self.path)
        if holder is not None:
            raise self._in_use(holder)

    def _in_use(self, holder):
        return OutputDirError(
            f"{self.path} is in use by another kgpt run ({holder}): wait for it to finish, "
            f"or pass another --output_dir."
        )

    def _release(self):
        if self.remote_lock is not None:
            self.remote_lock.release()
            self.remote_lock = None
        if self._lock is not None:
            run_folder.release_lock(self._lock)
            self._lock = None

    def inspect(self):
        """What claiming the directory would do, found without writing anything: `(action, foreign)`.

        `action` is `"same"` (this run again: it resumes or re-evaluates),
        `"new"` (nothing there yet) or `"overwrite"` (`foreign`, the files
        there, hold another run's outputs, which `overwrite=True` clears);
        a claim that would be refused raises its `OutputDirError` here. The
        claim itself (`__enter__`) and `--dry_run` both decide with it.
        """
        run_file = storage.join(self.path, RUN_FILE)
        theirs = None
        if storage.exists(run_file):
            try:
                theirs = json.loads(storage.read_text(run_file))
            except (OSError, ValueError) as e:
                if not self.overwrite:
                    raise OutputDirError(
                        f"{run_file} cannot be read ({e}): pass --overwrite to replace this "
                        f"directory's outputs, or another --output_dir."
                    ) from None
        if theirs == {"job": self.job, "settings": self.settings}:
            return "same", []
        foreign = [n for n in storage.listdir(self.path) if n not in (LOCK_FILE, RUN_FILE) and not storage.is_upload(n)]
        if theirs is None and not foreign:
            return "new", []
        if not self.overwrite:
            raise OutputDirError(self._refusal(theirs, foreign))
        return "overwrite", foreign

    def check_free(self):
        """Raises the claim's "in use" `OutputDirError` when a process holds the directory's lock; takes none."""
        holder = run_folder.lock_holder(self.path)
        if holder is not None:
            raise self._in_use(holder)

    def _check(self):
        action, _ = self.inspect()
        if action == "same":
            return
        if action == "overwrite":
            self._clear()
        storage.write_json(storage.join(self.path, RUN_FILE), {"job": self.job, "settings": self.settings})
        self._wrote_claim = True

    def _refusal(self, theirs, foreign):
        if theirs is None:
            shown = ", ".join(sorted(foreign)[:5]) + (", ..." if len(foreign) > 5 else "")
            return (
                f"{self.path} already holds files that no kgpt {self.job} run wrote ({shown}): pass "
                f"--overwrite to write beside them (kgpt's outputs there are replaced), or another --output_dir."
            )
        if not isinstance(theirs, dict) or theirs.get("job") != self.job:
            job = theirs.get("job") if isinstance(theirs, dict) else "unknown"
            return (
                f"{self.path} holds the outputs of a {job} run, not {self.job}: pass another --output_dir, or "
                f"--overwrite to replace them."
            )
        changed = checks.differences(theirs.get("settings") or {}, self.settings)
        return (
            f"{self.path} holds a {self.job} run with other settings ({changed}): pass another "
            f"--output_dir, or --overwrite to replace its outputs."
        )

    def _clear(self):
        """Removes whatever kgpt jobs write (`OUTPUTS`); other files stay."""
        for name in OUTPUTS:
            storage.remove(storage.join(self.path, name))
