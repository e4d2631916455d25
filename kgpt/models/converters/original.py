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
back: `kgpt.models.converters.original_convert` maps the arrays read here onto the
Keras layers and writes a backbone's weights in either format.
"""

import glob
import math
import os
import re

import numpy as np

from kgpt.checks import shown
from kgpt.errors import CheckpointError
from kgpt.io.presets import read_json

SHAPES_FILE = "params_shapes.json"
SHARD_PATTERN = "params_{}.npy"
HF_CONFIG_FILE = "config.json"
HF_WEIGHTS_FILE = "model.safetensors"
HF_TF_WEIGHTS_FILE = "tf_model.h5"  # transformers' TensorFlow weights: read where a repository has no safetensors
HF_VOCAB_FILE, HF_MERGES_FILE = "vocab.json", "merges.txt"
HF_ADDED_TOKENS_FILE = "added_tokens.json"
HF_SPECIAL_TOKENS_FILE = "special_tokens_map.json"
HF_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# Files that decide what a directory loads as: ours, plus those that would be read
# instead of them (a fast-tokenizer file, the original format's shapes file).
HF_FILES = (
    HF_CONFIG_FILE,
    HF_WEIGHTS_FILE,
    HF_VOCAB_FILE,
    HF_MERGES_FILE,
    HF_ADDED_TOKENS_FILE,
    HF_SPECIAL_TOKENS_FILE,
    HF_TOKENIZER_CONFIG_FILE,
    "tokenizer.json",
    SHAPES_FILE,
)
ENCODER_FILE, BPE_FILE = "encoder_bpe_40000.json", "vocab_40000.bpe"  # the original release's names
# The start, delimiter and extract tokens that GPTTokenizer appends after the vocabulary.
SPECIAL_TOKENS = ("_start_", "_delimiter_", "_classify_")
LAYER_ARRAYS = (
    "attn/c_attn/w",
    "attn/c_attn/b",
    "attn/c_proj/w",
    "attn/c_proj/b",
    "ln_1/g",
    "ln_1/b",
    "mlp/c_fc/w",
    "mlp/c_fc/b",
    "mlp/c_proj/w",
    "mlp/c_proj/b",
    "ln_2/g",
    "ln_2/b",
)
HF_LAYER_TENSORS = (  # the same arrays, as Hugging Face's OpenAIGPTModel names them
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_1.weight",
    "ln_1.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
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


def weight_count(vocabulary_size, max_sequence_length, hidden_dim, intermediate_dim, num_layers, **_):
    """The weights of the original release's arrays (`expected_shapes`) for these sizes: as many as a
    `GPTBackbone`'s (`GPTBackbone.min_weight_count`, tests/test_original.py).

    Computed from one layer's shapes, so an absurd `num_layers` (a tampered
    config) costs nothing. Other config entries (`num_heads`, ...) are ignored.
    """
    shapes = [
        math.prod(s)
        for s in expected_shapes(vocabulary_size, max_sequence_length, hidden_dim, intermediate_dim, num_layers=1)
    ]
    return sum(shapes[:2]) + num_layers * sum(shapes[2:])


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


def shard_paths(directory):
    """The checkpoint's `params_0.npy`, `params_1.npy`, ..., refused when none exist or the numbering has a gap."""
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
    return paths


def open_shard(path):
    """One `.npy` shard, memory-mapped (only its header is read now; no pickle), checked to be a flat float vector.

    A header that describes more bytes than the file holds fails here, naming
    them, rather than as a `MemoryError` or a short read later.
    """
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version in read_header:  # version 3 (UTF-8 field names) has no public reader: np.load checks it
                shape, _, dtype = read_header[version](f)
                needed, held = math.prod(shape) * dtype.itemsize, os.fstat(f.fileno()).st_size - f.tell()
                if needed > held:
                    raise ValueError(
                        f"its header describes {dtype} of shape {shape} ({needed:,} bytes), the file holds {held:,}"
                    )
        piece = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise CheckpointError(f"{path} is not a readable .npy array (truncated or corrupt: {e}).") from e
    if piece.ndim != 1 or not np.issubdtype(piece.dtype, np.floating):
        raise CheckpointError(f"{path}: expected a flat float vector, got {piece.dtype} of shape {piece.shape}.")
    return piece


def open_shards(directory, shapes):
    """The memory-mapped `params_*.npy` vectors (`open_shard`), checked to hold the numbers of `shapes`' arrays."""
    paths = shard_paths(directory)
    shards = [open_shard(path) for path in paths]
    held, needed = sum(shard.size for shard in shards), sum(math.prod(s) for s in shapes)
    if held != needed:
        raise CheckpointError(
            f"{directory}: the {len(paths)} shard(s) params_0..{len(paths) - 1}.npy hold {held:,} values, "
            f"{SHAPES_FILE} needs {needed:,}. A shard is missing or from another checkpoint "
            f"(the original release has params_0..params_9)."
        )
    return shards


def read_shards(directory, shapes):
    """Reads `params_*.npy` (no pickle), concatenates and splits them into float32 arrays of `shapes`."""
    flat = np.concatenate([shard.astype("float32", copy=False) for shard in open_shards(directory, shapes)])
    ends = np.cumsum([math.prod(s) for s in shapes])[:-1]
    return [part.reshape(shape) for part, shape in zip(np.split(flat, ends), shapes)]


def read_shapes(directory):
    """An original-format checkpoint's `(sizes, shapes)` from `params_shapes.json`, every shape checked."""
    shapes_path = os.path.join(directory, SHAPES_FILE)
    if not os.path.isdir(directory):
        raise CheckpointError(f"No checkpoint directory {directory!r}.")
    shapes = read_json(shapes_path, "the list of array shapes of the original release")
    return sizes_from_shapes(shapes, shapes_path), shapes


