"""Raw text into a `GPTTaskModel`: labels and texts encoded by its preprocessor, batched by length.

keras-hub's `PipelineModel` maps a preprocessor over `tf.data` batches; task
examples are tokenized in Python and batched by length
(`kgpt.data.batching`) instead, and a `tf.data.Dataset` of strings goes
through `kgpt.models.gpt.gpt_task_preprocessor.encode_dataset`.
"""

import warnings

import numpy as np

from kgpt.data import inputs_kind
from kgpt.data import batching
from kgpt import checks
from kgpt.models.gpt.gpt_task_preprocessor import encode_dataset as encode_text_dataset
from kgpt.tasks import heads as heads_lib
from kgpt.tasks.task import Example


def encode(model, x, y=None, name="inputs"):
    """Raw text (and labels) -> a `kgpt.data.batching.EncodedSplit` through the attached preprocessor."""
    if model.preprocessor is None:
        raise ValueError("Text inputs need a preprocessor: load with GPTTaskModel.from_preset(dir, task=...) or "
                         "pass preprocessor=kgpt.GPTTaskPreprocessor(tokenizer, transform).")
    targets = None
    if y is None and isinstance(x, list) and x and all(isinstance(e, Example) for e in x):
        if all(e.label is not None for e in x):  # labelled examples carry their labels and sources
            targets = np.asarray([model.head.target(e.label, e.source or f"{name} example {i}")
                                  for i, e in enumerate(x)], model.head.target_dtype)
    elif y is not None:
        if hasattr(y, "numpy") and not isinstance(y, np.ndarray):
            y = y.numpy()
        labels = y.tolist() if isinstance(y, np.ndarray) else list(y)
        targets = np.asarray([model.head.target(label, f"{name} label {i}") for i, label in enumerate(labels)],
                             model.head.target_dtype)
    split = model.preprocessor.encode_batch(x, targets, name=name)
    if split.counts["truncated"]:
        warnings.warn(f"{split.counts['truncated']} of {len(split)} examples in {name} are longer than "
                      f"sequence_length={model.preprocessor.sequence_length} tokens: {split.counts['tokens_cut']} tokens were "
                      f"cut from the end of their longest segments.", stacklevel=3)
    return split


def labeled_split(model, x, y, name="inputs"):
    """Texts and labels (or an `EncodedSplit`) as an `EncodedSplit` with targets."""
    split = x if isinstance(x, batching.EncodedSplit) else encode(model, x, y, name=name)
    if split.targets is None:
        raise ValueError(f"Training or evaluating on text needs labels: pass y (label names or indices) for {name}.")
    return split


def text_dataset(model, x, y, batch_size, seed=None, name="inputs", epochs=1,
                 compile_batches=batching.COMPILE_BATCHES, attention_length=None):
    """Texts and labels (or an `EncodedSplit`) as a `tf.data` dataset of length-bucketed model batches.

    Its padded lengths are planned for `epochs` passes, each compilation
    worth `compile_batches` steps, a row's cost growing with `attention_length`
    (`kgpt.data.batching.length_plan`).
    """
    split = labeled_split(model, x, y, name=name)
    batch_size = batch_size or 32
    return batching.dataset(split, batch_size, seed=seed, lm="lm" in model.output, epochs=epochs,
                            max_lengths=model.max_padded_lengths(split, batch_size, epochs, compile_batches,
                                                                 attention_length),
                            compile_batches=compile_batches, attention_length=attention_length)


def encode_dataset(model, ds, targets):
    """A batched `tf.data.Dataset` of raw text -> model batches (`kgpt.models.gpt.gpt_task_preprocessor.encode_dataset`)."""
    if model.preprocessor is None:
        raise ValueError("A dataset of text needs a preprocessor: load with GPTTaskModel.from_preset(dir, "
                         "task=...) or attach preprocessor=kgpt.GPTTaskPreprocessor(tokenizer, transform).")
    return encode_text_dataset(ds, model.encode, model.num_views, model.head.target_dtype, "lm" in model.output, targets)


