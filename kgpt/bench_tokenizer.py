"""How often the dependency-free word splitter agrees with the original's exact path.

    pip install "kgpt[exact]"          # ftfy + spaCy, for the reference
    python -m kgpt.bench_tokenizer                      # Python's own documentation (real English)
    python -m kgpt.bench_tokenizer --files 'books/*.txt'

Encodes every paragraph of the text twice with the GPT-1 vocabulary: with
`splitter="regex"` and with `splitter="spacy"` (ftfy + spaCy's English
tokenizer, as the original `text_utils.py`). Prints the share of paragraphs
encoded identically, the share of tokens that agree (difflib alignment),
both throughputs, and the most frequent disagreements. The default text is
the English prose of Python's bundled documentation (`pydoc_data`), which
every machine has.
"""

import collections
import difflib
import glob
import re
import time

from absl import app, flags

flags.DEFINE_string("files", None, "Glob of UTF-8 text files (default: Python's bundled documentation).")
flags.DEFINE_integer("max_paragraphs", 20000, "Paragraphs to compare at most.")
flags.DEFINE_integer("examples", 12, "Disagreements to print.")
FLAGS = flags.FLAGS


def paragraphs():
    if FLAGS.files:
        texts = [open(p, encoding="utf-8").read() for p in sorted(glob.glob(FLAGS.files))]
    else:
        from pydoc_data import topics

        texts = list(topics.topics.values())
    found = [p.strip() for text in texts for p in re.split(r"\n\s*\n", text) if p.strip()]
    return found[: FLAGS.max_paragraphs]


def main(argv):
    import kgpt

    regex = kgpt.GPTTokenizer.gpt1()
    exact = kgpt.GPTTokenizer.gpt1(splitter="spacy")
    texts = paragraphs()
    timings, encoded = {}, {}
    for name, tokenizer in (("regex", regex), ("spacy", exact)):
        start = time.perf_counter()
        encoded[name] = [tokenizer.encode(t) for t in texts]
        timings[name] = time.perf_counter() - start
    same = sum(a == b for a, b in zip(encoded["regex"], encoded["spacy"]))
    matched = total = 0
    differences = collections.Counter()
    for text, a, b in zip(texts, encoded["regex"], encoded["spacy"]):
        total += max(len(a), len(b))
        if a == b:
            matched += len(a)
            continue
        wa, wb = regex.words(text), exact.words(text)
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, wa, wb, autojunk=False).get_opcodes():
            if tag != "equal":
                differences[(" ".join(wa[i1:i2]), " ".join(wb[j1:j2]))] += 1
        blocks = difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
        matched += sum(block.size for block in blocks)
    tokens = sum(len(a) for a in encoded["spacy"])
    print(f"{len(texts):,} paragraphs, {tokens:,} tokens (exact path)")
    print(f"identical encodings: {same / len(texts):.2%} of paragraphs; "
          f"tokens in agreement: {matched / total:.2%}")
    print(f"throughput: regex {sum(map(len, encoded['regex'])) / timings['regex']:,.0f} tokens/s, "
          f"spacy {tokens / timings['spacy']:,.0f} tokens/s")
    print("most frequent disagreements (regex words -> spaCy words):")
    for (a, b), n in differences.most_common(FLAGS.examples):
        print(f"  {n:6,}  {a!r} -> {b!r}")


if __name__ == "__main__":
    app.run(main)
