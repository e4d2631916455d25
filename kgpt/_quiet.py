"""TensorFlow's and XLA's C++ start-up lines, kept out of kgpt's output.

Importing TensorFlow and finding the devices print about ten lines on every
machine (oneDNN, "Could not find cuda drivers", "failed call to cuInit", CPU
instruction sets). TensorFlow 2.21 writes them before absl's logging is
initialised, so `TF_CPP_MIN_LOG_LEVEL` no longer silences them. They are
written to file descriptor 2 directly, past `sys.stderr`, so only a capture
of the descriptor can filter them: every other captured line is repeated.
Some come later, at a job's first step (oneDNN's "supports DT_INT64 only on
platforms with AVX-512", logged as an error although it only says which
kernel runs), so a command filters its whole run (`LiveFilter`).
`TF_CPP_MIN_LOG_LEVEL=0` turns the filters off.
"""

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading

from kgpt import _children

NOISE = re.compile(
    r"All log messages before absl::InitializeLog|oneDNN custom operations|cudart_stub\.cc|cuda_platform\.cc|"
    r"cpu_feature_guard\.cc|To enable the following instructions|Unable to register cu(DNN|FFT|BLAS) factory|"
    r"computation_placer\.cc|TF-TRT Warning|Could not find TensorRT|xla_bridge\.py.*Unable to initialize backend|"
    r"oneDNN supports DT_\w+ only on platforms with|"
    # The runtime's own report of a process of the run gone, which kgpt's one line naming it replaces.
    r"ring_alg\.cc.*Aborting Ring|base_collective_executor\.cc.*StartAbort|"
    r"Additional GRPC error information from remote target|:UNKNOWN:Error received from peer"
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


# Runs in the child: Ctrl-C is the command's to handle, so the child ignores it and drains the pipe
# until the command closes it, then exits. When the command dies, even by SIGKILL, the child gets SIGTERM
# (kgpt/_children.py, loaded by its path: this child does not import kgpt) and stops waiting for the pipe's
# end, which a process the command forked may hold: it passes on what the pipe holds (all the command wrote
# before it died) and exits. A SIGTERM while the command lives (a scheduler's, sent to the whole process
# group) is the command's to handle: the child goes on passing its lines. The handler only wakes the select
# (the wakeup fd), so no line is lost between a read and its write. Lines are matched whole (a read may end
# inside one). A line starting with the `NOTE` marker (`note_lost_coordinator`) is kept back; JAX's abort
# report for a lost coordinator, and its stack trace, are dropped, and the note printed at the end, unless the
# command's own error line came after the report (its error path won the race with the abort).
_FILTER = r"""
import os, re, runpy, select, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
noise, marker = re.compile(sys.argv[1]), sys.argv[4]
abort = re.compile(r"Terminating process because the JAX distributed service detected fatal errors.*"
                   r"Failed to send RPC to coordination service")
trace = re.compile(r"^\*\*\* Check failure stack trace|^\s*@\s+0x")
state = {"pending": b"", "note": None, "held": None}

def show(chunk, end=False):
    *lines, state["pending"] = (state["pending"] + chunk).split(b"\n")
    lines = [line + b"\n" for line in lines]
    if end and state["pending"]:
        lines.append(state["pending"])
        state["pending"] = b""
    kept = []
    for line in (raw.decode("utf-8", "replace") for raw in lines):
        if line.startswith(marker):
            state["note"] = line[len(marker):]
        elif state["held"] is not None and trace.search(line):
            pass
        elif state["note"] and abort.search(line):
            state["held"] = state["note"]
        elif not noise.search(line):
            if state["held"] and line.startswith(state["held"].split(": ", 1)[0] + ": error: "):
                state["held"] = ""  # the command's own last line won the race with the abort: it is the one line
            kept.append(line)
    if kept:
        os.write(2, "".join(kept).encode("utf-8"))

woken, wake = os.pipe()
os.set_blocking(wake, False)
signal.set_wakeup_fd(wake)
signal.signal(signal.SIGTERM, lambda *_: None)
parent = int(sys.argv[3])
started_by = parent or os.getppid()
if parent:
    try:
        runpy.run_path(sys.argv[2])["die_with_parent"](parent, signal.SIGTERM)
    except Exception:  # without it the child still ends when the pipe does
        pass
while True:
    ready = select.select([0, woken], [], [])[0]
    if woken in ready:
        os.read(woken, 4096)
        if os.getppid() == started_by:
            continue  # the command lives: a SIGTERM sent to its whole process group is the command's to handle
        os.set_blocking(0, False)
        try:
            while chunk := os.read(0, 65536):
                show(chunk)
        except BlockingIOError:
            pass
        break
    if not (chunk := os.read(0, 65536)):
        break
    show(chunk)
show(b"", end=True)
if state["held"]:
    os.write(2, state["held"].encode("utf-8"))
"""

NOTE = "\x1bkgpt-note "  # starts a line of ours to the filter alone (an escape: no runtime line starts with one)
_running = []  # the LiveFilter descriptor 2 goes through now, if any


class LiveFilter:
    """File descriptor 2 passed through a child process that drops `NOISE` lines, from `start()` to `stop()`.

    A child process rather than a thread, so that what this process writes
    just before it dies (an abort, a fatal XLA error) still comes out. The
    child ends when this process does, even by SIGKILL (on Linux; see
    `kgpt._children`), once it has passed on what this process wrote.
    """

    def __init__(self):
        self._saved = self._child = None

    def start(self):
        if os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0" or self._saved is not None:
            return
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):  # no descriptor 2 (an embedded interpreter): nothing to filter
            return
        read, write = os.pipe()
        try:
            # The child ends with the thread that starts it (kgpt._children): only the main thread asks for that.
            parent = os.getpid() if threading.current_thread() is threading.main_thread() else 0
            self._child = subprocess.Popen(
                [sys.executable, "-c", _FILTER, NOISE.pattern, _children.__file__, str(parent), NOTE],
                stdin=read,
                stderr=saved,
                stdout=subprocess.DEVNULL,
            )
        except OSError:
            os.close(saved)
            return
        finally:
            os.close(read)
        os.dup2(write, 2)
        os.close(write)
        self._saved = saved
        _running.append(self)

    def stop(self):
        if self._saved is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)  # closes this process's end of the pipe: the child reads to its end and exits
        os.close(self._saved)
        self._saved = None
        _running.remove(self)
        try:
            self._child.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a subprocess still holds the pipe: the child ends with it, or with us
            pass


def note_lost_coordinator(line):
    """Has the running `LiveFilter` print `line` in place of JAX's report when this process aborts for want of
    its coordinator.

    A run's process 0 holds JAX's coordination service: when it dies, the
    runtime's own thread in every other process aborts that process (exit
    code 134) within a second, before any Python code can say which process
    went. Without a filter (`TF_CPP_MIN_LOG_LEVEL=0`, `--verbose`, a Python
    script) this does nothing, and the runtime's lines show as they are.
    """
    if _running:
        sys.stderr.flush()
        os.write(2, f"{NOTE}{line}\n".encode("utf-8", "replace"))
