"""GPT-1's byte-pair-encoding tokenizer (the original release's algorithm) as a keras-hub `Tokenizer` layer.

Pipeline, as in the original `text_utils.py`: `ftfy.fix_text`; standardise
dashes and ellipses; space out runs of punctuation; newlines become a `\\n`
token; split into words with spaCy's English tokenizer (or a regular
expression, `splitters`); lower-case; BPE over characters with `</w>` on the
last one, lowest-rank merge first; unknown symbols -> id 0. Three special
tokens follow the vocabulary: `_start_`, `_delimiter_`, `_classify_` (ids
40478-40480 with the original files). The pieces are the modules beside this
one; `kgpt.GPTTokenizer` is this layer with the GPT backbone named.
`benchmarks/tokenizer.py` measures agreement with the original and throughput.
"""

import hashlib
import json
import os
import re
import warnings
from importlib import resources

import keras
import numpy as np

from kgpt.checks import one_of, shown
from kgpt.errors import CheckpointError
from kgpt.io import hub
from kgpt.io.presets import deserialize, read_json
from kgpt.tokenizers.gpt1.encoder import TextEncoder
from kgpt.tokenizers.gpt1.files import ENCODER_FILE, MERGES_FILE, checked_encoder, find_files, read_files, write_files
from kgpt.tokenizers.gpt1.normalize import MAX_WORD_CHARS
from kgpt.tokenizers.gpt1.splitters import SPLITTERS, import_spacy
from kgpt.tokenizers.gpt1.training import learn_vocabulary
from kgpt.tokenizers.interface import PRESET_ASSETS, PRESET_CONFIG, SPECIAL_TOKENS
from kgpt.tokenizers.python_layer import PythonTokenizer


