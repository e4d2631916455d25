"""Is a model's input text or token ids? The one answer the tokenizer, the preprocessors and the models share.

Text is a `str` (or UTF-8 `bytes`), a list or tuple of them, a NumPy array of
strings, or a TensorFlow string tensor; token ids are anything else (arrays,
tensors, dicts of them). A task model also takes text as columns: a tuple of
such batches (one per segment, then the choices), or rows of segments.

TensorFlow is never imported here: a string tensor can only exist once the
program has imported it.

Example:
```python
from kgpt.data import inputs_kind

inputs_kind.is_text(["a film", b"a book"])      # True
inputs_kind.is_text([[12, 7, 3]])               # False: token ids
inputs_kind.texts(b"a film", "tokenize()")     # (['a film'], False): not a batch
inputs_kind.as_list(("a", b"b", None), "x")     # ['a', 'b', None]: items left to the caller
```
"""

import sys

import numpy as np


def _tf():
    return sys.modules.get("tensorflow")


def _is_string(value):
    return isinstance(value, (str, bytes))


def is_string_tensor(x):
    """Whether `x` is a TensorFlow tensor of strings."""
    tf = _tf()
    return tf is not None and isinstance(x, tf.Tensor) and x.dtype == tf.string


def is_text(x):
    """Whether `x` is text: a string, a non-empty list or tuple of strings, a string array or tensor."""
    if _is_string(x):
        return True
    if isinstance(x, (list, tuple)):
        return bool(x) and all(_is_string(t) for t in x)
    if is_string_tensor(x):
        return True
    return isinstance(x, np.ndarray) and x.dtype.kind in "US"


def first_leaf(x):
    """The first item of nested lists and tuples (`x` itself when it is neither, or empty)."""
    while isinstance(x, (list, tuple)) and x:
        x = x[0]
    return x


def is_text_columns(x):
    """Whether `x` is a task model's text: `is_text`, or columns/rows of strings (a tuple, nested lists).

    An empty list counts as text, so that the text path names the mistake;
    a `dtype=object` array counts too (its strings are checked where they are
    read).
    """
    if isinstance(x, str):
        return True
    if isinstance(x, tuple):
        return bool(x) and all(is_text_columns(c) or isinstance(first_leaf(c), str) for c in x)
    if isinstance(x, np.ndarray):
        return x.dtype.kind in "OUS"
    if is_string_tensor(x):
        return True
    if isinstance(x, list):
        return not x or isinstance(first_leaf(x), str)
    return False


def is_text_dataset(x):
    """Whether `x` is a `tf.data.Dataset` whose inputs (the first item of `(x, y[, w])`) are strings."""
    tf = _tf()
    if tf is None or not isinstance(x, tf.data.Dataset):
        return False
    spec = x.element_spec
    inputs = spec[0] if isinstance(spec, tuple) else spec
    return any(s.dtype == tf.string for s in tf.nest.flatten(inputs))


def texts(x, what):
    """`(list of str, batched)`: the strings of `x` (bytes decoded as UTF-8), and whether `x` is a batch.

    `what` names the argument or call in the errors: a `TypeError` for what
    is not text, a `ValueError` for an array of strings of rank above 1.
    """
    if _is_string(x):
        return [_as_str(x)], False
    if isinstance(x, (list, tuple)):
        if not all(_is_string(t) for t in x):
            kinds = sorted({type(t).__name__ for t in x if not _is_string(t)})
            raise TypeError(f"{what} takes strings; the list holds {', '.join(kinds)}.")
        return [_as_str(t) for t in x], True
    tf = _tf()
    if tf is not None and isinstance(x, tf.Tensor):
        if x.dtype != tf.string:
            raise TypeError(f"{what} takes string tensors, got {x.dtype.name}.")
        x = np.asarray(x.numpy())
    if isinstance(x, np.ndarray) and x.dtype.kind in "USO":
        if x.ndim == 0:
            return texts(x.item(), what)
        if x.ndim == 1:
            return texts(x.tolist(), what)[0], True
        raise ValueError(f"{what} takes a string or a rank-1 batch of strings, got shape {x.shape}.")
    raise TypeError(f"{what} takes a str, a list of str or a string tensor, got {type(x).__name__}.")


def as_list(x, what):
    """The items of a batch `x` (a str, list, tuple, NumPy array or tensor) as a list, bytes decoded as UTF-8.

    The items are not checked: a task's preprocessor names a bad one by its
    example. Anything that is not a batch is a `TypeError` naming `what`.
    """
    if isinstance(x, str):
        return [x]
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        x = x.numpy()
    if isinstance(x, np.ndarray):
        x = x.tolist()
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{what}: expected strings, got {type(x).__name__}.")
    return [_as_str(v) for v in x]


def _as_str(text):
    return text.decode("utf-8") if isinstance(text, bytes) else text
