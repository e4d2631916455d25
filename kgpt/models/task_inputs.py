"""Raw text into a `GPTTaskModel`: labels and texts encoded by its preprocessor, batched by length.

keras-hub's `PipelineModel` maps a preprocessor over `tf.data` batches; task
examples are tokenized in Python and batched by length
(`kgpt.data.batching`) instead, and a `tf.data.Dataset` of strings goes
through `kgpt.models.task_preprocessor.encode_dataset`.
"""

import warnings

import numpy as np

from kgpt.data import inputs_kind
from kgpt.data import batching
from kgpt.models import inputs as checks
from kgpt.models.task_preprocessor import encode_dataset as encode_text_dataset
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
    """A batched `tf.data.Dataset` of raw text -> model batches (`kgpt.models.task_preprocessor.encode_dataset`)."""
    if model.preprocessor is None:
        raise ValueError("A dataset of text needs a preprocessor: load with GPTTaskModel.from_preset(dir, "
                         "task=...) or attach preprocessor=kgpt.GPTTaskPreprocessor(tokenizer, transform).")
    return encode_text_dataset(ds, model.encode, model.num_views, model.head.target_dtype, "lm" in model.output, targets)


def check_inputs(model, x, batch_size):
    """What `fit`, `evaluate` and the `predict` methods check before anything runs; returns `batch_size`."""
    checks.not_none(x)
    checks.not_a_generator(x)
    checks.text_list(x)
    checks.model_inputs(x, model.backbone.vocabulary_size, model.backbone.max_sequence_length, ndim=3)
    return checks.batch_size(batch_size)


def is_text(x):
    """Whether `x` is raw text for the preprocessor (text columns, or a list of `Example`s), not token ids."""
    return inputs_kind.is_text_columns(x) or (isinstance(x, list) and bool(x) and isinstance(x[0], Example))
