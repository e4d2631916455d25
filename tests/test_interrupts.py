"""Ctrl-C (SIGINT) ends kgpt-train with one line and exit code 130, no traceback, and no child left behind.

A real process on the suite's backend (a tiny model: each run starts, trains a few steps and is interrupted
in about 15 s); SIGTERM to the whole process group, as a scheduler sends it, likewise. Every wait is
bounded, and each test kills what it started in its `finally`.
"""

import functools
import os
import signal
import subprocess
import sys
import time

import pytest
from test_child_processes import _descendants, _stat

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the children are found through /proc")


def _wait_for_line(process, text, seconds):
    """The output read until a line holding `text` came (or `seconds` passed, or the process ended)."""
    lines, deadline = [], time.monotonic() + seconds
    os.set_blocking(process.stdout.fileno(), False)
    pending = b""
    while time.monotonic() < deadline and process.poll() is None:
        chunk = process.stdout.read()
        if chunk:
            pending += chunk
            *done, pending = pending.split(b"\n")
            lines += [line.decode("utf-8", "replace") for line in done]
            if any(text in line for line in lines):
                break
        else:
            time.sleep(0.1)
    return lines


def _start_training(tmp_path, **options):
    """A tiny pre-training that runs until stopped (stdout and stderr merged), and its output directory."""
    words = "the cat sat on a mat and the dog ran far away while birds sang".split()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text(
        "\n".join(" ".join(words[(i + j) % len(words)] for j in range(12)) for i in range(300))
    )
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "kgpt.cli.train",
        "--task",
        "lm",
        "--corpus",
        str(corpus),
        "--output_dir",
        str(out),
    ]
    command += "--num_layers 1 --num_heads 2 --hidden_dim 16 --intermediate_dim 32 --sequence_length 32".split()
    command += "--max_steps 100000 --batch_size 8 --warmup_steps 2 --evaluations 1 --log_every 1".split()
    command += "--checkpoint_every 5".split()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}  # the suite's backend: CI runs it on each
    env.pop("KGPT_TRACEBACK", None)
    # As from a terminal: a suite started in the background (`cmd &` in a script) passes Ctrl-C on ignored, and
    # kgpt leaves an ignored Ctrl-C ignored.
    restore = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, preexec_fn=restore, **options
    )
    return process, out


def _signal_state(pid):
    """The signal masks of `pid` from /proc (SigBlk, SigIgn, SigCgt): for the message of a failed wait."""
    with open(f"/proc/{pid}/status") as f:
        return " ".join(line.strip() for line in f if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


def _rest(process, seconds):
    """The output lines until the process ends, or, `seconds` later, until it is killed (SIGABRT first, so that
    Python's fault handler prints where each thread was)."""
    try:
        rest, _ = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        try:
            rest, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            rest, _ = process.communicate(timeout=30)
    return rest.decode("utf-8", "replace").splitlines()


def _wait_gone(children):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_stat(pid) for pid in children):
        time.sleep(0.2)
    assert not [pid for pid in children if _stat(pid)], children


def test_ctrl_c_during_training_ends_with_one_line_and_code_130(tmp_path):
    process, out = _start_training(tmp_path)
    try:
        before = _wait_for_line(process, "step 7/", 240)  # after the checkpoint of step 5, which a rerun resumes
        assert process.poll() is None, "\n".join(before)
        children = _descendants(process.pid)
        signals = _signal_state(process.pid)
        process.send_signal(signal.SIGINT)
        lines = _rest(process, 120)
        assert process.returncode == 130, "\n".join([signals] + before + lines)
        assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in lines), "\n".join(lines)
        # Progress lines of the last steps may come after it (stdout and stderr are two pipes merged here).
        line = f"kgpt-train: interrupted; the same command resumes from the last checkpoint ({out})."
        assert lines.count(line) == 1 and not [x for x in lines if "interrupted" in x and x != line], "\n".join(lines)
        _wait_gone(children)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def test_sigterm_to_the_whole_process_group_checkpoints_and_says_so(tmp_path):
    # A scheduler (Slurm's scancel, GNU timeout) sends SIGTERM to every process of the job: kgpt's stderr
    # filter must keep passing lines, so that the run's last line comes out rather than a broken pipe.
    process, out = _start_training(tmp_path, start_new_session=True)
    try:
        before = _wait_for_line(process, "step 3/", 240)
        assert process.poll() is None, "\n".join(before)
        children = _descendants(process.pid)
        os.killpg(process.pid, signal.SIGTERM)
        lines = _rest(process, 120)
        assert process.returncode == 0, "\n".join(before + lines)
        assert not any("Traceback" in line or "Error" in line for line in lines), "\n".join(lines)
        stopped = [x for x in lines if x.startswith("kgpt-train: stopped by SIGTERM at step ")]
        assert len(stopped) == 1 and f"checkpoint written in {out}" in stopped[0], "\n".join(lines)
        _wait_gone(children)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
