"""The original GPT-1 release format, and Hugging Face's `openai-gpt` files.

The original release (github.com/openai/finetune-transformer-lm, `model/`)
stores every weight as one float32 vector cut into `params_0.npy` ..
`params_9.npy`; `params_shapes.json` lists the arrays it splits into:

    positions [n_ctx, H], tokens [vocab, H], then for each layer h0..h{L-1}:
    attn/c_attn w [1, H, 3H], b [3H]   query|key|value, heads side by side
    attn/c_proj w [1, H, H], b [H]
    ln_1 g [H], b [H]                  after attention: LN(x + attn(x))
    mlp/c_fc w [1, H, I], b [I]
    mlp/c_proj w [1, I, H], b [H]
    ln_2 g [H], b [H]                  after the MLP: LN(h + mlp(h))

Hugging Face's `model.safetensors` holds the same arrays under names such as
`h.0.attn.c_attn.weight` (Conv1D weights, i.e. `w[0]`). Both load into a
`GPTBackbone` whose forward pass equals the original's equations (checked
against a NumPy implementation of them in the tests), and both are written
back: `save_original` and `save_huggingface`.
"""

import glob
import json
import math
import os
import random
import re

import keras
import numpy as np

from kgpt.io.presets import CheckpointError, read_json
from kgpt.models.decoder_block import GPTDecoderBlock

SHAPES_FILE = "params_shapes.json"
SHARD_PATTERN = "params_{}.npy"
HF_CONFIG_FILE = "config.json"
HF_WEIGHTS_FILE = "model.safetensors"
HF_VOCAB_FILE, HF_MERGES_FILE = "vocab.json", "merges.txt"
HF_ADDED_TOKENS_FILE = "added_tokens.json"
HF_SPECIAL_TOKENS_FILE = "special_tokens_map.json"
HF_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# Files that decide what a directory loads as: ours, plus those that would be read
# instead of them (a fast-tokenizer file, the original format's shapes file).
HF_FILES = (HF_CONFIG_FILE, HF_WEIGHTS_FILE, HF_VOCAB_FILE, HF_MERGES_FILE, HF_ADDED_TOKENS_FILE,
            HF_SPECIAL_TOKENS_FILE, HF_TOKENIZER_CONFIG_FILE, "tokenizer.json", SHAPES_FILE)
ENCODER_FILE, BPE_FILE = "encoder_bpe_40000.json", "vocab_40000.bpe"  # the original release's names
# The start, delimiter and extract tokens that GPTTokenizer appends after the vocabulary.
SPECIAL_TOKENS = ("_start_", "_delimiter_", "_classify_")
LAYER_ARRAYS = (
    "attn/c_attn/w", "attn/c_attn/b", "attn/c_proj/w", "attn/c_proj/b", "ln_1/g", "ln_1/b",
    "mlp/c_fc/w", "mlp/c_fc/b", "mlp/c_proj/w", "mlp/c_proj/b", "ln_2/g", "ln_2/b",
)
HF_LAYER_TENSORS = (  # the same arrays, as Hugging Face's OpenAIGPTModel names them
    "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias", "ln_1.weight", "ln_1.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias", "ln_2.weight", "ln_2.bias",
)


def array_names(num_layers):
    """Names of the original checkpoint's arrays, in file order."""
    return ["positions", "tokens"] + [f"h{i}/{n}" for i in range(num_layers) for n in LAYER_ARRAYS]


def huggingface_names(num_layers):
    """Hugging Face's names of the same arrays, in the original's order."""
    names = ["positions_embed.weight", "tokens_embed.weight"]
    return names + [f"h.{i}.{n}" for i in range(num_layers) for n in HF_LAYER_TENSORS]


def expected_shapes(vocabulary_size, max_sequence_length, hidden_dim, intermediate_dim, num_layers):
    """The original format's array shapes for a model of these sizes."""
    h, i = hidden_dim, intermediate_dim
    layer = [[1, h, 3 * h], [3 * h], [1, h, h], [h], [h], [h], [1, h, i], [i], [1, i, h], [h], [h], [h]]
    return [[max_sequence_length, h], [vocabulary_size, h]] + layer * num_layers


