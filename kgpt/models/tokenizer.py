"""The GPT-1 byte-pair-encoding tokenizer (the original release's algorithm).

Pipeline, as in the original `text_utils.py`: `ftfy.fix_text`; standardise
dashes and ellipses; space out runs of punctuation; newlines become a `\\n`
token; split into words with spaCy's English tokenizer; lower-case; BPE over
characters with `</w>` on the last one, lowest-rank merge first; unknown
symbols -> id 0. Three special tokens follow the vocabulary: `_start_`,
`_delimiter_`, `_classify_` (ids 40478-40480 with the original files).

Two word splitters: `splitter="spacy"`, the original's (spaCy's English
tokenizer rules; no model is downloaded), which `gpt1()`, `from_original()`
and the original files use; and `splitter="regex"`, a regular expression
that follows spaCy's rules for the common cases (punctuation, `n't` and
`'s`-style clitics) but not its exception list (e.g. "Mrs."), faster on
words seen for the first time, the default of vocabularies learned with
`train()`.
Both splitters record themselves in the files `save()` writes, so a
vocabulary always loads with the splitter it was made with.

The work is cached per whitespace-separated word, so each distinct word is
fixed, split and BPE-encoded once; `ftfy` runs only on lines with characters
it could change. Words longer than `MAX_WORD_CHARS` are cut into pieces of
that length (counted), because spaCy's and BPE's time grows faster than
linearly with a word's length. `benchmarks/tokenizer.py` measures agreement
with the original and throughput.

`GPTTokenizer` is a keras-hub `Tokenizer` layer: callable on strings, mapped
over `tf.data` (through `tf.py_function`), saved in presets and found by
`keras_hub.tokenizers.Tokenizer.from_preset`.
"""

import functools
import hashlib
import heapq
import importlib
import itertools
import json
import logging
import os
import re
import warnings
from importlib import resources

import ftfy
import keras
import numpy as np
from keras_hub.tokenizers import Tokenizer

from kgpt.models.backbone import GPTBackbone
from kgpt.models.inputs import positive_int
from kgpt.data.text import text_chunks
from kgpt.io.presets import CheckpointError, check_save_target, deserialize, read_json

logger = logging.getLogger(__name__)

try:  # the tf.data path; keras-hub's own preprocessing needs TensorFlow there too
    import tensorflow as tf
except ImportError:
    tf = None

SPECIAL_TOKENS = ("_start_", "_delimiter_", "_classify_")
SPLITTERS = ("spacy", "regex")
ENCODER_FILE = "encoder_bpe_40000.json"
MERGES_FILE = "vocab_40000.bpe"
PRESET_CONFIG = "tokenizer.json"  # keras-hub's preset layout
PRESET_ASSETS = os.path.join("assets", "tokenizer")
MAX_WORD_CHARS = 1000  # longer runs of non-space characters are cut into pieces (counted)

_CACHE_WORDS = 1 << 18  # distinct words kept per TextEncoder before its caches start over
_HEAP_BPE_CHARS = 48  # longer words go through the O(n log n) BPE
_UNKNOWN = float("inf")  # the rank of a pair no merge makes
_LONG_WORD = re.compile(r"\S{%d}" % (MAX_WORD_CHARS + 1))
_HEADER = "#version: 0.2"
# The original reads the merges file from its second line on, so the splitter
# rides on the first: "#version: 0.2 kgpt-splitter: regex".
_HEADER_SPLITTER = re.compile(r"#version:[^\n]*?\bkgpt-splitter: *(\w+)")

_PUNCT_RUNS = re.compile(r"""(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\\+|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)""")
_DASHES = str.maketrans({"\u2014": "-", "\u2013": "-", "\u2015": "-", "\u2026": "...", "\u00b4": "'"})
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
# Lines made only of these characters are ones ftfy.fix_text leaves alone
# apart from straightening curly quotes and turning "\r\n" into "\n":
# printable ASCII without "&" (HTML entities), tab, line ends, dashes, ellipsis
# and curly quotes. None of them can start a UTF-8 sequence, so no mojibake
# fix applies (the tests check this against ftfy itself).
_FTFY_NEEDED = re.compile(r"[^\t\n\r\x20-\x25\x27-\x7e\u2013\u2014\u2018\u2019\u201c\u201d\u2026]|\r(?!\n)")
_UNCURL = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def standardize(text):
    """The original's punctuation and whitespace standardisation (`text_standardize`)."""
    text = _PUNCT_RUNS.sub(r" \1 ", text.translate(_DASHES))
    text = re.sub(r"\s*\n\s*", " \n ", text)
    text = re.sub(r"[^\S\n]+", " ", text)
    return text.strip()


