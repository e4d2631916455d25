"""`GPTTaskPreprocessor`: raw task text -> `GPTTaskModel` inputs, the one place this happens.

Fine-tuning (`kgpt-train`), `GPTTaskModel.fit/predict` on strings, the task
contract test and the analyses all encode examples here: tokenize every
segment and answer choice, build the paper's Figure 1 views with the start,
delimiter and extract tokens (`kgpt.tasks.transforms`), truncate over-long views by
the one policy of `kgpt.tasks.transforms.truncate` and count what was cut; then
`kgpt.data.batching` pads batches of similar length and derives the auxiliary LM
targets and weights.
"""

import keras
import numpy as np
from keras_hub.models import Preprocessor

from kgpt.data import batching
from kgpt.tasks import transforms
from kgpt.models.backbone import GPTBackbone
from kgpt.data.tokenizer import GPTTokenizer


def _texts(values, what):
    """A batch of strings from a list, tuple, NumPy array or string tensor."""
    if isinstance(values, str):
        return [values]
    if hasattr(values, "numpy") and not isinstance(values, np.ndarray):
        values = values.numpy()
    if isinstance(values, np.ndarray):
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"{what}: expected strings, got {type(values).__name__}.")
    return [v.decode("utf-8") if isinstance(v, bytes) else v for v in values]


MIN_MAX_LENGTH = 4  # start, delimiter and extract tokens, and one token of text


