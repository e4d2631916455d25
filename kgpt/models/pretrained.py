"""Starting points for fine-tuning: a pre-trained model and its tokenizer, from any format kgpt reads."""

import os

from kgpt.errors import CheckpointError, ConfigError
from kgpt.io import hub
from kgpt.io.presets import check_finished, load_any_backbone
from kgpt.models.converters import original
from kgpt.models.gpt.gpt_backbone import NUM_SPECIAL_TOKENS, GPTBackbone
from kgpt.models.gpt.gpt_tokenizer import GPTTokenizer, read_tokenizer
from kgpt.tokenizers.interface import fits_vocabulary


def with_special_tokens(backbone, tokenizer, seed=None):
    """The backbone, grown by the 3 special tokens when its vocabulary lacks them."""
    if backbone.vocabulary_size == tokenizer.vocabulary_size():
        return backbone
    if backbone.vocabulary_size == tokenizer.vocabulary_size() - NUM_SPECIAL_TOKENS:
        return backbone.with_added_tokens(NUM_SPECIAL_TOKENS, seed=seed)
    raise ValueError(
        f"The backbone has {backbone.vocabulary_size} token embeddings but the tokenizer "
        f"{tokenizer.vocabulary_size()} ids (with start/delimiter/extract); they do not belong together."
    )


def format_of(path):
    """`"original"`, `"huggingface"` or `"preset"`: what the folder `path` holds; `FileNotFoundError` if none."""
    if os.path.isfile(os.path.join(path, original.SHAPES_FILE)):
        return "original"
    if original.is_huggingface(path):
        return "huggingface"
    if not os.path.isfile(os.path.join(path, "config.json")):
        check_finished(path)  # a run's folder before its model is saved is named so
        raise FileNotFoundError(
            f"{path!r} is neither a kgpt preset (config.json; the --output_dir of kgpt-train --task lm) nor "
            f"an original GPT-1 checkpoint ({original.SHAPES_FILE}) nor Hugging Face openai-gpt files "
            f"({original.HF_WEIGHTS_FILE}). (kgpt-train --init scratch fine-tunes without pre-training.)"
        )
    return "preset"


def check_architecture(path, architecture, flag):
    """Raises `ConfigError` naming `flag` when the pre-trained model at `path` (a local folder) is not a
    `"transformer"` or an `"lstm"` as `architecture` says: an ablation's row would be labelled wrongly."""
    from kgpt.io.presets import CONFIG_FILE, read_json

    found = "transformer"
    if format_of(path) == "preset":
        name = read_json(os.path.join(path, CONFIG_FILE), "a backbone's Keras config")
        found = (
            "lstm" if isinstance(name, dict) and str(name.get("registered_name")).endswith("LSTMBackbone") else found
        )
    if found != architecture:
        what = {"lstm": "an LSTM (kgpt-train --task lm --architecture lstm)", "transformer": "a transformer"}
        raise ConfigError(
            f"{flag} {path} is a pre-trained {found}, not {what[architecture]}: its row would be labelled wrongly."
        )


def load_pretrained(path, num_heads=12, dtype=None):
    """`(backbone, tokenizer, description)` from a kgpt preset, the original GPT-1 release or Hugging Face
    openai-gpt files (`num_heads` is only used by the original format, whose shapes cannot tell it).
    `dtype` overrides the saved dtype policy (e.g. `"mixed_bfloat16"`). A Hub preset (`hf://OWNER/REPO`, or a
    named one such as `"gpt1_base_en"`) is downloaded and converted first (`kgpt.io.hub`)."""
    source, path = path, hub.local(path, GPTBackbone)
    kind = format_of(path)
    if kind == "original":
        backbone = GPTBackbone.from_original(path, num_heads=num_heads, dtype=dtype)
        return backbone, GPTTokenizer.from_original(path), f"original checkpoint {path}"
    if kind == "huggingface":
        backbone = GPTBackbone.from_original(path, dtype=dtype)
        return backbone, GPTTokenizer.from_original(path), f"Hugging Face checkpoint {path}"
    backbone = load_any_backbone(path, **({"dtype": dtype} if dtype else {}))
    tokenizer = read_tokenizer(path)
    size = tokenizer.vocabulary_size()
    if not fits_vocabulary(backbone.vocabulary_size, size):
        raise CheckpointError(
            f"{path}: the model has {backbone.vocabulary_size:,} token embeddings but the preset's tokenizer "
            f"{size:,} ids ({size - NUM_SPECIAL_TOKENS:,} without start/delimiter/extract): the tokenizer files "
            f"belong to another model. Save the model's own tokenizer beside it."
        )
    return backbone, tokenizer, f"preset {source}" + (f" ({path})" if source != path else "")
