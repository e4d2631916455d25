"""Outputs on a file system reached through tf.io.gfile (kgpt.io.storage): file:// and TensorFlow's in-memory ram://.

gs:// itself is not tested: TensorFlow's GCS client has no setting that points it at a local emulator.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import kill_at_step, one_backend

import kgpt
from kgpt.errors import OutputDirError
from kgpt.io import remote_lock, storage
from kgpt.jobs import finetune as finetune_lib
from kgpt.jobs import predict as predict_lib
from kgpt.jobs import pretrain as pretrain_lib
from kgpt.jobs.config import FinetuneConfig, PretrainConfig
from kgpt.jobs.rundir import RunDirectory
from kgpt_tasks import scitail_demo

TEXT = "The keeper climbed the steps of the tower and wrote the date in the notebook.\n" * 30
gfile = tf.io.gfile


def ram(name):
    """A fresh ram:// folder (TensorFlow's in-memory file system lives as long as this process)."""
    return f"ram://kgpt-tests/{name}-{time.time_ns()}"


def tiny_lm_config(tmp_path, output_dir, **overrides):
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    (corpus / "a.txt").write_text(TEXT, encoding="utf-8")
    values = dict(
        corpus=str(corpus),
        output_dir=output_dir,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        dropout=0.0,
        sequence_length=16,
        batch_size=8,
        learning_rate=1e-2,
        warmup_steps=1,
        max_steps=6,
        evaluations=2,
        sample_tokens=2,
        checkpoint_every=3,
        tokenizer="train",
        num_merges=20,
    )
    values.update(overrides)
    return PretrainConfig(**values)


def run_cli(*args, cwd, background=False):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    command = [sys.executable, "-m", "kgpt.cli.train", *args]
    if background:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_paths_with_a_scheme_are_remote():
    assert storage.scheme("gs://bucket/run") == "gs" and storage.scheme("RAM://x") == "ram"
    assert not storage.is_remote("runs/rte") and not storage.is_remote("/abs/c:/x") and not storage.is_remote(None)
    assert storage.join("gs://b/run/", "checkpoint", "latest.json") == "gs://b/run/checkpoint/latest.json"
    assert storage.join("out", "x") == os.path.join("out", "x")


def test_an_unusable_output_dir_is_one_line_naming_the_flag(tmp_path, monkeypatch):
    with pytest.raises(
        storage.StorageError,
        match=r"^--output_dir zz://b/run: no file system for zz:// is installed "
        r"here \(TensorFlow has .*ram://",
    ):
        RunDirectory("zz://b/run", "pretrain", {}).__enter__()
    (tmp_path / "file").write_text("x")
    with pytest.raises(
        storage.StorageError,
        match=r"^--output_dir file://.*/file/run: .*/file is a file, not a folder\.$",  # as the local path's
    ):
        RunDirectory(f"file://{tmp_path}/file/run", "pretrain", {}).__enter__()

    class Hanging:  # a storage service that never answers
        def __getattr__(self, name):
            return getattr(gfile, name)

        def makedirs(self, path):
            time.sleep(5)

    monkeypatch.setattr(storage, "_gfile", Hanging)
    monkeypatch.setattr(storage, "TIMEOUT_S", 0.3)
    start = time.monotonic()
    with pytest.raises(storage.StorageError, match=r"^--output_dir ram://x/run: no answer within 0.3 s"):
        RunDirectory("ram://x/run", "pretrain", {}).__enter__()
    assert time.monotonic() - start < 3


def test_the_lock_object_names_its_holder_and_is_taken_over_when_stale():
    folder = ram("lock")
    gfile.makedirs(folder)
    first = remote_lock.RemoteLock(folder)
    first.acquire()
    holder = json.loads(storage.read_text(folder + "/.lock"))
    assert holder["host"] == socket.gethostname() and holder["pid"] == os.getpid()
    with pytest.raises(storage.StorageError, match=rf"is in use by another kgpt run \(pid {os.getpid()} on "):
        remote_lock.RemoteLock(folder).acquire()
    first.release()
    assert not gfile.exists(folder + "/.lock")
    # A lock whose process of this host is gone, and one not refreshed for longer than stale_s, are taken over.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for pid, age in ((int(gone.stdout), 0), (os.getppid(), 1000)):
        storage.write_text(
            folder + "/.lock",
            json.dumps({"host": socket.gethostname(), "pid": pid, "token": "old", "time": time.time() - age}),
        )
        with remote_lock.RemoteLock(folder) as lock:
            lock.check()
            storage.write_text(
                folder + "/.lock", json.dumps({"host": "elsewhere", "pid": 1, "token": "new", "time": time.time()})
            )
            with pytest.raises(
                storage.StorageError,
                match=r"another run took over this run's lock \(pid 1 on "
                r"elsewhere\)",
            ):
                lock.check()
        assert gfile.exists(folder + "/.lock")  # the new holder's lock stays


