"""Host-side checks of what users pass to kgpt's public classes, methods and functions.

Each runs once per call, on NumPy arrays, before anything is traced, so a
bad argument fails with a message naming it (what was given, what is
allowed) instead of a NaN, a silent clip or an error from inside the
backend. Nothing here runs inside a compiled step.
"""

import contextlib
import math
import numbers
import re
import sys
import threading

import numpy as np

from kgpt.errors import RepeatedKeyError

# A number as a table spells it: Python's float() also takes "1_000", "infinity" and other scripts' digits.
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def number_text(text):
    """The float `text` spells (spaces aside) as tables and other tools read numbers, else NaN (also for `"nan"`)."""
    text = text.strip()
    return float(text) if _NUMBER.fullmatch(text) else math.nan


def positive_int(value, name, minimum=1, maximum=None, allow_none=False, or_else=None):
    """`value` as an int in `[minimum, maximum]`; bools, floats and strings are refused.

    `or_else` names what else the caller takes, for the message (it has
    handled those values before).

    Example:
    ```python
    positive_int(16, "max_length", maximum=512)  # 16
    positive_int(0, "max_length")  # ValueError: max_length must be an integer >= 1, got 0.
    ```
    """
    if value is None and allow_none:
        return None
    other = f", or {or_else}" if or_else else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer{other}, got {value!r} ({type(value).__name__}).")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be an integer {allowed}{other}, got {value}.")
    return value


def shown(value, limit=60, quote=True):
    """`repr(value)` (or `str` without `quote`) for a message, cut to about `limit` characters with its full
    length named: a label of 400 digits or a 10 MB field is echoed as its start, not whole.

    Example: `shown("7" * 400)  # "'7777...' (400 characters)"`
    """
    if isinstance(value, int) and value.bit_length() > 10_000:  # str() refuses an int of 4,300 digits or more
        return f"an integer of about {int(value.bit_length() * math.log10(2)):,} digits"
    text = repr(value) if quote else str(value)
    if len(text) <= limit:
        return text
    length = len(value) if isinstance(value, (str, bytes)) else len(text)
    if quote and isinstance(value, (str, bytes)):
        # Cut the value, not its repr, so that no escape ("\x00", "\u2028") is cut in two.
        count = limit
        while count and len(repr(value[:count])) > limit - 3:
            count -= 1
        piece = repr(value[:count])
        return f"{piece[:-1]}...{piece[-1]} ({length:,} characters)"
    return f"{text[: limit - 3]}... ({length:,} characters)"


def listed(values, most=10, show=shown):
    """`values` for a message: each `show`n (`str` for texts already made), comma-separated, the first `most` of
    them with the count of all.

    Example: `listed(["a", "b", "c"], most=2)  # "'a', 'b', ... (3 in all)"`
    """
    values = list(values)
    text = ", ".join(show(v) for v in values[:most])
    return f"{text}, ... ({len(values):,} in all)" if len(values) > most else text


_COMMANDS = [0]  # commands running in this process; a counter, so that overlapping ones in threads end right
_COMMANDS_LOCK = threading.Lock()


def differences(saved, settings, show=repr, where=("there", "now")):
    """`"key: old there, new now; ..."` for every setting that differs ("" when none), each value `show`n, the
    two sides named by `where`."""

    def shown(value):
        # An unset setting is its job's default (max_length: the model's context), which may be the value now.
        return "not set" if value is None else show(value)

    keys = sorted(set(saved) | set(settings), key=str)
    return "; ".join(
        f"{k}: {shown(saved.get(k))} {where[0]}, {shown(settings.get(k))} {where[1]}"
        for k in keys
        if saved.get(k) != settings.get(k)
    )


def option(name, keyword=None):
    """An option as the user gave it, for a message: `--name` while a kgpt command runs (`command_line()`),
    the keyword (`keyword`, default `name`) in Python.

    Example: `option("input", "path")  # "path"; "--input" inside command_line()`
    """
    return f"--{name}" if _COMMANDS[0] else keyword or name


