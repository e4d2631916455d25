"""What kgpt needs from a tokenizer, and what the shard builder needs from its corpus encoder.

A tokenizer is a keras-hub `Tokenizer` layer (callable on strings, mapped
over `tf.data`, saved with `save_to_preset(dir)`) that also has:

- `encode(text)` -> a list of int ids (no special token added);
  `decode(ids)` -> text;
- `vocabulary_size()`: ids in use, the added tokens included (the
  backbone's smallest vocabulary);
- `start_id`, `delimiter_id`, `extract_id`: the paper's added tokens that
  frame the task views (`kgpt.tasks.transforms.Layout`); `start_token_id`,
  `end_token_id` (None: GPT-1 has no end-of-text token) and `pad_token_id`
  for keras-hub's packers;
- `fingerprint()`: a short string that changes whenever the ids of some text
  would (token shards built with another tokenizer are rebuilt);
- `corpus_encoder()`: a `CorpusEncoder` (below) that encodes a file's text
  chunk by chunk.

GPT-1's BPE (`kgpt.tokenizers.gpt1`, `kgpt.GPTTokenizer`) and any keras-hub
tokenizer (`kgpt.KerasHubTokenizer`, `kgpt.tokenizers.keras_hub_adapter`) have them.
"""

import collections
import os

from kgpt.checks import shown

# The paper's added tokens that frame the task views (start, delimiter, extract), by these names in every
# kgpt tokenizer; GPT-1's appends them after its vocabulary, in this order.
SPECIAL_TOKENS = ("_start_", "_delimiter_", "_classify_")


def fits_vocabulary(model_size, tokenizer_size):
    """Whether a model of `model_size` token embeddings takes a tokenizer of `tokenizer_size` ids: the same size,
    or, before fine-tuning adds rows for them, the size without the `SPECIAL_TOKENS`."""
    return model_size in (tokenizer_size, tokenizer_size - len(SPECIAL_TOKENS))


PRESET_CONFIG = "tokenizer.json"  # keras-hub's preset layout: the tokenizer's config ...
PRESET_ASSETS = os.path.join("assets", "tokenizer")  # ... and its files

REQUIRED = (
    "encode",
    "decode",
    "vocabulary_size",
    "start_id",
    "delimiter_id",
    "extract_id",
    "fingerprint",
    "corpus_encoder",
    "tokenize",
    "detokenize",
    "save_to_preset",
)


def shared_id(pairs):
    """`(id, first token, second token)` for the first id that `(token, id)` pairs give two tokens, else None."""
    owner = {}
    for token, i in pairs:
        if i in owner and owner[i] != token:
            return i, owner[i], token
        owner[i] = token
    return None


# One encoded chunk of a file. `ids`: its token ids; `starts_line` / `ends_line`:
# whether the whitespace before / after its first / last word holds a newline;
# `has_newline`: whether it holds one at all; `cut_words`: words cut while
# encoding it (the encoder's `cut_label` says what they are).
Chunk = collections.namedtuple("Chunk", "ids starts_line ends_line has_newline cut_words")


class CorpusEncoder:
    """The protocol (documentation; nothing inherits it) of what `kgpt.data.shards` encodes a corpus with.

    Attributes:
        vocabulary_size: the tokenizer's, which sets the shards' integer type.
        newline_id: the id that joins two chunks when whitespace between
            their words holds a newline (GPT-1's tokenizer drops blank lines
            and joins lines with one newline token); None when a file's ids
            are its chunks' ids one after the other.
        processes: whether worker processes may encode chunks (the encoder is
            picklable and safe to use after a fork).
        cut_label: what `Chunk.cut_words` counts, for the build's report.

    Methods:
        follows(state, text): the state a file's next chunk is encoded with,
            after `text` was (the first chunk gets None).
        encode_chunk(text, state): a `Chunk`.
        record() / learn(journal): share what one process worked out with the
            others (return / take None when there is nothing to share).
    """


def check_tokenizer(tokenizer, what="tokenizer"):
    """Raises `TypeError` naming what `tokenizer` lacks of the interface above."""
    missing = [name for name in REQUIRED if not hasattr(type(tokenizer), name) and not hasattr(tokenizer, name)]
    if missing:
        raise TypeError(
            f"{what} must be a kgpt.GPTTokenizer, got {shown(tokenizer, 100)}, which lacks "
            f"{', '.join(missing)} (kgpt.tokenizers.interface; a keras-hub tokenizer goes in "
            f"kgpt.KerasHubTokenizer)."
        )
    return tokenizer
