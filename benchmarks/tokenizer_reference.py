"""Reference token ids of a text, line by line, from an independent implementation of GPT-1's tokenizer.

The reference is Hugging Face's `OpenAIGPTTokenizer` from transformers < 5,
whose Python tokenizer runs the original `text_utils.py` pipeline (ftfy,
`text_standardize`, spaCy's English tokenizer, lower-case, BPE). It is no
dependency of kgpt; install it in a throwaway environment:

    python -m venv --system-site-packages /tmp/tokref
    /tmp/tokref/bin/pip install "transformers<5" ftfy spacy
    /tmp/tokref/bin/python benchmarks/tokenizer_reference.py            # tests/data/prose_ids.json
    /tmp/tokref/bin/python benchmarks/tokenizer_reference.py --text corpus.txt --out corpus_ids.json

Two encodings are recorded per line: `_tokenize()`, the original algorithm,
which kgpt reproduces, and the public `tokenize()`, which first lower-cases
the text (transformers' `do_lower_case`) and so changes spaCy's splits of
abbreviations ("Dr." -> "dr" "."), a step the original does not have. Only
the lines where the two differ are stored for the second. kgpt is not
imported: the vocabulary files are read from kgpt/assets/gpt1_bpe.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = os.path.join(ROOT, "kgpt", "assets", "gpt1_bpe")


def reference_tokenizer():
    import transformers
    from transformers.models.openai.tokenization_openai import OpenAIGPTTokenizer

    tokenizer = OpenAIGPTTokenizer(
        os.path.join(ASSETS, "encoder_bpe_40000.json"), os.path.join(ASSETS, "vocab_40000.bpe")
    )
    if getattr(tokenizer, "fix_text", None) is None:
        sys.exit(
            f"transformers {transformers.__version__} has no ftfy + spaCy path: install transformers<5, ftfy, spacy."
        )
    return tokenizer, transformers.__version__


def versions():
    import ftfy
    import spacy

    return f"ftfy {ftfy.__version__}, spaCy {spacy.__version__}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--text", default=os.path.join(ROOT, "tests", "data", "prose.txt"), help="UTF-8 text file")
    parser.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "prose_ids.json"))
    args = parser.parse_args()
    tokenizer, version = reference_tokenizer()
    with open(args.text, encoding="utf-8", newline="") as f:  # newline="": a "\r" stays in its line
        lines = f.read().split("\n")
    original, public = [], {}
    for number, line in enumerate(lines):
        ids = tokenizer.convert_tokens_to_ids(tokenizer._tokenize(line))
        original.append(ids)
        lowered = tokenizer.encode(line, add_special_tokens=False)
        if lowered != ids:
            public[number] = lowered
    data = {
        "text": os.path.relpath(args.text, ROOT),
        "reference": f"transformers {version} OpenAIGPTTokenizer ({versions()})",
        "lines": original,
        "public_tokenize_differs": public,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))
        f.write("\n")
    print(f"{len(lines)} lines -> {args.out}; the public tokenize() differs on {len(public)} of them.")


if __name__ == "__main__":
    main()