@contextlib.contextmanager
def command_line():
    """Within it, messages name options as flags (`option`); each command's `main` runs inside it. Process-wide, not
    per thread: tf.data's threads read a command's files too."""
    with _COMMANDS_LOCK:
        _COMMANDS[0] += 1
    try:
        yield
    finally:
        with _COMMANDS_LOCK:
            _COMMANDS[0] -= 1


def unique_keys(pairs):
    """`object_pairs_hook` for `json.load`: a key given twice in one object raises `RepeatedKeyError` (`json`
    keeps the last value without a word)."""
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise RepeatedKeyError(key)
        obj[key] = value
    return obj


KERAS_MODEL_ARGUMENTS = {"name": None, "dtype": None, "trainable": True}  # with defaults: what a config may hold


def model_kwargs(kwargs, owner, also=()):
    """Refuses keyword arguments a Keras model would drop silently (its functional `__init__` keeps only
    `name` and `trainable`), so a misspelt one (`dropuot=0.2`) is named instead of changing nothing.

    `kwargs` may hold the names of `KERAS_MODEL_ARGUMENTS` and `also`.

    Example:
    ```python
    model_kwargs({"name": "gpt"}, "GPTBackbone")  # passes
    model_kwargs({"dropuot": 0.2}, "GPTBackbone")  # TypeError: GPTBackbone got an unexpected keyword argument 'dropuot'.
    ```
    """
    unknown = sorted(set(kwargs) - set(KERAS_MODEL_ARGUMENTS) - set(also))
    if unknown:
        s = "s" if len(unknown) > 1 else ""
        raise TypeError(
            f"{owner} got {'an ' if not s else ''}unexpected keyword argument{s} {', '.join(map(repr, unknown))}."
        )


def one_of(value, name, allowed):
    """`value` when it is one of the names `allowed`.

    Example:
    ```python
    one_of("linear", "decay", ("cosine", "linear"))  # 'linear'
    one_of("step", "decay", ("cosine", "linear"))  # ValueError: decay must be one of 'cosine', 'linear', got 'step'.
    ```
    """
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}.")
    return value


def token_ids(value, name, vocabulary_size, ndim=2):
    """`value` as an int32 array of ids in `[0, vocabulary_size)`, with `ndim` dimensions.

    Floats (even whole ones), booleans, strings and ragged lists are refused,
    as are negative ids and ids past the vocabulary, which the embedding
    lookup would turn into NaN (JAX), an error deep in TensorFlow, or a
    silently wrong row.
    """
    return _indices(value, name, vocabulary_size, ndim, "token ids", "the model's vocabulary_size")


def class_indices(value, name, num_classes):
    """`value` as an int32 array `[batch]` of class indices in `[0, num_classes)` (`[batch, 1]` is taken too).

    Whole floats pass (Keras' sparse losses take them); fractions, strings
    and indices out of range are refused: the loss would read one past the
    logits as NaN or 0 (JAX) or fail deep in TensorFlow's graph.
    """
    array = np.asarray(value)
    if array.dtype.kind == "f" and array.size and np.isfinite(array).all() and (array == np.round(array)).all():
        array = array.astype("int64")
    if array.ndim == 2 and array.shape[1:] == (1,):
        array = array[:, 0]
    return _indices(array, name, num_classes, 1, "class indices", f"the head's {num_classes} classes")