def sizes_from_shapes(shapes, source):
    """Infers the model sizes from the arrays' shapes, checking every one of them."""
    if not isinstance(shapes, list) or not all(
        isinstance(s, list) and all(isinstance(d, int) and d > 0 for d in s) for s in shapes
    ):
        raise CheckpointError(f"{source}: expected a JSON list of shapes (lists of positive integers).")
    if len(shapes) < 14 or (len(shapes) - 2) % len(LAYER_ARRAYS):
        raise CheckpointError(
            f"{source}: {len(shapes)} arrays; a GPT-1 checkpoint has 2 embeddings + "
            f"{len(LAYER_ARRAYS)} per layer (146 for 12 layers)."
        )
    if len(shapes[0]) != 2 or len(shapes[1]) != 2 or len(shapes[8]) != 3:
        raise CheckpointError(f"{source}: expected positions [n_ctx, H], tokens [vocab, H] and c_fc w [1, H, I].")
    sizes = {
        "max_sequence_length": shapes[0][0],
        "vocabulary_size": shapes[1][0],
        "hidden_dim": shapes[1][1],
        "intermediate_dim": shapes[8][2],
        "num_layers": (len(shapes) - 2) // len(LAYER_ARRAYS),
    }
    expected = expected_shapes(**sizes)
    for index, (name, got, want) in enumerate(zip(array_names(sizes["num_layers"]), shapes, expected)):
        if got != want:
            raise CheckpointError(
                f"{source}: array {index} ({name}) has shape {got}, expected {want} for a model of "
                f"hidden size {sizes['hidden_dim']} and inner size {sizes['intermediate_dim']}."
            )
    return sizes


def _check_npy_size(path):
    """Raises `ValueError` when the `.npy` header describes more bytes than the file holds.

    `np.load` allocates what the header says before reading: a corrupt header
    claiming terabytes would be a `MemoryError` rather than a named file.
    """
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read_header:
            return  # version 3 (UTF-8 field names) has no public reader; np.load checks it
        shape, _, dtype = read_header[version](f)
        needed = math.prod(shape) * dtype.itemsize
        held = os.fstat(f.fileno()).st_size - f.tell()
    if needed > held:
        raise ValueError(f"its header describes {dtype} of shape {shape} ({needed:,} bytes), the file holds {held:,}")


def read_shards(directory, shapes):
    """Reads `params_*.npy` (no pickle), concatenates and splits them into `shapes`."""
    paths = []
    while os.path.exists(os.path.join(directory, SHARD_PATTERN.format(len(paths)))):
        paths.append(os.path.join(directory, SHARD_PATTERN.format(len(paths))))
    strays = set(glob.glob(os.path.join(directory, "params_*.npy"))) - set(paths)
    if not paths:
        raise CheckpointError(f"Missing {os.path.join(directory, SHARD_PATTERN.format(0))}: no weight shards found.")
    if strays:
        raise CheckpointError(
            f"{directory}: shards must be numbered params_0.npy .. params_{len(paths) - 1}.npy without gaps; "
            f"{SHARD_PATTERN.format(len(paths))} is missing but {sorted(os.path.basename(p) for p in strays)} exist."
        )
    pieces = []
    for path in paths:
        try:
            _check_npy_size(path)
            piece = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise CheckpointError(f"{path} is not a readable .npy array (truncated or corrupt: {e}).") from e
        if piece.ndim != 1 or not np.issubdtype(piece.dtype, np.floating):
            raise CheckpointError(f"{path}: expected a flat float vector, got {piece.dtype} of shape {piece.shape}.")
        pieces.append(piece.astype("float32", copy=False))
    flat = np.concatenate(pieces)
    needed = sum(int(np.prod(s)) for s in shapes)
    if flat.size != needed:
        raise CheckpointError(
            f"{directory}: the {len(paths)} shard(s) params_0..{len(paths) - 1}.npy hold {flat.size:,} values, "
            f"{SHAPES_FILE} needs {needed:,}. A shard is missing or from another checkpoint "
            f"(the original release has params_0..params_9)."
        )
    ends = np.cumsum([int(np.prod(s)) for s in shapes])[:-1]
    return [part.reshape(shape) for part, shape in zip(np.split(flat, ends), shapes)]


