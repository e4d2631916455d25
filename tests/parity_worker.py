"""Run by test_backend_parity.py under the *other* backend.

    python parity_worker.py DIR

DIR holds `lm.weights.h5` and `io.npz` (inputs and the first backend's outputs),
written by the test. Prints the largest differences; exits 1 above 1e-5.
"""

import sys

import numpy as np
from conftest import TINY

import kgpt


def main(directory):
    import keras

    saved = np.load(f"{directory}/io.npz")
    lm = kgpt.GPTCausalLM(kgpt.GPTBackbone(**TINY))
    lm.load_weights(f"{directory}/lm.weights.h5")
    x = {"token_ids": saved["token_ids"], "padding_mask": saved["padding_mask"]}
    hidden = keras.ops.convert_to_numpy(lm.backbone(x))
    logits = keras.ops.convert_to_numpy(lm(x))
    dh = np.abs(hidden - saved["hidden"]).max()
    dl = np.abs(logits - saved["logits"]).max()
    print(f"backend={keras.config.backend()} max|dhidden|={dh:.2e} max|dlogits|={dl:.2e}")
    sys.exit(0 if max(dh, dl) <= 1e-5 else 1)


if __name__ == "__main__":
    main(sys.argv[1])
