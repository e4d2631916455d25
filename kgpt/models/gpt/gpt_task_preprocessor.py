"""`GPTTaskPreprocessor`: raw task text -> `GPTTaskModel` inputs, the one place this happens.

Fine-tuning (`kgpt-train`), `GPTTaskModel.fit/predict` on strings, the task
contract test and the analyses all encode examples here: tokenize every
segment and answer choice, build the paper's Figure 1 views with the start,
delimiter and extract tokens (`kgpt.tasks.transforms`), truncate over-long views by
the one policy of `kgpt.tasks.transforms.truncate` and count what was cut; then
`kgpt.data.batching` pads batches of similar length and derives the auxiliary LM
targets and weights.
"""

import logging

import keras
import numpy as np
from keras_hub.models import Preprocessor

from kgpt import checks
from kgpt.data import batching, inputs_kind
from kgpt.errors import EmptyTextError
from kgpt.io.presets import check_save_target
from kgpt.models.gpt.gpt_backbone import GPTBackbone
from kgpt.models.gpt.gpt_tokenizer import GPTTokenizer
from kgpt.tasks import transforms

logger = logging.getLogger(__name__)

MIN_MAX_LENGTH = 4  # start, delimiter and extract tokens, and one token of text


def _in_graph(x):
    """Whether `x` holds symbolic TensorFlow tensors (a `tf.data` map or a `tf.function` is tracing)."""
    if isinstance(x, (str, bytes, list, np.ndarray)) or (isinstance(x, tuple) and not x):
        return False
    leaves = x if isinstance(x, tuple) else (x,)
    if not all(type(leaf).__module__.startswith("tensorflow") for leaf in leaves):
        return False
    import tensorflow as tf

    return not tf.executing_eagerly() or any(not hasattr(leaf, "numpy") for leaf in leaves)


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
        sequence_length: most tokens per view (keras-hub's name for the
            packed length; default 512); longer views lose tokens from the
            end of their longest segment (`kgpt.tasks.transforms.truncate`),
            counted in `encode_batch`'s result. Batches are padded to their
            longest view, not to this length.
        columns: the table columns the examples' texts come from, in order
            (answer choices last), when fine-tuning read tables
            (`kgpt-train --text_columns`): saved with the preprocessor, so
            `kgpt-predict` reads the same columns of a new table by default.

    Example:
    ```python
    import kgpt

    preprocessor = kgpt.GPTTaskPreprocessor(kgpt.GPTTokenizer.gpt1(), kgpt.tasks.transforms.Entailment(), sequence_length=64)
    x = preprocessor((["A dog runs."], ["An animal moves."]))
    x["token_ids"].shape  # (1, 1, 12): [start] premise [delimiter] hypothesis [extract], 11 tokens, padded to 12
    ```
    """

    backbone_cls = GPTBackbone
    tokenizer_cls = GPTTokenizer

    def __init__(self, tokenizer, transform, sequence_length=512, columns=None, **kwargs):
        super().__init__(**kwargs)
        if isinstance(transform, dict):
            transform = keras.saving.deserialize_keras_object(transform)
        if not isinstance(transform, transforms.Transform):
            raise TypeError(f"transform must be a kgpt.tasks.transforms.Transform, got {transform!r}.")
        length = checks.positive_int(
            sequence_length, "sequence_length", minimum=max(MIN_MAX_LENGTH, transform.min_length)
        )
        if columns is not None and (
            isinstance(columns, str) or not all(isinstance(c, str) for c in columns) or not columns
        ):
            raise ValueError(f"columns must be a list of column names, got {checks.shown(columns, 100)}.")
        self.tokenizer = tokenizer
        self.transform = transform
        self.sequence_length = length
        self.columns = list(columns) if columns is not None else None

    # --- one example ---------------------------------------------------------

    def encode(self, segments, choices=()):
        """`(views, tokens_cut)` for one example: token-id lists, one per view.

        Raises `ValueError` when the example does not fit the transformation
        (e.g. one segment for an entailment task).
        """
        problem = self.transform.check(tuple(segments), tuple(choices))
        if problem:
            raise ValueError(problem)
        # Classification joins any number of segments (a pair was predicted as one text), and a multiple-choice
        # example takes any number of contexts: the columns say how many.
        texts = (
            len(self.columns) - (self.transform.num_views if self.transform.takes_choices else 0) if self.columns else 0
        )
        if self.columns and len(segments) != texts:
            raise ValueError(
                f"{len(segments)} text segment(s), where the model was fine-tuned on {texts} text column(s) "
                f"({', '.join(self.columns[:texts])}): give each example {texts}"
            )
        for text in (*segments, *choices):
            if not isinstance(text, str):
                raise ValueError(f"expected text, got {type(text).__name__} {checks.shown(text, 80)}")
            if not text.strip():  # a task's reader counts and skips such rows (`Task.iter_examples`)
                raise EmptyTextError(f"a text is empty ({text!r}): leave the example out")
        encoded = [self.tokenizer.encode(text) for text in (*segments, *choices)]
        for text, ids in zip((*segments, *choices), encoded):
            if not len(ids):  # the view would be the special tokens alone; a run's split counts and skips it
                raise EmptyTextError(
                    f"the text {checks.shown(text, 40)} has no tokens (the tokenizer drops all its characters): leave the "
                    f"example out"
                )
        layout = transforms.Layout.from_tokenizer(self.tokenizer)
        return transforms.build_views(
            self.transform, encoded[: len(segments)], encoded[len(segments) :], layout, self.sequence_length
        )

    # --- a batch -------------------------------------------------------------

    def examples(self, x):
        """Normalises `x` (see the class docstring) to a list of `(segments, choices)` tuples."""
        from kgpt.tasks.task import Example

        if isinstance(x, str):
            x = [x]
        if isinstance(x, (list, np.ndarray)) or (hasattr(x, "numpy") and not isinstance(x, tuple)):
            items = list(x) if not hasattr(x, "numpy") or isinstance(x, np.ndarray) else inputs_kind.as_list(x, "x")
            if items and all(isinstance(i, Example) for i in items):
                return [(tuple(e.segments), tuple(e.choices)) for e in items]
            if items and all(isinstance(i, tuple) for i in items):  # one tuple per example
                return [self._split_choices(i) for i in items]
            if any(isinstance(i, list) for i in items):
                raise ValueError(
                    "A list of lists is ambiguous: pass segments as a tuple of columns, "
                    "(premises, hypotheses), or examples as a list of tuples, [(premise, hypothesis), ...]."
                )
            return [((text,), ()) for text in inputs_kind.as_list(items, "x")]
        if isinstance(x, tuple):
            columns = list(x)
            if any(isinstance(c, (str, bytes)) for c in columns):
                raise TypeError(
                    f"A tuple is read as columns of segments, (premises, hypotheses), each a list of "
                    f"texts; got a tuple holding a string ({checks.shown(next(c for c in columns if isinstance(c, (str, bytes))), 40)}). "
                    f"Pass texts as a list, or each example as a tuple inside a list."
                )
            choices = None
            if self.transform.takes_choices:
                if len(columns) < 2:
                    raise ValueError("Multiple choice inputs are (contexts, ..., choices): got one column.")
                choices = [tuple(inputs_kind.as_list(c, "choices")) for c in columns.pop()]
            columns = [inputs_kind.as_list(c, f"segment {i + 1}") for i, c in enumerate(columns)]
            sizes = {len(c) for c in columns} | ({len(choices)} if choices is not None else set())
            if len(sizes) > 1:
                raise ValueError(f"The input columns have different lengths: {sorted(sizes)}.")
            return [
                (tuple(c[i] for c in columns), choices[i] if choices is not None else ())
                for i in range(len(columns[0]))
            ]
        raise TypeError(
            f"Expected text inputs (a list of strings, a tuple of lists, or kgpt.Example objects), got {type(x).__name__}."
        )

    def _split_choices(self, item):
        if self.transform.takes_choices:
            if len(item) < 2 or isinstance(item[-1], str):
                raise ValueError(
                    f"A multiple-choice example is (context, ..., [choices]), got {checks.shown(item, 200)}."
                )
            return tuple(item[:-1]), tuple(item[-1])
        return tuple(item), ()

    def encode_batch(self, x, targets=None, name="inputs"):
        """Encodes a batch of raw inputs into a `kgpt.data.batching.EncodedSplit` (real tokens only).

        `targets` are the head's targets (one per example) or None. The
        split's `counts` say how many examples were truncated and by how
        many tokens. An example that does not fit the transformation raises
        `ValueError` naming its position.
        """
        builder = batching.SplitBuilder(name, self.transform.num_views, self.sequence_length)
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
        counts = {
            "read": len(examples),
            "used": len(examples),
            "skipped": 0,
            "skipped_reasons": {},
            "truncated": truncated,
            "tokens_cut": tokens_cut,
        }
        dtype = np.asarray(targets).dtype.name if targets is not None and len(targets) else "int32"
        return builder.build(counts, target_dtype=dtype)

    def __call__(self, x, y=None, sample_weight=None):
        # keras-hub's preprocessing layers read a lone 2- or 3-tuple as (x, y,
        # sample_weight); here a tuple is the segments of a batch, as
        # (premises, hypotheses). The work is Python, so Layer.__call__ has
        # nothing to build or trace.
        return self.call(x, y=y, sample_weight=sample_weight)

    def call(self, x, y=None, sample_weight=None):
        if _in_graph(x):
            return self._graph_call(x, y, sample_weight)
        split = self.encode_batch(x)
        inputs = split.inputs(np.arange(len(split)))
        if y is None:
            return inputs
        y = {"task": y, "lm": inputs["token_ids"][..., 1:]}
        task_weight = np.ones(len(split), "float32") if sample_weight is None else sample_weight
        sample_weight = {"task": task_weight, "lm": inputs["padding_mask"][..., 1:].astype("float32")}
        return keras.utils.pack_x_y_sample_weight(inputs, y, sample_weight)

    def _graph_call(self, x, y, sample_weight):
        """`call` inside `tf.data.Dataset.map` (or a `tf.function`): the Python encoding runs through
        `tf.py_function`, so each batch is padded to its longest view as in an eager call. A dataset of single
        examples (unbatched) gives `[views, length]` per example."""
        import tensorflow as tf

        flat = tf.nest.flatten(x)
        unbatched = flat[0].shape.rank == 0  # the first segment: one string per example
        if unbatched:
            flat = [tf.expand_dims(t, 0) for t in flat]

        def encode(*tensors):
            texts = tf.nest.pack_sequence_as(x, [t.numpy() for t in tensors])
            inputs = self.encode_batch(texts, name="dataset").inputs
            packed = inputs(np.arange(len(tensors[0])))
            return packed["token_ids"], packed["padding_mask"]

        token_ids, padding_mask = tf.py_function(encode, flat, (tf.int32, tf.int32))
        for tensor in (token_ids, padding_mask):
            tensor.set_shape((None, self.transform.num_views, None))
        if unbatched:
            token_ids, padding_mask = token_ids[0], padding_mask[0]
        inputs = {"token_ids": token_ids, "padding_mask": padding_mask}
        if y is None:
            return inputs
        targets = {"task": y, "lm": token_ids[..., 1:]}
        weights = {
            "task": tf.ones(tf.shape(y)[:1], "float32") if sample_weight is None else sample_weight,
            "lm": tf.cast(padding_mask[..., 1:], "float32"),
        }
        return keras.utils.pack_x_y_sample_weight(inputs, targets, weights)

    def save_to_preset(self, preset_dir):
        """Writes `preprocessor.json` and the tokenizer's files into the folder `preset_dir`."""
        super().save_to_preset(check_save_target(preset_dir))

    def get_config(self):
        config = super().get_config()
        config.update(
            {"transform": keras.saving.serialize_keras_object(self.transform), "sequence_length": self.sequence_length}
        )
        if self.columns is not None:  # absent otherwise: a preset reads as it did before columns were kept
            config["columns"] = list(self.columns)
        return config


