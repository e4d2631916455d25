"""What marks a folder as a kgpt run's output directory: its files, its lock, and who may save a model into it.

A job's output directory (`kgpt.jobs.rundir.RunDirectory`) holds `run.json`
and `.lock`, the run's exclusive lock (`take_lock`, `lock_holder`), and its
checkpoints under `checkpoint/` (`kgpt.train.checkpoint`). The job writes
its model there itself (`saving_outputs`) when it ends: a model saved into
such a folder from Python (`save_to_preset`) would replace that run's model
without a word, so it is refused (`check_save_target`); a loader names a
folder whose run has not saved its model yet (`kgpt.io.presets.check_finished`).
"""

import contextlib
import errno
import json
import os
import threading

from kgpt.errors import OutputDirError

RUN_FILE = "run.json"
LOCK_FILE = ".lock"
CHECKPOINTS = "checkpoint"  # the folder of a run's checkpoints, each in step-NNNNNNNNN/
LATEST = "latest.json"  # in CHECKPOINTS: the name of the newest complete checkpoint
STATE = "state.json"  # in each checkpoint: its step, epoch and running sums
RESULTS = ("metrics.json", "history.csv", "predictions", "submission")  # a run's figures of the model it saved

_saving = set()  # the folders (real paths) this process's jobs are saving their outputs into
_saving_guard = threading.Lock()


@contextlib.contextmanager
def saving_outputs(directory):
    """Inside, a model may be saved into the run folder `directory`: a job saving its own outputs."""
    path = os.path.realpath(directory)
    with _saving_guard:
        _saving.add(path)
    try:
        yield
    finally:
        with _saving_guard:
            _saving.discard(path)


def job_is_saving(directory):
    """Whether a job of this process is saving its outputs into `directory` (`saving_outputs`)."""
    with _saving_guard:
        return os.path.realpath(directory) in _saving


def check_save_target(preset_dir):
    """Raises `OutputDirError` when `preset_dir` holds a kgpt run (its `run.json`) that is not saving itself."""
    path = os.fspath(preset_dir)
    if not path:  # the preset's own checks name an empty path
        return
    run_file = os.path.join(path, RUN_FILE)
    if not os.path.isfile(run_file):
        return
    if job_is_saving(path):
        return
    try:
        with open(run_file, encoding="utf-8") as f:
            job = json.load(f).get("job")
    except (OSError, ValueError, AttributeError):
        job = None
    raise OutputDirError(
        f"{path} is the output directory of a kgpt{f' {job}' if isinstance(job, str) else ''} run ({RUN_FILE}), "
        f"which writes its model there itself: save the preset to a new folder."
    )


# --- the lock ----------------------------------------------------------------------------------------------

# The lock files this process holds, as {(device, inode): pid}. A POSIX record lock is the process's, so
# the process must refuse a second claim itself, and without opening the file: closing any descriptor of
# a file drops the process's record locks on it.
_held = {}
_held_guard = threading.Lock()


def _file_id(file):
    """`(device, inode)` of a path (None if there is no such file) or of an open descriptor."""
    try:
        stat = os.fstat(file) if isinstance(file, int) else os.stat(file)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def take_lock(directory):
    """Takes the run lock of the local folder `directory`: `(open lock file, None)`, or `(None, holder)` when a
    process holds it ("pid N", this one's included).

    fcntl.lockf, a POSIX record lock, belongs to this process: the processes
    it forks (kgpt's tokenizer workers) inherit the descriptor but not the
    lock, so the lock goes when this process dies, even by SIGKILL. A flock
    belongs to the open file, which fork shares: a child that outlived its
    parent kept it.
    """
    import fcntl

    path = os.path.join(directory, LOCK_FILE)
    with _held_guard:
        if _held.get(_file_id(path)) == os.getpid():
            return None, f"pid {os.getpid()}"
        lock = open(path, "a+")
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                lock.close()
                raise
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()  # this process held no lock on the file: closing it drops nothing
            return None, holder
        _held[_file_id(lock.fileno())] = os.getpid()
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()}\n")
    lock.flush()
    return lock, None


def release_lock(lock):
    """Releases a lock `take_lock` returned (the file stays, harmless)."""
    with _held_guard:
        _held.pop(_file_id(lock.fileno()), None)
        lock.close()


def lock_holder(directory):
    """Who holds the run lock of the local folder `directory` ("pid N"), or None; takes none.

    For a look that must not claim (`--dry_run`, a loader): a lock taken and
    released here tests the lock file only.
    """
    import fcntl

    path = os.path.join(directory, LOCK_FILE)
    with _held_guard:
        if _held.get(_file_id(path)) == os.getpid():  # this process's own run: opening the file would drop its lock
            return f"pid {os.getpid()}"
    if not os.path.exists(path) or not os.access(path, os.W_OK):
        return None
    with open(path, "r+") as lock:
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            return lock.read().strip() or "another process"
        fcntl.lockf(lock, fcntl.LOCK_UN)
    return None
