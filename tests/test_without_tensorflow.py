"""What runs on JAX with TensorFlow never imported: kgpt's input checks and profile_step.py's feed and flags."""

import importlib.abc
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from kgpt import checks as inputs

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


class _NoTensorFlow(importlib.abc.MetaPathFinder):
    """An import of tensorflow fails, as on a JAX-only install."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


@pytest.fixture
def no_tensorflow(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_NoTensorFlow(), *sys.meta_path])


def test_dataset_ids_passes_arrays_without_importing_tensorflow(no_tensorflow):
    x = {"token_ids": np.array([[1, 2]]), "padding_mask": np.array([[1, 1]])}
    assert inputs.dataset_ids(x, 3, targets=True) is x
    assert "tensorflow" not in sys.modules


# benchmarks/profile_step.py in a process of its own (its absl flags are global: another test's module may
# define the same names), with every import of tensorflow failing as on a JAX-only install.
CHILD = """
import importlib.abc, runpy, sys

class NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoTensorFlow())
script = sys.argv[1]
sys.path.insert(0, script.rsplit("/", 1)[0])
sys.argv = sys.argv[1:]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    print("tensorflow imported" if "tensorflow" in sys.modules else "tensorflow never imported", flush=True)
"""
TINY = [
    "--num_layers=1",
    "--hidden_dim=16",
    "--num_heads=2",
    "--intermediate_dim=32",
    "--vocabulary_size=97",
    "--sequence_length=16",
    "--batch_size=4",
    "--steps=2",
    "--rounds=1",
    "--warmup_steps=1",
    "--notrace",
]


def _profile_step(*args):
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        [sys.executable, "-c", CHILD, os.path.join(BENCHMARKS, "profile_step.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_profile_step_refuses_a_chunk_size_or_dtype_it_would_not_measure():
    # --lm_loss_chunk_size=0 measured the default chunk size under a config line that said 0.
    for flag, words in (("--lm_loss_chunk_size=0", "0 is not a positive integer"), ("--dtype=bf16", "mixed_bfloat16")):
        result = _profile_step(*TINY, flag)
        assert result.returncode != 0 and words in result.stderr, (flag, result.stderr[-2000:])
        assert "Traceback" not in result.stderr


@pytest.mark.skipif(keras.config.backend() != "jax", reason="one process on JAX is enough: it sets its backend")
def test_profile_step_trains_on_jax_with_tensorflow_never_imported():
    result = _profile_step(*TINY)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step, dropout masks kgpt:" in result.stdout
    assert result.stdout.rstrip().endswith("tensorflow never imported"), result.stdout[-2000:]