def _indices(value, name, limit, ndim, what, limit_name):
    try:
        array = np.asarray(value)
    except ValueError as e:  # ragged nested lists
        raise ValueError(
            f"{name} must be a rectangular array of {what}; rows of different lengths ({str(e)[:120]})."
        ) from None
    if array.size == 0:
        raise ValueError(f"{name} is empty: there are no {what} in it.")
    if array.dtype == object or array.dtype.kind not in "iu":
        values = array.ravel() if array.dtype == object else []
        other = [v for v in values if not isinstance(v, str)][:1]
        if array.dtype.kind in "US" or any(isinstance(v, str) for v in values):
            kind = (
                f"strings mixed with {'None' if other[0] is None else type(other[0]).__name__}" if other else "strings"
            )
        elif array.dtype == object:  # None, a dict (score({"token_ids": ...})): named, not called strings
            odd = [v for v in array.ravel() if not isinstance(v, numbers.Integral)][:1]
            kind = (
                f"a {type(odd[0]).__name__}" if odd and odd[0] is not None else "None" if odd else "integers past int64"
            )
        else:
            kind = f"dtype {array.dtype}"
        raise TypeError(
            f"{name} must hold integer {what}, got {kind}"
            + (
                " (rows of different lengths?)"
                if any(isinstance(v, (list, tuple, np.ndarray)) for v in array.ravel())
                else ""
            )
            + "."
        )
    if array.ndim != ndim:
        dims = {1: "[batch]", 2: "[batch, length]", 3: "[batch, views, length]"}.get(ndim, "")
        raise ValueError(f"{name} must have {ndim} dimension{'s' * (ndim > 1)} {dims}, got shape {array.shape}.")
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        where = tuple(int(i) for i in np.argwhere(array == bad)[0])
        raise ValueError(f"{name}{list(where)} is {bad}: {what} must be in [0, {limit}) ({limit_name}).")
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


def fraction(value, name):
    """`value` as a float in `[0, 1]`: a share of something."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= float(value) <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}.")
    return float(value)


def nonnegative(value, name):
    """`value` as a finite float >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 <= float(value) < float("inf")):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}.")
    return float(value)


def positive(value, name):
    """`value` as a finite float > 0 (a scale, such as a standard deviation)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 < float(value) < float("inf")):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")
    return float(value)


def boolean(value, name):
    """`value` when it is True or False (a flag: 0, 1 or "no" are refused)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}.")
    return value


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


def within_context(length, max_sequence_length, what, advice=""):
    """`length` when it is at most `max_sequence_length` (the model's context); else a `ValueError` naming `what`
    (`"max_length"`, `"The preprocessor's sequence_length"`), with `advice` after the reason.

    The one place kgpt compares a length with the context: position embeddings exist only up to it, and a
    longer input fails deep in the backend or is silently cut.

    Example: `within_context(17, 16, "max_length")  # ValueError: max_length is 17, more than the model's context
    max_sequence_length=16.`
    """
    if length > max_sequence_length:
        raise ValueError(
            f"{what} is {length}, more than the model's context max_sequence_length={max_sequence_length}{advice}."
        )
    return length


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
    # At least 1: `token_ids` refused an empty array.
    within_context(ids.shape[-1], max_sequence_length, f"The length of {name}['token_ids']")
    mask = concrete(x.get("padding_mask"))
    if mask is not None:
        padding_mask(mask, f"{name}['padding_mask']", ids.shape)


INPUT_KEYS = ("token_ids", "padding_mask")


def token_id_dict(x, shape, name="x"):
    """Refuses token-id inputs that are not the model's `{"token_ids", "padding_mask"}` dict.

    For what is not text: a dict with another key or a missing one (Keras
    matched keys by position on JAX and predicted from the wrong arrays), or
    a list, tuple or array (of None, of numbers) that Keras fails on deep
    inside. `shape` names the arrays' dimensions for the message. Datasets
    and other objects are left to Keras.
    """
    expected = f"a dict {{'token_ids': ..., 'padding_mask': ...}} of integer arrays {shape}"
    if isinstance(x, dict):
        missing = [k for k in INPUT_KEYS if k not in x]
        unknown = sorted(map(str, set(x) - set(INPUT_KEYS)))
        if missing or unknown:
            problem = "; ".join(filter(None, [missing and f"missing {missing}", unknown and f"unknown {unknown}"]))
            raise ValueError(f"{name} has keys {sorted(map(str, x))} ({problem}): token-id inputs are {expected}.")
        return
    if isinstance(x, (list, tuple, np.ndarray, numbers.Number)) or concrete(x) is not None:
        first = x[0] if isinstance(x, (list, tuple)) and x else None
        what = f"a {type(x).__name__}" + (f" of {type(first).__name__}" if isinstance(x, (list, tuple)) and x else "")
        hint = " (decode bytes to str)" if isinstance(first, bytes) else ""
        raise TypeError(f"{name} is {what}{hint}: pass texts, {expected}, or a tf.data.Dataset of either.")


