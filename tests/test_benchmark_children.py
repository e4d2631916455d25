"""The benchmarks' measuring processes end with the benchmark, even when it is killed with SIGKILL.

A benchmark that starts its workers with `kgpt._children.ends_with_this_process()` leaves none of them
running when it is killed; a static check keeps every process start in benchmarks/ on it. Real processes,
found through /proc; every wait is bounded.
"""

import ast
import glob
import os
import signal
import subprocess
import sys
import time

import pytest
from test_child_processes import _descendants, _stat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTS = {"run", "Popen", "call", "check_call", "check_output"}


def _process_starts(path):
    """`[(line, whether the call passes preexec_fn=ends_with_this_process())]` of each subprocess start."""
    starts = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in STARTS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "subprocess"
        ):
            ends = any(
                k.arg == "preexec_fn"
                and isinstance(k.value, ast.Call)
                and getattr(k.value.func, "id", None) == "ends_with_this_process"
                for k in node.keywords
            )
            starts.append((node.lineno, ends))
    return starts


def test_every_process_a_benchmark_starts_ends_with_it():
    scripts = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py")))
    starts = {os.path.relpath(p, ROOT): _process_starts(p) for p in scripts}
    assert sum(len(s) for s in starts.values()) >= 7  # the check sees the starts it is meant to check
    missing = [f"{path}:{line}" for path, found in starts.items() for line, ends in found if not ends]
    assert not missing, f"processes started without preexec_fn=ends_with_this_process(): {missing}"


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG and /proc are Linux's")
def test_killing_the_model_benchmark_ends_its_worker():
    command = [
        sys.executable,
        os.path.join(ROOT, "benchmarks", "model.py"),
        "--models=kgpt",
        "--num_layers=1",
        "--hidden_dim=16",
        "--num_heads=2",
        "--intermediate_dim=32",
        "--sequence_length=16",
        "--vocabulary_size=97",
        "--batch_size=2",
        "--steps=10000000",
        "--warmup=1",
    ]
    parent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    workers = {}
    try:
        deadline = time.monotonic() + 120
        while not workers and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
            workers = {
                pid: line
                for pid, (_, line) in _descendants(parent.pid).items()
                if any(part.startswith("--worker=") for part in line)
            }
        assert workers, "the benchmark started no worker within 120 s"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_stat(pid) for pid in workers):
            time.sleep(0.1)
        alive = [pid for pid in workers if _stat(pid)]
        assert not alive, f"workers still running 30 s after the benchmark was killed: {alive}"
    finally:
        for pid in [parent.pid, *workers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        parent.wait(timeout=30)