@keras.saving.register_keras_serializable(package="kgpt")
class GPTTaskPreprocessor(Preprocessor):
    """Task examples as text -> views of token ids for `kgpt.GPTTaskModel`.

    Inputs, as keras-hub's text classifiers take them (a batch at a time):
    - one segment: a list of strings, `["a great film", ...]`;
    - two segments: a tuple of lists, `(premises, hypotheses)`;
    - multiple choice: a tuple whose last item holds each example's answer
      choices, `(contexts, [[answer_1, ..., answer_k], ...])` (more context
      segments may come before the choices, e.g. `(articles, questions,
      choices)`);
    - or a list of `kgpt.Example`, or of per-example tuples (`[(premise,
      hypothesis), ...]`). A list of lists is refused as ambiguous (columns
      or rows?).

    Calling it gives padded `{"token_ids", "padding_mask"}` of shape
    `[batch, views, length]` (with `y` and `sample_weight` passed through
    and the LM targets added when `y` is given). `GPTTaskModel.fit` and
    `predict` on strings use `encode_batch` and length-bucketed batches
    instead, so that long and short examples are not padded together.

    Args:
        tokenizer: a `kgpt.GPTTokenizer` (its start, delimiter and extract
            tokens frame the views).
        transform: a `kgpt.tasks.transforms.Transform` (the task's Figure 1 input
            transformation).
        max_length: most tokens per view; longer views lose tokens from the
            end of their longest segment (`kgpt.tasks.transforms.truncate`),
            counted in `encode_batch`'s result.

    Example:
    ```python
    import kgpt

    preprocessor = kgpt.GPTTaskPreprocessor(kgpt.GPTTokenizer.gpt1(), kgpt.tasks.transforms.Entailment(), max_length=64)
    x = preprocessor((["A dog runs."], ["An animal moves."]))
    x["token_ids"].shape  # (1, 1, 12): [start] premise [delimiter] hypothesis [extract], 11 tokens, padded to 12
    ```
    """

    backbone_cls = GPTBackbone
    tokenizer_cls = GPTTokenizer

    def __init__(self, tokenizer, transform, max_length=512, **kwargs):
        super().__init__(**kwargs)
        if isinstance(transform, dict):
            transform = keras.saving.deserialize_keras_object(transform)
        if not isinstance(transform, transforms.Transform):
            raise TypeError(f"transform must be a kgpt.tasks.transforms.Transform, got {transform!r}.")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < MIN_MAX_LENGTH:
            raise ValueError(f"max_length must be an integer >= {MIN_MAX_LENGTH}, got {max_length!r}.")
        self.tokenizer = tokenizer
        self.transform = transform
        self.max_length = max_length

    # --- one example ---------------------------------------------------------

    def encode(self, segments, choices=()):
        """`(views, tokens_cut)` for one example: token-id lists, one per view.

        Raises `ValueError` when the example does not fit the transformation
        (e.g. one segment for an entailment task).
        """
        problem = self.transform.check(tuple(segments), tuple(choices))
        if problem:
            raise ValueError(problem)
        for text in (*segments, *choices):
            if not isinstance(text, str):
                raise ValueError(f"expected text, got {type(text).__name__} {text!r:.80}")
        encode = self.tokenizer.encode
        layout = transforms.Layout.from_tokenizer(self.tokenizer)
        return transforms.build_views(self.transform, [encode(s) for s in segments], [encode(c) for c in choices],
                                      layout, self.max_length)

    # --- a batch -------------------------------------------------------------

    def examples(self, x):
        """Normalises `x` (see the class docstring) to a list of `(segments, choices)` tuples."""
        from kgpt.tasks.task import Example

        if isinstance(x, str):
            x = [x]
        if isinstance(x, (list, np.ndarray)) or (hasattr(x, "numpy") and not isinstance(x, tuple)):
            items = list(x) if not hasattr(x, "numpy") or isinstance(x, np.ndarray) else _texts(x, "x")
            if items and all(isinstance(i, Example) for i in items):
                return [(tuple(e.segments), tuple(e.choices)) for e in items]
            if items and all(isinstance(i, tuple) for i in items):  # one tuple per example
                return [self._split_choices(i) for i in items]
            if any(isinstance(i, list) for i in items):
                raise ValueError("A list of lists is ambiguous: pass segments as a tuple of columns, "
                                 "(premises, hypotheses), or examples as a list of tuples, [(premise, hypothesis), ...].")
            return [((text,), ()) for text in _texts(items, "x")]
        if isinstance(x, tuple):
            columns = list(x)
            if any(isinstance(c, (str, bytes)) for c in columns):
                raise TypeError(f"A tuple is read as columns of segments, (premises, hypotheses), each a list of "
                                f"texts; got a tuple holding a string ({next(c for c in columns if isinstance(c, (str, bytes)))!r:.40}). "
                                f"Pass texts as a list, or each example as a tuple inside a list.")
            choices = None
            if self.transform.takes_choices:
                if len(columns) < 2:
                    raise ValueError("Multiple choice inputs are (contexts, ..., choices): got one column.")
                choices = [tuple(_texts(c, "choices")) for c in columns.pop()]
            columns = [_texts(c, f"segment {i + 1}") for i, c in enumerate(columns)]
            sizes = {len(c) for c in columns} | ({len(choices)} if choices is not None else set())
            if len(sizes) > 1:
                raise ValueError(f"The input columns have different lengths: {sorted(sizes)}.")
            return [(tuple(c[i] for c in columns), choices[i] if choices is not None else ())
                    for i in range(len(columns[0]))]
        raise TypeError(f"Expected text inputs (a list of strings, a tuple of lists, or kgpt.Examples), "
                        f"got {type(x).__name__}.")

    def _split_choices(self, item):
        if self.transform.takes_choices:
            if len(item) < 2 or isinstance(item[-1], str):
                raise ValueError(f"A multiple-choice example is (context, ..., [choices]), got {item!r:.200}.")
            return tuple(item[:-1]), tuple(item[-1])
        return tuple(item), ()

    def encode_batch(self, x, targets=None, name="inputs"):
        """Encodes a batch of raw inputs into a `kgpt.data.batching.EncodedSplit` (real tokens only).

        `targets` are the head's targets (one per example) or None. The
        split's `counts` say how many examples were truncated and by how
        many tokens. An example that does not fit the transformation raises
        `ValueError` naming its position.
        """
        builder = batching.SplitBuilder(name, self.transform.num_views, self.max_length)
        truncated = tokens_cut = 0
        examples = self.examples(x)
        if not examples:
            raise ValueError(f"No examples in {name}.")
        if targets is not None and len(targets) != len(examples):
            raise ValueError(f"Got {len(examples)} examples but {len(targets)} labels.")
        for i, (segments, choices) in enumerate(examples):
            try:
                views, cut = self.encode(segments, choices)
            except ValueError as e:
                raise ValueError(f"{name} example {i}: {e}.") from None
            truncated += cut > 0
            tokens_cut += cut
            builder.add(views, None if targets is None else targets[i], uid=str(i))
        counts = {"read": len(examples), "used": len(examples), "skipped": 0, "skipped_reasons": {},
                  "truncated": truncated, "tokens_cut": tokens_cut}
        dtype = np.asarray(targets).dtype.name if targets is not None and len(targets) else "int32"
        return builder.build(counts, target_dtype=dtype)

    def __call__(self, x, y=None, sample_weight=None):
        # keras-hub's preprocessing layers read a lone 2- or 3-tuple as (x, y,
        # sample_weight); here a tuple is the segments of a batch, as
        # (premises, hypotheses). The work is Python, so Layer.__call__ has
        # nothing to build or trace.
        return self.call(x, y=y, sample_weight=sample_weight)

    def call(self, x, y=None, sample_weight=None):
        if not isinstance(x, (str, list, tuple, np.ndarray)):
            try:
                import tensorflow as tf

                if not tf.executing_eagerly():
                    raise TypeError
            except (ImportError, TypeError):
                raise TypeError(
                    "GPTTaskPreprocessor runs in Python, not inside tf.data or tf.function: give raw text to "
                    "GPTTaskModel.fit/predict, which batch it by length."
                ) from None
        split = self.encode_batch(x)
        inputs = split.inputs(np.arange(len(split)))
        if y is None:
            return inputs
        y = {"task": y, "lm": inputs["token_ids"][..., 1:]}
        task_weight = np.ones(len(split), "float32") if sample_weight is None else sample_weight
        sample_weight = {"task": task_weight, "lm": inputs["padding_mask"][..., 1:].astype("float32")}
        return keras.utils.pack_x_y_sample_weight(inputs, y, sample_weight)

    def get_config(self):
        config = super().get_config()
        config.update({"transform": keras.saving.serialize_keras_object(self.transform),
                       "max_length": self.max_length})
        return config
