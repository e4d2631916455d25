"""Several processes, one run: real `kgpt-train` processes on 127.0.0.1 against one process.

Every wait is bounded, and every process a test starts is killed at its end.
The runs are tiny (2 x 32 model, a 0.6 MB corpus, a few dozen steps): they
check behaviour (the same losses, resuming, stopping), not speed
(`benchmarks/processes.py` measures that).
"""

import contextlib
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from conftest import checkpoint_step, one_backend

JAX = keras.config.backend() == "jax"
# TensorFlow's replicas each draw their own dropout masks, so only JAX's runs match one process with dropout.
DROPOUT = "0.1" if JAX else "0"
WORDS = (
    "the keeper of the lighthouse wrote the date in the log every night while the sea rose and the ships "
    "came home before the storm"
).split()


def free_ports(count):
    """`count` consecutive free ports on 127.0.0.1 (TensorFlow puts process i at PORT + i)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free ports")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """0.6 MB of text in two files: three 256 KiB chunks, so both processes tokenize some."""
    folder = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for name, lines in (("a.txt", 3000), ("b.txt", 2000)):
        text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(20)) for _ in range(lines))
        (folder / name).write_text(text + "\n", encoding="utf-8")
    return str(folder)


def lm_args(corpus, out, *extra):
    return [
        "--task=lm",
        f"--corpus={corpus}/*.txt",
        f"--output_dir={out}",
        "--tokenizer=train",
        "--num_merges=60",
        "--num_layers=2",
        "--num_heads=2",
        "--hidden_dim=32",
        "--intermediate_dim=64",
        "--sequence_length=32",
        "--batch_size=8",
        "--warmup_steps=4",
        "--learning_rate=3e-3",
        f"--dropout={DROPOUT}",
        *extra,
    ]


def start(args, log, env=None, devices=None):
    """`python -m kgpt.cli.train ARGS` with its output in `log` (a file, so a full pipe never stalls it)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    if devices:
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kgpt.cli.train", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=pathlib.Path(log).parent,
        )


def cluster_flags(port, count, index):
    return [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={count}", f"--process_id={index}"]


def start_all(args, logs, count=2, env=None, devices=None, extra=None):
    port = free_ports(count)
    return [
        start(
            [*args, *cluster_flags(port, count, i), *((extra or {}).get(i, []))],
            logs[i],
            env=(env or {}).get(i),
            devices=devices,
        )
        for i in range(count)
    ]


def finish(processes, timeout=300):
    """Waits for every process (bounded); returns their exit codes; kills what is left."""
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(1, deadline - time.monotonic())) for p in processes]
    finally:
        stop(processes)


def stop(processes):
    for p in processes:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)


def run_one(args, log, timeout=300, **kwargs):
    process = start(args, log, **kwargs)
    assert finish([process], timeout) == [0], pathlib.Path(log).read_text()[-3000:]


def metrics(out):
    return json.loads(pathlib.Path(out, "metrics.json").read_text())


def wait_for_checkpoint(out, step, processes, timeout=240):
    """Waits until the run in `out` has a checkpoint at `step` or later; returns it."""
    deadline = time.monotonic() + timeout
    latest = pathlib.Path(out, "checkpoint", "latest.json")
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            name = json.loads(latest.read_text())["checkpoint"]
            if int(name.split("-")[1]) >= step:
                return int(name.split("-")[1])
        assert all(p.poll() is None for p in processes), "a process ended before the checkpoint"
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint at step {step} within {timeout} s")


def lines(log):
    return pathlib.Path(log).read_text().strip().splitlines()


def odd_scitail(folder, sizes=(61, 23, 23)):
    """SciTail files of `sizes` rows (train, dev, test): by default batches of 10 end in 1 and 3 rows, which must
    fill to split."""
    from kgpt_tasks import scitail_demo

    data = pathlib.Path(scitail_demo.write(str(folder)))
    for split, rows in zip(("train", "dev", "test"), sizes):
        (path,) = data.rglob(f"scitail_1.0_{split}.tsv")
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:rows]))
    return str(data)