def read_original(directory):
    """Reads an original-format checkpoint: `(sizes, arrays)` in file order."""
    shapes_path = os.path.join(directory, SHAPES_FILE)
    if not os.path.isdir(directory):
        raise CheckpointError(f"No checkpoint directory {directory!r}.")
    shapes = read_json(shapes_path, "the list of array shapes of the original release")
    sizes = sizes_from_shapes(shapes, shapes_path)
    return sizes, read_shards(directory, shapes)


def read_huggingface(directory):
    """Reads Hugging Face `openai-gpt` files: `(sizes, arrays)` in the original order."""
    from safetensors.numpy import load_file

    config_path = os.path.join(directory, HF_CONFIG_FILE)
    config = read_json(config_path, "Hugging Face's openai-gpt config")
    keys = ("n_layer", "n_embd", "n_positions", "vocab_size")
    if not isinstance(config, dict) or any(not isinstance(config.get(k), int) for k in keys):
        raise CheckpointError(f"{config_path}: expected integer {', '.join(keys)} (an openai-gpt config).")
    weights_path = os.path.join(directory, HF_WEIGHTS_FILE)
    if not os.path.isfile(weights_path):
        raise CheckpointError(f"Missing {weights_path}: expected the openai-gpt weights.")
    try:
        tensors = load_file(weights_path)
    except Exception as e:  # safetensors raises its own SafetensorError
        raise CheckpointError(f"{weights_path} is not a readable safetensors file (truncated or corrupt: {e}).") from e
    # Checkpoints saved from the LM-head model prefix names with "transformer.".
    tensors = {re.sub(r"^transformer\.", "", k): v for k, v in tensors.items()}
    # Sizes come from the file before anything is built from the config (a config may lie).
    layers = {int(m.group(1)) for m in map(re.compile(r"^h\.(\d+)\.").match, tensors) if m}
    if config["n_layer"] != len(layers) or layers != set(range(len(layers))):
        raise CheckpointError(f"{config_path} says n_layer={config['n_layer']}, but {weights_path} holds blocks "
                              f"{_ranges(sorted(layers))}.")
    names = huggingface_names(config["n_layer"])
    missing = [n for n in names if n not in tensors]
    if missing:
        raise CheckpointError(
            f"{weights_path}: {len(missing)} expected tensor(s) missing for n_layer={config['n_layer']}, "
            f"e.g. {missing[:3]}."
        )
    # Conv1D weights are [in, out]: the original's w without its leading 1.
    arrays = [np.asarray(tensors[n], "float32") for n in names]
    arrays = [a[None] if n.endswith("weight") and n.startswith("h.") and a.ndim == 2 else a
              for n, a in zip(names, arrays)]
    sizes = sizes_from_shapes([list(a.shape) for a in arrays], weights_path)
    if sizes["vocabulary_size"] != config["vocab_size"] or sizes["hidden_dim"] != config["n_embd"]:
        raise CheckpointError(
            f"{weights_path}: tokens_embed is {list(arrays[1].shape)}, but {config_path} says vocab_size="
            f"{config['vocab_size']}, n_embd={config['n_embd']}."
        )
    return sizes, arrays, config.get("n_head")


def _ranges(numbers):
    """`[0, 1, 2, 5]` -> `"0-2, 5"` (or "none")."""
    if not numbers:
        return "none"
    spans, start = [], numbers[0]
    for a, b in zip(numbers, numbers[1:] + [None]):
        if b != a + 1:
            spans.append(f"{start}-{a}" if a != start else f"{a}")
            start = b
    return ", ".join(spans)


