"""What `GPTCausalLM`'s `fit`, `evaluate` and `predict` check before anything runs.

Token ids in the vocabulary, texts only with a preprocessor and without `y`,
nothing empty; over-long texts and a `fit` that ends inside the learning-rate
warm-up are counted and warned of. Each check names the argument it refuses.
"""

import warnings

import numpy as np
from keras import ops

from kgpt.data import inputs_kind
from kgpt import checks
from kgpt.models.optimizers import WarmupSchedule

try:
    import tensorflow as tf
except ImportError:
    tf = None

NO_PREPROCESSOR = (
    "This GPTCausalLM has no preprocessor, so it takes token ids only. Load it with "
    "kgpt.GPTCausalLM.from_preset(dir) from a preset that holds a tokenizer, or attach one: "
    "lm.preprocessor = kgpt.GPTCausalLMPreprocessor(tokenizer, sequence_length=lm.backbone.max_sequence_length)."
)


def check_length(lm, length):
    """Refuses a sequence length past the model's context."""
    limit = lm.backbone.max_sequence_length
    if length > limit:
        raise ValueError(
            f"Sequence length {length} exceeds the model's context "
            f"max_sequence_length={limit}."
        )


def check_call(lm, method, x, y, batch_size):
    """The checks `fit`, `evaluate` and `predict` share; returns `x` (a tuple of texts as a list, since
    keras-hub reads a tuple as `(x, y, sample_weight)`) and `batch_size`."""
    batch_size = checks.batch_size(batch_size)
    checks.not_none(x)
    checks.not_a_generator(x)
    _check_not_empty(x, method, "x")
    if isinstance(x, tuple) and inputs_kind.is_text(x):
        x = list(x)
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{method}() takes a list of texts, got one string: pass [{x!r:.40}].")
    _check_ids(lm, x, y)
    if inputs_kind.is_text(x):
        _check_texts(lm, x, y, method)
    return checks.dataset_ids(x, lm.backbone.vocabulary_size, targets=True), batch_size


def _check_ids(lm, x, y):
    """Token ids given as arrays are in the vocabulary (a lookup past it gives NaN on JAX, an error deep
    in TensorFlow); datasets and tensors go unchecked."""
    vocabulary = lm.backbone.vocabulary_size
    checks.text_list(x)
    if not inputs_kind.is_text(x):
        checks.token_id_dict(x, "[batch, length]")
    checks.model_inputs(x, vocabulary, lm.backbone.max_sequence_length)
    targets = checks.concrete(y)
    if targets is not None and not inputs_kind.is_text(x):
        targets = checks.token_ids(targets, "y", vocabulary)
        ids = checks.concrete(x.get("token_ids")) if isinstance(x, dict) else None
        if ids is not None and targets.shape != np.shape(ids):
            raise ValueError(f"y must have the shape of x['token_ids'] {np.shape(ids)} (the next token at each "
                             f"position), got {targets.shape}.")


def _check_texts(lm, texts, y, method):
    """Refuses `y` beside text (the targets are the text's own next tokens) and text with nothing to
    predict; warns, with counts, of texts with none and of texts longer than the packed length."""
    if lm.preprocessor is None:
        raise ValueError(NO_PREPROCESSOR)
    if y is not None:
        raise ValueError(f"{method}() on text uses each text's own next tokens as targets, so it takes no y: "
                         f"leave y out (for labels, fine-tune a kgpt.GPTTaskModel).")
    texts = texts.numpy() if tf is not None and isinstance(texts, tf.Tensor) else texts
    texts = [texts] if isinstance(texts, (str, bytes)) else np.asarray(texts, dtype=object).reshape(-1).tolist()
    start = int(bool(lm.preprocessor.add_start_token))
    length = lm.preprocessor.sequence_length
    sizes = []
    for i, text in enumerate(texts):
        try:  # TensorFlow's string tensors take UTF-8 only
            if isinstance(text, bytes):
                text = text.decode("utf-8")
            else:
                text.encode("utf-8")
        except UnicodeError as e:
            raise ValueError(f"x[{i}] is not valid UTF-8 text ({e.reason} at character {e.start}): {text!r:.60}"
                             ) from None
        sizes.append(start + len(lm.preprocessor.tokenizer.encode(text)))
    sizes = np.array(sizes)
    empty, cut = int((sizes < 2).sum()), int((sizes > length + 1).sum())
    used = {"fit": "trained on", "evaluate": "evaluated", "predict": "predicted"}[method]
    if empty == len(texts) and method != "predict":
        raise ValueError(f"{method}() got {len(texts)} text(s) with nothing to predict: each needs at least 2 "
                         f"tokens (a token and the one after it).")
    if empty:
        warnings.warn(f"{empty} of {len(texts)} texts have fewer than 2 tokens: nothing of them is {used}"
                      + (" (their logits predict no token of theirs)." if method == "predict" else "."),
                      stacklevel=3)
    if cut:
        warnings.warn(f"{cut} of {len(texts)} texts are longer than sequence_length={length} tokens (+1 target): "
                      f"{int(np.maximum(sizes - length - 1, 0).sum())} tokens past it are not {used}. Split "
                      f"long texts into windows to use all of them.", stacklevel=3)


def warn_if_warming_up(lm, x, batch_size, kwargs):
    """Says so when the whole `fit` stays inside the learning-rate warm-up (`compile()`'s default is
    the paper's 2,000 updates of pre-training: a short fit barely moves the weights)."""
    schedule = getattr(getattr(lm, "optimizer", None), "_learning_rate", None)
    if not isinstance(schedule, WarmupSchedule) or schedule.warmup_steps <= 0:
        return
    ids = checks.concrete(x.get("token_ids")) if isinstance(x, dict) else None
    rows = len(x) if isinstance(x, (list, np.ndarray)) else len(ids) if ids is not None else None
    steps = kwargs.get("steps_per_epoch") or (-(-rows // (batch_size or 32)) if rows else None)
    if not steps:
        return
    accumulation = schedule.gradient_accumulation_steps
    done = int(ops.convert_to_numpy(lm.optimizer.iterations)) // accumulation
    end = done + steps * kwargs.get("epochs", 1) // accumulation
    if end < schedule.warmup_steps:
        reached = schedule.peak_learning_rate * end / schedule.warmup_steps
        warnings.warn(
            f"fit() runs {end - done} update(s), ending at update {end} of the optimizer's {schedule.warmup_steps}-"
            f"update warm-up: the learning rate reaches only {reached:.3g} of its peak "
            f"{schedule.peak_learning_rate:g}, so the model will barely change. For a short run, compile with a "
            f"shorter warm-up: lm.compile(optimizer=kgpt.gpt_adamw(warmup_steps=..., total_steps=...)).",
            stacklevel=3)


def _check_not_empty(x, method, name):
    """Refuses an empty list or array (Keras would fail inside its first traced step)."""
    if isinstance(x, dict):
        for key, value in x.items():
            _check_not_empty(value, method, f"{name}[{key!r}]")
    elif isinstance(x, (list, tuple, np.ndarray)) and len(x) == 0:
        raise ValueError(f"{method}() got no examples: {name} is empty.")


def is_distributed_dataset(x):
    if not type(x).__module__.startswith("tensorflow"):
        return False
    import tensorflow as tf

    return isinstance(x, tf.distribute.DistributedDataset)
