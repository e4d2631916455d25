"""What runs on JAX with TensorFlow never imported: kgpt's input checks and profile_step.py's feed and flags."""

import importlib.abc
import os
import sys

import keras
import numpy as np
import pytest
from absl import flags

from kgpt.models import inputs

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


@pytest.fixture(scope="module")
def profile_step():
    """benchmarks/profile_step.py as a module, its flags parsed from its defaults (and removed afterwards)."""
    sys.path.insert(0, BENCHMARKS)
    before = set(flags.FLAGS)
    try:
        module = __import__("profile_step")
        flags.FLAGS(["profile_step.py"])
        yield module
    finally:
        sys.path.remove(BENCHMARKS)
        for name in set(flags.FLAGS) - before:
            delattr(flags.FLAGS, name)
        for name in ("profile_step", "finetune", "step_profile"):
            sys.modules.pop(name, None)


def test_profile_step_refuses_a_chunk_size_or_dtype_it_would_not_measure(profile_step):
    # --lm_loss_chunk_size=0 measured the default chunk size under a config line that said 0.
    with pytest.raises(flags.IllegalFlagValueError, match="0 is not a positive integer"):
        flags.FLAGS["lm_loss_chunk_size"].parse("0")
    with pytest.raises(flags.IllegalFlagValueError, match="mixed_bfloat16"):
        flags.FLAGS["dtype"].parse("bf16")


@pytest.mark.skipif(keras.config.backend() != "jax", reason="the PyDataset feed is JAX's; TensorFlow's is tf.data")
def test_profile_step_feeds_jax_one_batch_with_no_tensorflow(profile_step, no_tensorflow):
    example = ({"token_ids": np.ones((2, 1, 4), "int32")}, {"task": np.zeros(2, "int32")})
    data = profile_step.repeated(example)
    assert len(data) == max(flags.FLAGS.steps, flags.FLAGS.warmup_steps) and data[len(data) - 1] is example
    assert "tensorflow" not in sys.modules
