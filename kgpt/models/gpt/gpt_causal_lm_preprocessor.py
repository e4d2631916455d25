"""Raw text -> `GPTCausalLM` inputs: tokenize, pack to a fixed length, shift for next-token targets."""

import os

import keras
import numpy as np
from keras_hub.models import CausalLMPreprocessor

from kgpt.checks import positive_int
from kgpt.io import hub
from kgpt.io.presets import CONFIG_FILE, PREPROCESSOR_CONFIG_FILE, check_preset_dir, check_save_target, read_json
from kgpt.models.gpt.gpt_backbone import GPTBackbone
from kgpt.models.gpt.gpt_tokenizer import GPTTokenizer, read_tokenizer
from kgpt.tokenizers.interface import check_tokenizer


@keras.saving.register_keras_serializable(package="kgpt")
class GPTCausalLMPreprocessor(CausalLMPreprocessor):
    """GPT-1 causal LM preprocessing, the keras-hub way.

    Calling the layer on strings gives `(x, y, sample_weight)`: `x` holds
    `token_ids` and `padding_mask` `[batch, sequence_length]` (right-padded
    with id 0), `y` the next token at each position and `sample_weight` 1
    where that target is a real token. GPT-1's language model was trained on
    running text with no beginning- or end-of-text token, so none is added
    by default; `add_start_token=True` prepends the fine-tuning `_start_`
    token (paper section 3.3). There is no end token to add.
    `generate_preprocess()` / `generate_postprocess()` are what
    `GPTCausalLM.generate()` runs on text.

    Works eagerly on Python strings and mapped over a `tf.data.Dataset`
    (the tokenizer runs its exact Python algorithm through `tf.py_function`
    there), on every backend.

    Args:
        tokenizer: a `kgpt.GPTTokenizer` (or another kgpt tokenizer, `kgpt.tokenizers.interface`).
        sequence_length: packed length; at most the model's
            `max_sequence_length` (GPT-1: 512).
        add_start_token: prepend `_start_`.
        add_end_token: must stay False (GPT-1 has no end token).

    Example:
    ```python
    preprocessor = kgpt.GPTCausalLMPreprocessor(kgpt.GPTTokenizer.gpt1(), sequence_length=8)
    x, y, sample_weight = preprocessor(["The keeper climbed the tower.", "Hi"])
    x["token_ids"].shape  # (2, 8)

    ds = tf.data.Dataset.from_tensor_slices(["The keeper", "Hi"]).batch(2)
    ds = ds.map(preprocessor)  # (x, y, sample_weight) batches for fit()
    ```
    """

    backbone_cls = GPTBackbone
    tokenizer_cls = GPTTokenizer

    def __init__(self, tokenizer, sequence_length=512, add_start_token=False, add_end_token=False, **kwargs):
        if add_end_token:
            raise ValueError(
                "GPT-1 has no end-of-text token, so add_end_token must be False (GPTTokenizer.end_token_id is None)."
            )
        check_tokenizer(tokenizer)
        sequence_length = positive_int(sequence_length, "sequence_length")
        super().__init__(
            tokenizer=tokenizer,
            sequence_length=sequence_length,
            add_start_token=add_start_token,
            add_end_token=add_end_token,
            **kwargs,
        )

    def call(self, x, y=None, sample_weight=None, sequence_length=None):
        if y is not None:
            raise ValueError(
                "GPTCausalLMPreprocessor makes the targets from the text itself (each next token), so it "
                "takes no y: leave it out."
            )
        if isinstance(x, (list, tuple)) and not x:
            raise ValueError("GPTCausalLMPreprocessor got no texts: x is empty.")
        sequence_length = positive_int(sequence_length, "sequence_length", allow_none=True)
        return super().call(x, sample_weight=sample_weight, sequence_length=sequence_length)

    def generate_preprocess(self, x, sequence_length=None):
        """Prompts -> right-padded `{"token_ids", "padding_mask"}` for `generate()`.

        `_start_` leads only with `add_start_token=True` (keras-hub's base
        class always adds its start token here). Eagerly, a prompt with no
        token, or one that fills `sequence_length` (leaving nothing to
        generate), is an error.
        """
        sequence_length = positive_int(sequence_length, "sequence_length", minimum=2, allow_none=True)
        if isinstance(x, (list, tuple)) and not x:
            raise ValueError("generate() got no prompts.")
        if not self.built:
            self.build(None)
        token_ids, padding_mask = self.packer(
            self.tokenizer(x),
            sequence_length=sequence_length,
            add_start_value=self.add_start_token,
            add_end_value=False,
        )
        outputs = {"token_ids": token_ids, "padding_mask": padding_mask}
        if not self._use_tf_workflow():
            mask = np.asarray(keras.ops.convert_to_numpy(outputs["padding_mask"])).astype(bool)
            length = mask.shape[-1]
            counts = mask.reshape(-1, length).sum(-1)
            if (counts == 0).any():
                raise ValueError("generate() needs at least one token in every prompt; a prompt has none.")
            if (counts == length).any():
                raise ValueError(
                    f"A prompt has {length} or more tokens, leaving no room to generate within max_length={length}."
                )
        return outputs

    def save_to_preset(self, preset_dir):
        """Writes `preprocessor.json` and the tokenizer's files into the folder `preset_dir`."""
        super().save_to_preset(check_save_target(preset_dir))

    @classmethod
    def from_preset(cls, preset, config_file=PREPROCESSOR_CONFIG_FILE, **kwargs):
        """The preprocessor of a preset: a local folder, `hf://OWNER/REPO[@REVISION]` or a named preset.

        Reads `preprocessor.json` when the preset has one; otherwise builds
        one around the preset's tokenizer, with `sequence_length` the
        backbone's `max_sequence_length` when `config.json` is there.
        `kwargs` override the saved config (e.g. `sequence_length`).
        """
        preset = os.fspath(hub.local(preset, cls.tokenizer_cls.backbone_cls))
        if os.path.isfile(os.path.join(preset, config_file)):
            config = check_preset_dir(preset, config_file, cls)
            config["config"].update(kwargs)
            preprocessor = keras.saving.deserialize_keras_object(config, safe_mode=True)
            preprocessor.load_preset_assets(preset)
            return preprocessor
        if "tokenizer" not in kwargs:
            kwargs["tokenizer"] = read_tokenizer(preset)
        backbone_config = os.path.join(preset, CONFIG_FILE)
        if "sequence_length" not in kwargs and os.path.isfile(backbone_config):
            length = read_json(backbone_config, "a backbone config").get("config", {}).get("max_sequence_length")
            if isinstance(length, int):
                kwargs["sequence_length"] = length
        return cls(**kwargs)