def read_original(directory):
    """Reads an original-format checkpoint: `(sizes, arrays)` in file order."""
    sizes, shapes = read_shapes(directory)
    return sizes, read_shards(directory, shapes)


def is_huggingface(directory):
    """Whether `directory` holds transformers' openai-gpt weights, in either format kgpt reads."""
    return any(os.path.isfile(os.path.join(directory, name)) for name in (HF_WEIGHTS_FILE, HF_TF_WEIGHTS_FILE))


def read_huggingface(directory):
    """Reads Hugging Face `openai-gpt` files: `(sizes, arrays)` in the original order."""
    from safetensors.numpy import load_file

    config_path = os.path.join(directory, HF_CONFIG_FILE)
    config = read_json(config_path, "Hugging Face's openai-gpt config")
    keys = ("n_layer", "n_embd", "n_positions", "vocab_size")
    if not isinstance(config, dict) or any(not isinstance(config.get(k), int) for k in keys):
        raise CheckpointError(f"{config_path}: expected integer {', '.join(keys)} (an openai-gpt config).")
    weights_path = os.path.join(directory, HF_WEIGHTS_FILE)
    if os.path.isfile(weights_path):
        try:
            tensors = load_file(weights_path)
        except Exception as e:  # safetensors raises its own SafetensorError
            raise CheckpointError(
                f"{weights_path} is not a readable safetensors file (truncated or corrupt: {e})."
            ) from e
    elif os.path.isfile(os.path.join(directory, HF_TF_WEIGHTS_FILE)):
        weights_path = os.path.join(directory, HF_TF_WEIGHTS_FILE)
        tensors = read_tf_weights(weights_path)
    else:
        raise CheckpointError(
            f"Missing {weights_path}: expected the openai-gpt weights ({HF_WEIGHTS_FILE}, or {HF_TF_WEIGHTS_FILE})."
        )
    # Checkpoints saved from the LM-head model prefix names with "transformer.".
    tensors = {re.sub(r"^transformer\.", "", k): v for k, v in tensors.items()}
    # Sizes come from the file before anything is built from the config (a config may lie).
    layers = {int(m.group(1)) for m in map(re.compile(r"^h\.(\d+)\.").match, tensors) if m}
    if config["n_layer"] != len(layers) or layers != set(range(len(layers))):
        raise CheckpointError(
            f"{config_path} says n_layer={config['n_layer']}, but {weights_path} holds blocks "
            f"{_ranges(sorted(layers))}."
        )
    names = huggingface_names(config["n_layer"])
    missing = [n for n in names if n not in tensors]
    if missing:
        raise CheckpointError(
            f"{weights_path}: {len(missing)} expected tensor(s) missing for n_layer={config['n_layer']}, "
            f"e.g. {missing[:3]}."
        )
    # Conv1D weights are [in, out]: the original's w without its leading 1.
    arrays = [np.asarray(tensors[n], "float32") for n in names]
    arrays = [
        a[None] if n.endswith("weight") and n.startswith("h.") and a.ndim == 2 else a for n, a in zip(names, arrays)
    ]
    sizes = sizes_from_shapes([list(a.shape) for a in arrays], weights_path)
    if sizes["vocabulary_size"] != config["vocab_size"] or sizes["hidden_dim"] != config["n_embd"]:
        raise CheckpointError(
            f"{weights_path}: tokens_embed is {list(arrays[1].shape)}, but {config_path} says vocab_size="
            f"{config['vocab_size']}, n_embd={config['n_embd']}."
        )
    return sizes, arrays, config.get("n_head")


# transformers' TF names (TFOpenAIGPTMainLayer) -> its PyTorch names: `h_._3/attn/c_attn/weight:0` -> `h.3.attn.c_attn.weight`.
_TF_NAMES = (
    (re.compile(r"(?:^|/)tokens_embed/weight:0$"), lambda m: "tokens_embed.weight"),
    (re.compile(r"(?:^|/)positions_embed/embeddings:0$"), lambda m: "positions_embed.weight"),
    (
        re.compile(r"(?:^|/)h_\._(\d+)/((?:attn|mlp)/c_\w+)/(weight|bias):0$"),
        lambda m: f"h.{m[1]}.{m[2].replace('/', '.')}.{m[3]}",
    ),
    (
        re.compile(r"(?:^|/)h_\._(\d+)/(ln_[12])/(gamma|beta):0$"),
        lambda m: f"h.{m[1]}.{m[2]}.{'weight' if m[3] == 'gamma' else 'bias'}",
    ),
)


def read_tf_weights(path):
    """The tensors of transformers' `tf_model.h5` (an HDF5 file of arrays, no pickle) under the PyTorch names."""
    import h5py

    tensors = {}
    try:
        with h5py.File(path, "r") as f:

            def visit(name, obj):
                if not isinstance(obj, h5py.Dataset):
                    return
                for pattern, rename in _TF_NAMES:
                    match = pattern.search(name)
                    if match:
                        # TFConv1D keeps its bias as [1, n]: the PyTorch layout drops the 1.
                        value = obj[()]
                        tensors[rename(match)] = value.reshape(-1) if name.endswith("bias:0") else value
                        return

            f.visititems(visit)
    except OSError as e:
        raise CheckpointError(f"{path} is not a readable HDF5 file (truncated or corrupt: {e}).") from e
    return tensors


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


def check_vocabulary(directory, vocabulary_size):
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
            f"but this file holds {shown(added, 200)}."
        )
    return added
