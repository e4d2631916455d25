"""The GPT-1 byte-pair-encoding tokenizer (the original release's algorithm).

Pipeline, as in the original `text_utils.py`: optional `ftfy.fix_text`;
standardise dashes and ellipses; space out runs of punctuation; newlines
become a ` \\n ` token; split into words; lower-case; BPE over characters with
`</w>` on the last one, lowest-rank merge first; unknown symbols -> id 0.
Three special tokens follow the vocabulary: `_start_`, `_delimiter_`,
`_classify_` (ids 40478-40480 with the original files).

Two word splitters: `splitter="regex"` (default, no extra dependency), a
regular expression that follows spaCy's English rules for the common cases
(punctuation, `n't` and `'s`-style clitics) but not its exception list (e.g.
"U.S."), with `ftfy` used only when installed; and `splitter="spacy"`, the
original's exact path (`ftfy.fix_text` + spaCy's English tokenizer, which
needs no downloaded model), installed with `pip install "kgpt[exact]"`.
`python -m kgpt.bench_tokenizer` measures how often the two agree.

`GPTTokenizer` is a keras-hub `Tokenizer` layer: callable on strings, mapped
over `tf.data` (through `tf.py_function`), saved in presets and found by
`keras_hub.tokenizers.Tokenizer.from_preset`.
"""

import hashlib
import importlib
import itertools
import json
import os
import re
import unicodedata
from importlib import resources

import keras
import numpy as np
from keras_hub.tokenizers import Tokenizer

from kgpt.backbone import GPTBackbone
from kgpt.presets import CheckpointError, read_json

try:  # the tf.data path; keras-hub's own preprocessing needs TensorFlow there too
    import tensorflow as tf
except ImportError:
    tf = None

SPECIAL_TOKENS = ("_start_", "_delimiter_", "_classify_")
ENCODER_FILE = "encoder_bpe_40000.json"
MERGES_FILE = "vocab_40000.bpe"
PRESET_CONFIG = "tokenizer.json"  # keras-hub's preset layout
PRESET_ASSETS = os.path.join("assets", "tokenizer")

_PUNCT_RUNS = re.compile(r"""(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\\+|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)""")
# Alternatives in order, after spaCy's English rules: newline; "can|not"; the
# "do|n't" and "it|'s" clitics; dotted abbreviations and names ("u.s.",
# "e.g.", "x.format") and initials ("j."); numbers; words; runs of "." "-"
# "~" "/" "|", which spaCy keeps whole; any other symbol alone ("_" too).
_WORDS = re.compile(
    r"\n|\bcan(?=not\b)|(?<=can)not\b|[^\W\d_]+(?=n't\b)|n't\b|'(?:s|m|d|ll|re|ve)\b"
    r"|[^\W\d_]+(?:\.[^\W\d_]+)+\.?|\b[^\W\d_]\.(?=\s|$)"
    r"|\d+(?:[.,:]\d+)*|[^\W_]+|\.\.+|-+|~+|/+|\|+|[^\w\s]|_",
    re.IGNORECASE,
)


def standardize(text):
    """The original's punctuation and whitespace standardisation."""
    text = text.replace("\u2014", "-").replace("\u2013", "-").replace("\u2015", "-")
    text = text.replace("\u2026", "...").replace("\u00b4", "'")
    text = _PUNCT_RUNS.sub(r" \1 ", text)
    text = re.sub(r"\s*\n\s*", " \n ", text)
    text = re.sub(r"[^\S\n]+", " ", text)
    return text.strip()


try:  # optional, as in the original; resolved once, not per text
    import ftfy as _ftfy
except ImportError:
    _ftfy = None


def _fix_text(text):
    if _ftfy is None:
        return unicodedata.normalize("NFC", text)
    return _ftfy.fix_text(text)


_SPACY = []


