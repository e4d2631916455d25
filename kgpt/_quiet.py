"""TensorFlow's and XLA's C++ start-up lines, kept out of kgpt's output.

Importing TensorFlow and finding the devices print about ten lines on every
machine (oneDNN, "Could not find cuda drivers", "failed call to cuInit", CPU
instruction sets). TensorFlow 2.21 writes them before absl's logging is
initialised, so `TF_CPP_MIN_LOG_LEVEL` no longer silences them. They are
written to file descriptor 2 directly, past `sys.stderr`, so only a capture
of the descriptor can filter them: every other captured line is repeated.
`TF_CPP_MIN_LOG_LEVEL=0` turns the filter off.
"""

import contextlib
import os
import re
import sys
import tempfile

NOISE = re.compile(
    r"All log messages before absl::InitializeLog|oneDNN custom operations|cudart_stub\.cc|cuda_platform\.cc|"
    r"cpu_feature_guard\.cc|To enable the following instructions|Unable to register cu(DNN|FFT|BLAS) factory|"
    r"computation_placer\.cc|TF-TRT Warning|Could not find TensorRT|xla_bridge\.py.*Unable to initialize backend"
)


class Capture:
    """File descriptor 2 captured between `start()` and `stop()`; `stop` repeats every line but `NOISE`."""

    def __init__(self):
        self._saved = self._file = None

    def start(self):
        if os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0" or self._saved is not None:
            return
        try:
            sys.stderr.flush()
            self._saved = os.dup(2)
        except (OSError, ValueError):  # no descriptor 2 (an embedded interpreter): nothing to filter
            return
        self._file = tempfile.TemporaryFile(mode="w+b")
        os.dup2(self._file.fileno(), 2)

    def stop(self):
        if self._saved is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._saved = None
        self._file.seek(0)
        for line in self._file.read().decode("utf-8", "replace").splitlines(keepends=True):
            if not NOISE.search(line):
                sys.stderr.write(line)
        sys.stderr.flush()
        self._file.close()


@contextlib.contextmanager
def quiet_stderr():
    """Runs the block with file descriptor 2 captured, then repeats every captured line but `NOISE`."""
    capture = Capture()
    capture.start()
    try:
        yield
    finally:
        capture.stop()
