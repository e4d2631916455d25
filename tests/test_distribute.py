"""Data parallelism on 2 virtual CPU devices matches one device; mixed precision trains on CPU."""

import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import TINY, char_tokenizer

import kgpt
from kgpt.parallel import distribute

JAX = keras.config.backend() == "jax"
TEXT = "the keeper of the lighthouse wrote the date in the log every night . " * 80


def start_worker(*args, log):
    """Starts tests/distribute_worker.py; its output goes to files, so a full pipe never stalls it."""
    root = pathlib.Path(__file__).parents[1]
    # Its own JAX compilation cache: workers running at the same time must not share one.
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=f"{log}-xla-cache")
    with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
        return subprocess.Popen(
            [sys.executable, "tests/distribute_worker.py", *args], stdout=out, stderr=err, cwd=root, env=env
        )


def worker_figures(process, log):
    process.wait(timeout=600)
    assert process.returncode == 0, pathlib.Path(f"{log}.err").read_text()[-4000:]
    figures = json.loads(pathlib.Path(f"{log}.out").read_text().strip().splitlines()[-1])
    assert figures["devices"] == 2 and figures["backend"] == keras.config.backend()
    return figures


def test_data_parallel_losses_match_one_device(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    # Fine-tuning starts from a tiny preset without dropout (each TensorFlow replica would draw its own masks).
    tokenizer = char_tokenizer()
    preset = str(tmp_path / "preset")
    kgpt.GPTBackbone(
        **{**TINY, "vocabulary_size": tokenizer.vocabulary_size(), "max_sequence_length": 64, "dropout": 0.0}
    ).save_to_preset(preset)
    tokenizer.save_to_preset(preset)
    # Pre-training (tf.data windows) and fine-tuning (NumPy inputs, a last partial
    # batch, predictions over a split), each on 2 devices and on one. TensorFlow takes
    # one tf.distribute strategy per process: two worker processes, run at the same
    # time. JAX runs every job in one (a process start-up is ~7 s of CPU time, which
    # the suite's other worker would have had).
    if JAX:
        runs = {
            "first": "pretrain:none,finetune:none,pretrain:data_parallel,finetune:data_parallel,lm_evaluate:"
            "data_parallel,model_parallel:none"
        }
    else:
        runs = {
            "first": "pretrain:none,finetune:none,pretrain:data_parallel",
            "second": "finetune:data_parallel",
            "third": "lm_evaluate:data_parallel",
        }
    processes = {name: start_worker(str(tmp_path), jobs, preset, log=tmp_path / name) for name, jobs in runs.items()}
    try:
        first = worker_figures(processes["first"], tmp_path / "first")
        second = worker_figures(processes["second"], tmp_path / "second") if "second" in runs else first
        third = worker_figures(processes["third"], tmp_path / "third") if "third" in runs else first
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    single, parallel = first["pretrain:none"], first["pretrain:data_parallel"]
    assert len(parallel) == 6 and single[-1] < single[0]  # it trained
    # On TensorFlow each replica traces the step in its own thread: the running loss must add up every
    # replica's share (it once held one replica's, 0.35% off).
    np.testing.assert_allclose(parallel, single, rtol=2e-4)
    np.testing.assert_allclose(second["finetune:data_parallel"][:-1], first["finetune:none"][:-1], rtol=2e-4)
    # GPTCausalLM.evaluate on padded text split over 2 devices: the mean over the batch's tokens (on TensorFlow
    # it was the mean of each replica's mean, 0.34% off here).
    np.testing.assert_allclose(third["lm_evaluate:data_parallel"], third["lm_evaluate:exact"], rtol=2e-5)
    if JAX:  # keras.distribution.ModelParallel: a backbone sharded over a ("batch", "model") mesh
        assert second["kernel_shards"] == 2 and second["kernel_shard_shape"] == [16, 16]  # 32 columns in 2
        assert second["model_parallel_max_difference"] < 1e-5


def test_batch_must_split_evenly_over_devices(monkeypatch):
    monkeypatch.setattr(distribute, "mesh_devices", lambda: ["d0", "d1"])
    with pytest.raises(ValueError, match="batch_size 7 must be a multiple of 2"):
        with distribute.data_parallel(batch_size=7):
            pass


def tiny_losses(dtype):
    with distribute.dtype_policy(dtype):
        keras.utils.set_random_seed(0)
        backbone = kgpt.GPTBackbone(**{**TINY, "dropout": 0.0})
        lm = kgpt.GPTCausalLM(backbone)
        lm.compile(optimizer=keras.optimizers.Adam(1e-2))
        ids = np.random.default_rng(0).integers(0, TINY["vocabulary_size"], (16, 17)).astype("int32")
        x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((16, 16), "int32")}
        history = lm.fit(x, ids[:, 1:], batch_size=8, epochs=3, shuffle=False, verbose=0)
        return lm, history.history["loss"]


@pytest.fixture(scope="module")
def float32_losses():
    """The float32 run both mixed-precision cases compare with (trained once: it is seeded)."""
    return tiny_losses("float32")[1]


@pytest.mark.parametrize("dtype", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_trains_close_to_float32(dtype, float32_losses):
    if dtype == "mixed_float16" and keras.config.backend() == "jax":
        pytest.skip("XLA:CPU has no float16 matmul with float32 accumulation; runs on GPU")
    lm, losses = tiny_losses(dtype)
    backbone = lm.backbone
    assert backbone.compute_dtype == dtype.split("_")[1] and backbone.token_embedding.embeddings.dtype == "float32"
    softmax = backbone.transformer_layers[0].attention_softmax
    assert softmax.compute_dtype == "float32"  # attention probabilities stay in float32
    assert (
        keras.ops.convert_to_numpy(
            lm({"token_ids": np.ones((1, 4), "int32"), "padding_mask": np.ones((1, 4), "int32")})
        ).dtype
        == np.float32
    )
    if dtype == "mixed_float16":
        assert isinstance(lm.optimizer, keras.optimizers.LossScaleOptimizer)
    np.testing.assert_allclose(losses, float32_losses, rtol=2e-2)
    assert losses[-1] < losses[0]
    assert keras.config.dtype_policy().name == "float32"  # the policy is restored after the block


def test_model_parallel_layout_covers_the_big_matrices():
    mesh = keras.distribution.DeviceMesh((1, 1), ["batch", "model"], keras.distribution.list_devices()[:1])
    layout = distribute.model_parallel_layout(mesh)
    backbone = kgpt.GPTBackbone(**TINY)
    sharded = [w.path for w in backbone.weights if layout[w.path] is not None]
    kernels = [w.path for w in backbone.weights if w.path.endswith(("kernel", "embeddings"))]
    assert set(kernels) <= set(sharded)
