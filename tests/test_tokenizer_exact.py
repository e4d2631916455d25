"""GPTTokenizer.gpt1() against the original algorithm, and the shortcuts it takes checked against ftfy and spaCy."""

import json
import os
import random
import re
import string

import ftfy
import pytest
import spacy

import kgpt
from kgpt.tokenizers.gpt1.encoder import TextEncoder
from kgpt.tokenizers.gpt1.normalize import MAX_WORD_CHARS, fix_text
from kgpt.tokenizers.gpt1.normalize import pieces as word_pieces
from kgpt.tokenizers.gpt1.splitters import special_cases

DATA = os.path.join(os.path.dirname(__file__), "data")


def standardize(text):
    """The original release's `text_standardize` (text_utils.py), as written there: the reference."""
    text = text.replace("\u2014", "-").replace("\u2013", "-").replace("\u2015", "-").replace("\u2026", "...")
    text = text.replace("\u00b4", "'")
    text = re.sub(r"""(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\\+|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)""", r" \1 ", text)
    text = re.sub(r"\s*\n\s*", " \n ", text)
    text = re.sub(r"[^\S\n]+", " ", text)
    return text.strip()


@pytest.fixture(scope="module")
def gpt1():
    return kgpt.GPTTokenizer.gpt1()


@pytest.fixture(scope="module")
def prose():
    """Lines of tests/data/prose.txt (written for kgpt) and their reference ids.

    benchmarks/tokenizer_reference.py wrote the ids with Hugging Face's
    OpenAIGPTTokenizer (ftfy + spaCy), an implementation independent of kgpt.
    """
    with open(os.path.join(DATA, "prose.txt"), encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    with open(os.path.join(DATA, "prose_ids.json"), encoding="utf-8") as f:
        reference = json.load(f)
    assert len(reference["lines"]) == len(lines), "prose.txt changed: rerun benchmarks/tokenizer_reference.py"
    return lines, reference


def test_gpt1_encodes_every_line_as_the_original(gpt1, prose):
    lines, reference = prose
    different = [(n, line) for n, (line, ids) in enumerate(zip(lines, reference["lines"])) if gpt1.encode(line) != ids]
    assert not different, f"{len(different)} of {len(lines)} lines differ, e.g. {different[:3]}"


def test_the_reference_public_tokenize_lower_cases_first(gpt1, prose):
    # transformers' tokenize() lower-cases the text before ftfy and spaCy (its
    # do_lower_case), which the original does not: spaCy then splits "Dr."
    # and "U.S." differently. Every such line is explained by that step alone.
    lines, reference = prose
    differs = reference["public_tokenize_differs"]
    assert len(differs) > 10
    for number, ids in differs.items():
        line = lines[int(number)]
        assert gpt1.encode("".join(c.lower() for c in line)) == ids, line


def test_the_regex_splitter_differs_on_abbreviations_only_in_part(prose):
    lines, reference = prose
    regex = kgpt.GPTTokenizer.gpt1(splitter="regex")
    same = sum(regex.encode(line) == ids for line, ids in zip(lines, reference["lines"]))
    assert 0.7 * len(lines) < same < len(lines)


SAFE = "\t\n !\"#$%'()*+,-./0123456789:;<=>?@ABCXYZabcxyz[\\]^_`{|}~\u2013\u2014\u2018\u2019\u201c\u201d\u2026"
TRICKY = [
    "&amp;",
    "&lt;",
    "<b>",
    "\r",
    "\r\n",
    "\u2028",
    "\x1b[31m",
    "\x00",
    "\x07",
    "\u00e9",
    "e\u0301",
    "\u00a0",
    "\u00c3\u00a9",
    "\u00e2\u20ac\u2122",
    "\ufb01",
    "\uff21",
    "\u201e",
    "\u00b4",
    "\ufeff",
    "\u0085",
]


def test_fix_text_equals_ftfy():
    rng = random.Random(0)
    for trial in range(3000):
        pool = list(SAFE) + ["\r\n"] if trial % 2 else list(SAFE) + TRICKY
        pieces = [rng.choice(pool) for _ in range(rng.randint(0, 40))]
        if trial % 3 == 0:
            pieces.insert(rng.randint(0, len(pieces)), rng.choice(TRICKY))
        text = "".join(pieces)
        assert fix_text(text) == ftfy.fix_text(text), repr(text)
    # After a line holding "<", ftfy decodes no more HTML entities, in this text or (after_lt) in a later chunk.
    first, second = "Tom &amp; <b>Jerry</b>\n", "Fish &amp; chips \u00e9\n"
    assert fix_text(first + second) == ftfy.fix_text(first + second)
    assert fix_text(first) + fix_text(second, after_lt=True) == ftfy.fix_text(first + second)
    assert fix_text(second) == ftfy.fix_text(second) == "Fish & chips \u00e9\n"


def test_standardize_is_the_original_per_word():
    rng = random.Random(1)
    alphabet = "ab.-!?,;\"'()[]{}/\\*+_|~\u2014\u2013\u2015\u2026\u00b4 \n\t"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        words = TextEncoder({}, [], "regex").lines(text)
        expected = [line.split(" ") for line in standardize(text).split(" \n ")] if standardize(text) else []
        assert [[p for key in keys for p in word_pieces(key)] for keys in words] == expected, repr(text)


def test_spacy_keeps_plain_ascii_words_whole():
    # The shortcut TextEncoder takes for ASCII letters, checked on spaCy itself.
    tokenizer = spacy.blank("en").tokenizer
    rules, joins = special_cases()
    with open(os.path.join(os.path.dirname(kgpt.__file__), "assets", "gpt1_bpe", "encoder_bpe_40000.json")) as f:
        words = {w[:-4] for w in json.load(f) if w.endswith("</w>")}
    rng = random.Random(2)
    words |= {w.upper() for w in words} | {w.capitalize() for w in words}
    words |= {"".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(1, 12))) for _ in range(5000)}
    plain = sorted(w for w in words if w.isascii() and w.isalpha() and w not in rules)
    assert len(plain) > 50_000
    assert [t.text for t in tokenizer(" ".join(plain))] == plain
    letters = [
        (left, right)
        for pairs in joins.values()
        for left, rights in pairs
        for right in rights
        if left.isalpha() and right.isalpha()
    ]
    assert not letters  # no special case spans two all-letter tokens