def _pieces(word):
    """`standardize` of one whitespace-free word, split at the spaces it adds."""
    return _PUNCT_RUNS.sub(r" \1 ", word.translate(_DASHES)).split()


def fix_text(text, after_lt=False):
    """`ftfy.fix_text(text)`, with ftfy run only on the lines that need it.

    ftfy fixes a text line by line, and stops decoding HTML entities for good
    after the first line holding a "<"; `after_lt` says that text before this
    one (an earlier chunk of the same file) had one.
    """
    found = _FTFY_NEEDED.search(text)
    if found is None:
        return _fix_plain(text)
    lt = text.find("<")
    out, done = [], 0
    while found is not None:
        start = text.rfind("\n", 0, found.start()) + 1
        end = text.find("\n", found.end()) + 1 or len(text)
        found = _FTFY_NEEDED.search(text, end)
        while found is not None and text.rfind("\n", 0, found.start()) + 1 == end:  # the next line too
            end = text.find("\n", found.end()) + 1 or len(text)
            found = _FTFY_NEEDED.search(text, end)
        html = False if after_lt or 0 <= lt < start else "auto"
        out += [_fix_plain(text[done:start]), ftfy.fix_text(text[start:end], unescape_html=html)]
        done = end
    out.append(_fix_plain(text[done:]))
    return "".join(out)


def _fix_plain(text):
    """What ftfy.fix_text makes of text without a character `_FTFY_NEEDED` matches."""
    text = text.translate(_UNCURL)
    return text.replace("\r\n", "\n") if "\r" in text else text


def _bpe_short(word, ranks, merges):
    """The original's BPE: merge every occurrence of the lowest-rank pair, left to right, until none is known."""
    symbols = list(word[:-1]) + [word[-1] + "</w>"]
    found = list(map(ranks.get, zip(symbols, symbols[1:]), itertools.repeat(_UNKNOWN)))  # rank of each pair
    while found:
        rank = min(found)
        if rank == _UNKNOWN:
            break
        first, second = merges[rank]
        merged = first + second
        i = found.index(rank)
        while True:
            symbols[i : i + 2] = [merged]
            del found[i]
            if i > 0:
                found[i - 1] = ranks.get((symbols[i - 1], merged), _UNKNOWN)
            if i < len(found):  # also hides an overlapping occurrence: "a a a" -> "aa a"
                found[i] = ranks.get((merged, symbols[i + 1]), _UNKNOWN)
            try:
                i = found.index(rank, i + 1)
            except ValueError:
                break
    return symbols