def cut_to_context(max_length, context, origin="the model", name="max_length"):
    """`max_length` (tokens per view), or the model's `context` when it is past it, said in a warning naming
    `origin` and the length as `--max_length` on the command line, `name` in Python (None stays None: the caller's
    default)."""
    if max_length is not None and max_length > context:
        logger.warning(
            f"Warning: {checks.option('max_length', name)} {max_length} is longer than the model's context ({context} "
            f"tokens, {origin}): views are cut to {context} tokens."
        )
        return context
    return max_length


def segment_columns(inputs):
    """The columns, in order, of a task's `inputs()` (`{"text_columns": [...], "choice_columns": [...]}`, as a
    table task gives them and `metrics.json` records them); None when it names none."""
    if not isinstance(inputs, dict):
        return None
    columns = [*inputs.get("text_columns", []), *inputs.get("choice_columns", [])]
    return columns if columns and all(isinstance(c, str) for c in columns) else None


def encode_dataset(ds, encode, num_views, target_dtype, lm, targets):
    """A batched `tf.data.Dataset` of raw text, `(texts, labels)` or texts alone, -> `GPTTaskModel` batches.

    `encode(texts, labels, name)` is `GPTTaskModel.encode`: each batch is encoded in Python (`tf.py_function`)
    as text given to `fit` is (labels by name or index, truncation counted and warned of), padded to its
    longest view, with the auxiliary LM targets when `lm`. Labels are dropped when `targets` is False
    (predict). Inputs are keras-hub's layout: texts, or a tuple of segment columns, first in each element.
    """
    import tensorflow as tf

    spec = ds.element_spec
    x_spec, y_spec, w_spec = (
        keras.utils.unpack_x_y_sample_weight(spec) if isinstance(spec, tuple) else (spec, None, None)
    )
    if targets and y_spec is None:
        raise ValueError("Training or evaluating on a tf.data.Dataset of text needs labels: elements (texts, labels).")
    if targets and w_spec is not None:
        raise ValueError("A tf.data.Dataset of text takes (texts, labels): sample weights are not supported.")
    if tf.nest.flatten(x_spec)[0].shape.rank == 0:
        raise ValueError("The tf.data.Dataset of text is not batched: batch it first, e.g. ds.batch(32).")
    num_x = len(tf.nest.flatten(x_spec))
    target_type = tf.float32 if np.dtype(target_dtype).kind == "f" else tf.int32

    def encode_batch(index, *tensors):
        name = f"batch {int(index)} (from 0)"
        try:
            texts = tf.nest.pack_sequence_as(x_spec, [t.numpy() for t in tensors[:num_x]])
            labels = None
            if targets:
                labels = [v.decode("utf-8") if isinstance(v, bytes) else v for v in tensors[num_x].numpy().tolist()]
            split = encode(texts, labels, name=name)
        except UnicodeDecodeError as e:  # a label or text of bytes that are not UTF-8
            raise ValueError(f"{checks.DATASET_TEXT_ERROR}{name}: a text or label is not UTF-8 ({e.reason}).") from None
        except (ValueError, TypeError) as e:  # on one line: `checks.dataset_errors` finds it in TensorFlow's error
            raise type(e)(checks.DATASET_TEXT_ERROR + " ".join(str(e).split())) from None
        indices = np.arange(len(split))
        if not targets:
            inputs = split.inputs(indices)
            return inputs["token_ids"], inputs["padding_mask"]
        x, y, weights = split.batch(indices, lm=False)
        return x["token_ids"], x["padding_mask"], y["task"].astype(target_type.as_numpy_dtype), weights["task"]

    def split_element(element):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(element) if isinstance(element, tuple) else (element, None, None)
        return tf.nest.flatten(x) + ([y] if targets else [])

    def to_model(index, element):
        types = (tf.int32, tf.int32) + ((target_type, tf.float32) if targets else ())
        outputs = tf.py_function(encode_batch, [index, *split_element(element)], types)
        for tensor in outputs[:2]:
            tensor.set_shape((None, num_views, None))
        inputs = {"token_ids": outputs[0], "padding_mask": outputs[1]}
        if not targets:
            return inputs
        for tensor in outputs[2:]:
            tensor.set_shape((None,))
        y, weights = {"task": outputs[2]}, {"task": outputs[3]}
        if lm:
            y["lm"] = inputs["token_ids"][..., 1:]
            weights["lm"] = tf.cast(inputs["padding_mask"][..., 1:], "float32")
        return inputs, y, weights

    # The first batch is encoded here, eagerly: a mistake in the data (a segment missing, an unknown label)
    # is then a ValueError naming the example, not an error from inside the tf.data pipeline.
    for element in ds.take(1):
        encode_batch(0, *split_element(element))
    return ds.enumerate().map(to_model)
