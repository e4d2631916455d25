"""What marks a folder as a kgpt run's output directory, and who may save a model into one.

A job's output directory holds `run.json` (`kgpt.jobs.rundir`), and the
job writes its model there itself (`saving_outputs`). A model saved into
such a folder from Python (`save_to_preset`) would replace that run's model
without a word, so it is refused (`check_save_target`).
"""

import contextlib
import json
import os
import threading

from kgpt.errors import OutputDirError

RUN_FILE = "run.json"

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


def check_save_target(preset_dir):
    """Raises `OutputDirError` when `preset_dir` holds a kgpt run (its `run.json`) that is not saving itself."""
    path = os.fspath(preset_dir)
    if not path:  # the preset's own checks name an empty path
        return
    run_file = os.path.join(path, RUN_FILE)
    if not os.path.isfile(run_file):
        return
    with _saving_guard:
        if os.path.realpath(path) in _saving:
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