def _bpe_long(word, ranks, merges):
    """The same result as `_bpe_short` in O(n log n): a heap of pairs over a linked list of symbols.

    All occurrences of one pair are merged in one left-to-right pass before
    the pairs they create are queued, as the original's loop does.
    """
    symbols = list(word[:-1]) + [word[-1] + "</w>"]
    after = list(range(1, len(symbols))) + [-1]
    before = list(range(-1, len(symbols) - 1))
    heap = [(ranks[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in ranks]
    heapq.heapify(heap)
    while heap:
        rank = heap[0][0]
        first, second = merges[rank]
        merged = []
        while heap and heap[0][0] == rank:  # pops in position order: left to right
            i = heapq.heappop(heap)[1]
            j = after[i]
            if symbols[i] != first or j < 0 or symbols[j] != second:
                continue  # stale, or taken by the merge just left of it
            symbols[i], symbols[j] = first + second, None
            after[i] = after[j]
            if after[j] >= 0:
                before[after[j]] = i
            merged.append(i)
        for i in merged:
            for left, right in ((before[i], i), (i, after[i])):
                pair = (symbols[left], symbols[right]) if left >= 0 and right >= 0 else None
                if pair in ranks:
                    heapq.heappush(heap, (ranks[pair], left))
    return [s for s in symbols if s is not None]


class TextEncoder:
    """Text -> token ids for one BPE vocabulary, with no Keras in it (what worker processes run).

    Each distinct whitespace-separated word is standardised, split, lower-cased
    and BPE-encoded once, then read from a cache; the caches start over after
    `_CACHE_WORDS` words, so memory stays bounded on any corpus. `cut_words`
    counts the words longer than `MAX_WORD_CHARS` that were cut into pieces.

    With spaCy, a word's tokens can depend on its neighbour: spaCy matches its
    special cases ("'s", ":o)", "Dr." ...) across spaces, and a match that
    spans two words blocks the special cases it overlaps (in "boys' s." it
    keeps "s." from being one token). Words next to such a possible match are
    tokenized together, so the result is always that of spaCy on the whole text.
    """

    def __init__(self, encoder, merges, splitter):
        if splitter not in SPLITTERS:
            raise ValueError(f"splitter must be 'spacy' or 'regex', got {splitter!r}.")
        self.encoder, self.merges, self.splitter = encoder, merges, splitter
        self.bpe_ranks = {pair: rank for rank, pair in enumerate(merges)}
        self.newline_id = encoder.get("\n</w>", 0)
        self.cut_words = 0
        self.journal = None  # see `record`
        self._reset()

    def __getstate__(self):  # spaCy's tokenizer and the caches are rebuilt where this is unpickled
        return {"encoder": self.encoder, "merges": self.merges, "splitter": self.splitter}

    def __setstate__(self, state):
        self.__init__(**state)

    def _reset(self):
        self.word_ids = {}
        self.bpe_cache = {}
        self.word_edges = {}  # word -> _edges(word), with spaCy
        self.joiners = set()  # the words whose edges may join the next word
        self._nlp = None  # spaCy's vocabulary also grows with every new word

    # --- words -----------------------------------------------------------------

    def _spacy(self):
        if self._nlp is None:
            self._nlp = _SpacyRules()
        return self._nlp

    def _split(self, keys):
        """Words (not lower-cased) of each key: a whitespace-free word or a space-joined group of them."""
        if self.splitter == "spacy":
            return self._spacy().tokens([_pieces(key) for key in keys])
        return [_WORDS.findall(" ".join(_pieces(key))) for key in keys]

    def _edges(self, word):
        """`(first piece, tokens that may follow the word's end in one spaCy special case)` of one word."""
        pieces = _pieces(word)
        return pieces[0], self._spacy().joins(pieces[-1])

    @staticmethod
    def _group(words, edges, joiners):
        """Space-joined runs of the words spaCy may read together; the others alone."""
        keys, start = [], 0
        for i in range(1, len(words) + 1):
            if i < len(words) and words[i - 1] in joiners:
                if _starts_with_token(edges[words[i]][0], edges[words[i - 1]][1]):
                    continue
            keys.append(" ".join(words[start:i]))
            start = i
        return keys

    def _cut(self, words):
        if max(map(len, words)) <= MAX_WORD_CHARS:
            return words
        out = []
        for word in words:
            if len(word) > MAX_WORD_CHARS:
                self.cut_words += 1
                out += [word[i : i + MAX_WORD_CHARS] for i in range(0, len(word), MAX_WORD_CHARS)]
            else:
                out.append(word)
        return out

    def lines(self, text):
        """Cache keys per line of already fixed text: its words, cut to `MAX_WORD_CHARS`, grouped where
        spaCy needs context; lines without words are left out."""
        lines = [words for words in map(str.split, text.split("\n")) if words]
        if _LONG_WORD.search(text):
            lines = [self._cut(words) for words in lines]
        if self.splitter == "spacy":
            edges, joiners = self.word_edges, self.joiners  # the same two all along, even if caches start over
            seen = set(itertools.chain.from_iterable(lines))
            new_edges = {word: self._edges(word) for word in seen.difference(edges)}
            if new_edges:
                _add_edges(edges, joiners, new_edges)
                if self.journal is not None:
                    self.journal[1].update(new_edges)
            if not joiners.isdisjoint(seen):
                lines = [self._group(w, edges, joiners) if len(w) > 1 and not joiners.isdisjoint(w[:-1]) else w
                         for w in lines]
        return lines

    def words(self, text, after_lt=False):
        """The lower-cased words BPE sees, with `"\\n"` between lines (`after_lt`: see `fix_text`)."""
        out = []
        for keys in self.lines(fix_text(text, after_lt)):
            if out:
                out.append("\n")
            out += [w.lower() for words in self._split(keys) for w in words]
        return out

    # --- ids -------------------------------------------------------------------

    def bpe(self, word):
        """BPE symbols of one lower-cased word, e.g. 'hello' -> ['hello</w>']."""
        symbols = self.bpe_cache.get(word)
        if symbols is None:
            if len(word) > _HEAP_BPE_CHARS:
                symbols = _bpe_long(word, self.bpe_ranks, self.merges)
            else:
                symbols = self.bpe_cache[word] = _bpe_short(word, self.bpe_ranks, self.merges)
        return symbols

    def _add(self, keys, cache):
        """Puts the ids of keys not seen yet in `cache` (spaCy runs once for all of them)."""
        keys, lookup, bpe = list(keys), self.encoder.get, self.bpe
        for key, words in zip(keys, self._split(keys)):
            cache[key] = tuple(lookup(s, 0) for w in words for s in bpe(w.lower()))
        if self.journal is not None:
            self.journal[0].update((key, cache[key]) for key in keys)

    # --- sharing what was learned between processes ------------------------------

    def record(self):
        """Starts a journal of the words this encoder works out from now on; returns the previous one.

        A journal is `({cache key: ids}, {word: spaCy edges})`. Encoders of the
        same vocabulary in other processes take it with `learn`, so a word is
        split and BPE-encoded once, not once per process (the results are the
        same: a word's ids depend on the word alone).
        """
        journal, self.journal = self.journal, ({}, {})
        return journal

    def learn(self, journal):
        """Adds another encoder's journal (see `record`) to the caches."""
        ids, edges = journal
        self.word_ids.update(ids)
        _add_edges(self.word_edges, self.joiners, edges)

    def encode_fixed(self, text):
        """Token ids of text that `fix_text` already went through."""
        if len(self.word_ids) > _CACHE_WORDS:
            self._reset()
        cache = self.word_ids  # this call's, even if another thread (tf.data) starts the caches over
        lines = self.lines(text)
        new = set(itertools.chain.from_iterable(lines)).difference(cache)
        if new:
            self._add(new, cache)
        ids, lookup = [], cache.__getitem__
        for keys in lines:
            if ids:
                ids.append(self.newline_id)
            ids.extend(itertools.chain.from_iterable(map(lookup, keys)))
        return ids

    def encode(self, text, after_lt=False):
        """Token ids of `text` (`after_lt`: see `fix_text`)."""
        return self.encode_fixed(fix_text(text, after_lt))


def _add_edges(edges, joiners, new):
    edges.update(new)
    joiners.update(word for word, (_, follows) in new.items() if follows)


def _import_spacy():
    try:
        return importlib.import_module("spacy")
    except ImportError as e:
        raise ImportError("splitter='spacy' needs spaCy, a kgpt dependency: pip install 'spacy>=3.7,<4'") from e


class _SpacyRules:
    """spaCy's English tokenizer (rules only, no model download) and the pairs its special cases can join."""

    def __init__(self):
        self.tokenizer = _import_spacy().blank("en").tokenizer
        self.rules, self._joins = _special_cases()

    def tokens(self, texts):
        """spaCy's tokens of each list of pieces (as if space-joined): one spaCy call for all."""
        out = [pieces if all(map(self._plain, pieces)) else None for pieces in texts]
        todo = [i for i, tokens in enumerate(out) if tokens is None]
        if todo:
            # A newline between two texts is a whitespace token, which no special
            # case spans: each text is tokenized as it would be alone.
            doc = self.tokenizer(" \n ".join(" ".join(texts[i]) for i in todo))
            groups = [[]]
            for token in doc:
                if token.is_space:
                    groups.append([])
                else:
                    groups[-1].append(token.text)
            if len(groups) != len(todo):
                raise RuntimeError(f"spaCy split {len(todo)} texts into {len(groups)}.")
            for i, tokens in zip(todo, groups):
                out[i] = tokens
        return out

    def _plain(self, piece):
        # ASCII letters are one token unless a special case names them ("cannot",
        # "Im"): no prefix, suffix or infix rule matches letters alone, and no
        # special case joins two such tokens (the tests check both on spaCy itself).
        return piece.isascii() and piece.isalpha() and piece not in self.rules

    def joins(self, piece):
        """Tokens that may follow `piece` across a space inside one special-case match (a tuple)."""
        found = ()
        for end, follows in self._joins.get(piece[-1:], ()):
            if piece.endswith(end) and not _inside_run(piece, len(piece) - len(end)):
                found += follows
        return found


def _inside_run(text, i):
    """Whether `text[i - 1]` and `text[i]` are both ASCII letters or both digits: no spaCy rule splits there."""
    if i <= 0 or i >= len(text):
        return False
    a, b = text[i - 1], text[i]
    return a.isascii() and b.isascii() and ((a.isalpha() and b.isalpha()) or (a.isdigit() and b.isdigit()))


def _starts_with_token(piece, tokens):
    """Whether `piece` may start with one of `tokens` as a whole spaCy token."""
    return any(piece.startswith(t) and not _inside_run(piece, len(t)) for t in tokens)


@functools.cache
def _special_cases():
    """`(special-case strings, {last character: [(token, tokens that may follow it), ...]})` of spaCy's English.

    spaCy matches a special case against the tokens its prefix, suffix and
    infix rules make of it, across spaces too; these are its adjacent pairs.
    """
    tokenizer = _import_spacy().blank("en").tokenizer
    plain = type(tokenizer)(
        tokenizer.vocab, rules={}, prefix_search=tokenizer.prefix_search, suffix_search=tokenizer.suffix_search,
        infix_finditer=tokenizer.infix_finditer, token_match=tokenizer.token_match, url_match=tokenizer.url_match,
    )
    pairs = {}
    for special in tokenizer.rules:
        pattern = [t.text for t in plain(special)]
        for left, right in zip(pattern, pattern[1:]):
            pairs.setdefault(left, set()).add(right)
    joins = {}
    for left, rights in pairs.items():
        joins.setdefault(left[-1:], []).append((left, tuple(sorted(rights))))
    return frozenset(tokenizer.rules), joins


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
        splitter: `"spacy"` (the original's word splitting) or `"regex"`
            (the default here, for vocabularies built in code; `gpt1()` and
            the loaders take the one their files record, spaCy for the
            original files).

    Example:
    ```python
    tokenizer = kgpt.GPTTokenizer.gpt1()  # the original files and algorithm, shipped
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
        if splitter not in SPLITTERS:
            raise ValueError(f"splitter must be 'spacy' or 'regex', got {splitter!r}.")
        if splitter == "spacy":
            _import_spacy()  # fail now, with the install hint, not at the first encode()
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
            encoder = _checked_encoder(encoder)
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
            encoder_json, bpe_merges = _find_files(encoder_json)
        encoder = _read_encoder(encoder_json)
        merges, recorded = _read_merges(bpe_merges, encoder)
        _check_derivable(encoder, merges, encoder_json, bpe_merges)
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
        original formats, so `from_original()`, `load()` and the original
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
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        if isinstance(files, (str, bytes, os.PathLike)):
            raise TypeError(f"files must be a list of paths, got the single path {files!r}: pass [{files!r}].")
        files = [os.fspath(f) for f in files]
        if not files:
            raise ValueError("GPTTokenizer.train() got no files: pass the paths of the text to learn from.")
        num_merges = positive_int(num_merges, "num_merges", minimum=0)
        min_frequency = positive_int(min_frequency, "min_frequency")
        words = TextEncoder({}, [], splitter)

        def texts():
            for path in files:
                after_lt = False
                for chunk in text_chunks(path):
                    yield " ".join(w for w in words.words(chunk, after_lt) if w != "\n")
                    after_lt = after_lt or "<" in chunk

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
        if words.cut_words:
            logger.info(f"Cut {words.cut_words:,} word(s) longer than {MAX_WORD_CHARS:,} characters into pieces.")
        model = json.loads(engine.to_str())["model"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]][:num_merges]
        chars = []  # every character, in the trainer's order, whether seen inside or at the end of words
        for symbol in sorted(model["vocab"], key=model["vocab"].get):
            char = symbol[: -len("</w>")] if symbol.endswith("</w>") else symbol
            if symbol != "<unk>" and len(char) == 1 and char not in chars:
                chars.append(char)
        if not chars:
            raise ValueError(f"GPTTokenizer.train() found no text in {', '.join(files)[:200]}: the files are empty "
                             f"or hold only spaces and newlines.")
        encoder = {"<unk>": 0}
        for symbol in chars + [c + "</w>" for c in chars] + [a + b for a, b in merges] + ["\n</w>"]:
            encoder.setdefault(symbol, len(encoder))
        if len(merges) < num_merges:
            logger.info(f"Learned {len(merges):,} of {num_merges:,} merges: no pair occurs {min_frequency} times any more.")
        tokenizer = cls(encoder, merges, splitter=splitter)
        if directory is not None:
            tokenizer.save(directory)
        return tokenizer

    def save(self, directory):
        """Writes the two files in the original formats (the splitter on the merges file's first line)."""
        self._check_vocabulary()
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise ValueError(f"directory {directory} is a file: the tokenizer's two files are saved into a folder.")
        os.makedirs(directory, exist_ok=True)
        plain = {s: i for s, i in self.encoder.items() if s not in SPECIAL_TOKENS}
        with open(os.path.join(directory, ENCODER_FILE), "w", encoding="utf-8") as f:
            json.dump(plain, f, ensure_ascii=False)
        with open(os.path.join(directory, MERGES_FILE), "w", encoding="utf-8") as f:
            f.write(f"{_HEADER} kgpt-splitter: {self.splitter}\n")
            f.writelines(f"{a} {b}\n" for a, b in self.merges)

    @classmethod
    def load(cls, directory):
        """Reads a tokenizer written by `save()` (or the original files)."""
        return cls.from_original(directory)

    def save_assets(self, dir_path):
        """keras-hub/Keras saving hook: the two BPE files, as `save()` writes them."""
        self.save(dir_path)

    def load_assets(self, dir_path):
        """keras-hub/Keras loading hook: reads the two BPE files of `dir_path` into this tokenizer.

        The splitter stays the one of this tokenizer's config.
        """
        encoder_path, merges_path = os.path.join(dir_path, ENCODER_FILE), os.path.join(dir_path, MERGES_FILE)
        encoder = _read_encoder(encoder_path)
        merges, _ = _read_merges(merges_path, encoder)
        _check_derivable(encoder, merges, encoder_path, merges_path)
        self._set_vocabulary(encoder, merges)
        self._update_special_token_ids()

    @classmethod
    def from_preset(cls, preset, config_file=PRESET_CONFIG, **kwargs):
        """Reads the tokenizer of a local preset folder, or a folder of BPE files.

        A preset holds keras-hub's `tokenizer.json` (written by
        `save_to_preset()`, `GPTCausalLM.save_to_preset()` or
        `kgpt-train --output_dir`; it records the splitter) and
        `assets/tokenizer/`. A folder without `tokenizer.json` is read with
        `from_original()` (the original release's two files, or Hugging Face
        `vocab.json` + `merges.txt`). Nothing is ever downloaded.
        `keras_hub.tokenizers.Tokenizer.from_preset(dir)` also loads a kgpt
        preset that holds a backbone (`config.json`).

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
        if os.path.isfile(preset):
            folder = os.path.dirname(preset) or "."
            raise CheckpointError(f"{preset} is a file: a preset is the folder that holds it; pass "
                                  f"GPTTokenizer.from_preset({folder!r}).")
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

    def save_to_preset(self, preset_dir):
        """Writes `tokenizer.json` and the two BPE files (`assets/tokenizer/`) into the folder `preset_dir`."""
        super().save_to_preset(check_save_target(preset_dir))

    def decode(self, ids):
        """Text from ids; words are joined by single spaces (case is lost)."""
        self._check_vocabulary()
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__") and not hasattr(ids, "__array__"):
            raise TypeError(f"decode() takes a sequence of token ids, got {ids!r:.80}.")
        try:
            array = np.asarray(ids)
        except ValueError:
            raise ValueError("decode() takes one flat sequence of token ids; got rows of different lengths "
                             "(decode each row).") from None
        if array.ndim != 1:
            raise ValueError(f"decode() takes one flat sequence of token ids, got shape {array.shape} (decode each "
                             f"row).")
        if array.size and (array.dtype == object or array.dtype.kind not in "iu"
                           or isinstance(ids, (list, tuple)) and any(isinstance(i, bool) for i in ids)):
            raise TypeError(f"decode() takes integer token ids, got {array.dtype} values ({ids!r:.80}).")
        pieces = []
        for i in array.tolist():
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
    """`(merges, splitter recorded on the first line or None)`; errors name the file and line."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Tokenizer merges file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not a UTF-8 BPE merges file ({e}).") from e
    if not lines[0].startswith("#version"):
        raise CheckpointError(f"{path}:1: expected a '#version' header line in a BPE merges file.")
    recorded = _HEADER_SPLITTER.match(lines[0])
    if recorded and recorded.group(1) not in SPLITTERS:
        raise CheckpointError(f"{path}:1: unknown splitter {recorded.group(1)!r} (expected spacy or regex).")
    while len(lines) > 1 and not lines[-1]:  # the file's final newline(s)
        lines.pop()
    merges = []
    for number, line in enumerate(lines[1:], start=2):
        parts = line.split()
        if len(parts) != 2:
            raise CheckpointError(f"{path}:{number}: expected two symbols separated by a space, got {line!r}.")
        if "".join(parts) not in encoder:
            raise CheckpointError(
                f"{path}:{number}: merge {line!r} makes {''.join(parts)!r}, which the encoder file lacks: "
                f"the two files are from different vocabularies."
            )
        merges.append(tuple(parts))
    return merges, recorded and recorded.group(1)


def _checked_encoder(encoder):
    """A copy of `encoder` after checking it maps strings to the ids 0 .. n-1, each once."""
    if not isinstance(encoder, dict):
        raise TypeError(f"encoder must be a dict of BPE symbols to ids, got {type(encoder).__name__}.")
    encoder = dict(encoder)
    bad = next(((k, v) for k, v in encoder.items() if not isinstance(k, str) or isinstance(v, bool)
                or not isinstance(v, (int, np.integer))), None)
    if bad is not None:
        raise TypeError(f"encoder must map strings to integer ids; it maps {bad[0]!r} to {bad[1]!r}.")
    ids = sorted(int(v) for v in encoder.values())
    if ids != list(range(len(ids))):
        duplicate = next((a for a, b in zip(ids, ids[1:]) if a == b), None)  # sorted: repeats are neighbours
        problem = (f"id {duplicate} is given to more than one symbol" if duplicate is not None else
                   f"its ids run from {ids[0]} to {ids[-1]} with gaps")
        raise ValueError(f"encoder must give each of its {len(ids)} symbols one of the ids 0 .. {len(ids) - 1}: "
                         f"{problem}.")
    return encoder


def _check_derivable(encoder, merges, encoder_path, merges_path):
    """Refuses symbols that no merge makes: a merges file cut short, or one of another vocabulary."""
    made = {a + b for a, b in merges}
    orphans = [s for s in encoder if s not in made and not _is_base_symbol(s)]
    if orphans:
        raise CheckpointError(
            f"{merges_path}:{len(merges) + 1}: the merges end here, after {len(merges):,}, but {len(orphans):,} "
            f"symbol(s) of {encoder_path} come from no merge (e.g. {orphans[0]!r}): the merges file is cut "
            "short, or the two files are from different vocabularies."
        )


def _is_base_symbol(symbol):
    """`<unk>`, a special token, a character, or a character that ends a word."""
    return len(symbol) == 1 or (len(symbol) == 5 and symbol.endswith("</w>")) or symbol in ("<unk>",) + SPECIAL_TOKENS
