"""GPT-1's text normalisation, before words are split: ftfy, dashes, runs of punctuation, over-long words.

As in the original `text_utils.py`: `ftfy.fix_text`; standardise dashes and
ellipses; space out runs of punctuation. `fix_text` runs ftfy only on the
lines it could change; `pieces` is the original's standardisation of one
whitespace-free word. Words longer than `MAX_WORD_CHARS` are cut into pieces
of that length (counted by the encoder), because spaCy's and BPE's time grows
faster than linearly with a word's length.
"""

import re

import ftfy

MAX_WORD_CHARS = 1000  # longer runs of non-space characters are cut into pieces (counted)

LONG_WORD = re.compile(rf"\S{{{MAX_WORD_CHARS + 1}}}")
_PUNCT_RUNS = re.compile(r"""(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\\+|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)""")
_DASHES = str.maketrans({"\u2014": "-", "\u2013": "-", "\u2015": "-", "\u2026": "...", "\u00b4": "'"})
# Lines made only of these characters are ones ftfy.fix_text leaves alone
# apart from straightening curly quotes and turning "\r\n" into "\n":
# printable ASCII without "&" (HTML entities), tab, line ends, dashes, ellipsis
# and curly quotes. None of them can start a UTF-8 sequence, so no mojibake
# fix applies (the tests check this against ftfy itself).
_FTFY_NEEDED = re.compile(r"[^\t\n\r\x20-\x25\x27-\x7e\u2013\u2014\u2018\u2019\u201c\u201d\u2026]|\r(?!\n)")
_UNCURL = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def pieces(word):
    """The original's standardisation of one whitespace-free word, split at the spaces it adds."""
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
