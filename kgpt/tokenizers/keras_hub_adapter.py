"""Any keras-hub tokenizer (`BytePairTokenizer`, `SentencePieceTokenizer`, `WordPieceTokenizer`, a model's) as a
kgpt tokenizer.

`KerasHubTokenizer(inner)` gives the inner tokenizer's ids for text, and
finds or adds the paper's three task tokens: `_start_`, `_delimiter_` and
`_classify_` take their ids in the inner vocabulary when it holds them, else
the next free ids after it, in that order (as GPT-1's tokenizer appends them).
`kgpt-train --tokenizer DIR` takes a folder that keras-hub's
`tokenizer.save_to_preset(DIR)` wrote (`tokenizer.json` + `assets/tokenizer/`);
the preset kgpt writes after pre-training holds this wrapper (registered as
"kgpt>KerasHubTokenizer") and the inner tokenizer's files, so fine-tuning and
prediction read it back.

The shard builder encodes a file chunk by chunk (whole lines, about 256 KiB
each) and puts the chunks' ids one after the other; that is the ids of the
whole file for tokenizers whose tokens never span a line end, as with
keras-hub's byte-pair (GPT-2 style), WordPiece and SentencePiece tokenizers
on ordinary text. keras-hub's tokenizers run TensorFlow ops, so they encode
in the building process itself, not in worker processes.
"""

import hashlib
import json
import os
import tempfile

import keras
import numpy as np
from keras_hub.tokenizers import Tokenizer

from kgpt.checks import shown
from kgpt.errors import CheckpointError
from kgpt.io.presets import deserialize, read_json
from kgpt.tokenizers.interface import PRESET_ASSETS, PRESET_CONFIG, SPECIAL_TOKENS, Chunk, shared_id
from kgpt.tokenizers.python_layer import PythonTokenizer

_NAMES = ("start_token", "delimiter_token", "extract_token")


