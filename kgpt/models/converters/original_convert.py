"""A `GPTBackbone` from and to the original GPT-1 release's and Hugging Face's `openai-gpt` files.

`kgpt.models.converters.original` reads and checks the files' arrays; here they are
mapped onto the Keras layers (`assign`, `arrays_of`), loaded as a backbone
(`load_backbone`) and written back (`save_original`, `save_huggingface`),
each file under a temporary name first.
"""

import glob
import json
import os

import keras
import numpy as np

from kgpt import checks
from kgpt.errors import CheckpointError
from kgpt.io import storage
from kgpt.layers.decoder_block import GPTDecoderBlock
from kgpt.models.converters.original import (
    BPE_FILE,
    ENCODER_FILE,
    HF_ADDED_TOKENS_FILE,
    HF_CONFIG_FILE,
    HF_FILES,
    HF_MERGES_FILE,
    HF_SPECIAL_TOKENS_FILE,
    HF_TF_WEIGHTS_FILE,
    HF_TOKENIZER_CONFIG_FILE,
    HF_VOCAB_FILE,
    HF_WEIGHTS_FILE,
    LAYER_ARRAYS,
    SHAPES_FILE,
    SHARD_PATTERN,
    SPECIAL_TOKENS,
    check_vocabulary,
    huggingface_names,
    is_huggingface,
    read_huggingface,
    read_original,
)

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
        tokens = np.concatenate([tokens, keras.ops.convert_to_numpy(table)[tokens.shape[0] :]], axis=0)
    table.assign(tokens)
    for index, block in enumerate(backbone.transformer_layers):
        w = arrays[2 + index * len(LAYER_ARRAYS) : 2 + (index + 1) * len(LAYER_ARRAYS)]
        attn_w, attn_b, proj_w, proj_b, ln1_g, ln1_b, fc_w, fc_b, out_w, out_b, ln2_g, ln2_b = w
        for part, dense in enumerate((block.query_dense, block.key_dense, block.value_dense)):
            # Column j of each third belongs to head j // head_dim.
            dense.kernel.assign(attn_w[0, :, part * h : (part + 1) * h].reshape(h, heads, head_dim))
            dense.bias.assign(attn_b[part * h : (part + 1) * h].reshape(heads, head_dim))
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
    elif is_huggingface(directory):
        sizes, arrays, stored_heads = read_huggingface(directory)
    else:
        raise CheckpointError(
            f"{directory!r} holds neither the original release ({SHAPES_FILE} + params_0..9.npy) nor "
            f"Hugging Face's openai-gpt files ({HF_CONFIG_FILE} + {HF_WEIGHTS_FILE} or {HF_TF_WEIGHTS_FILE})."
        )
    check_vocabulary(directory, sizes["vocabulary_size"])
    heads = num_heads or stored_heads or 12
    if sizes["hidden_dim"] % heads:
        raise CheckpointError(
            f"{directory}: hidden size {sizes['hidden_dim']} is not divisible by num_heads={heads}; "
            f"pass the checkpoint's head count (shapes cannot tell it)."
        )
    checks.positive_int(num_special_tokens, "num_special_tokens", minimum=0)
    config = dict(sizes, num_heads=heads, **kwargs)
    config["vocabulary_size"] += num_special_tokens
    backbone = cls(**config)
    if seed is not None and num_special_tokens:
        table = keras.ops.convert_to_numpy(backbone.token_embedding.embeddings)
        table[sizes["vocabulary_size"] :] = new_token_rows(
            num_special_tokens, sizes["hidden_dim"], backbone.initializer_range, seed
        )
        backbone.token_embedding.embeddings.assign(table)
    assign(backbone, arrays)
    return backbone


def new_token_rows(num_rows, hidden_dim, stddev, seed):
    """`[num_rows, hidden_dim]` float32 embedding rows for added tokens, drawn from N(0, `stddev`).

    NumPy's generator seeded with `seed` (None: fresh entropy) draws them:
    no global random state is touched.
    """
    return np.random.default_rng(seed).normal(0.0, stddev, (num_rows, hidden_dim)).astype("float32")


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
        with storage.naming(path), open(temporary, "wb") as f:
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
    config = {
        "tokenizer_class": "OpenAIGPTTokenizer",
        "model_max_length": max_length,
        "do_lower_case": True,
        "unk_token": unknown,
    }
    if specials:
        added = {token: len(base) + i for i, token in enumerate(SPECIAL_TOKENS)}
        # Both layouts: added_tokens_decoder (current transformers), added_tokens.json + the map (older ones).
        files[HF_ADDED_TOKENS_FILE] = _json_bytes(added, indent=2)
        files[HF_SPECIAL_TOKENS_FILE] = _json_bytes(
            {"unk_token": unknown, "additional_special_tokens": list(SPECIAL_TOKENS)}, indent=2
        )
        config["additional_special_tokens"] = list(SPECIAL_TOKENS)
        config["added_tokens_decoder"] = {
            str(i): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
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
    kgpt.models.converters.original_convert.save_huggingface(backbone, "hf_out", tokenizer=kgpt.GPTTokenizer.gpt1())
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
        with storage.naming(os.path.join(directory, SHARD_PATTERN.format(index))):
            np.save(os.path.join(directory, SHARD_PATTERN.format(index)), shard)
    # Written last: a directory with the shapes file is a complete checkpoint.
    with storage.naming(shapes_path), open(shapes_path, "w", encoding="utf-8") as f:
        json.dump([list(a.shape) for a in arrays], f)