def _check_vocabulary(directory, vocabulary_size):
    """The BPE files beside the weights fit the token embedding: their vocabulary, or it and the three special
    tokens `GPTTokenizer` appends (a fine-tuned model's rows; `added_tokens.json` must then place them likewise)."""
    for name in (ENCODER_FILE, HF_VOCAB_FILE):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        size = len(read_json(path, "the BPE encoder"))
        added = _added_tokens(directory, size)
        allowed = [size + len(added)] if added else [size, size + len(SPECIAL_TOKENS)]
        if vocabulary_size not in allowed:
            raise CheckpointError(
                f"{path} has {size:,} tokens but the checkpoint's token embedding has {vocabulary_size:,} rows "
                f"(expected {' or '.join(f'{n:,}' for n in allowed)}"
                f"{', with ' + HF_ADDED_TOKENS_FILE if added else ''}): the files are from different models."
            )


def _added_tokens(directory, size):
    """Hugging Face's `added_tokens.json`, checked to hold the special tokens where `GPTTokenizer` puts them."""
    path = os.path.join(directory, HF_ADDED_TOKENS_FILE)
    if not os.path.isfile(path):
        return {}
    added = read_json(path, "Hugging Face's added tokens")
    expected = {token: size + i for i, token in enumerate(SPECIAL_TOKENS)}
    if added != expected:
        raise CheckpointError(
            f"{path}: kgpt's tokenizer reads {expected} after the {size:,}-token vocabulary, "
            f"but this file holds {added!r:.200}."
        )
    return added


# --- mapping onto the Keras layers ------------------------------------------

def assign(backbone, arrays):
    """Copies original-order `arrays` into `backbone` (sizes already checked)."""
    h = backbone.hidden_dim
    heads, head_dim = backbone.num_heads, backbone.hidden_dim // backbone.num_heads
    positions, tokens = arrays[0], arrays[1]
    backbone.position_embedding.position_embeddings.assign(positions)
    table = backbone.token_embedding.embeddings
    extra = table.shape[0] - tokens.shape[0]
    if extra:  # new special-token rows keep their N(0, 0.02) initialisation
        tokens = np.concatenate([tokens, keras.ops.convert_to_numpy(table)[tokens.shape[0]:]], axis=0)
    table.assign(tokens)
    for index, block in enumerate(backbone.transformer_layers):
        w = arrays[2 + index * len(LAYER_ARRAYS): 2 + (index + 1) * len(LAYER_ARRAYS)]
        attn_w, attn_b, proj_w, proj_b, ln1_g, ln1_b, fc_w, fc_b, out_w, out_b, ln2_g, ln2_b = w
        for part, dense in enumerate((block.query_dense, block.key_dense, block.value_dense)):
            # Column j of each third belongs to head j // head_dim.
            dense.kernel.assign(attn_w[0, :, part * h:(part + 1) * h].reshape(h, heads, head_dim))
            dense.bias.assign(attn_b[part * h:(part + 1) * h].reshape(heads, head_dim))
        block.attention_output_dense.kernel.assign(proj_w[0].reshape(heads, head_dim, h))
        block.attention_output_dense.bias.assign(proj_b)
        block.attention_layer_norm.gamma.assign(ln1_g)
        block.attention_layer_norm.beta.assign(ln1_b)
        block.feedforward_intermediate_dense.kernel.assign(fc_w[0])
        block.feedforward_intermediate_dense.bias.assign(fc_b)
        block.feedforward_output_dense.kernel.assign(out_w[0])
        block.feedforward_output_dense.bias.assign(out_b)
        block.feedforward_layer_norm.gamma.assign(ln2_g)
        block.feedforward_layer_norm.beta.assign(ln2_b)