@keras.saving.register_keras_serializable(package="kgpt")
class KerasHubTokenizer(PythonTokenizer):
    """A keras-hub tokenizer with kgpt's interface (`kgpt.tokenizers.interface`) and the three task tokens.

    Args:
        tokenizer: a keras-hub `Tokenizer` (with or without its vocabulary
            yet; `load_assets` gives it one), or its serialized config.

    Example:
    ```python
    inner = keras_hub.tokenizers.BytePairTokenizer(vocabulary=vocab, merges=merges)
    tokenizer = KerasHubTokenizer(inner)
    tokenizer.encode("a b")  # the inner tokenizer's ids
    tokenizer.start_id  # inner.vocabulary_size() unless the vocabulary holds "_start_"
    tokenizer.save_to_preset("bpe")  # kgpt.tokenizers.loading.load_tokenizer("bpe") reads it back
    ```
    """

    def __init__(self, tokenizer, **kwargs):
        if isinstance(tokenizer, dict):
            tokenizer = keras.layers.deserialize(tokenizer)
        if not isinstance(tokenizer, Tokenizer) or isinstance(tokenizer, PythonTokenizer):
            raise TypeError(f"KerasHubTokenizer wraps a keras-hub tokenizer, got {shown(tokenizer, 100)}.")
        super().__init__(**{**kwargs, "dtype": "int32"})
        # Not tracked as a sublayer: a preprocessor's load_preset_assets would load its files a second time.
        object.__setattr__(self, "inner", tokenizer)
        self.file_assets = tokenizer.file_assets
        self.end_token_id = None  # the GPT language model has no end-of-text token
        self.pad_token_id = 0  # under the padding mask
        self._added = None
        if _has_vocabulary(tokenizer):
            self._find_added_tokens()
        for token, name in zip(SPECIAL_TOKENS, _NAMES):
            self._add_special_token(token, name)

    def _find_added_tokens(self):
        size = self.inner.vocabulary_size()
        ids, next_id = {}, size
        for token in SPECIAL_TOKENS:
            try:
                ids[token] = int(self.inner.token_to_id(token))
            except (KeyError, ValueError, TypeError):
                ids[token], next_id = next_id, next_id + 1
            else:
                if not 0 <= ids[token] < size or self.inner.id_to_token(ids[token]) != token:
                    ids[token], next_id = next_id, next_id + 1  # an out-of-vocabulary id, not the token
        self._added, self._size, self._inner_size = ids, next_id, size
        self._appended = {i: t for t, i in ids.items() if i >= size}
        self._fingerprint = None

    def _check_vocabulary(self):
        if self._added is None:
            raise ValueError(
                f"This KerasHubTokenizer's {type(self.inner).__name__} has no vocabulary yet: give it "
                f"one, or call load_assets(directory) on its files."
            )

    # --- the interface ---------------------------------------------------------

    def vocabulary_size(self):
        """The inner tokenizer's ids and the task tokens appended after them."""
        self._check_vocabulary()
        return self._size

    def get_vocabulary(self):
        self._check_vocabulary()
        return [self.inner.id_to_token(i) for i in range(self._inner_size)] + list(self._appended.values())

    def id_to_token(self, id):
        self._check_vocabulary()
        id = int(id)
        if id in self._appended:
            return self._appended[id]
        if not 0 <= id < self._inner_size:
            raise ValueError(f"Token id {id} is outside the vocabulary (size {self._size}).")
        return self.inner.id_to_token(id)

    def token_to_id(self, token):
        self._check_vocabulary()
        if token in self._added:
            return self._added[token]
        return self.inner.token_to_id(token)

    def tokenize(self, inputs):
        """The inner tokenizer's ids (its own `tf.data` ops run in graphs)."""
        self._check_vocabulary()
        return self.inner.tokenize(inputs)

    def encode(self, text):
        """Token ids of `text` (a list of ints; no task token added)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}.")
        self._check_vocabulary()
        return np.asarray(self.inner.tokenize(text)).reshape(-1).tolist()

    def decode(self, ids):
        """Text of `ids`: the inner tokenizer's text, a task token as its name, parts joined by a space."""
        self._check_vocabulary()
        array = np.asarray(ids)
        if array.ndim != 1 or array.size and array.dtype.kind not in "iu":
            raise TypeError(f"decode() takes one flat sequence of integer token ids, got {shown(ids, 80)}.")
        parts, run = [], []
        for i in array.tolist():
            if i in self._appended:
                parts += [self._inner_text(run), self._appended[i]] if run else [self._appended[i]]
                run = []
            elif 0 <= i < self._inner_size:
                run.append(i)
            else:
                raise ValueError(f"Token id {i} is outside the vocabulary (size {self._size}).")
        if run:
            parts.append(self._inner_text(run))
        return " ".join(part for part in parts if part)

    def _inner_text(self, ids):
        text = self.inner.detokenize(np.asarray(ids, "int32"))
        text = text.numpy() if hasattr(text, "numpy") else text
        text = text.item() if isinstance(text, np.ndarray) else text
        return text.decode("utf-8") if isinstance(text, bytes) else str(text)

    def fingerprint(self):
        """A hash of the inner tokenizer's class, config and files, and the task tokens' ids."""
        self._check_vocabulary()
        if self._fingerprint is None:
            digest = hashlib.sha256()
            config = {k: v for k, v in self.inner.get_config().items() if k not in ("name", "trainable", "dtype")}
            digest.update(f"{type(self.inner).__module__}.{type(self.inner).__qualname__}".encode())
            digest.update(json.dumps(config, sort_keys=True, default=str).encode())
            digest.update(json.dumps(sorted(self._added.items())).encode())
            with tempfile.TemporaryDirectory() as folder:
                self.inner.save_assets(folder)
                for name in sorted(os.listdir(folder)):
                    with open(os.path.join(folder, name), "rb") as f:
                        digest.update(name.encode() + b"\0" + f.read())
            self._fingerprint = digest.hexdigest()[:16]
        return self._fingerprint

    def corpus_encoder(self):
        """What the shard builder encodes a corpus with: whole chunks through the inner tokenizer."""
        self._check_vocabulary()
        return _ChunkEncoder(self)

    # --- files -----------------------------------------------------------------

    def save_assets(self, dir_path):
        self.inner.save_assets(dir_path)

    def load_assets(self, dir_path):
        check_vocabulary_files(dir_path, self.file_assets)
        self.inner.load_assets(dir_path)
        self._find_added_tokens()
        self._update_special_token_ids()

    def get_config(self):
        config = super().get_config()
        config["tokenizer"] = keras.layers.serialize(self.inner)
        return config

    @classmethod
    def from_preset(cls, preset, config_file=PRESET_CONFIG, **kwargs):
        """The tokenizer of a local keras-hub preset folder: one `save_to_preset` wrote, this wrapper's or any
        keras-hub tokenizer's (then wrapped). Nothing is downloaded."""
        preset = os.fspath(preset)
        path = os.path.join(preset, config_file)
        config = read_json(path, "a keras-hub tokenizer config (tokenizer.save_to_preset(dir) writes it)")
        if not isinstance(config, dict) or not isinstance(config.get("config"), dict):
            raise CheckpointError(f"{path}: expected a keras-hub tokenizer config, got {shown(config, 200)}.")
        config["config"].update(kwargs)
        tokenizer = deserialize(config, path, "a keras-hub tokenizer")
        if (
            not isinstance(tokenizer, Tokenizer)
            or isinstance(tokenizer, PythonTokenizer)
            and not isinstance(tokenizer, cls)
        ):
            raise CheckpointError(f"{path}: expected a keras-hub tokenizer, got {type(tokenizer).__name__}.")
        check_vocabulary_files(os.path.join(preset, PRESET_ASSETS), tokenizer.file_assets or ())
        try:
            tokenizer.load_preset_assets(preset)
        except CheckpointError:
            raise
        except Exception as e:  # keras-hub's readers' many kinds, TensorFlow's and tf-text's among them
            raise CheckpointError(
                f"{preset}: cannot read the files of its {type(tokenizer).__name__} "
                f"({type(e).__name__}: {str(e)[:300]})."
            ) from e
        if isinstance(tokenizer, cls):
            return tokenizer
        if not _has_vocabulary(tokenizer):
            raise CheckpointError(
                f"{preset}: its {type(tokenizer).__name__} has no vocabulary after reading its files."
            )
        return cls(tokenizer)


