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
"""

import hashlib
import importlib
import json
import os
import re
import unicodedata
from importlib import resources

from kgpt.presets import CheckpointError, read_json

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


class GPTTokenizer:
    """Text <-> token ids with the GPT-1 BPE vocabulary.

    Args:
        encoder: dict of BPE symbol -> id, ids `0..n-1` (`<unk>` is 0 in the
            original files).
        merges: list of `(left, right)` symbol pairs in rank order.

    Example:
    ```python
    tokenizer = kgpt.GPTTokenizer.gpt1()  # the original files, shipped
    ids = tokenizer.encode("Hello world!")
    tokenizer.decode(ids)  # 'hello world !'
    tokenizer.vocabulary_size()  # 40481 (40478 + start, delimiter, extract)
    ```
    """

    def __init__(self, encoder, merges, splitter="regex"):
        if splitter not in ("regex", "spacy"):
            raise ValueError(f"splitter must be 'regex' or 'spacy', got {splitter!r}.")
        if splitter == "spacy":
            _spacy_english()  # fail now, with the install hint, not at the first encode()
        self.splitter = splitter
        self.encoder = dict(encoder)
        self.merges = [tuple(m) for m in merges]
        self.bpe_ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        base = len(self.encoder)
        for offset, token in enumerate(SPECIAL_TOKENS):
            self.encoder.setdefault(token, base + offset)
        self.decoder = {i: s for s, i in self.encoder.items()}
        self._cache = {}

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

    def save_to_preset(self, preset_dir):
        """Writes `tokenizer.json` + `assets/tokenizer/` in a keras-hub preset directory."""
        self.save(os.path.join(preset_dir, PRESET_ASSETS))
        config = {"module": "kgpt", "class_name": "GPTTokenizer", "config": {"splitter": self.splitter}}
        with open(os.path.join(preset_dir, PRESET_CONFIG), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=4)

    @classmethod
    def from_preset(cls, preset_dir):
        """Reads the tokenizer of a kgpt preset, or a folder of the two BPE files.

        Example: `kgpt.GPTTokenizer.from_preset("out")` after `kgpt-train --task lm --output_dir out`.
        """
        config_path = os.path.join(preset_dir, PRESET_CONFIG)
        if not os.path.isfile(config_path):
            return cls.from_original(preset_dir)
        config = read_json(config_path, "a kgpt tokenizer config")
        if not isinstance(config, dict) or config.get("class_name") != "GPTTokenizer":
            raise CheckpointError(f"{config_path}: expected a kgpt GPTTokenizer config, got {config!r:.200}.")
        splitter = config.get("config", {}).get("splitter", "regex")
        return cls.from_original(os.path.join(preset_dir, PRESET_ASSETS), splitter=splitter)

    def fingerprint(self):
        """A short hash of the vocabulary and merges (same files, same fingerprint)."""
        digest = hashlib.sha256()
        digest.update(json.dumps(sorted(self.encoder.items()), ensure_ascii=False).encode())
        digest.update(json.dumps(self.merges, ensure_ascii=False).encode())
        return digest.hexdigest()[:16]

    # --- ids -----------------------------------------------------------------

    def vocabulary_size(self):
        """Ids in use, special tokens included (the backbone's minimum size)."""
        return len(self.encoder)

    @property
    def start_id(self):
        return self.encoder["_start_"]

    @property
    def delimiter_id(self):
        return self.encoder["_delimiter_"]

    @property
    def extract_id(self):
        return self.encoder["_classify_"]

    # --- encoding ------------------------------------------------------------

    def bpe(self, word):
        """BPE symbols of one lower-cased word, e.g. 'hello' -> ['hello</w>']."""
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        symbols = tuple(word[:-1]) + (word[-1] + "</w>",)
        pairs = _pairs(symbols)
        while pairs:
            best = min(pairs, key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if best not in self.bpe_ranks:
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
        ids = []
        for word in self.words(text):
            ids.extend(self.encoder.get(s, 0) for s in self.bpe(word))
        return ids

    def encode_batch(self, texts):
        """`encode` over a list of strings."""
        return [self.encode(t) for t in texts]

    def decode(self, ids):
        """Text from ids; words are joined by single spaces (case is lost)."""
        pieces = []
        for i in ids:
            i = int(i)
            if i not in self.decoder:
                raise ValueError(f"Token id {i} is outside the vocabulary (size {self.vocabulary_size()}).")
            symbol = self.decoder[i]
            pieces.append(f" {symbol} " if symbol in SPECIAL_TOKENS else symbol)
        text = "".join(pieces).replace("</w>", " ")
        return re.sub(r"[^\S\n]+", " ", text).replace(" \n ", "\n").strip()


def _find_files(directory):
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
        raise ValueError(f"{path}: not a JSON encoder file ({e}).") from e
    if not isinstance(encoder, dict) or not all(
        isinstance(k, str) and isinstance(v, int) for k, v in encoder.items()
    ):
        raise ValueError(f"{path}: expected a JSON object mapping BPE symbols to integer ids.")
    if sorted(encoder.values()) != list(range(len(encoder))):
        raise ValueError(f"{path}: ids must be exactly 0..{len(encoder) - 1}, each used once.")
    return encoder


def _read_merges(path, encoder):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Tokenizer merges file not found: {path}")
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if not lines or not lines[0].startswith("#version"):
        raise ValueError(f"{path}:1: expected a '#version' header line in a BPE merges file.")
    merges = []
    for number, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{number}: expected two symbols separated by a space, got {line!r}.")
        if "".join(parts) not in encoder:
            raise ValueError(
                f"{path}:{number}: merge {line!r} makes {''.join(parts)!r}, which the encoder file lacks: "
                f"the two files are from different vocabularies."
            )
        merges.append(tuple(parts))
    return merges
