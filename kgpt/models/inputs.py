"""Host-side checks of what users pass to the models' public methods.

Each runs once per call, on NumPy arrays, before anything is traced, so a
bad argument fails with a message naming it (what was given, what is
allowed) instead of a NaN, a silent clip or an error from inside the
backend. Nothing here runs inside a compiled step.
"""

import numbers

import numpy as np


def positive_int(value, name, minimum=1, maximum=None, allow_none=False):
    """`value` as an int in `[minimum, maximum]`; bools, floats and strings are refused.

    Example:
    ```python
    positive_int(16, "max_length", maximum=512)  # 16
    positive_int(0, "max_length")  # ValueError: max_length must be an integer >= 1, got 0.
    ```
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__}).")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be an integer {allowed}, got {value}.")
    return value


def token_ids(value, name, vocabulary_size, ndim=2):
    """`value` as an int32 array of ids in `[0, vocabulary_size)`, with `ndim` dimensions.

    Floats (even whole ones), booleans, strings and ragged lists are refused,
    as are negative ids and ids past the vocabulary, which the embedding
    lookup would turn into NaN (JAX), an error deep in TensorFlow, or a
    silently wrong row.
    """
    try:
        array = np.asarray(value)
    except ValueError as e:  # ragged nested lists
        raise ValueError(f"{name} must be a rectangular array of token ids; rows of different lengths "
                         f"({str(e)[:120]}).") from None
    if array.size == 0:
        raise ValueError(f"{name} is empty: there are no token ids in it.")
    if array.dtype == object or array.dtype.kind not in "iu":
        kind = "strings" if array.dtype.kind in "USO" else f"dtype {array.dtype}"
        raise TypeError(f"{name} must hold integer token ids, got {kind}"
                        + (" (rows of different lengths?)" if array.dtype == object else "") + ".")
    if array.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions [batch, length], got shape {array.shape}.")
    if array.size:
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= vocabulary_size:
            bad = low if low < 0 else high
            where = tuple(int(i) for i in np.argwhere(array == bad)[0])
            raise ValueError(f"{name}{list(where)} is {bad}: token ids must be in [0, {vocabulary_size}) "
                             f"(the model's vocabulary_size).")
    return array.astype("int32")


def padding_mask(value, name, shape):
    """`value` as a boolean array of `shape` holding only 0/1 (or booleans)."""
    array = np.asarray(value)
    if array.shape != tuple(shape):
        raise ValueError(f"{name} must have the shape of token_ids {tuple(shape)}, got {array.shape}.")
    if array.dtype.kind not in "biuf" or (array.size and not np.isin(array, (0, 1)).all()):
        raise ValueError(f"{name} must hold only 0 and 1 (or booleans).")
    return array.astype(bool)