@keras.saving.register_keras_serializable(package="kgpt")
class GPT1Tokenizer(PythonTokenizer):
    """Text <-> token ids with a GPT-1 BPE vocabulary; `kgpt.GPTTokenizer` documents it (its subclass that
    names the GPT backbone, as keras-hub's model tokenizers do)."""

    def __init__(self, encoder=None, merges=None, splitter="regex", **kwargs):
        if one_of(splitter, "splitter", SPLITTERS) == "spacy":
            import_spacy()  # fail now, with the install hint, not at the first encode()
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
        state = dict(encoder=None, merges=None, bpe_ranks=None, decoder=None, text_encoder=None)
        if encoder is not None:
            encoder = checked_encoder(encoder)
            base = len(encoder)
            for offset, token in enumerate(SPECIAL_TOKENS):
                encoder.setdefault(token, base + offset)
            engine = TextEncoder(encoder, [tuple(m) for m in merges], self.splitter)
            state.update(
                encoder=encoder,
                merges=engine.merges,
                bpe_ranks=engine.bpe_ranks,
                decoder={i: s for s, i in encoder.items()},
                text_encoder=engine,
            )
        # Plain attributes: Keras' attribute tracking would copy these large
        # containers into tracked wrappers (and the caches on every insert),
        # which costs time and has nothing to track.
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
    def from_original(cls, encoder_json, bpe_merges=None, splitter=None):
        """Reads the original release's `encoder_bpe_40000.json` + `vocab_40000.bpe`.

        Give the two paths, or one directory holding them (or Hugging Face's
        `vocab.json` + `merges.txt` for `openai-gpt`, the same vocabulary).
        `splitter=None` takes the one the merges file records (files written
        by `save()`), else spaCy's, the original's.

        Example: `kgpt.GPTTokenizer.from_original("finetune-transformer-lm/model")`
        """
        if bpe_merges is None:
            encoder_json, bpe_merges = find_files(encoder_json)
        encoder, merges, recorded = read_files(encoder_json, bpe_merges)
        return cls(encoder, merges, splitter=splitter or recorded or "spacy")

    @classmethod
    def gpt1(cls, splitter="spacy"):
        """The original GPT-1 vocabulary (MIT licence) and tokenization, shipped with kgpt.

        `splitter="regex"` trades exactness (1 to 3 tokens in 100 split
        differently, see `benchmarks/tokenizer.py`) for a faster first sight of each word.
        """
        assets = resources.files("kgpt") / "assets" / "gpt1_bpe"
        return cls.from_original(str(assets / ENCODER_FILE), str(assets / MERGES_FILE), splitter=splitter)

    @classmethod
    def train(cls, files, num_merges=40000, min_frequency=2, directory=None, splitter="regex"):
        """Learns a new BPE vocabulary from text files, in the original's layout.

        Text goes through the same normalisation and word splitting as
        `encode()`; the merges are learned by the Hugging Face `tokenizers`
        BPE trainer (Rust) with the original's `</w>` end-of-word marker. The
        vocabulary is laid out as the original: `<unk>` = 0, the characters,
        the characters + `</w>`, one symbol per merge in rank order, then
        `\\n</w>`. With `directory`, the two files are written there in the
        original formats, so `from_original()` and the original
        code read them; the merges file's first line records `splitter`.

        Args:
            files: paths of UTF-8 text files.
            num_merges: merges to learn (the original: 40,000). Fewer are
                kept when no pair is seen `min_frequency` times any more;
                the count is logged.
            min_frequency: smallest pair count that is merged.
            directory: optional folder to `save()` into.
            splitter: `"regex"` (default: faster) or `"spacy"`; the
                tokenizer encodes with the one it learned from.

        Example:
        ```python
        tokenizer = kgpt.GPTTokenizer.train(["books.txt"], num_merges=8000, directory="my_bpe")
        ```
        """
        encoder, merges = learn_vocabulary(files, num_merges, min_frequency, splitter)
        tokenizer = cls(encoder, merges, splitter=splitter)
        if directory is not None:
            tokenizer.save(directory)
        return tokenizer

    def save(self, directory):
        """Writes the two files in the original formats (the splitter on the merges file's first line)."""
        self._check_vocabulary()
        write_files(directory, self.encoder, self.merges, self.splitter)

    def save_assets(self, dir_path):
        """keras-hub/Keras saving hook: the two BPE files, as `save()` writes them."""
        self.save(dir_path)

    def load_assets(self, dir_path):
        """keras-hub/Keras loading hook: reads the two BPE files of `dir_path` into this tokenizer.

        The splitter stays the one of this tokenizer's config.
        """
        encoder_path, merges_path = os.path.join(dir_path, ENCODER_FILE), os.path.join(dir_path, MERGES_FILE)
        encoder, merges, _ = read_files(encoder_path, merges_path)
        self._set_vocabulary(encoder, merges)
        self._update_special_token_ids()

    @classmethod
    def from_preset(cls, preset, config_file=PRESET_CONFIG, **kwargs):
        """Reads the tokenizer of a preset, or of a folder of BPE files.

        A preset holds keras-hub's `tokenizer.json` (written by
        `save_to_preset()`, `GPTCausalLM.save_to_preset()` or
        `kgpt-train --output_dir`; it records the splitter) and
        `assets/tokenizer/`. A folder without `tokenizer.json` is read with
        `from_original()` (the original release's two files, or Hugging Face
        `vocab.json` + `merges.txt`). `hf://OWNER/REPO[@REVISION]` and named
        presets (`"gpt1_base_en"`) are downloaded through `kgpt.io.hub`.
        `keras_hub.tokenizers.Tokenizer.from_preset(dir)` also loads a kgpt
        preset that holds a backbone (`config.json`).

        Args:
            preset: path of the folder, or a Hub preset.
            config_file: the tokenizer's config file in it.
            **kwargs: overrides of the saved config (e.g. `splitter`).

        Example:
        ```python
        tokenizer = kgpt.GPTTokenizer.from_preset("out")  # after kgpt-train --task lm --output_dir out
        ```
        """
        preset = os.fspath(hub.local(preset, cls.backbone_cls))
        if os.path.isfile(preset):
            folder = os.path.dirname(preset) or "."
            raise CheckpointError(
                f"{preset} is a file: a preset is the folder that holds it; pass GPTTokenizer.from_preset({folder!r})."
            )
        path = os.path.join(preset, config_file)
        if not os.path.isfile(path):
            return cls.from_original(preset, **kwargs)
        config = read_json(path, "a kgpt tokenizer config")
        name = config.get("registered_name") if isinstance(config, dict) else None
        registered = keras.saving.get_registered_object(name) if isinstance(name, str) else None
        if not (isinstance(registered, type) and issubclass(registered, cls)) or not isinstance(
            config.get("config"), dict
        ):
            raise CheckpointError(f"{path}: expected a kgpt {cls.__name__} config, got {shown(config, 200)}.")
        config["config"].update(kwargs)
        tokenizer = deserialize(config, path, f"a {cls.__name__}")
        tokenizer.load_assets(os.path.join(preset, PRESET_ASSETS))
        return tokenizer

    def fingerprint(self):
        """A short hash of what decides the ids: vocabulary, merges and word splitter."""
        self._check_vocabulary()
        digest = hashlib.sha256()
        digest.update(json.dumps(sorted(self.encoder.items()), ensure_ascii=False).encode())
        digest.update(json.dumps(self.merges, ensure_ascii=False).encode())
        digest.update(self.splitter.encode())
        return digest.hexdigest()[:16]

    def corpus_encoder(self):
        """The `TextEncoder` the shard builder encodes a corpus with (`kgpt.tokenizers.interface`)."""
        self._check_vocabulary()
        return self.text_encoder

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

    # --- encoding ------------------------------------------------------------

    def bpe(self, word):
        """BPE symbols of one lower-cased word, e.g. 'hello' -> ['hello</w>']."""
        self._check_vocabulary()
        return list(self.text_encoder.bpe(word))

    def words(self, text):
        """The normalised, lower-cased words that BPE sees (`"\\n"` between lines)."""
        if self.text_encoder is None:
            return TextEncoder({}, [], self.splitter).words(text)
        return self.text_encoder.words(text)

    def encode(self, text):
        """Token ids of `text` (no special tokens added)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}.")
        self._check_vocabulary()
        engine = self.text_encoder
        cut = engine.cut_words
        ids = engine.encode(text)
        if engine.cut_words > cut:
            warnings.warn(
                f"Cut {engine.cut_words - cut} word(s) longer than {MAX_WORD_CHARS:,} characters into pieces "
                "of that length (the original tokenizes them whole, in time that grows faster than their length).",
                stacklevel=2,
            )
        return ids

    def decode(self, ids):
        """Text from ids; words are joined by single spaces (case is lost)."""
        self._check_vocabulary()
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__") and not hasattr(ids, "__array__"):
            raise TypeError(f"decode() takes a sequence of token ids, got {shown(ids, 80)}.")
        try:
            array = np.asarray(ids)
        except ValueError:
            raise ValueError(
                "decode() takes one flat sequence of token ids; got rows of different lengths (decode each row)."
            ) from None
        if array.ndim != 1:
            raise ValueError(
                f"decode() takes one flat sequence of token ids, got shape {array.shape} (decode each row)."
            )
        if array.size and (
            array.dtype == object
            or array.dtype.kind not in "iu"
            or isinstance(ids, (list, tuple))
            and any(isinstance(i, bool) for i in ids)
        ):
            raise TypeError(f"decode() takes integer token ids, got {array.dtype} values ({shown(ids, 80)}).")
        pieces = []
        for i in array.tolist():
            if i not in self.decoder:
                raise ValueError(f"Token id {i} is outside the vocabulary (size {self.vocabulary_size()}).")
            symbol = self.decoder[i]
            pieces.append(f" {symbol} " if symbol in SPECIAL_TOKENS else symbol)
        text = "".join(pieces).replace("</w>", " ")
        return re.sub(r"[^\S\n]+", " ", text).replace(" \n ", "\n").strip()

    # --- the keras-hub layer -----------------------------------------------
    def get_config(self):
        config = super().get_config()
        config["splitter"] = self.splitter
        return config
