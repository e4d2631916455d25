"""GPT-1's two word splitters: spaCy's English tokenizer rules (the original's) and a regular expression.

`splitter="spacy"` is the original's (spaCy's English tokenizer rules; no
model is downloaded), which `gpt1()`, `from_original()` and the original
files use. `splitter="regex"` (`WORDS`) follows spaCy's rules for the common
cases (punctuation, `n't` and `'s`-style clitics) but not its exception list
(e.g. "Mrs."), faster on words seen for the first time, the default of
vocabularies learned with `train()`.
"""

import functools
import importlib
import re

SPLITTERS = ("spacy", "regex")

# Alternatives in order, after spaCy's English rules: newline; "can|not"; the
# "do|n't" and "it|'s" clitics; dotted abbreviations and names ("u.s.",
# "e.g.", "x.format") and initials ("j."); numbers; words; runs of "." "-"
# "~" "/" "|", which spaCy keeps whole; any other symbol alone ("_" too).
WORDS = re.compile(
    r"\n|\bcan(?=not\b)|(?<=can)not\b|[^\W\d_]+(?=n't\b)|n't\b|'(?:s|m|d|ll|re|ve)\b"
    r"|[^\W\d_]+(?:\.[^\W\d_]+)+\.?|\b[^\W\d_]\.(?=\s|$)"
    r"|\d+(?:[.,:]\d+)*|[^\W_]+|\.\.+|-+|~+|/+|\|+|[^\w\s]|_",
    re.IGNORECASE,
)


def import_spacy():
    try:
        return importlib.import_module("spacy")
    except ImportError as e:
        raise ImportError("splitter='spacy' needs spaCy, a kgpt dependency: pip install 'spacy>=3.7,<4'") from e


class SpacyRules:
    """spaCy's English tokenizer (rules only, no model download) and the pairs its special cases can join."""

    def __init__(self):
        self.tokenizer = import_spacy().blank("en").tokenizer
        self.rules, self._joins = special_cases()

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


def starts_with_token(piece, tokens):
    """Whether `piece` may start with one of `tokens` as a whole spaCy token."""
    return any(piece.startswith(t) and not _inside_run(piece, len(t)) for t in tokens)


@functools.cache
def special_cases():
    """`(special-case strings, {last character: [(token, tokens that may follow it), ...]})` of spaCy's English.

    spaCy matches a special case against the tokens its prefix, suffix and
    infix rules make of it, across spaces too; these are its adjacent pairs.
    """
    tokenizer = import_spacy().blank("en").tokenizer
    plain = type(tokenizer)(
        tokenizer.vocab,
        rules={},
        prefix_search=tokenizer.prefix_search,
        suffix_search=tokenizer.suffix_search,
        infix_finditer=tokenizer.infix_finditer,
        token_match=tokenizer.token_match,
        url_match=tokenizer.url_match,
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