def check_vocabulary_files(directory, names):
    """Refuses, by file, a vocabulary giving two tokens one id or one token two ids: keras-hub's lookup tables
    fail on either deep in TensorFlow, naming neither file nor token."""
    for name in names:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue  # keras-hub's loader says so
        if name.endswith(".json"):  # a byte-pair vocabulary, {token: id}
            try:
                with open(path, encoding="utf-8") as f:
                    pairs = json.load(f, object_pairs_hook=lambda pairs: pairs)
            except (ValueError, OSError):
                continue  # not a vocabulary this check can read: keras-hub's loader reports it
            if not isinstance(pairs, list) or not all(isinstance(p, tuple) and isinstance(p[1], int) for p in pairs):
                continue
            shared = shared_id(pairs)
            if shared is not None:
                raise CheckpointError(
                    f"{path}: id {shared[0]} is given to two tokens, {shared[1]!r} and "
                    f"{shared[2]!r}; each token needs an id of its own."
                )
            twice = shared_id((i, token) for token, i in pairs)
            if twice is not None:
                raise CheckpointError(f"{path}: the token {twice[0]!r} is given two ids, {twice[1]} and {twice[2]}.")
        elif name.endswith(".txt") and "vocab" in name:  # WordPiece's: a token a line, its id the line's index
            first = {}
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, start=1):
                    token = line.rstrip("\r\n")
                    if token in first:
                        raise CheckpointError(
                            f"{path}:{n}: the token {token!r} again (line {first[token]} has it "
                            f"too): its id would be two lines' ids."
                        )
                    first[token] = n


def _has_vocabulary(tokenizer):
    try:
        return tokenizer.vocabulary_size() > 0
    except (ValueError, AttributeError, TypeError, RuntimeError):
        return False


class _ChunkEncoder:
    """The corpus encoder of a `KerasHubTokenizer` (`kgpt.tokenizers.interface.CorpusEncoder`)."""

    newline_id = None  # a file's ids are its chunks' ids one after the other
    processes = False  # TensorFlow ops: encoded in the building process
    cut_label = "words cut"  # nothing is cut here (long lines are, by the reader, and counted there)

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocabulary_size = tokenizer.vocabulary_size()

    @staticmethod
    def follows(state, text):
        return None

    def encode_chunk(self, text, state=None):
        return Chunk(self.tokenizer.encode(text), False, False, "\n" in text, 0)

    def record(self):
        return None

    def learn(self, journal):
        pass