def test_words_that_spacy_reads_together_are_grouped():
    # spaCy's special cases match across spaces; one that spans two words
    # blocks the ones it overlaps ("goin ''x": "goin '" keeps "''" apart).
    # Texts built to do that, and runs of special-case pieces, checked
    # against spaCy on the whole standardised text.
    tokenizer = spacy.blank("en").tokenizer
    plain = type(tokenizer)(
        tokenizer.vocab,
        rules={},
        prefix_search=tokenizer.prefix_search,
        suffix_search=tokenizer.suffix_search,
        infix_finditer=tokenizer.infix_finditer,
        token_match=tokenizer.token_match,
        url_match=tokenizer.url_match,
    )
    rules, joins = special_cases()
    starting = {}  # first token of a special case -> the special cases
    for rule in sorted(rules):  # sorted: a frozenset's order changes with PYTHONHASHSEED
        if not any(c.isspace() for c in rule):
            starting.setdefault(plain(rule)[0].text, []).append(rule)
    pairs = [(left, right) for ends in joins.values() for left, rights in ends for right in rights if right in starting]
    pieces = sorted(
        {
            p
            for rule in rules
            for p in (rule, rule[:1], rule[1:], rule[:-1], rule[-1:])
            if p and not any(c.isspace() for c in p)
        }
    )
    encoder = TextEncoder({}, [], "spacy")
    rng = random.Random(3)
    context = 0  # texts where spaCy on each word alone gives other tokens
    for trial in range(4000):
        if trial % 2:
            left, right = rng.choice(pairs)
            text = left + " " + rng.choice(starting[right]) + rng.choice(["", "x", " x", "."])
        else:
            text = " ".join("".join(rng.choice(pieces) for _ in range(rng.randint(1, 2))) for _ in range(3))
        expected = [t.text.lower() for t in tokenizer(standardize(ftfy.fix_text(text)))]
        assert encoder.words(text) == expected, repr(text)
        alone = [t.text.lower() for word in text.split() for t in tokenizer(standardize(ftfy.fix_text(word)))]
        context += alone != expected
    assert context > 5


def test_words_and_encode_agree(gpt1, prose):
    lines, _ = prose
    text = "\n".join(lines)
    ids = [
        i
        for word in gpt1.words(text)
        for i in ([gpt1.encoder["\n</w>"]] if word == "\n" else [gpt1.encoder.get(s, 0) for s in gpt1.bpe(word)])
    ]
    assert gpt1.encode(text) == ids


def test_caches_start_over_without_changing_ids(gpt1, prose, monkeypatch):
    import kgpt.tokenizers.gpt1.encoder as tokenizer_module

    lines, reference = prose
    small = kgpt.GPTTokenizer.gpt1()
    monkeypatch.setattr(tokenizer_module, "_CACHE_WORDS", 300)
    for line, ids in zip(lines, reference["lines"]):
        assert small.encode(line) == ids
    assert len(small.text_encoder.word_ids) <= 300 + max(len(line.split()) for line in lines)
    assert MAX_WORD_CHARS == 1000