def test_a_mirror_copies_changes_pointers_last_and_leaves_other_files_alone(monkeypatch):
    remote = ram("mirror")
    gfile.makedirs(remote + "/checkpoint/step-1")
    for name, text in (("notes.txt", "theirs"), ("checkpoint/step-1/w", "1"), ("checkpoint/latest.json", "step-1")):
        storage.write_text(f"{remote}/{name}", text)
    renamed = []

    class Recording:
        def __getattr__(self, name):
            return getattr(gfile, name)

        def rename(self, source, target, overwrite=False):
            renamed.append(target[len(remote) + 1 :])
            gfile.rename(source, target, overwrite)

    with storage.Mirror(remote, names=("checkpoint",)) as mirror:
        local = mirror.local
        assert sorted(os.listdir(local)) == ["checkpoint"]  # only kgpt's outputs are copied down
        assert open(os.path.join(local, "checkpoint", "latest.json")).read() == "step-1"
        monkeypatch.setattr(storage, "_gfile", Recording)
        os.makedirs(os.path.join(local, "checkpoint", "step-2"))
        for name, text in (
            ("checkpoint/step-2/w", "2"),
            ("checkpoint/latest.json", "step-2"),
            ("metrics.json", "{}"),
            ("checkpoint/.latest.json.x.tmp", "half"),
        ):
            with open(os.path.join(local, *name.split("/")), "w") as f:
                f.write(text)
        import shutil

        shutil.rmtree(os.path.join(local, "checkpoint", "step-1"))
        mirror.push()
        assert renamed == ["checkpoint/step-2/w", "checkpoint/latest.json", "metrics.json"]
        assert mirror.remote_path(os.path.join(local, "metrics.json")) == remote + "/metrics.json"
        assert mirror.remote_path(local) == remote
        mirror.push()  # nothing changed: nothing copied
        assert len(renamed) == 3
    assert not os.path.exists(local)
    assert storage.read_text(remote + "/notes.txt") == "theirs"
    assert storage.read_text(remote + "/checkpoint/latest.json") == "step-2"
    assert not gfile.exists(remote + "/checkpoint/step-1")
    assert sorted(gfile.listdir(remote + "/checkpoint")) == ["latest.json", "step-2"]


