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
        dims = "[batch, length]" if ndim == 2 else "[batch, views, length]" if ndim == 3 else ""
        raise ValueError(f"{name} must have {ndim} dimensions {dims}, got shape {array.shape}.")
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


def rate(value, name, allow_none=False):
    """`value` as a float in `[0, 1)`: a dropout rate."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= float(value) < 1:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}.")
    return float(value)


def nonnegative(value, name):
    """`value` as a finite float >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 <= float(value) < float("inf")):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}.")
    return float(value)


def concrete(value):
    """`value` as something NumPy can read when it holds values now (a list, an array, an eager tensor);
    None for what only has values later (Keras' symbolic tensors, JAX tracers, TensorFlow graph tensors,
    datasets), which no host check can see without a per-step cost."""
    if isinstance(value, (np.ndarray, list)):
        return value
    module = type(value).__module__
    if module.startswith(("jax", "jaxlib")):
        import jax

        return None if isinstance(value, jax.core.Tracer) else np.asarray(value)
    if module.startswith("tensorflow"):
        import tensorflow as tf

        if isinstance(value, tf.Tensor) and tf.executing_eagerly() and hasattr(value, "numpy"):
            return value.numpy()
    return None


def model_inputs(x, vocabulary_size, max_sequence_length, ndim=2, name="x"):
    """Checks a `{"token_ids", "padding_mask"}` dict before a model sees it.

    Ids in the vocabulary, a length between 1 and `max_sequence_length`, a
    0/1 mask of the same shape: for lists, NumPy arrays and eager tensors
    (`concrete`). Symbolic or traced tensors and datasets are left to the
    model.
    """
    if not isinstance(x, dict):
        return
    ids = concrete(x.get("token_ids"))
    if ids is None:
        return
    ids = token_ids(ids, f"{name}['token_ids']", vocabulary_size, ndim=ndim)
    length = ids.shape[-1]
    if not 1 <= length <= max_sequence_length:
        raise ValueError(f"{name}['token_ids'] has length {length}: it must be between 1 and the model's "
                         f"max_sequence_length={max_sequence_length}.")
    mask = concrete(x.get("padding_mask"))
    if mask is not None:
        padding_mask(mask, f"{name}['padding_mask']", ids.shape)


def text_list(x, name="x"):
    """Refuses a list that mixes texts with other things (None, numbers), naming the first that is not text."""
    if isinstance(x, list) and any(isinstance(t, (str, bytes)) for t in x):
        bad = next((i for i, t in enumerate(x) if not isinstance(t, (str, bytes))), None)
        if bad is not None:
            raise TypeError(f"{name}[{bad}] is {x[bad]!r:.60}, not text: a list of texts must hold only strings.")


def not_a_generator(x, name="x"):
    """Refuses iterators and generators, which Keras and keras-hub read only partly or not at all."""
    import types

    if isinstance(x, types.GeneratorType) or (hasattr(x, "__next__") and not hasattr(x, "__len__")):
        raise TypeError(f"{name} is a {type(x).__name__}: pass a list, an array or a tf.data.Dataset.")


def batch_size(value, allow_none=True):
    """`batch_size` as an int >= 1 (or None)."""
    return positive_int(value, "batch_size", allow_none=allow_none)


def tokenizer_fits(preprocessor, backbone):
    """The preprocessor's tokenizer gives only ids the backbone's embedding has rows for."""
    tokenizer = getattr(preprocessor, "tokenizer", None)
    if getattr(tokenizer, "encoder", None) is None:
        return  # a preset's tokenizer before its files are read: checked once they are
    size = tokenizer.vocabulary_size()
    if isinstance(size, int) and size > backbone.vocabulary_size:
        raise ValueError(f"The preprocessor's tokenizer has {size} ids, more than the backbone's vocabulary_size="
                         f"{backbone.vocabulary_size}: its ids past {backbone.vocabulary_size - 1} have no embedding. "
                         f"Use the tokenizer the backbone was trained with (backbone.with_added_tokens(n) makes rows for "
                         f"n added tokens).")