def arrays_of(backbone):
    """The backbone's weights as original-order float32 arrays."""
    def np_(v):
        return keras.ops.convert_to_numpy(v).astype("float32")

    h = backbone.hidden_dim
    arrays = [np_(backbone.position_embedding.position_embeddings), np_(backbone.token_embedding.embeddings)]
    for block in backbone.transformer_layers:
        qkv = (block.query_dense, block.key_dense, block.value_dense)
        arrays += [
            np.concatenate([np_(d.kernel).reshape(h, h) for d in qkv], axis=1)[None],
            np.concatenate([np_(d.bias).reshape(h) for d in qkv]),
            np_(block.attention_output_dense.kernel).reshape(h, h)[None],
            np_(block.attention_output_dense.bias),
            np_(block.attention_layer_norm.gamma),
            np_(block.attention_layer_norm.beta),
            np_(block.feedforward_intermediate_dense.kernel)[None],
            np_(block.feedforward_intermediate_dense.bias),
            np_(block.feedforward_output_dense.kernel)[None],
            np_(block.feedforward_output_dense.bias),
            np_(block.feedforward_layer_norm.gamma),
            np_(block.feedforward_layer_norm.beta),
        ]
    return arrays


def load_backbone(cls, directory, num_heads=None, num_special_tokens=0, seed=None, **kwargs):
    """Builds `cls` (a `GPTBackbone`) from an original or Hugging Face checkpoint directory."""
    if os.path.isfile(os.path.join(directory, SHAPES_FILE)):
        sizes, arrays = read_original(directory)
        stored_heads = None
    elif os.path.isfile(os.path.join(directory, HF_WEIGHTS_FILE)):
        sizes, arrays, stored_heads = read_huggingface(directory)
    else:
        raise CheckpointError(
            f"{directory!r} holds neither the original release ({SHAPES_FILE} + params_0..9.npy) nor "
            f"Hugging Face's openai-gpt files ({HF_CONFIG_FILE} + {HF_WEIGHTS_FILE})."
        )
    _check_vocabulary(directory, sizes["vocabulary_size"])
    heads = num_heads or stored_heads or 12
    if sizes["hidden_dim"] % heads:
        raise CheckpointError(
            f"{directory}: hidden size {sizes['hidden_dim']} is not divisible by num_heads={heads}; "
            f"pass the checkpoint's head count (shapes cannot tell it)."
        )
    if num_special_tokens < 0:
        raise ValueError(f"num_special_tokens must be >= 0, got {num_special_tokens}.")
    config = dict(sizes, num_heads=heads, **kwargs)
    config["vocabulary_size"] += num_special_tokens
    backbone = cls(**config)
    if seed is not None and num_special_tokens:
        table = keras.ops.convert_to_numpy(backbone.token_embedding.embeddings)
        table[sizes["vocabulary_size"]:] = special_token_rows(seed, table.shape)[sizes["vocabulary_size"]:]
        backbone.token_embedding.embeddings.assign(table)
    assign(backbone, arrays)
    return backbone


def special_token_rows(seed, shape):
    """The N(0, 0.02) token table `[rows, hidden]` from which `load_backbone(seed=)` takes the new rows.

    They are those kgpt drew when it seeded every global generator with `seed`
    and then built the backbone, whose token embedding took the first seed
    Keras drew from Python's `random` (`randint(1, 1e9)`); now nothing global
    is touched.
    """
    initializer = keras.initializers.RandomNormal(stddev=0.02, seed=random.Random(seed).randint(1, int(1e9)))
    return keras.ops.convert_to_numpy(initializer(shape, dtype="float32"))


# --- writing -------------------------------------------------------------------

def _require_transformer(backbone, what):
    blocks = getattr(backbone, "transformer_layers", None)
    if not blocks or not all(isinstance(block, GPTDecoderBlock) for block in blocks):
        raise TypeError(f"{type(backbone).__name__} has no {what} format: only a GPTBackbone is GPT-1's architecture.")


def _json_bytes(value, indent=None):
    return json.dumps(value, ensure_ascii=False, indent=indent).encode("utf-8")


