"""Callbacks both training jobs share."""

import math

import keras
import numpy as np


class NonFiniteLossError(ArithmeticError):
    """Training produced a NaN or infinite loss; the run stopped before saving anything from it."""


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Stops training with `NonFiniteLossError` at the first batch whose loss is NaN or infinite.

    Keras' `TerminateOnNaN` only ends `fit`, after which a job would go on to
    save the broken weights over a good preset; raising stops the job itself,
    and the last checkpoint (written before the loss broke) stays the one a
    rerun resumes from.

    Args:
        hint: what the user can change, appended to the message.
        first_step: the optimizer step the run starts from (a resumed run).
    """

    def __init__(self, hint="", first_step=0):
        super().__init__()
        self.hint, self.step = hint, first_step

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        value = float(np.asarray(keras.ops.convert_to_numpy(loss)))
        if not math.isfinite(value):
            raise NonFiniteLossError(f"The training loss is {value} at step {self.step}: training stopped and nothing "
                                     f"from this run was saved over earlier outputs. {self.hint}".strip())