@one_backend("tensorflow")
def test_pretraining_to_ram_resumes_from_and_refuses_by_the_remote_folder(tmp_path):
    out = ram("lm")
    config = tiny_lm_config(tmp_path, out)
    lm, tokenizer, metrics = pretrain_lib.pretrain(config)
    assert config.output_dir == out  # the job's local mirror is not left in the config
    assert json.loads(storage.read_text(out + "/checkpoint/latest.json"))["checkpoint"] == "step-000000006"
    assert json.loads(storage.read_text(out + "/metrics.json"))["optimizer_steps"] == 6
    assert gfile.exists(out + "/shards/index.json") and not gfile.exists(out + "/.lock")
    with storage.local_copy(out) as local:
        loaded = kgpt.GPTCausalLM.from_preset(local)
    ids = np.asarray([tokenizer.encode("the keeper wrote the date")], "int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), keras.ops.convert_to_numpy(lm(x)), atol=1e-6)
    # The same command again finds the remote checkpoint at the last step and trains nothing.
    _, _, again = pretrain_lib.pretrain(config)
    assert again["resumed_from_step"] == 6 and again["train_loss"] == metrics["train_loss"]
    other = tiny_lm_config(tmp_path, out, learning_rate=5e-3)
    with pytest.raises(OutputDirError, match=rf"{out} holds a pretrain run with other settings \(learning_rate: "):
        pretrain_lib.pretrain(other)
    storage.write_text(out + "/mine.txt", "not kgpt's")
    with RunDirectory(out, "pretrain", {"other": 1}, overwrite=True):  # clears kgpt's outputs, and only those
        assert sorted(gfile.listdir(out)) == [".lock", "mine.txt", "run.json"]


@one_backend("jax")
def test_fine_tuning_writes_a_preset_to_a_file_url_that_loads_back(tiny_preset, tmp_path):
    out = f"file://{tmp_path}/remote/rte"
    config = FinetuneConfig(
        task="scitail",
        init=tiny_preset,
        output_dir=out,
        epochs=1,
        batch_size=32,
        learning_rate=1e-3,
        max_length=32,
        data_dir=scitail_demo.write(str(tmp_path / "data")),
    )
    model, results = finetune_lib.finetune(config)
    folder = tmp_path / "remote" / "rte"
    assert (
        json.loads((folder / "metrics.json").read_text())["splits"]["dev"]["accuracy"]
        == results["splits"]["dev"]["accuracy"]
    )
    assert (folder / "predictions" / "dev.tsv").read_text().startswith("id\tprediction")
    assert (folder / "checkpoint" / "latest.json").exists() and not (folder / ".lock").exists()
    texts = (["A dog runs in the park."], ["An animal is outside."])
    with storage.local_copy(out) as local:
        loaded = kgpt.GPTTaskModel.from_preset(local)
        np.testing.assert_allclose(loaded.predict(texts, verbose=0), model.predict(texts, verbose=0), atol=1e-5)
    # Predictions of new inputs go to a remote file too (kgpt-predict --output).
    (tmp_path / "new.txt").write_text("A dog runs.\tAn animal moves.\n")
    inputs = predict_lib.read_inputs(str(tmp_path / "new.txt"), loaded.preprocessor.transform)
    target = ram("predict") + "/p.tsv"
    assert predict_lib.write(loaded, inputs, target) == 1
    assert storage.read_text(target).startswith("id\tprediction\tp_entails")


@pytest.mark.large  # three command-line runs (about 140 s on a busy 2-core machine)
def test_a_killed_run_resumes_from_the_remote_checkpoint(tmp_path):
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    remote = tmp_path / "bucket" / "run"
    args = [
        "--task=lm",
        f"--corpus={tmp_path / 'corpus.txt'}",
        f"--output_dir=file://{remote}",
        "--num_layers=1",
        "--hidden_dim=16",
        "--intermediate_dim=32",
        "--num_heads=2",
        "--sequence_length=16",
        "--batch_size=4",
        "--max_steps=120",
        "--evaluations=2",
        "--warmup_steps=2",
        "--checkpoint_every=4",
        "--sample_tokens=2",
    ]

    first = run_cli(*args, cwd=tmp_path, background=True)
    saved = kill_at_step(first, remote / "checkpoint", 8)
    assert 8 <= saved < 120
    assert json.loads((remote / ".lock").read_text())["pid"] == first.pid  # left behind by the kill
    second = run_cli(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    output = second.stdout + second.stderr
    assert f"process {first.pid} of this host is gone" in output
    resumed = int(re.search(r"Resuming from the checkpoint at step (\d+)", output).group(1))
    assert resumed >= saved and "Reusing" in output  # the shards came back from the remote folder
    metrics = json.loads((remote / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == resumed and metrics["optimizer_steps"] == 120
    assert not (remote / ".lock").exists()


def test_storage_errors_are_user_mistakes_the_command_line_prints_in_one_line():
    from kgpt.cli.common import user_errors

    assert issubclass(storage.StorageError, user_errors())


@pytest.mark.large  # one command-line start (20 to 40 s on a busy 2-core machine); the test above checks the type
def test_the_command_line_names_an_unknown_scheme_in_one_line(tmp_path):
    bad = run_cli("--task=lm", "--output_dir=zz://bucket/run", "--max_steps=1", "--warmup_steps=0", cwd=tmp_path)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .startswith("kgpt-train: error: --output_dir zz://bucket/run: no file system for zz://")
    )


@pytest.mark.large  # two runs of two processes and one of one (minutes on a 2-core machine)
def test_two_processes_write_a_remote_folder_like_one_process_and_resume_from_it(tmp_path):
    from test_cluster import finish, lines, metrics, run_one, start_all

    (tmp_path / "corpus.txt").write_text(TEXT * 20, encoding="utf-8")
    remote, reference = tmp_path / "bucket" / "run", tmp_path / "reference"

    def args(out):
        return [
            "--task=lm",
            f"--corpus={tmp_path / 'corpus.txt'}",
            f"--output_dir={out}",
            "--tokenizer=train",
            "--num_merges=30",
            "--num_layers=1",
            "--num_heads=2",
            "--hidden_dim=16",
            "--intermediate_dim=32",
            "--sequence_length=16",
            "--batch_size=8",
            "--warmup_steps=2",
            "--learning_rate=3e-3",
            "--dropout=0",
            "--max_steps=8",
            "--evaluations=2",
            "--checkpoint_every=4",
        ]

    logs = [tmp_path / "p0.log", tmp_path / "p1.log"]
    assert finish(start_all(args(f"file://{remote}"), logs)) == [0, 0], logs[1].read_text()[-3000:]
    run_one(args(reference), tmp_path / "reference.log")
    two, one = metrics(remote), metrics(reference)
    np.testing.assert_allclose(two["train_loss"], one["train_loss"], rtol=1e-4)
    assert sorted(p.name for p in remote.iterdir()) == sorted(p.name for p in reference.iterdir() if p.name != ".lock")
    # Again: both processes read the checkpoint back from the remote folder, each into its own copy.
    assert finish(start_all(args(f"file://{remote}"), logs)) == [0, 0], logs[1].read_text()[-3000:]
    assert any("Resuming from the checkpoint at step 8 of 8" in line for line in lines(logs[0]))
    assert not any("as process 0 does" in line for line in lines(logs[1]))  # process 1 saw the same checkpoint
    assert metrics(remote)["resumed_from_step"] == 8
