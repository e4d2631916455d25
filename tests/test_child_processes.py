"""Every process kgpt starts ends with it, even when it is killed with SIGKILL; no child holds a run's lock.

Real processes, found through /proc (Linux: `kgpt._children` does nothing elsewhere). Every wait is bounded,
and whatever a test started is killed in its `finally`.
"""

import contextlib
import os
import random
import re
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kgpt.data.shards import default_workers
from kgpt.errors import OutputDirError
from kgpt.jobs.rundir import RunDirectory

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG and /proc are Linux's")


def _stat(pid):
    """`(parent pid, start time)` of a running process; None once it has ended (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
    except OSError:
        return None
    state, parent, start = fields[0], int(fields[1]), fields[19]
    return None if state in "ZXx" else (parent, start)


def _command_line(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode("utf-8", "replace") for part in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


def _descendants(pid):
    """`{pid: (start time, command line)}` of every running process below `pid`."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))):
            parents[int(name)] = stat
    found, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        for child, (its_parent, start) in parents.items():
            if its_parent == parent and child not in found:
                found[child] = (start, _command_line(child))
                todo.append(child)
    return found


def _running(processes):
    """Those of `processes` (`_descendants`' form) still running: not ended, and not a new process under the pid."""
    return {pid: seen for pid, seen in processes.items() if (stat := _stat(pid)) and stat[1] == seen[0]}


def _kill(processes):
    for pid in _running(processes):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _line(process, timeout=60):
    """The next line `process` prints (each whole, to an unbuffered pipe), waiting at most `timeout` seconds."""
    if not select.select([process.stdout], [], [], timeout)[0]:
        raise AssertionError(f"no line from the process within {timeout} s")
    return process.stdout.readline().decode()


def _write_corpus(path, megabytes):
    """Varied text: 20,000 sentences of 4,000 made-up words, drawn with repeats."""
    rng = random.Random(0)
    syllables = ["ka", "lo", "mi", "ter", "an", "sel", "du", "ro", "ve", "qui", "na", "por", "el", "ist", "um", "ba"]
    words = sorted({"".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(4000)})
    sentences = [" ".join(rng.choices(words, k=rng.randint(5, 20))).capitalize() + ".\n" for _ in range(20_000)]
    count = int(megabytes * 1e6 / (sum(map(len, sentences)) / len(sentences)))
    path.write_text("".join(rng.choices(sentences, k=count)), encoding="utf-8")


