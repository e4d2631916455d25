"""GPT-1's tokenizer as plain Python (no Keras): text -> ids, fast, with caches; what worker processes run.

The work is cached per whitespace-separated word, so each distinct word is
fixed, split and BPE-encoded once; `ftfy` runs only on lines with characters
it could change (`normalize.fix_text`). `TextEncoder` is also the corpus
encoder of `kgpt.tokenizers.interface` for GPT-1's tokenizer: the shard
builder encodes a file in line-aligned chunks with it, in worker processes
that share what each one learns (`record` / `learn`).
"""

import itertools

from kgpt.checks import one_of
from kgpt.tokenizers.gpt1.bpe import bpe_long, bpe_short
from kgpt.tokenizers.gpt1.normalize import LONG_WORD, MAX_WORD_CHARS, fix_text, pieces
from kgpt.tokenizers.gpt1.splitters import SPLITTERS, WORDS, SpacyRules, starts_with_token
from kgpt.tokenizers.interface import Chunk

_CACHE_WORDS = 1 << 18  # distinct words kept per TextEncoder before its caches start over
_HEAP_BPE_CHARS = 48  # longer words go through the O(n log n) BPE


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
        self.encoder, self.merges, self.splitter = encoder, merges, one_of(splitter, "splitter", SPLITTERS)
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
            self._nlp = SpacyRules()
        return self._nlp

    def _split(self, keys):
        """Words (not lower-cased) of each key: a whitespace-free word or a space-joined group of them."""
        if self.splitter == "spacy":
            return self._spacy().tokens([pieces(key) for key in keys])
        return [WORDS.findall(" ".join(pieces(key))) for key in keys]

    def _edges(self, word):
        """`(first piece, tokens that may follow the word's end in one spaCy special case)` of one word."""
        parts = pieces(word)
        return parts[0], self._spacy().joins(parts[-1])

    @staticmethod
    def _group(words, edges, joiners):
        """Space-joined runs of the words spaCy may read together; the others alone."""
        keys, start = [], 0
        for i in range(1, len(words) + 1):
            if i < len(words) and words[i - 1] in joiners:
                if starts_with_token(edges[words[i]][0], edges[words[i - 1]][1]):
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
        if LONG_WORD.search(text):
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
                lines = [
                    self._group(w, edges, joiners) if len(w) > 1 and not joiners.isdisjoint(w[:-1]) else w
                    for w in lines
                ]
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
                symbols = bpe_long(word, self.bpe_ranks, self.merges)
            else:
                symbols = self.bpe_cache[word] = bpe_short(word, self.bpe_ranks, self.merges)
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

    # --- the corpus encoder (kgpt.tokenizers.interface) ---------------------------

    processes = True  # picklable without its caches, and forks safely: no Keras, no TensorFlow
    cut_label = f"words over {MAX_WORD_CHARS:,} characters"

    @property
    def vocabulary_size(self):
        return len(self.encoder)

    @staticmethod
    def follows(state, text):
        """Whether a chunk after `text` (and the earlier `state`) follows a "<": ftfy stops decoding HTML
        entities after one."""
        return bool(state) or "<" in text

    def encode_chunk(self, text, state=False):
        """A `Chunk` of one piece of a file: its ids and the newlines around its words (see `encode`).

        A file's chunks joined by one newline token wherever whitespace between
        words holds a newline give `encode(whole file)`."""
        fixed = fix_text(text, bool(state))
        cut = self.cut_words
        ids = self.encode_fixed(fixed)
        lead, trail = fixed[: len(fixed) - len(fixed.lstrip())], fixed[len(fixed.rstrip()) :]
        return Chunk(ids, "\n" in lead, "\n" in trail, "\n" in fixed, self.cut_words - cut)


def _add_edges(edges, joiners, new):
    edges.update(new)
    joiners.update(word for word, (_, follows) in new.items() if follows)
