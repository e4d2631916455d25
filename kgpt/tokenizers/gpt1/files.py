"""GPT-1's vocabulary files: the original release's two files (or Hugging Face's), read with checks and written.

`encoder_bpe_40000.json` maps each BPE symbol to its id (0 .. n-1);
`vocab_40000.bpe` lists the merges in rank order after a `#version` line,
on which kgpt also records the word splitter ("#version: 0.2 kgpt-splitter:
regex": the original reads the file from its second line on). Errors name
the file and line.
"""

import json
import os
import re

import numpy as np

from kgpt import checks
from kgpt.errors import CheckpointError, RepeatedKeyError
from kgpt.io import storage
from kgpt.tokenizers.gpt1.splitters import SPLITTERS
from kgpt.tokenizers.interface import PRESET_ASSETS, PRESET_CONFIG, SPECIAL_TOKENS, shared_id

ENCODER_FILE = "encoder_bpe_40000.json"
MERGES_FILE = "vocab_40000.bpe"
_HEADER = "#version: 0.2"
_HEADER_SPLITTER = re.compile(r"#version:[^\n]*?\bkgpt-splitter: *(\w+)")


def write_files(directory, encoder, merges, splitter):
    """Writes the two files in the original formats (the splitter on the merges file's first line)."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(f"directory {directory} is a file: the tokenizer's two files are saved into a folder.")
    os.makedirs(directory, exist_ok=True)
    plain = {s: i for s, i in encoder.items() if s not in SPECIAL_TOKENS}
    encoder_path, merges_path = os.path.join(directory, ENCODER_FILE), os.path.join(directory, MERGES_FILE)
    with storage.naming(encoder_path), open(encoder_path, "w", encoding="utf-8") as f:
        json.dump(plain, f, ensure_ascii=False)
    with storage.naming(merges_path), open(merges_path, "w", encoding="utf-8") as f:
        f.write(f"{_HEADER} kgpt-splitter: {splitter}\n")
        f.writelines(f"{a} {b}\n" for a, b in merges)


def read_files(encoder_path, merges_path):
    """`(encoder, merges, splitter recorded or None)` of the two files, checked to belong together."""
    encoder = read_encoder(encoder_path)
    merges, recorded = read_merges(merges_path, encoder)
    check_derivable(encoder, merges, encoder_path, merges_path)
    return encoder, merges, recorded


# The original release's names, then Hugging Face's for the same two files (openai-gpt).
_FILE_PAIRS = ((ENCODER_FILE, MERGES_FILE), ("vocab.json", "merges.txt"))


def holds_bpe_files(directory):
    """Whether the folder holds GPT-1's two BPE files under either pair of names."""
    return any(os.path.isfile(os.path.join(directory, encoder)) for encoder, _ in _FILE_PAIRS)


def find_files(directory):
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"No tokenizer in {directory!r}: no such folder (a tokenizer is a local folder of files, or a Hub preset "
            f"loaded with from_preset)."
        )
    for encoder, merges in _FILE_PAIRS:
        if os.path.isfile(os.path.join(directory, encoder)):
            return os.path.join(directory, encoder), os.path.join(directory, merges)
    raise FileNotFoundError(
        f"No tokenizer in {directory!r}: expected {ENCODER_FILE} + {MERGES_FILE} (the original release or "
        f"a kgpt preset's {PRESET_ASSETS}/), {PRESET_CONFIG} (a kgpt preset) or vocab.json + merges.txt "
        f"(Hugging Face openai-gpt)."
    )


def read_encoder(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Tokenizer encoder file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            encoder = json.load(f, object_pairs_hook=checks.unique_keys)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not a JSON encoder file ({e}).") from e
    except RepeatedKeyError as e:
        raise CheckpointError(f"{path}: the token {e.args[0]!r} is given twice.") from None
    if not isinstance(encoder, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in encoder.items()):
        raise CheckpointError(f"{path}: expected a JSON object mapping BPE symbols to integer ids.")
    if sorted(encoder.values()) != list(range(len(encoder))):
        shared = shared_id(encoder.items())
        raise CheckpointError(
            f"{path}: ids must be exactly 0..{len(encoder) - 1}, each used once"
            + (f"; id {shared[0]} is given to two tokens, {shared[1]!r} and {shared[2]!r}." if shared else ".")
        )
    return encoder


def read_merges(path, encoder):
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
    merges, made, lines_of = [], set(), {}
    for number, line in enumerate(lines[1:], start=2):
        parts = line.split()
        where = f"{path}:{number}: merge {checks.shown(line)}"
        if len(parts) != 2:
            raise CheckpointError(
                f"{path}:{number}: expected two symbols separated by a space, got {checks.shown(line)}."
            )
        if "".join(parts) not in encoder:
            raise CheckpointError(
                f"{where} makes {checks.shown(''.join(parts))}, which the encoder file lacks: the two files are "
                f"from different vocabularies."
            )
        # BPE builds each symbol from characters and earlier merges' symbols (GPT-1's files do): a part that
        # is neither never occurs, so the merge is dead and its symbol a token no text encodes to; so is a merge
        # given twice.
        unmade = next((p for p in parts if p not in made and not is_base_symbol(p)), None)
        if unmade is not None:
            raise CheckpointError(
                f"{where} joins {checks.shown(unmade)}, which no earlier merge makes: the merges are out of order, "
                f"or edited."
            )
        if tuple(parts) in lines_of:
            raise CheckpointError(f"{where} is line {lines_of[tuple(parts)]}'s again.")
        lines_of[tuple(parts)] = number
        made.add("".join(parts))
        merges.append(tuple(parts))
    return merges, recorded and recorded.group(1)


def checked_encoder(encoder):
    """A copy of `encoder` after checking it maps strings to the ids 0 .. n-1, each once."""
    if not isinstance(encoder, dict):
        raise TypeError(f"encoder must be a dict of BPE symbols to ids, got {type(encoder).__name__}.")
    encoder = dict(encoder)
    bad = next(
        (
            (k, v)
            for k, v in encoder.items()
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, np.integer))
        ),
        None,
    )
    if bad is not None:
        raise TypeError(f"encoder must map strings to integer ids; it maps {bad[0]!r} to {bad[1]!r}.")
    ids = sorted(int(v) for v in encoder.values())
    if ids != list(range(len(ids))):
        duplicate = next((a for a, b in zip(ids, ids[1:]) if a == b), None)  # sorted: repeats are neighbours
        problem = (
            f"id {duplicate} is given to more than one symbol"
            if duplicate is not None
            else f"its ids run from {ids[0]} to {ids[-1]} with gaps"
        )
        raise ValueError(
            f"encoder must give each of its {len(ids)} symbols one of the ids 0 .. {len(ids) - 1}: {problem}."
        )
    return encoder


def check_derivable(encoder, merges, encoder_path, merges_path):
    """Refuses symbols that no merge makes: a merges file cut short, or one of another vocabulary."""
    made = {a + b for a, b in merges}
    orphans = [s for s in encoder if s not in made and not is_base_symbol(s)]
    if orphans:
        raise CheckpointError(
            f"{merges_path}:{len(merges) + 1}: the merges end here, after {len(merges):,}, but {len(orphans):,} "
            f"symbol(s) of {encoder_path} come from no merge (e.g. {orphans[0]!r}): the merges file is cut "
            "short, or the two files are from different vocabularies."
        )


def is_base_symbol(symbol):
    """`<unk>`, a special token, a character, or a character that ends a word."""
    return len(symbol) == 1 or (len(symbol) == 5 and symbol.endswith("</w>")) or symbol in ("<unk>",) + SPECIAL_TOKENS