def _spacy_english():
    """spaCy's English tokenizer (rules only, no model download), built once."""
    if not _SPACY:
        try:
            importlib.import_module("ftfy")  # the exact path needs both
            spacy = importlib.import_module("spacy")
        except ImportError as e:
            raise ImportError(
                f"splitter='spacy' needs spaCy and ftfy ({e.name} is missing): pip install \"kgpt[exact]\""
            ) from e
        _SPACY.append(spacy.blank("en"))
    return _SPACY[0]


def _pairs(word):
    return set(zip(word, word[1:]))


@keras.saving.register_keras_serializable(package="kgpt")
class GPTTokenizer(Tokenizer):
    """Text <-> token ids with the GPT-1 BPE vocabulary, as a keras-hub `Tokenizer`.

    Calling the layer (or `tokenize()`) on a string gives an int32 NumPy
    array of ids; on a list of strings or a rank-1 string tensor, a list of
    id lists. Inside a `tf.data` pipeline or a `tf.function` the exact Python
    algorithm runs through `tf.py_function` (ftfy, spaCy's rules and the
    original BPE have no faithful TensorFlow ops), giving a dense int32
    vector for a scalar string and a `tf.RaggedTensor` for a batch, which
    keras-hub's packers take. `detokenize()` is the inverse: ids in any
    form -> a string or a list of strings (see `decode()` for the spacing).

    `encode()`/`decode()` are the plain-Python API on single texts.
    `special_tokens` are the paper's three added tokens (`_start_`,
    `_delimiter_`, `_classify_`; `start_token_id`, `delimiter_token_id`,
    `extract_token_id`, also as `start_id`, `delimiter_id`, `extract_id`).
    GPT-1's language model has no beginning- or end-of-text token, so
    `end_token_id` is None (generation runs to `max_length`) and padding uses
    id 0 (`pad_token_id`, `<unk>`), which the padding mask hides.

    Args:
        encoder: dict of BPE symbol -> id, ids `0..n-1` (`<unk>` is 0 in the
            original files); None for an empty tokenizer that
            `load_assets(directory)` fills (how presets are loaded).
        merges: list of `(left, right)` symbol pairs in rank order (None
            with `encoder=None`).
        splitter: `"regex"` (default) or `"spacy"` (the original's exact
            word splitting; `pip install "kgpt[exact]"`).

    Example:
    ```python
    tokenizer = kgpt.GPTTokenizer.gpt1()  # the original files, shipped
    ids = tokenizer.encode("Hello world!")
    tokenizer.decode(ids)  # 'hello world !'
    tokenizer.vocabulary_size()  # 40481 (40478 + start, delimiter, extract)

    tokenizer("Hello world!")  # array([3570, 1276, 267], dtype=int32)
    tokenizer(["Hello world!", "Hi"])  # [[3570, 1276, 267], [3569]]
    tokenizer.detokenize([[3570, 1276]])  # ['hello world']

    ds = tf.data.Dataset.from_tensor_slices(["Hello world!", "Hi"])
    ds = ds.batch(2).map(tokenizer)  # tf.RaggedTensor batches

    tokenizer.save_to_preset("my_preset")  # tokenizer.json + assets/tokenizer/
    kgpt.GPTTokenizer.from_preset("my_preset")
    ```
    """

    backbone_cls = GPTBackbone

    def __init__(self, encoder=None, merges=None, splitter="regex", **kwargs):
        if splitter not in ("regex", "spacy"):
            raise ValueError(f"splitter must be 'regex' or 'spacy', got {splitter!r}.")
        if splitter == "spacy":
            _spacy_english()  # fail now, with the install hint, not at the first encode()
        if (encoder is None) != (merges is None):
            raise ValueError("Give both encoder and merges, or neither (then load them with load_assets()).")
        # Ids are always int32, whatever dtype a saved config names.
        super().__init__(**{**kwargs, "dtype": "int32"})
        self.splitter = splitter
        self.file_assets = [ENCODER_FILE, MERGES_FILE]
        # GPT-1 has no end-of-text token; 0 (<unk>) pads, under a padding mask.
        self.end_token_id = None
        self.pad_token_id = 0
        self._set_vocabulary(encoder, merges)
        for token, name in zip(SPECIAL_TOKENS, ("start_token", "delimiter_token", "extract_token")):
            self._add_special_token(token, name)

    def _set_vocabulary(self, encoder, merges):
        state = dict(encoder=None, merges=None, bpe_ranks=None, decoder=None, _cache={})
        if encoder is not None:
            encoder = dict(encoder)
            base = len(encoder)
            for offset, token in enumerate(SPECIAL_TOKENS):
                encoder.setdefault(token, base + offset)
            merges = [tuple(m) for m in merges]
            state.update(
                encoder=encoder,
                merges=merges,
                bpe_ranks={pair: rank for rank, pair in enumerate(merges)},
                decoder={i: s for s, i in encoder.items()},
            )
        # Plain attributes: Keras' attribute tracking would copy these large
        # containers into tracked wrappers (and the BPE cache's lists on every
        # insert), which costs time and has nothing to track.
        for name, value in state.items():
            object.__setattr__(self, name, value)

    def _check_vocabulary(self):
        if self.encoder is None:
            raise ValueError(
                "This GPTTokenizer has no vocabulary yet: build it with GPTTokenizer.gpt1(), from_original(), "
                "from_preset() or train(), or call load_assets(directory) on a folder of the two BPE files."
            )

    # --- files ---------------------------------------------------------------

    @classmethod
    def from_original(cls, encoder_json, bpe_merges=None, splitter="regex"):
        """Reads the original release's `encoder_bpe_40000.json` + `vocab_40000.bpe`.

        Give the two paths, or one directory holding them (or Hugging Face's
        `vocab.json` + `merges.txt` for `openai-gpt`, the same vocabulary).

        Example: `kgpt.GPTTokenizer.from_original("finetune-transformer-lm/model")`
        """
        if bpe_merges is None:
            encoder_json, bpe_merges = _find_files(encoder_json)
        encoder = _read_encoder(encoder_json)
        merges = _read_merges(bpe_merges, encoder)
        return cls(encoder, merges, splitter=splitter)

    @classmethod
    def gpt1(cls, splitter="regex"):
        """The original GPT-1 vocabulary (MIT licence), shipped with kgpt.

        `splitter="spacy"` reproduces the original tokenization exactly (needs `kgpt[exact]`).
        """
        assets = resources.files("kgpt") / "assets" / "gpt1_bpe"
        return cls.from_original(str(assets / ENCODER_FILE), str(assets / MERGES_FILE), splitter=splitter)

    @classmethod
    def train(cls, files, num_merges=40000, min_frequency=2, directory=None, log=print):
        """Learns a new BPE vocabulary from text files, in the original's layout.

        Text goes through the same normalisation and word splitting as
        `encode()`; the merges are learned by the Hugging Face `tokenizers`
        BPE trainer (Rust; installed with keras-hub) with the original's `</w>`
        end-of-word marker. The vocabulary is laid out as the original:
        `<unk>` = 0, the characters, the characters + `</w>`, one symbol per
        merge in rank order, then `\\n</w>`. With `directory`, the two files
        are written there in the original formats, so `from_original()`,
        `load()` and the original code read them.

        Args:
            files: paths of UTF-8 text files.
            num_merges: merges to learn (the original: 40,000). Fewer are
                kept when no pair is seen `min_frequency` times any more;
                the count is logged.
            min_frequency: smallest pair count that is merged.
            directory: optional folder to `save()` into.

        Example:
        ```python
        tokenizer = kgpt.GPTTokenizer.train(["books.txt"], num_merges=8000, directory="my_bpe")
        ```
        """
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        from kgpt.shards import text_chunks  # streaming, line-aligned, UTF-8 checked

        def texts():
            for path in files:
                for chunk in text_chunks(path):
                    words = _WORDS.findall(standardize(_fix_text(chunk)))
                    yield " ".join(w.lower() for w in words if w != "\n")

        engine = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"))
        engine.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.BpeTrainer(
            # Room for every merge on top of any alphabet; the merge list is cut below.
            vocab_size=num_merges + (1 << 20),
            min_frequency=min_frequency,
            special_tokens=["<unk>"],
            end_of_word_suffix="</w>",
            show_progress=False,
        )
        engine.train_from_iterator(texts(), trainer=trainer)
        model = json.loads(engine.to_str())["model"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]][:num_merges]
        chars = []  # every character, in the trainer's order, whether seen inside or at the end of words
        for symbol in sorted(model["vocab"], key=model["vocab"].get):
            char = symbol[: -len("</w>")] if symbol.endswith("</w>") else symbol
            if symbol != "<unk>" and len(char) == 1 and char not in chars:
                chars.append(char)
        encoder = {"<unk>": 0}
        for symbol in chars + [c + "</w>" for c in chars] + [a + b for a, b in merges] + ["\n</w>"]:
            encoder.setdefault(symbol, len(encoder))
        if len(merges) < num_merges:
            log(f"Learned {len(merges):,} of {num_merges:,} merges: no pair occurs {min_frequency} times any more.")
        tokenizer = cls(encoder, merges)
        if directory is not None:
            tokenizer.save(directory)
        return tokenizer

    def save(self, directory):
        """Writes the two files in the original formats; `load()` reads them."""
        self._check_vocabulary()
        os.makedirs(directory, exist_ok=True)
        plain = {s: i for s, i in self.encoder.items() if s not in SPECIAL_TOKENS}
        with open(os.path.join(directory, ENCODER_FILE), "w", encoding="utf-8") as f:
            json.dump(plain, f, ensure_ascii=False)
        with open(os.path.join(directory, MERGES_FILE), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n")
            f.writelines(f"{a} {b}\n" for a, b in self.merges)

    @classmethod
    def load(cls, directory):
        """Reads a tokenizer written by `save()` (or the original files)."""
        return cls.from_original(directory)

    def save_assets(self, dir_path):
        """keras-hub/Keras saving hook: the two BPE files, as `save()` writes them."""
        self.save(dir_path)

    def load_assets(self, dir_path):
        """keras-hub/Keras loading hook: reads the two BPE files of `dir_path` into this tokenizer."""
        encoder = _read_encoder(os.path.join(dir_path, ENCODER_FILE))
        merges = _read_merges(os.path.join(dir_path, MERGES_FILE), encoder)
        self._set_vocabulary(encoder, merges)
        self._update_special_token_ids()

    @classmethod
    def from_preset(cls, preset, config_file=PRESET_CONFIG, **kwargs):
        """Reads the tokenizer of a local preset folder, or a folder of BPE files.

        A preset holds keras-hub's `tokenizer.json` (written by
        `save_to_preset()`, `GPTCausalLM.save_to_preset()` or
        `kgpt-train --output_dir`) and `assets/tokenizer/`. A folder without
        `tokenizer.json` is read with `from_original()` (the original release's
        two files, or Hugging Face `vocab.json` + `merges.txt`). Nothing is
        ever downloaded. `keras_hub.tokenizers.Tokenizer.from_preset(dir)`
        also loads a kgpt preset that holds a backbone (`config.json`).

        Args:
            preset: path of the folder.
            config_file: the tokenizer's config file in it.
            **kwargs: overrides of the saved config (e.g. `splitter`).

        Example:
        ```python
        tokenizer = kgpt.GPTTokenizer.from_preset("out")  # after kgpt-train --task lm --output_dir out
        ```
        """
        preset = os.fspath(preset)
        path = os.path.join(preset, config_file)
        if not os.path.isfile(path):
            return cls.from_original(preset, **kwargs)
        config = read_json(path, "a kgpt tokenizer config")
        name = config.get("registered_name") if isinstance(config, dict) else None
        registered = keras.saving.get_registered_object(name) if isinstance(name, str) else None
        if not (isinstance(registered, type) and issubclass(registered, cls)) or not isinstance(
            config.get("config"), dict
        ):
            raise CheckpointError(f"{path}: expected a kgpt {cls.__name__} config, got {config!r:.200}.")
        config["config"].update(kwargs)
        tokenizer = keras.saving.deserialize_keras_object(config, safe_mode=True)
        tokenizer.load_assets(os.path.join(preset, PRESET_ASSETS))
        return tokenizer

    def fingerprint(self):
        """A short hash of the vocabulary and merges (same files, same fingerprint)."""
        self._check_vocabulary()
        digest = hashlib.sha256()
        digest.update(json.dumps(sorted(self.encoder.items()), ensure_ascii=False).encode())
        digest.update(json.dumps(self.merges, ensure_ascii=False).encode())
        return digest.hexdigest()[:16]

    # --- ids -----------------------------------------------------------------

    def vocabulary_size(self):
        """Ids in use, special tokens included (the backbone's minimum size)."""
        self._check_vocabulary()
        return len(self.encoder)

    def get_vocabulary(self):
        """Every token (BPE symbol or special token), in id order."""
        self._check_vocabulary()
        return sorted(self.encoder, key=self.encoder.get)

    def id_to_token(self, id):
        """The BPE symbol (or special token) of one id."""
        self._check_vocabulary()
        token = self.decoder.get(int(id))
        if token is None:
            raise ValueError(f"Token id {id} is outside the vocabulary (size {self.vocabulary_size()}).")
        return token

    def token_to_id(self, token):
        """The id of one BPE symbol (e.g. `'the</w>'`) or special token."""
        self._check_vocabulary()
        if token not in self.encoder:
            raise ValueError(f"Token {token!r} is not in the vocabulary.")
        return self.encoder[token]

    @property
    def start_id(self):
        return self.start_token_id

    @property
    def delimiter_id(self):
        return self.delimiter_token_id

    @property
    def extract_id(self):
        return self.extract_token_id

    # --- encoding ------------------------------------------------------------

    def bpe(self, word):
        """BPE symbols of one lower-cased word, e.g. 'hello' -> ['hello</w>']."""
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        ranks = self.bpe_ranks
        symbols = tuple(word[:-1]) + (word[-1] + "</w>",)
        pairs = _pairs(symbols)
        while pairs:
            best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
            if best not in ranks:
                break
            first, second = best
            merged, i = [], 0
            while i < len(symbols):
                if i < len(symbols) - 1 and symbols[i] == first and symbols[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = tuple(merged)
            pairs = _pairs(symbols) if len(symbols) > 1 else set()
        result = list(symbols)
        if len(self._cache) < 200_000:
            self._cache[word] = result
        return result

    def words(self, text):
        """The normalised, lower-cased words that BPE sees."""
        if self.splitter == "spacy":
            import ftfy

            tokens = _spacy_english()(standardize(ftfy.fix_text(text)))
            # spaCy >= 2.1 makes "\n " (newline + the next space) a token where
            # the original's spaCy gave "\n", as its vocabulary's `\n</w>`
            # entry shows; pure spaces only come from doubled spaces.
            return ["\n" if "\n" in t.text else t.text.lower() for t in tokens if t.text.strip() or "\n" in t.text]
        return [w.lower() for w in _WORDS.findall(standardize(_fix_text(text)))]

    def encode(self, text):
        """Token ids of `text` (no special tokens added)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}.")
        self._check_vocabulary()
        # Locals: attribute lookups on a Keras layer cost more than on a plain object.
        lookup, cached, bpe = self.encoder.get, self._cache.get, self.bpe
        ids = []
        for word in self.words(text):
            symbols = cached(word)
            ids.extend([lookup(s, 0) for s in (bpe(word) if symbols is None else symbols)])
        return ids

    def encode_batch(self, texts):
        """`encode` over a list of strings."""
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        """Text from ids; words are joined by single spaces (case is lost)."""
        self._check_vocabulary()
        pieces = []
        for i in ids:
            i = int(i)
            if i not in self.decoder:
                raise ValueError(f"Token id {i} is outside the vocabulary (size {self.vocabulary_size()}).")
            symbol = self.decoder[i]
            pieces.append(f" {symbol} " if symbol in SPECIAL_TOKENS else symbol)
        text = "".join(pieces).replace("</w>", " ")
        return re.sub(r"[^\S\n]+", " ", text).replace(" \n ", "\n").strip()

    # --- the keras-hub layer -----------------------------------------------

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
        texts, batched = _texts(inputs)
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

    def get_config(self):
        config = super().get_config()
        config["splitter"] = self.splitter
        return config


def _texts(inputs):
    """`(list of str, batched)` from the Python-side inputs `tokenize()` takes."""
    if isinstance(inputs, (str, bytes)):
        return [_as_str(inputs)], False
    if isinstance(inputs, (list, tuple)):
        if not all(isinstance(t, (str, bytes)) for t in inputs):
            kinds = sorted({type(t).__name__ for t in inputs if not isinstance(t, (str, bytes))})
            raise TypeError(f"tokenize() takes strings; the list holds {', '.join(kinds)}.")
        return [_as_str(t) for t in inputs], True
    if tf is not None and isinstance(inputs, tf.Tensor):
        if inputs.dtype != tf.string:
            raise TypeError(f"tokenize() takes string tensors, got {inputs.dtype.name}.")
        inputs = np.asarray(inputs.numpy())
    if isinstance(inputs, np.ndarray) and inputs.dtype.kind in "USO":
        if inputs.ndim == 0:
            return [_as_str(inputs.item())], False
        if inputs.ndim == 1:
            return _texts(inputs.tolist())[0], True
        raise ValueError(f"tokenize() takes a string or a rank-1 batch of strings, got shape {inputs.shape}.")
    raise TypeError(
        f"tokenize() takes a str, a list of str or a string tensor, got {type(inputs).__name__}."
    )


def _as_str(text):
    return text.decode("utf-8") if isinstance(text, bytes) else text


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


def _find_files(directory):
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"No tokenizer in {directory!r}: no such folder (kgpt reads local files only; it never downloads)."
        )
    for encoder, merges in ((ENCODER_FILE, MERGES_FILE), ("vocab.json", "merges.txt")):
        if os.path.isfile(os.path.join(directory, encoder)):
            return os.path.join(directory, encoder), os.path.join(directory, merges)
    raise FileNotFoundError(
        f"No tokenizer in {directory!r}: expected {ENCODER_FILE} + {MERGES_FILE} (the original release or "
        f"a kgpt preset's {PRESET_ASSETS}/), {PRESET_CONFIG} (a kgpt preset) or vocab.json + merges.txt "
        f"(Hugging Face openai-gpt)."
    )


def _read_encoder(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Tokenizer encoder file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            encoder = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not a JSON encoder file ({e}).") from e
    if not isinstance(encoder, dict) or not all(
        isinstance(k, str) and isinstance(v, int) for k, v in encoder.items()
    ):
        raise CheckpointError(f"{path}: expected a JSON object mapping BPE symbols to integer ids.")
    if sorted(encoder.values()) != list(range(len(encoder))):
        raise CheckpointError(f"{path}: ids must be exactly 0..{len(encoder) - 1}, each used once.")
    return encoder


def _read_merges(path, encoder):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Tokenizer merges file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not a UTF-8 BPE merges file ({e}).") from e
    if not lines or not lines[0].startswith("#version"):
        raise CheckpointError(f"{path}:1: expected a '#version' header line in a BPE merges file.")
    merges = []
    for number, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise CheckpointError(f"{path}:{number}: expected two symbols separated by a space, got {line!r}.")
        if "".join(parts) not in encoder:
            raise CheckpointError(
                f"{path}:{number}: merge {line!r} makes {''.join(parts)!r}, which the encoder file lacks: "
                f"the two files are from different vocabularies."
            )
        merges.append(tuple(parts))
    return merges