def preset_without_dropout(folder):
    """A 2 x 32 pre-trained-model stand-in with a character vocabulary (GPT-1's would take longer to load)."""
    from conftest import char_tokenizer

    import kgpt

    tokenizer = char_tokenizer()
    kgpt.GPTBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=64,
        dropout=0.0,
    ).save_to_preset(str(folder))
    tokenizer.save_to_preset(str(folder))
    return str(folder)


def test_two_processes_fine_tune_like_one_process(tmp_path):
    data = odd_scitail(tmp_path / "data")
    # No dropout: a filled batch has another shape, and so other dropout masks, than the same batch unfilled.
    args = [
        "--task=scitail",
        f"--data_dir={data}",
        f"--init={preset_without_dropout(tmp_path / 'preset')}",
        "--max_length=48",
        "--batch_size=10",
        "--epochs=2",
        "--learning_rate=1e-3",
        "--classifier_dropout=0",
    ]
    processes = start_all([*args, f"--output_dir={tmp_path / 'two'}"], [tmp_path / "p0.log", tmp_path / "p1.log"])
    run_one([*args, f"--output_dir={tmp_path / 'one'}"], tmp_path / "one.log")
    assert finish(processes) == [0, 0], (tmp_path / "p0.log").read_text()[-3000:]
    single, double = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert single["splits"]["train"]["examples"]["used"] == 61
    # The reported losses average over real examples: the filler rows of each epoch's last batch count nothing.
    np.testing.assert_allclose(double["history"]["loss"], single["history"]["loss"], rtol=2e-5)
    np.testing.assert_allclose(double["history"]["val_loss"], single["history"]["val_loss"], rtol=2e-5)
    for split in ("dev", "test"):
        assert double["splits"][split]["accuracy"] == single["splits"][split]["accuracy"]
        # Every example scored once, in order, with the same probabilities (the filler rows dropped).
        ours = [row.split("\t") for row in (tmp_path / "two" / "predictions" / f"{split}.tsv").read_text().splitlines()]
        theirs = [
            row.split("\t") for row in (tmp_path / "one" / "predictions" / f"{split}.tsv").read_text().splitlines()
        ]
        assert len(ours) == len(theirs) == 24 and [r[0] for r in ours] == [r[0] for r in theirs]
        ours, theirs = (np.asarray([r[2:4] for r in rows[1:]], float) for rows in (ours, theirs))
        np.testing.assert_allclose(ours, theirs, atol=2e-5)


def descendants(pid):
    """Every live process below `pid` (from /proc)."""
    children = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid):
    with contextlib.suppress(OSError):
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return False


# The one-process run both the killed two-process run and the model split over two processes
# must match: 36 steps, 3 evaluations, 4 heads (so the split can cut them 4 ways).
REFERENCE = ("--max_steps=36", "--evaluations=3", "--num_heads=4")


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """The output folder of one process's uninterrupted run of `REFERENCE`."""
    folder = tmp_path_factory.mktemp("reference")
    run_one(lm_args(corpus, folder / "run", *REFERENCE), folder / "reference.log")
    return folder / "run"


