"""A keras-hub `Tokenizer` layer around a tokenizer whose `encode` / `decode` are Python.

`tokenize()` / `detokenize()` take every form keras-hub's tokenizers take
(a string, a list, a NumPy array, a backend tensor, a `tf.RaggedTensor`);
inside a `tf.data` pipeline or a `tf.function` the exact Python algorithm runs
through `tf.py_function` (ftfy, spaCy's rules and GPT-1's BPE have no faithful
TensorFlow ops), giving a dense int32 vector for a scalar string and a
`tf.RaggedTensor` for a batch, which keras-hub's packers take.
"""

import contextlib
import itertools
import json
import logging
import os
import shutil
import tempfile

import keras
import numpy as np
from keras_hub.tokenizers import Tokenizer

from kgpt.data import inputs_kind
from kgpt.io import storage
from kgpt.io.presets import CONFIG_FILE, PARTIAL_DIR, check_save_target, refuse_foreign_files
from kgpt.tokenizers.interface import PRESET_ASSETS, PRESET_CONFIG, fits_vocabulary

logger = logging.getLogger(__name__)

try:  # the tf.data path; keras-hub's own preprocessing needs TensorFlow there too
    import tensorflow as tf
except ImportError:
    tf = None


@contextlib.contextmanager
def _named_as_in(staging, path):
    """Within it, an `OSError` naming a file in the hidden folder `staging` names it where it was going, in `path`."""
    try:
        yield
    except OSError as e:
        named = os.fspath(e.filename) if e.filename else str(e).split(": ", 1)[0]
        if not named.startswith(staging + os.sep):
            raise
        target = os.path.join(path, os.path.relpath(named, staging))
        raise storage.os_error(f"{target}: {storage.reason(e)}", e.errno) from e


class PythonTokenizer(Tokenizer):
    """Base class: subclasses give `encode(text) -> ids`, `decode(ids) -> str`, `_check_vocabulary()` and the
    `start_token_id`, `delimiter_token_id` and `extract_token_id` of the paper's added tokens."""

    def _check_vocabulary(self):
        """Raises when the tokenizer has no vocabulary yet (subclasses say how to give it one)."""

    # The paper's added tokens under the interface's names (subclasses set the keras-hub `*_token_id`s).

    @property
    def start_id(self):
        return self.start_token_id

    @property
    def delimiter_id(self):
        return self.delimiter_token_id

    @property
    def extract_id(self):
        return self.extract_token_id

    def save_to_preset(self, preset_dir):
        """Writes `tokenizer.json` and the tokenizer's files (`assets/tokenizer/`) into the folder `preset_dir`.

        Beside a model saved there (its `config.json`), a tokenizer that does not fit it (the model's
        `vocabulary_size` is neither this tokenizer's nor, before fine-tuning adds them, that less the paper's
        added tokens) is refused with nothing written, and another tokenizer than the one there replaces it with a
        warning. The same tokenizer saved again, or into a folder without a model, is written without a word.
        """
        path = check_save_target(preset_dir)
        refuse_foreign_files(path, [PRESET_CONFIG])
        old, model = _saved_tokenizer(path), _model_vocabulary_size(path)
        same = False
        if old is not None and model is not None:  # compared only where a model loads with it
            with tempfile.TemporaryDirectory() as folder:
                super().save_to_preset(folder)
                same = _saved_tokenizer(folder) == old
        if model is not None and not same:
            size = self.vocabulary_size()
            if not fits_vocabulary(model, size):
                raise ValueError(
                    f"{path} holds a model of vocabulary_size={model} ({CONFIG_FILE}), which this tokenizer of "
                    f"{size} ids does not fit: nothing was written. Save the tokenizer to another folder."
                )
        self._save_whole(path)
        if model is not None and old is not None and not same:
            logger.warning(
                f"Warning: {path} held another tokenizer: it is replaced by this one, which the model saved there "
                f"now loads with."
            )

    def _save_whole(self, path):
        """keras-hub's save, into a hidden folder of `path` first, then moved in (`tokenizer.json` last): a save
        that fails (a full disk) leaves `path` as it was, never a file cut short that a rerun would read."""
        if os.path.basename(os.path.normpath(path)) == PARTIAL_DIR:  # inside a model's save, moved in whole
            super().save_to_preset(path)
            return
        staging = os.path.join(path, PARTIAL_DIR + "-tokenizer")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            with storage.naming(path), _named_as_in(staging, path):
                super().save_to_preset(staging)
                written = [os.path.relpath(os.path.join(d, n), staging) for d, _, ns in os.walk(staging) for n in ns]
                for name in sorted(written, key=lambda n: n == PRESET_CONFIG):
                    os.makedirs(os.path.dirname(os.path.join(path, name)), exist_ok=True)
                    os.replace(os.path.join(staging, name), os.path.join(path, name))
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def call(self, inputs, *args, training=None, **kwargs):
        return self.tokenize(inputs, *args, **kwargs)

    def tokenize(self, inputs):
        """Token ids of a string (int32 array) or of a batch of strings (id lists).

        Args:
            inputs: a `str`; a list/tuple of `str`; or a string tensor or
                array of rank 0 or 1.

        Returns:
            In Python: an int32 NumPy array for one string, a list of lists
            of ints for a batch. Traced by `tf.data`/`tf.function`: an int32
            vector for a scalar string, a `tf.RaggedTensor` `[batch, None]`
            for a rank-1 string tensor.
        """
        self._check_vocabulary()
        if self._use_tf_workflow():
            return self._tokenize_tf(inputs)
        texts, batched = inputs_kind.texts(inputs, "tokenize()")
        ids = [self.encode(text) for text in texts]
        return ids if batched else np.asarray(ids[0], dtype="int32")

    def _tokenize_tf(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype != tf.string:
            raise TypeError(f"tokenize() takes string tensors, got {inputs.dtype.name}.")
        if inputs.shape.rank == 0:
            ids = tf.py_function(self._encode_scalar, [inputs], Tout=tf.int32)
            ids.set_shape([None])
            return ids
        if inputs.shape.rank == 1:
            values, lengths = tf.py_function(self._encode_flat, [inputs], Tout=[tf.int32, tf.int64])
            values.set_shape([None])
            lengths.set_shape(inputs.shape)
            return tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)
        raise ValueError(f"tokenize() takes a string or a rank-1 batch of strings, got shape {inputs.shape}.")

    def _encode_scalar(self, text):  # runs eagerly inside tf.py_function
        return np.asarray(self.encode(text.numpy().decode("utf-8")), dtype=np.int32)

    def _encode_flat(self, texts):  # runs eagerly inside tf.py_function
        rows = [self.encode(t.decode("utf-8")) for t in texts.numpy()]
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        values = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=int(lengths.sum()))
        return values, lengths

    def detokenize(self, inputs):
        """Text from ids: one sequence -> a `str`, a batch -> a list of `str`.

        Args:
            inputs: ids as an int, a list of ints, a list of lists, a NumPy
                array or backend tensor of rank 0-2, or a `tf.RaggedTensor`.
                Traced by `tf.data`/`tf.function` it returns a string tensor
                (scalar for a rank-1 input).
        """
        self._check_vocabulary()
        if self._use_tf_workflow():
            return self._detokenize_tf(inputs)
        rows, batched = _id_rows(inputs)
        texts = [self.decode(row) for row in rows]
        return texts if batched else texts[0]

    def _detokenize_tf(self, inputs):
        unbatched = False
        if not isinstance(inputs, tf.RaggedTensor):
            inputs = tf.convert_to_tensor(inputs)
            if inputs.shape.rank == 1:
                inputs, unbatched = inputs[tf.newaxis], True
            if inputs.shape.rank != 2:
                raise ValueError(f"detokenize() takes ids of rank 1 or 2, got shape {inputs.shape}.")
            inputs = tf.RaggedTensor.from_tensor(inputs)
        if inputs.shape.rank != 2:
            raise ValueError(f"detokenize() takes a ragged batch of rank 2, got shape {inputs.shape}.")
        lengths = inputs.row_lengths()
        texts = tf.py_function(self._decode_flat, [tf.cast(inputs.flat_values, tf.int32), lengths], Tout=tf.string)
        texts.set_shape(lengths.shape)
        return texts[0] if unbatched else texts

    def _decode_flat(self, values, lengths):  # runs eagerly inside tf.py_function
        values, ends = values.numpy(), np.cumsum(lengths.numpy())
        starts = ends - lengths.numpy()
        texts = [self.decode(values[s:e]).encode("utf-8") for s, e in zip(starts, ends)]
        return np.array(texts, dtype=object) if texts else np.zeros((0,), dtype="S1")


