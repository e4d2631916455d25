"""Learning a GPT-1-style BPE vocabulary from text files, in the original's layout.

Text goes through the same normalisation and word splitting as encoding;
the merges are learned by the Hugging Face `tokenizers` BPE trainer (Rust)
with the original's `</w>` end-of-word marker. The vocabulary is laid out
as the original: `<unk>` = 0, the characters, the characters + `</w>`, one
symbol per merge in rank order, then `\\n</w>`.
"""

import json
import logging
import os

from kgpt.checks import positive_int
from kgpt.data.text import text_chunks
from kgpt.tokenizers.gpt1.encoder import TextEncoder
from kgpt.tokenizers.gpt1.normalize import MAX_WORD_CHARS

logger = logging.getLogger(__name__)


def learn_vocabulary(files, num_merges=40000, min_frequency=2, splitter="regex"):
    """`(encoder, merges)` learned from `files` (see `GPTTokenizer.train`, which documents the arguments)."""
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
        raise ValueError(
            f"GPTTokenizer.train() found no text in {', '.join(files)[:200]}: the files are empty "
            f"or hold only spaces and newlines."
        )
    encoder = {"<unk>": 0}
    for symbol in chars + [c + "</w>" for c in chars] + [a + b for a, b in merges] + ["\n</w>"]:
        encoder.setdefault(symbol, len(encoder))
    if len(merges) < num_merges:
        logger.info(f"Learned {len(merges):,} of {num_merges:,} merges: no pair occurs {min_frequency} times any more.")
    return encoder, merges