def test_two_processes_train_like_one_even_when_killed_or_stopped_and_only_process_0_writes(
    corpus, reference, tmp_path
):
    out = tmp_path / "run"
    args = lm_args(corpus, out, *REFERENCE, "--checkpoint_every=4", "--log_every=10")
    logs = [tmp_path / "p0.log", tmp_path / "p1.log"]
    # 1. kill -9 of process 1 after a checkpoint: process 0 stops, at once, with one line.
    processes = start_all(args, logs)
    try:
        wait_for_checkpoint(out, 8, processes)
        family = [pid for p in processes for pid in [p.pid, *descendants(p.pid)]]
        processes[1].send_signal(signal.SIGKILL)
        assert processes[0].wait(timeout=60) == 1
        message = lines(logs[0])[-1]
        assert (
            message.startswith("kgpt-train: error: process 1 of 2 stopped (")
            and "); process 0 stopped too." in message
            and "Rerun every process with the same command" in message
        ), message
        deadline = time.monotonic() + 15
        while any(alive(pid) for pid in family) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in family if alive(pid)], "processes of the run outlived it"
    finally:
        stop(processes)
    killed = checkpoint_step(out / "checkpoint")
    # 2. The same command resumes; SIGTERM to process 0, after a checkpoint of its own, makes both write
    # a checkpoint and exit 0.
    processes = start_all(args, logs)
    try:
        step = wait_for_checkpoint(out, max(16, killed + 4), processes)
        processes[0].send_signal(signal.SIGTERM)
        assert finish(processes, timeout=120) == [0, 0]
    finally:
        stop(processes)
    assert any(line.startswith("Resuming from the checkpoint at step ") for line in lines(logs[0]))
    for log in logs:
        last = lines(log)[-1]
        assert last.startswith("kgpt-train: stopped by SIGTERM at step ") and "Run the same command" in last, last
    stopped = int(lines(logs[0])[-1].split("at step ")[1].split(";")[0])
    assert stopped >= step and (out / "checkpoint" / f"step-{stopped:09d}").is_dir()
    # 3. Once more to the end: the run ends as one uninterrupted process's does, and both processes exit
    # once process 0 has written its last file (the interpreter's teardown took them 12-60 s more on JAX).
    processes = start_all(args, logs)
    ended = {}
    deadline = time.monotonic() + 300
    try:
        while len(ended) < 2 and time.monotonic() < deadline:
            ended.update({i: time.time() for i, p in enumerate(processes) if i not in ended and p.poll() is not None})
            time.sleep(0.1)
    finally:
        stop(processes)
    assert [p.returncode for p in processes] == [0, 0], logs[0].read_text()[-3000:]
    assert max(ended.values()) - (out / "metrics.json").stat().st_mtime < 5
    # Process 0 read the tokenizer its first run learned, and said so once.
    assert sum("Using the tokenizer learned earlier" in line for line in lines(logs[0])) == 1
    resumed, whole = metrics(out), metrics(reference)
    assert resumed["resumed_from_step"] == stopped and whole["train_loss"][-1] < whole["train_loss"][0]
    # The epochs cut by the kill and by SIGTERM record the loss of all their steps (the checkpoint keeps the sums).
    np.testing.assert_allclose(resumed["train_loss"], whole["train_loss"], rtol=1e-4 if JAX else 2e-3)
    np.testing.assert_allclose(resumed["validation_loss"], whole["validation_loss"], rtol=1e-4 if JAX else 2e-3)
    # The shards the two processes built together are those one process builds, byte for byte.
    for shard in sorted((reference / "shards").glob("tokens_*.bin")):
        assert (out / "shards" / shard.name).read_bytes() == shard.read_bytes()
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())
    # Process 0 reports the progress (a line every 10 steps); process 1 says what it runs and that it joined,
    # and nothing else.
    assert any(line.startswith("step 30/36, loss ") and "tokens/s" in line for line in lines(logs[0]))
    second = [line for line in lines(logs[1]) if not line.startswith("[Gloo]")]
    assert len(second) == 2 and second[0].startswith("kgpt-train --task lm on Keras "), second
    assert second[1].startswith("Joined a run of 2 processes as process 1"), second


@pytest.mark.skipif(not JAX, reason="keras.distribution.ModelParallel is JAX's")
def test_a_model_split_over_two_processes_trains_checkpoints_and_resumes_like_one_process(corpus, reference, tmp_path):
    out = tmp_path / "split"
    # 2 processes x 2 devices, each model split over all 4 (--num_heads 4: heads split 4 ways).
    args = lm_args(
        corpus, out, *REFERENCE, "--checkpoint_every=4", "--distribution=model_parallel", "--model_parallel=4"
    )
    logs = [tmp_path / "p0.log", tmp_path / "p1.log"]
    processes = start_all(args, logs, devices=2)
    try:
        wait_for_checkpoint(out, 8, processes)
        processes[1].send_signal(signal.SIGTERM)
        assert finish(processes, timeout=120) == [0, 0], logs[0].read_text()[-3000:]
    finally:
        stop(processes)
    (folder,) = (out / "checkpoint").glob("step-*")
    assert (folder / "sharded").is_dir() and not (folder / "model.weights.h5").exists()  # each process wrote its parts
    assert finish(start_all(args, logs, devices=2)) == [0, 0], logs[0].read_text()[-3000:]
    assert any("Model-parallel on 4 JAX device(s): each model split over 4" in line for line in lines(logs[0]))
    np.testing.assert_allclose(metrics(out)["train_loss"], metrics(reference)["train_loss"], rtol=1e-4)
    np.testing.assert_allclose(metrics(out)["validation_loss"], metrics(reference)["validation_loss"], rtol=1e-4)
    import kgpt

    # The preset holds the whole model, gathered: it loads on one process.
    assert kgpt.GPTBackbone.from_preset(str(out)).num_heads == 4