@pytest.mark.skipif(default_workers() < 2, reason="the shards are tokenized in worker processes with 2 cores or more")
def test_killing_a_run_while_its_workers_tokenize_leaves_no_process_and_no_lock(tmp_path):
    (tmp_path / "corpus").mkdir()
    _write_corpus(tmp_path / "corpus" / "a.txt", 16)  # about 2 s of tokenizing on 2 cores
    # --prepare_only: the run claims its output directory, starts the stderr filter and tokenizes in worker
    # processes as a training run does, and the rerun need not train (25 s more on 2 cores).
    args = [
        sys.executable,
        "-m",
        "kgpt.cli.train",
        "--task=lm",
        f"--corpus={tmp_path / 'corpus'}",
        f"--output_dir={tmp_path / 'out'}",
        "--prepare_only",
    ]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # "0" would start no filter
    seen = {}
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 300
        workers = filters = []
        while time.monotonic() < deadline and first.poll() is None:
            seen |= _descendants(first.pid)
            running = _running(seen)
            # The workers are forks (the parent's command line); the stderr filter is `python -c`.
            workers = [pid for pid, (_, command) in running.items() if command == args]
            filters = [pid for pid, (_, command) in running.items() if command[1:2] == ["-c"]]
            if len(workers) >= 2 and filters:
                break
            time.sleep(0.005)
        assert len(workers) >= 2 and filters, (
            f"the run (exit code {first.poll()}) was not seen with its tokenizer workers and stderr filter: "
            f"{seen}\n{(tmp_path / 'first.log').read_text()[-3000:]}"
        )
        seen |= _descendants(first.pid)
        first.kill()
        first.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _running(seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = {pid: " ".join(command)[:100] for pid, (_, command) in _running(seen).items()}
        assert not left, f"{len(left)} of {len(seen)} processes outlived the killed run: {left}"
    finally:
        first.kill()
        _kill(seen)
        with contextlib.suppress(subprocess.TimeoutExpired):
            first.wait(timeout=30)

    # The same command again: the lock went with the run, and the shards are built anew (the killed build left
    # no index).
    second = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "in use" not in second.stderr
    assert re.search(r"Tokenized 1 file\(s\) into [\d,]+ tokens .* with \d+ worker", second.stdout), second.stdout
    assert (tmp_path / "out" / "shards" / "index.json").is_file()


def test_a_child_whose_parent_ended_before_it_asked_ends_at_once():
    code = "import sys; from kgpt._children import die_with_parent; die_with_parent(int(sys.argv[1])); print('alive')"
    ours = subprocess.run([sys.executable, "-c", code, str(os.getpid())], capture_output=True, text=True, timeout=60)
    assert (ours.returncode, ours.stdout) == (0, "alive\n"), ours.stderr
    # Told that its parent was another process (pid 1): as if that parent had ended before the call.
    other = subprocess.run([sys.executable, "-c", code, "1"], capture_output=True, text=True, timeout=60)
    assert (other.returncode, other.stdout) == (-signal.SIGKILL, ""), other.stderr


_FILTERED = """
import os, signal, sys, time
from kgpt._quiet import LiveFilter
live = LiveFilter()
live.start()
child = os.fork()
if child == 0:  # holds the filter's pipe (descriptor 2) and outlives this process
    time.sleep(120)
    os._exit(0)
print(live._child.pid, child, flush=True)
sys.stdin.readline()  # until the test has seen both
os.write(2, b"the last words\\n")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_stderr_filter_ends_with_its_process_and_passes_on_its_last_words(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    with open(tmp_path / "stderr", "wb") as stderr:
        command = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_FILTERED)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            bufsize=0,
        )
    started = {}
    try:
        filter_pid, child_pid = map(int, _line(command).split())
        started = {pid: (_stat(pid)[1], []) for pid in (filter_pid, child_pid)}
        command.stdin.write(b"go\n")
        command.stdin.close()
        assert command.wait(timeout=30) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while filter_pid in _running(started) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert filter_pid not in _running(started), "the filter outlived its process (a forked child holds its pipe)"
        assert child_pid in _running(started)  # it did hold the pipe all along
        assert (tmp_path / "stderr").read_text() == "the last words\n"
    finally:
        command.kill()
        command.wait(timeout=30)
        command.stdout.close()
        with contextlib.suppress(OSError):
            command.stdin.close()
        _kill(started)


_HOLD = """
import os, signal, sys, time
from kgpt.jobs.rundir import RunDirectory
run = RunDirectory(sys.argv[1], "pretrain", {"seed": 0}).__enter__()
child = os.fork()
if child == 0:  # holds every descriptor the parent had, the lock file's included, until it is killed
    time.sleep(120)
    os._exit(0)
print(child, flush=True)
if sys.argv[2] == "release":
    run.__exit__(None, None, None)
    print("released", flush=True)
    time.sleep(120)
else:
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("end", ["release", "die"])
def test_a_forked_child_does_not_hold_the_output_directory(tmp_path, end):
    out = str(tmp_path / "out")
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLD), out, end], stdout=subprocess.PIPE, bufsize=0
    )
    child = {}
    try:
        pid = int(_line(holder))
        child = {pid: (_stat(pid)[1], [])}
        if end == "release":
            assert _line(holder) == "released\n"
        else:
            holder.wait(timeout=30)
        assert _running(child), "the forked child should still run, holding the inherited descriptor"
        with RunDirectory(out, "pretrain", {"seed": 0}):  # a third process claims the directory
            pass
    finally:
        holder.kill()
        holder.wait(timeout=30)
        holder.stdout.close()
        _kill(child)


_CLAIM = """
import sys
from kgpt.jobs.rundir import RunDirectory
from kgpt.errors import OutputDirError
try:
    with RunDirectory(sys.argv[1], "pretrain", {"seed": 0}):
        print("claimed")
except OutputDirError as e:
    print(e)
"""


def test_a_second_claim_in_the_same_process_is_refused_and_keeps_the_first(tmp_path):
    out = str(tmp_path / "out")
    message = rf"out is in use by another kgpt run \(pid {os.getpid()}\): wait for it to finish"
    with RunDirectory(out, "pretrain", {"seed": 0}):
        with pytest.raises(OutputDirError, match=message):
            with RunDirectory(out, "pretrain", {"seed": 0}):
                pass
        # The refusal opened and closed nothing that would drop this process's lock: another process is refused.
        other = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_CLAIM), out], capture_output=True, text=True, timeout=60
        )
        assert other.returncode == 0, other.stderr[-3000:]
        assert f"is in use by another kgpt run (pid {os.getpid()})" in other.stdout
    with RunDirectory(out, "pretrain", {"seed": 0}):  # released: claimed again
        pass