def _write_atomically(path, data):
    """Writes `data` under a temporary name, then renames: readers never see half a file."""
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def _vocabulary(tokenizer, vocabulary_size):
    """`(encoder without the special tokens, merges, whether the backbone has the special tokens' rows)`."""
    total = tokenizer.vocabulary_size()  # also refuses a tokenizer without a vocabulary
    base = {s: i for s, i in tokenizer.encoder.items() if s not in SPECIAL_TOKENS}
    specials = [tokenizer.encoder.get(t) for t in SPECIAL_TOKENS]
    if specials != list(range(len(base), total)) or vocabulary_size not in (len(base), total):
        raise ValueError(
            f"tokenizer: its {len(base):,} tokens (+ {len(SPECIAL_TOKENS)} special) do not fit the backbone's "
            f"{vocabulary_size:,} token embeddings; pass the tokenizer the model was trained with."
        )
    return base, tokenizer.merges, vocabulary_size == total


def _merges_bytes(merges, splitter):
    # The splitter rides on the header line, which transformers and the original code skip,
    # so that kgpt reads the files back with the word splitter they were made with.
    return (f"#version: 0.2 kgpt-splitter: {splitter}\n" + "".join(f"{a} {b}\n" for a, b in merges)).encode("utf-8")


def huggingface_config(backbone):
    """Hugging Face's `OpenAIGPTConfig` fields for `backbone` (the content of `config.json`)."""
    attention_dropout = backbone.dropout if backbone.attention_dropout is None else backbone.attention_dropout
    return {
        "architectures": ["OpenAIGPTLMHeadModel"],  # the LM head is the tied token embedding, as in kgpt
        "model_type": "openai-gpt",
        "vocab_size": backbone.vocabulary_size,
        "n_positions": backbone.max_sequence_length,
        "n_ctx": backbone.max_sequence_length,
        "n_embd": backbone.hidden_dim,
        "n_layer": backbone.num_layers,
        "n_head": backbone.num_heads,
        "afn": "gelu",  # openai-gpt's "gelu" is the tanh approximation, as kgpt's
        "resid_pdrop": backbone.dropout,
        "embd_pdrop": backbone.dropout,
        "attn_pdrop": attention_dropout,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": getattr(backbone, "initializer_range", 0.02),
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def huggingface_tensors(backbone):
    """`{name: float32 array}` as Hugging Face's `OpenAIGPTModel` state dict holds them."""
    names = huggingface_names(backbone.num_layers)
    # Conv1D weights are [in, out]: the original's w without its leading 1.
    return {n: np.ascontiguousarray(a[0] if a.ndim == 3 else a) for n, a in zip(names, arrays_of(backbone))}


def huggingface_tokenizer_files(tokenizer, vocabulary_size, max_length):
    """`{file name: bytes}` of the tokenizer as Hugging Face's `OpenAIGPTTokenizer` reads it."""
    base, merges, specials = _vocabulary(tokenizer, vocabulary_size)
    unknown = next(s for s, i in base.items() if i == 0)  # kgpt maps unknown symbols to id 0
    files = {HF_VOCAB_FILE: _json_bytes(base), HF_MERGES_FILE: _merges_bytes(merges, tokenizer.splitter)}
    config = {"tokenizer_class": "OpenAIGPTTokenizer", "model_max_length": max_length, "do_lower_case": True,
              "unk_token": unknown}
    if specials:
        added = {token: len(base) + i for i, token in enumerate(SPECIAL_TOKENS)}
        # Both layouts: added_tokens_decoder (current transformers), added_tokens.json + the map (older ones).
        files[HF_ADDED_TOKENS_FILE] = _json_bytes(added, indent=2)
        files[HF_SPECIAL_TOKENS_FILE] = _json_bytes(
            {"unk_token": unknown, "additional_special_tokens": list(SPECIAL_TOKENS)}, indent=2)
        config["additional_special_tokens"] = list(SPECIAL_TOKENS)
        config["added_tokens_decoder"] = {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": True}
            for t, i in added.items()
        }
    files[HF_TOKENIZER_CONFIG_FILE] = _json_bytes(config, indent=2)
    return files


def _stale_files(directory):
    """Files an earlier export left that would be replaced, or read instead of this one."""
    present = [n for n in HF_FILES if os.path.exists(os.path.join(directory, n))]
    if SHAPES_FILE in present:
        present += sorted(os.path.basename(p) for p in glob.glob(os.path.join(directory, "params_*.npy")))
    return present


def save_huggingface(backbone, directory, tokenizer=None, overwrite=False):
    """Writes `backbone` (and `tokenizer`) as Hugging Face `openai-gpt` files; `load_backbone` reads them back.

    `config.json` + `model.safetensors` (float32, the `OpenAIGPTModel` names),
    with a tokenizer `vocab.json` + `merges.txt` + `tokenizer_config.json`
    (+ the special tokens as added tokens when the backbone has their rows).
    Every file is written under a temporary name and renamed; files of an
    earlier export (or an original-format checkpoint) are refused unless
    `overwrite`, which replaces them and removes those this export has no
    counterpart for.

    Example:
    ```python
    kgpt.models.original.save_huggingface(backbone, "hf_out", tokenizer=kgpt.GPTTokenizer.gpt1())
    ```
    """
    from safetensors.numpy import save as safetensors_bytes

    _require_transformer(backbone, "Hugging Face openai-gpt")
    if backbone.intermediate_dim != 4 * backbone.hidden_dim:
        raise ValueError(
            f"Hugging Face's openai-gpt has an inner size of 4 x hidden ({4 * backbone.hidden_dim}); this backbone's "
            f"intermediate_dim is {backbone.intermediate_dim}. Use format='original', which stores any size."
        )
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory} is a file: pass a directory to write the checkpoint into.")
    stale = _stale_files(directory) if os.path.isdir(directory) else []
    if stale and not overwrite:
        raise FileExistsError(
            f"{directory} already holds {', '.join(stale[:8])}{' ...' if len(stale) > 8 else ''}: "
            f"pass overwrite=True to replace them, or choose an empty directory."
        )
    files = {HF_WEIGHTS_FILE: safetensors_bytes(huggingface_tensors(backbone), metadata={"format": "pt"})}
    if tokenizer is not None:
        files.update(huggingface_tokenizer_files(tokenizer, backbone.vocabulary_size, backbone.max_sequence_length))
    files[HF_CONFIG_FILE] = _json_bytes(huggingface_config(backbone), indent=2)
    os.makedirs(directory, exist_ok=True)
    # The config goes last: config.json + model.safetensors make a complete checkpoint.
    for name, data in files.items():
        _write_atomically(os.path.join(directory, name), data)
    for name in stale:
        if name not in files:
            os.remove(os.path.join(directory, name))