# Joins a JAX run of 3 on 127.0.0.1 (argv: port, process id), gathers once, then again after process 1 is killed,
# ending as kgpt-train does when a collective fails.
THREE = """
import os, sys, time
from kgpt.parallel import cluster, placement
port, me = sys.argv[1], int(sys.argv[2])
cluster.PROG = "kgpt-train"
cluster.start(placement.resolve(f"127.0.0.1:{port}", num_processes=3, process_id=me), timeout=120)
import jax.numpy as jnp
from jax.experimental import multihost_utils
multihost_utils.process_allgather(jnp.ones(1))
print("joined", flush=True)
deadline = time.monotonic() + 120
while not os.path.exists("killed") and time.monotonic() < deadline:
    time.sleep(0.1)
try:
    multihost_utils.process_allgather(jnp.ones(1))
except Exception as e:
    if cluster.lost_process(e):
        cluster.stop_lost(e)
    raise
"""


def start_joined(script, count, tmp_path, processes):
    """`count` processes of `python -c script PORT ID` (appended to `processes`), waited for until each printed
    "joined"; their logs and the port."""
    port = free_ports(1)
    logs = [tmp_path / f"p{i}.log" for i in range(count)]
    for i, log in enumerate(logs):
        with open(log, "w") as out:
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-c", script, str(port), str(i)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                    cwd=tmp_path,
                )
            )
    deadline = time.monotonic() + 180
    while not all("joined" in log.read_text() for log in logs):
        assert time.monotonic() < deadline and all(p.poll() is None for p in processes), [
            log.read_text()[-2000:] for log in logs
        ]
        time.sleep(0.2)
    return logs, port


@pytest.mark.skipif(not JAX, reason="gloo's error names a socket, not a process; TensorFlow's name the task")
def test_of_three_jax_processes_the_survivors_name_the_one_killed(tmp_path):
    processes = []
    try:
        logs, _ = start_joined(THREE, 3, tmp_path, processes)
        processes[1].kill()
        processes[1].wait(timeout=30)
        (tmp_path / "killed").touch()
        assert [processes[i].wait(timeout=60) for i in (0, 2)] == [1, 1]
    finally:
        stop(processes)
    for i in (0, 2):
        last = lines(logs[i])[-1]
        assert last.startswith("kgpt-train: error: process 1 of 3 stopped (its connection closed); process "), last