def check_inputs(model, x, batch_size, y=None, sample_weight=None, name="x"):
    """What `fit`, `evaluate` and the `predict` methods check before anything runs; returns `batch_size`.

    On token ids, `y` and `sample_weight` too (`check_targets`).
    """
    checks.not_none(x, name)
    checks.not_a_generator(x, name)
    checks.text_list(x, name)
    if not is_text(x) and not isinstance(x, batching.EncodedSplit):
        checks.token_id_dict(x, "[batch, num_views, length]", name)
        checks.model_inputs(x, model.backbone.vocabulary_size, model.backbone.max_sequence_length, ndim=3, name=name)
        _check_views(model, x, name)
        check_targets(model, x, y, sample_weight)
    return checks.batch_size(batch_size)


def _check_views(model, x, name):
    """Each example has `num_views` right-padded views with a real token: a view count the model does not take
    came back as that many rows of outputs, and an empty or left-padded view's extract state is a padding one."""
    if not isinstance(x, dict):
        return
    ids, mask = (checks.concrete(x.get(key)) for key in checks.INPUT_KEYS)
    if ids is None or mask is None:
        return
    ids, mask = np.asarray(ids), np.asarray(mask).astype(bool)
    if ids.shape[1] != model.num_views:
        raise ValueError(f"{name}['token_ids'] has {ids.shape[1]} views per example (shape {ids.shape}); this model "
                         f"takes num_views={model.num_views}: [batch, {model.num_views}, length].")
    empty = np.argwhere(~mask.any(-1))
    if len(empty):
        raise ValueError(f"{name}['padding_mask']{empty[0].tolist()} has no real token: every view needs its tokens "
                         f"(at least the extract token the head reads).")
    unpadded = np.argwhere((mask[..., 1:] > mask[..., :-1]).any(-1))
    if len(unpadded):
        raise ValueError(f"{name}['padding_mask']{unpadded[0].tolist()} is not right-padded: real tokens first, "
                         f"then padding (the head reads the last real token).")


def check_targets(model, x, y, sample_weight):
    """Targets beside token-id arrays: `{"task": [batch], "lm": token_ids[..., 1:]}` (a bare task array
    without the LM output), each in range and one per example. Class indices past the head's classes
    trained silently on JAX and failed deep in TensorFlow's graph; LM targets past the vocabulary gave NaN."""
    ids = checks.concrete(x.get("token_ids")) if isinstance(x, dict) else None
    if ids is None:
        return
    ids = np.asarray(ids)
    outputs = sorted(model.output)
    if y is not None:
        if not isinstance(y, dict) and outputs == ["task"]:
            y = {"task": y}
        layout = "{'task': targets [batch]" + (", 'lm': x['token_ids'][..., 1:]}" if "lm" in outputs else "}")
        if not isinstance(y, dict) or sorted(map(str, y)) != outputs:
            got = f"has keys {sorted(map(str, y))}" if isinstance(y, dict) else f"is a {type(y).__name__}"
            raise ValueError(f"y {got}; the model's outputs are {outputs}, so y on token ids is {layout}"
                             + (" (lm_coef=0 removes the LM output)." if "lm" in outputs else "."))
        task = checks.concrete(y["task"])
        if task is not None and isinstance(model.head, heads_lib.Categorical):
            checks.class_indices(task, "y['task']", int(model.output["task"].shape[-1]))
        elif task is not None and not np.isfinite(np.asarray(task, "float64")).all():
            raise ValueError("y['task'] holds a non-finite value: regression targets must be finite numbers.")
        lm = checks.concrete(y.get("lm"))
        if lm is not None:
            lm = checks.token_ids(lm, "y['lm']", model.backbone.vocabulary_size, ndim=3)
            if lm.shape != ids.shape[:-1] + (ids.shape[-1] - 1,):
                raise ValueError(f"y['lm'] must have shape {ids.shape[:-1] + (ids.shape[-1] - 1,)} "
                                 f"(x['token_ids'][..., 1:], each position's next token), got {lm.shape}.")
        checks.same_batch(len(ids), {f"y[{k!r}]": v for k, v in y.items()})
    if isinstance(sample_weight, dict):
        checks.same_batch(len(ids), {f"sample_weight[{k!r}]": v for k, v in sample_weight.items()})
    elif sample_weight is not None:
        checks.same_batch(len(ids), {"sample_weight": sample_weight})


def is_text(x):
    """Whether `x` is raw text for the preprocessor (text columns, or a list of `Example`s), not token ids."""
    return inputs_kind.is_text_columns(x) or (isinstance(x, list) and bool(x) and isinstance(x[0], Example))