def save_original(backbone, directory, num_shards=10, tokenizer=None):
    """Writes `backbone` as `params_shapes.json` + `params_0..{num_shards-1}.npy` (and the tokenizer's two files)."""
    _require_transformer(backbone, "original GPT-1")
    tokenizer_files = {}
    if tokenizer is not None:  # checked before anything is written
        base, merges, _ = _vocabulary(tokenizer, backbone.vocabulary_size)
        tokenizer_files = {ENCODER_FILE: _json_bytes(base), BPE_FILE: _merges_bytes(merges, tokenizer.splitter)}
    arrays = arrays_of(backbone)
    os.makedirs(directory, exist_ok=True)
    # Old shards would be read as part of the new checkpoint; the shapes file goes first.
    shapes_path = os.path.join(directory, SHAPES_FILE)
    for stale in ([shapes_path] if os.path.exists(shapes_path) else []) + glob.glob(
        os.path.join(directory, "params_*.npy")
    ):
        os.remove(stale)
    for name, data in tokenizer_files.items():
        _write_atomically(os.path.join(directory, name), data)
    flat = np.concatenate([a.ravel() for a in arrays])
    for index, shard in enumerate(np.array_split(flat, num_shards)):
        np.save(os.path.join(directory, SHARD_PATTERN.format(index)), shard)
    # Written last: a directory with the shapes file is a complete checkpoint.
    with open(os.path.join(directory, SHAPES_FILE), "w", encoding="utf-8") as f:
        json.dump([list(a.shape) for a in arrays], f)