def same_batch(batch, arrays):
    """Refuses an array of `arrays` (`{name: value}`) whose first dimension is not `batch` (x's examples)."""
    for name, value in arrays.items():
        value = concrete(value)
        if value is not None and np.ndim(value) and len(value) != batch:
            raise ValueError(f"{name} has {len(value)} rows, x['token_ids'] has {batch}: one per example.")


def text_list(x, name="x"):
    """Refuses a list that mixes texts with other things (None, numbers), naming the first that is not text."""
    if isinstance(x, list) and any(isinstance(t, (str, bytes)) for t in x):
        bad = next((i for i, t in enumerate(x) if not isinstance(t, (str, bytes))), None)
        if bad is not None:
            raise TypeError(f"{name}[{bad}] is {shown(x[bad], 60)}, not text: a list of texts must hold only strings.")


def not_none(x, name="x"):
    """Refuses `None` where data is due (Keras would fail deep inside its data adapters)."""
    if x is None:
        raise TypeError(f"{name} is None: pass texts, token ids or a tf.data.Dataset.")


def not_a_generator(x, name="x"):
    """Refuses iterators and generators, which Keras and keras-hub read only partly or not at all."""
    import types

    if isinstance(x, types.GeneratorType) or (hasattr(x, "__next__") and not hasattr(x, "__len__")):
        raise TypeError(f"{name} is a {type(x).__name__}: pass a list, an array or a tf.data.Dataset.")


def batch_size(value, allow_none=True):
    """`batch_size` as an int >= 1 (or None)."""
    return positive_int(value, "batch_size", allow_none=allow_none)


def dataset_ids(dataset, vocabulary_size, targets=False, needs_y=None):
    """`dataset` with its token ids checked as each batch is read: a `tf.data.Dataset` map on the host.

    Ids in a dataset cannot be checked before the call, and the compiled step
    would turn one past the vocabulary into NaN (JAX) or an error deep in
    TensorFlow's gather. The check is a min and a max per batch, inside the
    input pipeline (not the compiled step); it fails the read with
    `DATASET_ID_ERROR` and the position's name, which `dataset_errors` turns
    into a `ValueError`. `targets`: the `y` of the elements are token ids
    too (a causal LM's next tokens). Elements of text pass unchanged.
    `needs_y` names the method (`"fit"`, `"evaluate"`) for which elements of
    token ids without targets are a `ValueError` (Keras failed on their
    structure, and a TensorFlow model could not fit again).

    Example:
    ```python
    ds = dataset_ids(tf.data.Dataset.from_tensor_slices({"token_ids": [[1, 2]], "padding_mask": [[1, 1]]}), 3)
    ```
    """
    if "tensorflow" not in sys.modules:  # no dataset without TensorFlow imported; JAX needs no TensorFlow for arrays
        return dataset
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        return dataset
    spec = dataset.element_spec
    if needs_y and isinstance(spec, dict) and "token_ids" in spec:
        raise ValueError(
            f"{needs_y}() on a tf.data.Dataset of token ids needs (x, y) elements, y the targets as for arrays of "
            f"token ids; its elements are x alone."
        )

    def check(ids, name):
        if not ids.dtype.is_integer:
            return ids
        message = f"{DATASET_ID_ERROR} {name}: token ids must be in 0..{vocabulary_size - 1} (vocabulary_size={vocabulary_size})"
        with tf.control_dependencies(
            [
                tf.debugging.assert_non_negative(ids, message=message),
                tf.debugging.assert_less(ids, tf.cast(vocabulary_size, ids.dtype), message=message),
            ]
        ):
            return tf.identity(ids)

    def check_element(*element):
        x, *rest = element
        if isinstance(x, dict) and "token_ids" in x:
            x = {**x, "token_ids": check(x["token_ids"], "x token_ids")}
        if targets and rest and isinstance(rest[0], tf.Tensor):
            rest[0] = check(rest[0], "y")
        return (x, *rest) if rest else x

    return dataset.map(check_element if isinstance(dataset.element_spec, tuple) else lambda x: check_element(x))