LEFT_BEHIND = """
import sys, time
from kgpt._quiet import LiveFilter
from kgpt.parallel import cluster, placement
LiveFilter().start()  # as the commands do (kgpt.cli.common)
cluster.PROG = "kgpt-train"
cluster.start(placement.resolve(f"127.0.0.1:{sys.argv[1]}", num_processes=2, process_id=int(sys.argv[2])), timeout=120)
print("joined", flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not JAX, reason="JAX's runtime aborts a process whose coordinator is gone; TensorFlow's does not")
def test_when_jax_process_0_is_killed_the_survivor_names_it_in_one_line(tmp_path):
    processes = []
    try:
        logs, port = start_joined(LEFT_BEHIND, 2, tmp_path, processes)
        processes[0].kill()
        assert processes[1].wait(timeout=60) == -signal.SIGABRT  # the runtime's own abort: exit code 134 in a shell
    finally:
        stop(processes)
    text = logs[1].read_text()
    assert lines(logs[1])[-1] == (
        f"kgpt-train: error: process 0 of 2 stopped (the coordination service it held at 127.0.0.1:{port} stopped "
        "answering, so JAX aborted this process: exit code 134); process 1 stopped too. Rerun every process with "
        "the same command to resume from the last checkpoint."
    ), text
    assert "Terminating process" not in text and "Check failure" not in text and "@     0x" not in text, text


def test_processes_started_differently_stop_before_writing_anything(corpus, tmp_path):
    out = tmp_path / "run"
    args = lm_args(corpus, out, "--max_steps=8")
    # Process 1 runs another kgpt (its source hash differs) and another learning rate.
    patch = tmp_path / "patch"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(
        "import kgpt.parallel.cluster as c\nc.source_fingerprint = lambda: '0.0.1 (source another)'\n"
    )
    logs = [tmp_path / "p0.log", tmp_path / "p1.log"]
    processes = start_all(
        args,
        logs,
        env={1: {"PYTHONPATH": f"{patch}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}},
        extra={1: ["--learning_rate=1e-2"]},
    )
    assert finish(processes, timeout=180) == [1, 1]
    for log in logs:
        last = lines(log)[-1]
        assert last.startswith("kgpt-train: error: Process 1 was started with other settings than process 0: "), last
        assert "--learning_rate is 0.003 on process 0, 0.01 there" in last and "kgpt is " in last, last
    assert not out.exists()  # nothing written


def test_a_process_whose_coordinator_never_answers_stops_within_the_timeout(corpus, tmp_path):
    log = tmp_path / "alone.log"
    began = time.monotonic()
    process = start(
        [*lm_args(corpus, tmp_path / "run"), *cluster_flags(free_ports(2), 2, 1), "--startup_timeout=3"], log
    )
    assert finish([process], timeout=120) == [1]
    assert time.monotonic() - began < 90
    last = lines(log)[-1]
    assert last.startswith(
        "kgpt-train: error: the 2 processes did not all join within 3 s (process 1, coordinator 127.0.0.1:"
    ), last


# One flag that placement.resolve refuses and one that the job refuses: the other messages of resolve take the same
# way to this line and are checked one by one in test_cluster_parts.py::test_flags_that_cannot_run_are_named.
@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--num_processes=2", "--process_id=2", "--coordinator_address=127.0.0.1:9"],
            "--process_id: process 2 is not one of the 2 processes (0..1).",
        ),
        (
            ["--num_processes=2", "--process_id=0", "--coordinator_address=127.0.0.1:9", "--batch_size=7"],
            "batch_size 7 must split evenly over the 2 processes",
        ),
    ],
)
def test_flags_that_cannot_run_end_in_one_line_before_any_process_joins(tmp_path, flags, message):
    process = start(["--task=lm", *flags], tmp_path / "run.log")
    assert finish([process], timeout=120) == [1]
    last = lines(tmp_path / "run.log")
    assert len([line for line in last if "Traceback" in line]) == 0 and message in last[-1], last[-5:]


@one_backend("tensorflow")  # the same code path on both; TensorFlow's processes start and compile faster
def test_kgpt_analyze_transfer_on_two_processes_gives_the_table_of_one(tiny_preset, tmp_path):
    # Whole batches of 10: the filled last batches are test_two_processes_fine_tune_like_one_process's (the same
    # fine-tuning code); a batch of another shape would compile each step once more in each of the 3 processes.
    data = odd_scitail(tmp_path / "data", sizes=(60, 20, 20))
    args = [
        "transfer",
        f"--init={tiny_preset}",
        f"--tasks=scitail={data}",
        "--layers=0,2",
        "--epochs=1",
        "--batch_size=10",
        "--max_length=48",
        "--classifier_dropout=0",
        "--learning_rate=1e-3",
    ]
    analyze = [sys.executable, "-m", "kgpt.cli.analyze"]
    logs = [tmp_path / "p0.log", tmp_path / "p1.log"]
    port = free_ports(2)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    processes = []
    for index, log in enumerate(logs):
        with open(log, "w") as out:
            processes.append(
                subprocess.Popen(
                    [*analyze, *args, f"--output_dir={tmp_path / 'two'}", *cluster_flags(port, 2, index)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=tmp_path,
                )
            )
    one = subprocess.run(
        [*analyze, *args, f"--output_dir={tmp_path / 'one'}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert finish(processes) == [0, 0], logs[0].read_text()[-3000:]
    assert (tmp_path / "two" / "transfer_depth.csv").read_text() == (
        tmp_path / "one" / "transfer_depth.csv"
    ).read_text()
    assert (tmp_path / "two" / "transfer_depth.png").is_file()
