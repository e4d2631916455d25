"""A keras-hub `Tokenizer` layer around a tokenizer whose `encode` / `decode` are Python.

`tokenize()` / `detokenize()` take every form keras-hub's tokenizers take
(a string, a list, a NumPy array, a backend tensor, a `tf.RaggedTensor`);
inside a `tf.data` pipeline or a `tf.function` the exact Python algorithm runs
through `tf.py_function` (ftfy, spaCy's rules and GPT-1's BPE have no faithful
TensorFlow ops), giving a dense int32 vector for a scalar string and a
`tf.RaggedTensor` for a batch, which keras-hub's packers take.
"""

import itertools

import keras
import numpy as np
from keras_hub.tokenizers import Tokenizer

from kgpt.data import inputs_kind

try:  # the tf.data path; keras-hub's own preprocessing needs TensorFlow there too
    import tensorflow as tf
except ImportError:
    tf = None


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