DATASET_ID_ERROR = "A token id in the dataset is out of range at"
# How an error in a dataset of text's encoding (a batch read inside tf.data) starts: `dataset_errors` finds it in
# TensorFlow's error and gives its line alone.
DATASET_TEXT_ERROR = "In a tf.data.Dataset of text, "


# Keras' JAX trainer detaches every variable's value while a fit, evaluate or predict loop runs: a call
# from another thread (on this model, or another sharing its layers) read None. On every backend a `fit` or
# `evaluate` resets and updates the model's metric trackers: two at once in threads reported each other's
# (a loss of 0.0). One such loop at a time.
_ONE_LOOP = threading.RLock()


@contextlib.contextmanager
def one_loop_at_a_time(metrics=False):
    """Around a Keras loop: on JAX any loop, elsewhere those with metrics (`fit`, `evaluate`), one at a time in
    the process (reentrant)."""
    import keras

    with _ONE_LOOP if metrics or keras.config.backend() == "jax" else contextlib.nullcontext():
        yield


@contextlib.contextmanager
def dataset_errors(model, metrics=True):
    """Around a Keras loop on `model`: `one_loop_at_a_time(metrics)`, and the errors `dataset_ids` and a dataset of
    text's encoding raise while Keras reads a dataset turned into a one-line `ValueError`.

    Whatever fails inside the call, `model` keeps its weights: Keras' JAX
    trainer detaches them from the variables while a loop runs, and a failure
    in the input pipeline before the first step (or anywhere in `evaluate`)
    left the variables empty, so every later call on the model failed.
    """
    with one_loop_at_a_time(metrics):
        kept = _values(model)
        try:
            yield
        except Exception as e:  # noqa: BLE001 - re-raised, as it was or as a ValueError
            _restore(model, kept)
            text = str(e)
            if DATASET_TEXT_ERROR in text and not isinstance(e, ValueError):
                raise ValueError(text[text.index(DATASET_TEXT_ERROR) :].splitlines()[0]) from None
            if DATASET_ID_ERROR not in text:
                raise
            line = text[text.index(DATASET_ID_ERROR) :].split("]")[0]
            raise ValueError(f"{line}. Ids inside a tf.data.Dataset are checked as each batch is read.") from None


def _variables(model):
    optimizer = getattr(model, "optimizer", None)
    return [*model.variables, *(optimizer.variables if optimizer is not None else ()), *model.metrics_variables]


def _values(model):
    """The variables' current values (JAX arrays are immutable: references, not copies); None off JAX."""
    if not hasattr(model, "jax_state_sync"):
        return None
    return [(v, v._value) for v in _variables(model)]


def _restore(model, kept):
    if kept is None:
        return
    if getattr(model, "_jax_state", None):  # the loop's latest state, where a step had run
        model.jax_state_sync()
        model._jax_state = None
    for variable, value in kept:
        if variable._value is None and value is not None and not value.is_deleted():
            variable._value = value


def refuse_on_text(method, kwargs, names):
    """A `ValueError` for Keras arguments of `method` that text cannot take: kgpt batches text itself (by
    length), so Keras' own messages about tf.data (or a silently ignored `steps`) would follow."""
    given = [n for n in names if kwargs.get(n) is not None]
    if given:
        raise ValueError(
            f"{method} on text takes no {', '.join(given)}: kgpt encodes and batches the text itself. Pass "
            f"token ids (model.preprocessor(texts)) for Keras' own arguments, or leave them out."
        )