def _saved_tokenizer(folder):
    """What a tokenizer saved in `folder` is, to compare two: its `tokenizer.json` without Keras' layer names (a
    second instance saves `gpt_tokenizer_1`) and the bytes of its files; None where the folder holds none."""
    try:
        with open(os.path.join(folder, PRESET_CONFIG), "rb") as f:
            config = _without_names(json.loads(f.read()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # unreadable: another tokenizer than any that saves one
        config = None
    assets, files = os.path.join(folder, PRESET_ASSETS), {}
    for name in sorted(os.listdir(assets)) if os.path.isdir(assets) else ():
        with open(os.path.join(assets, name), "rb") as f:
            files[name] = f.read()
    return config, files


def _without_names(config):
    """`config` (parsed JSON) without its "name" entries."""
    if isinstance(config, dict):
        return {k: _without_names(v) for k, v in config.items() if k != "name"}
    return [_without_names(v) for v in config] if isinstance(config, list) else config


def _model_vocabulary_size(folder):
    """The `vocabulary_size` of the model saved in `folder` (its `config.json`), None where it gives none."""
    try:
        with open(os.path.join(folder, CONFIG_FILE), encoding="utf-8") as f:
            size = json.load(f)["config"]["vocabulary_size"]
    except (OSError, ValueError, KeyError, TypeError):  # no model there, or one its loader names as damaged
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _id_rows(inputs):
    """`(list of id sequences, batched)` from the Python-side inputs `detokenize()` takes."""
    if tf is not None and isinstance(inputs, tf.RaggedTensor):
        return inputs.to_list(), True
    if isinstance(inputs, (list, tuple)):
        if inputs and np.ndim(inputs[0]) > 0:
            return [np.asarray(row).reshape(-1).tolist() for row in inputs], True
        return [list(inputs)], False
    if tf is not None and isinstance(inputs, tf.Tensor):
        array = inputs.numpy()
    elif keras.ops.is_tensor(inputs):
        array = keras.ops.convert_to_numpy(inputs)
    else:
        array = np.asarray(inputs)
    if array.dtype.kind not in "iu":
        raise TypeError(f"detokenize() takes integer token ids, got {array.dtype}.")
    if array.ndim <= 1:
        return [array.reshape(-1).tolist()], False
    if array.ndim == 2:
        return array.tolist(), True
    raise ValueError(f"detokenize() takes ids of rank 0 to 2, got shape {array.shape}.")
