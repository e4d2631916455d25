"""Reading the tokenizer of a folder, whichever kind it holds."""

import os

from kgpt.io.presets import read_json
from kgpt.tokenizers.gpt1.tokenizer import GPT1Tokenizer
from kgpt.tokenizers.interface import PRESET_CONFIG
from kgpt.tokenizers.keras_hub_adapter import KerasHubTokenizer

_WRAPPER = "kgpt>KerasHubTokenizer"


def load_tokenizer(path, gpt1_cls=GPT1Tokenizer):
    """The tokenizer in the folder `path`; nothing is downloaded.

    A `tokenizer.json` of another keras-hub tokenizer than kgpt's GPT-1 BPE
    (any that `save_to_preset` wrote, or kgpt's `KerasHubTokenizer`) gives a
    `KerasHubTokenizer`; a kgpt GPT-1 preset, or a folder of the original
    release's (or Hugging Face's) BPE files, gives `gpt1_cls.from_preset(path)`.
    """
    path = os.fspath(path)
    config_path = os.path.join(path, PRESET_CONFIG)
    if os.path.isfile(config_path):
        config = read_json(config_path, "a tokenizer config")
        name = config.get("registered_name") if isinstance(config, dict) else None
        # kgpt's own names stay with the GPT-1 loader, which explains a config it cannot read.
        if isinstance(name, str) and (name == _WRAPPER or not name.startswith("kgpt>")):
            return KerasHubTokenizer.from_preset(path)
    return gpt1_cls.from_preset(path)
