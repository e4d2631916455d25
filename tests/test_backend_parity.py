import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
from conftest import TINY, random_inputs, to_numpy

import kgpt

HERE = pathlib.Path(__file__).parent


def test_weights_move_between_backends(tmp_path):
    """Weights saved here give the same hidden states and logits on the other backend."""
    lm = kgpt.GPTCausalLM(kgpt.GPTBackbone(**TINY))
    x = random_inputs(batch=2, length=16)
    x["padding_mask"][1, 11:] = 0
    lm.save_weights(tmp_path / "lm.weights.h5")
    np.savez(
        tmp_path / "io.npz",
        hidden=to_numpy(lm.backbone(x)),
        logits=to_numpy(lm(x)),
        **x,
    )
    other = "tensorflow" if keras.config.backend() == "jax" else "jax"
    env = dict(os.environ, KERAS_BACKEND=other, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, str(HERE / "parity_worker.py"), str(tmp_path)],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert f"backend={other}" in result.stdout
