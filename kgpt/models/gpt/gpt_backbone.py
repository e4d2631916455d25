"""The GPT-1 decoder: token ids in, last hidden states out.

Paper section 3.1/4.1, checked against the original release: learned
position embeddings, post-layer-norm blocks (`h = LN(x + attn(x))`,
`out = LN(h + mlp(h))`, epsilon 1e-5), tanh-approximated GELU, N(0, 0.02)
initialisation (`initializer_range`) and dropout 0.1 on embeddings, attention weights and residuals.
There is no final layer norm (that is GPT-2).
"""

import collections
import math
import os
import shutil

import keras
import numpy as np
from keras import ops
from keras_hub.layers import PositionEmbedding, ReversibleEmbedding
from keras_hub.models import Backbone

from kgpt import checks
from kgpt.io import hub
from kgpt.io.presets import PresetMixin
from kgpt.layers.decoder_block import GPTDecoderBlock
from kgpt.layers.dropout import Dropout
from kgpt.layers.lora import LoraMixin
from kgpt.models.converters import original, original_convert

# The paper's model (section 4.1). Vocabulary: 40,000 merges + 478 base symbols.
GPT1_CONFIG = {
    "vocabulary_size": 40478,
    "num_layers": 12,
    "num_heads": 12,
    "hidden_dim": 768,
    "intermediate_dim": 3072,
    "max_sequence_length": 512,
    "dropout": 0.1,
}

# The constructor's size arguments: positive integers.
_SIZES = ("vocabulary_size", "num_layers", "num_heads", "hidden_dim", "intermediate_dim", "max_sequence_length")

# start, delimiter, extract (paper section 3.3), appended after the vocabulary.
NUM_SPECIAL_TOKENS = 3


def normal_initializer(stddev=0.02):
    """The paper's initialisation, N(0, `stddev`), for kgpt's backbones' kernels and embeddings."""
    return keras.initializers.RandomNormal(stddev=stddev)


class AddedTokensMixin:
    """`with_added_tokens` for backbones with a `token_embedding` and a flat config."""

    def with_added_tokens(self, num_tokens=NUM_SPECIAL_TOKENS, seed=None):
        """Returns a copy with `num_tokens` new embedding rows after the vocabulary.

        Every existing weight is copied; the new rows (ids `vocabulary_size`
        onwards, e.g. start/delimiter/extract for fine-tuning) are drawn from
        N(0, 0.02) as in the original fine-tuning code (N(0, `initializer_range`)
        for a backbone that has one). `self` is unchanged.

        Example:
        ```python
        tuned = backbone.with_added_tokens(3)
        tuned.vocabulary_size == backbone.vocabulary_size + 3  # True
        ```
        """
        checks.positive_int(num_tokens, "num_tokens", minimum=0)
        config = self.get_config()
        config["vocabulary_size"] = self.vocabulary_size + num_tokens
        grown = type(self).from_config(config)
        old = keras.ops.convert_to_numpy(self.token_embedding.embeddings)
        new_rows = original_convert.new_token_rows(
            num_tokens, self.hidden_dim, getattr(self, "initializer_range", 0.02), seed
        )
        table = np.concatenate([old, new_rows.astype(old.dtype)], axis=0)
        for src, dst in zip(self.layers, grown.layers):
            if src is self.token_embedding:
                dst.embeddings.assign(table)
            else:
                dst.set_weights(src.get_weights())
        return grown


@keras.saving.register_keras_serializable(package="kgpt")
class GPTBackbone(AddedTokensMixin, LoraMixin, PresetMixin, Backbone):
    """The GPT-1 transformer decoder as a Keras functional model.

    Maps `{"token_ids", "padding_mask"}` (both `[batch, length]`) to the last
    layer's hidden states `[batch, length, hidden_dim]`. Attention is causal
    and `padding_mask` (1 = real token) also hides padded keys. Positions are
    absolute from 0, as in the original, so pad on the right: the states at
    real positions are then exactly those of the unpadded sequence.

    Args:
        vocabulary_size: int. Rows of the token embedding (tied to the LM head).
        num_layers: int. Number of transformer blocks.
        num_heads: int. Attention heads per block.
        hidden_dim: int. Width of the residual stream.
        intermediate_dim: int. Width of the feed-forward inner layer.
        max_sequence_length: int. Context length (learned positions).
        dropout: float. Embedding, attention and residual dropout.
        attention_dropout: optional float. Dropout on the attention
            probabilities when it should differ from `dropout`. 0 lets Keras
            run attention through `keras.ops.dot_product_attention` (flash
            attention where the device has it) in training too; the paper
            uses 0.1 (`None`: same as `dropout`).
        initializer_range: float. Standard deviation of the normal
            initialisation of every embedding and kernel (biases start at 0,
            layer-norm gains at 1). The paper's 0.02 suits its width of 768;
            a narrow model trained briefly with the post-LN blocks stays at
            the unigram loss for hundreds of steps with it, and starts
            learning from context far sooner with about `hidden_dim**-0.5`
            (README, "A recipe for a CPU").
        dtype: optional dtype policy, e.g. `"mixed_bfloat16"`.

    Example:
    ```python
    import numpy as np
    import kgpt

    backbone = kgpt.GPTBackbone(
        vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=16,
    )
    x = {"token_ids": np.ones((1, 8), "int32"),
         "padding_mask": np.ones((1, 8), "int32")}
    backbone(x).shape  # (1, 8, 16)
    ```
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        max_sequence_length=512,
        dropout=0.1,
        attention_dropout=None,
        initializer_range=0.02,
        dtype=None,
        **kwargs,
    ):
        checks.model_kwargs(kwargs, type(self).__name__)
        # Checked values: NumPy integers and floats become Python ones, for Keras' layers and a JSON config.
        checked = GPTBackbone.check_config(
            {
                "vocabulary_size": vocabulary_size,
                "num_layers": num_layers,
                "num_heads": num_heads,
                "hidden_dim": hidden_dim,
                "intermediate_dim": intermediate_dim,
                "max_sequence_length": max_sequence_length,
                "dropout": dropout,
                "attention_dropout": attention_dropout,
                "initializer_range": initializer_range,
                "dtype": dtype,
            }
        )
        vocabulary_size, num_layers, num_heads, hidden_dim, intermediate_dim, max_sequence_length = (
            checked[k] for k in _SIZES
        )
        dropout, attention_dropout, initializer_range = (
            checked[k] for k in ("dropout", "attention_dropout", "initializer_range")
        )
        # === Layers ===
        self.token_embedding = ReversibleEmbedding(
            input_dim=vocabulary_size,
            output_dim=hidden_dim,
            embeddings_initializer=normal_initializer(initializer_range),
            dtype=dtype,
            name="token_embedding",
        )
        self.position_embedding = PositionEmbedding(
            sequence_length=max_sequence_length,
            initializer=normal_initializer(initializer_range),
            dtype=dtype,
            name="position_embedding",
        )
        self.embeddings_add = keras.layers.Add(dtype=dtype, name="embeddings_add")
        self.embeddings_dropout = Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        self.transformer_layers = [
            GPTDecoderBlock(
                num_heads=num_heads,
                intermediate_dim=intermediate_dim,
                dropout=dropout,
                attention_dropout=attention_dropout,
                layer_norm_epsilon=1e-5,
                kernel_initializer=normal_initializer(initializer_range),
                dtype=dtype,
                name=f"transformer_layer_{i}",
            )
            for i in range(num_layers)
        ]

        # === Functional Model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        tokens = self.token_embedding(token_ids)  # [B, T, H]
        positions = self.position_embedding(tokens)  # [B, T, H]
        x = self.embeddings_dropout(self.embeddings_add((tokens, positions)))
        for layer in self.transformer_layers:
            x = layer(x, padding_mask=padding_mask)
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask},
            outputs=x,
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.max_sequence_length = max_sequence_length
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.initializer_range = initializer_range

    def __call__(self, inputs, *args, **kwargs):
        checks.model_inputs(inputs, self.vocabulary_size, self.max_sequence_length, name="inputs")
        return super().__call__(inputs, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        """Keras `predict`; token-id arrays are checked first (ids, length, mask) as in a call."""
        checks.model_inputs(x, self.vocabulary_size, self.max_sequence_length)
        return super().predict(x, *args, **kwargs)

    @staticmethod
    def min_weight_count(config):
        """The weights of a model of the (checked, `check_config`) `config`: the elements of its `weight_shapes`.
        A weights file holds at least these (LoRA and int8 scales add more).

        Compared with a preset's weights file before building (`kgpt.io.presets.check_backbone_config`).
        """
        return sum(math.prod(shape) * n for shape, n in GPTBackbone.weight_shapes(config).items())

    @staticmethod
    def check_config(config):
        """Raises `ValueError` or `TypeError` naming the entry of `config` (every constructor argument but
        `kwargs`) that cannot build the model: what it is and what is allowed.

        Returns a copy of `config` with its sizes as Python ints and its rates as Python floats (NumPy
        integers and floats pass, as their values), which the constructor builds with and saves. The
        constructor checks its arguments with it, and a preset's `config.json` is checked with it before
        anything is built (`kgpt.io.presets.check_backbone_config`).
        """
        config = dict(config)
        for key in _SIZES:
            config[key] = checks.positive_int(config[key], key)
        config["dropout"] = checks.rate(config["dropout"], "dropout")
        config["attention_dropout"] = checks.rate(config["attention_dropout"], "attention_dropout", allow_none=True)
        config["initializer_range"] = checks.positive(config["initializer_range"], "initializer_range")
        if config["hidden_dim"] % config["num_heads"]:
            raise ValueError(
                f"hidden_dim ({config['hidden_dim']}) must be divisible by num_heads ({config['num_heads']})."
            )
        check_dtype(config["dtype"])
        return config

    @staticmethod
    def weight_shapes(config):
        """`{shape: count}` of the arrays of a model of the (checked) `config`: what its weights file holds
        unless it is quantized. From the sizes alone, so that an absurd `num_layers` costs nothing; the model's
        own weights are compared with it in tests/test_presets.py."""
        vocabulary, context, hidden, inner, heads = (
            config[k] for k in ("vocabulary_size", "max_sequence_length", "hidden_dim", "intermediate_dim", "num_heads")
        )
        per_head = hidden // heads
        block = collections.Counter(
            {
                (hidden,): 6,  # two layer norms' scales and offsets, the attention output's and the MLP's biases
                (hidden, heads, per_head): 3,  # query, key, value kernels
                (heads, per_head): 3,  # and their biases
                (heads, per_head, hidden): 1,  # the attention output kernel
                (hidden, inner): 1,
                (inner,): 1,
                (inner, hidden): 1,
            }
        )
        shapes = collections.Counter({shape: n * config["num_layers"] for shape, n in block.items()})
        shapes.update([(vocabulary, hidden), (context, hidden)])  # token and position embeddings
        return shapes

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_layers": self.num_layers,
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "max_sequence_length": self.max_sequence_length,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "initializer_range": self.initializer_range,
            }
        )
        return config

    @classmethod
    def from_sizes(cls, sizes, vocabulary_size, max_sequence_length):
        """Builds from any object with `num_layers`, `num_heads`, `hidden_dim`,
        `intermediate_dim` and `dropout` attributes (e.g. a training config)."""
        return cls(
            vocabulary_size=vocabulary_size,
            num_layers=sizes.num_layers,
            num_heads=sizes.num_heads,
            hidden_dim=sizes.hidden_dim,
            intermediate_dim=sizes.intermediate_dim,
            max_sequence_length=max_sequence_length,
            dropout=sizes.dropout,
            attention_dropout=getattr(sizes, "attention_dropout", None),
            initializer_range=getattr(sizes, "initializer_range", 0.02),
        )

    @classmethod
    def gpt1(cls, num_special_tokens=0, **overrides):
        """Builds the paper's model: 12 x 768, 12 heads, 3072 inner, 512 context.

        Randomly initialised (116,534,784 weights, plus `hidden_dim` per
        special token); `overrides` replaces any constructor argument.

        Example:
        ```python
        backbone = kgpt.GPTBackbone.gpt1()
        backbone.count_params()  # 116534784
        ```
        """
        config = dict(GPT1_CONFIG, **overrides)
        config["vocabulary_size"] += num_special_tokens
        return cls(**config)

    @classmethod
    def from_original(cls, directory, num_heads=None, num_special_tokens=0, seed=None, **kwargs):
        """Loads the original GPT-1 release, or Hugging Face's `openai-gpt` files.

        `directory` holds either `params_shapes.json` + `params_0..9.npy` (read
        with `allow_pickle=False`) or `config.json` + `model.safetensors`. The
        sizes come from the shapes; the head count, which shapes cannot tell,
        is `num_heads` (default: Hugging Face's `n_head`, else 12).
        `num_special_tokens` appends new N(0, 0.02) embedding rows (3 for
        start/delimiter/extract). `kwargs` go to the constructor (`dropout`,
        `dtype`). Every file, shape and count is checked first; errors name
        the file and what was expected.

        Example:
        ```python
        backbone = kgpt.GPTBackbone.from_original("finetune-transformer-lm/model")
        tokenizer = kgpt.GPTTokenizer.from_original("finetune-transformer-lm/model")
        ```
        """
        return original_convert.load_backbone(
            cls, directory, num_heads=num_heads, num_special_tokens=num_special_tokens, seed=seed, **kwargs
        )

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """Loads a kgpt preset: a local folder, `hf://OWNER/REPO[@REVISION]` or a named preset (`kgpt.io.hub.PRESETS`).

        A Hub repository of Hugging Face's openai-gpt files (e.g.
        `"gpt1_base_en"`, the released GPT-1) is converted once per commit
        and cached. `kwargs` override config entries (e.g. `dropout`).
        """
        return super().from_preset(hub.local(preset, cls), load_weights=load_weights, **kwargs)

    @classmethod
    def convert_openai_gpt(cls, source, target):
        """Writes into `target` the kgpt preset of a folder of Hugging Face openai-gpt files (`hf://` repositories).

        The backbone gets its rows for the start, delimiter and extract
        tokens (N(0, 0.02), seed 0, so every conversion is the same), as
        fine-tuning adds them; the BPE files are copied beside it, where
        `GPTTokenizer.from_preset` reads them.
        """
        backbone = cls.from_original(source, num_special_tokens=NUM_SPECIAL_TOKENS, seed=0)
        backbone.save_to_preset(target)
        for name in (original.HF_VOCAB_FILE, original.HF_MERGES_FILE):
            shutil.copyfile(os.path.join(source, name), os.path.join(target, name))

    def save_original(self, directory, format="original", tokenizer=None, overwrite=False, num_shards=10):
        """Writes the weights in the original release's or Hugging Face's format; `from_original` reads both.

        Special-token rows are kept: the token array has `vocabulary_size`
        rows. Weights are written as float32 whatever the dtype policy.

        Args:
            directory: the folder to write (created when missing).
            format: `"original"`: `params_shapes.json` + `params_0..{num_shards-1}.npy`,
                the release's layout (an earlier export's shards are replaced).
                `"huggingface"`: `config.json` + `model.safetensors`, which
                `transformers.OpenAIGPTModel.from_pretrained(directory)` (or
                `OpenAIGPTLMHeadModel`) loads; it needs `intermediate_dim == 4 * hidden_dim`.
            tokenizer: optional `kgpt.GPTTokenizer` to write beside the
                weights: `encoder_bpe_40000.json` + `vocab_40000.bpe`
                (original), or `vocab.json` + `merges.txt` +
                `tokenizer_config.json` (Hugging Face; with `added_tokens.json`
                and `special_tokens_map.json` for `_start_`, `_delimiter_`,
                `_classify_` when the backbone has their rows). Hugging Face's
                `OpenAIGPTTokenizer` reads these files, but it splits words with
                BERT's rules, not the original's: ids can differ around
                clitics ("don't") and accents.
            overwrite: `"huggingface"` only: replace the files of an earlier
                export (else `FileExistsError`).
            num_shards: `"original"` only: how many `params_*.npy` files.

        Example:
        ```python
        backbone.save_original("release")                      # params_shapes.json + params_0..9.npy
        backbone.save_original("hf", format="huggingface", tokenizer=kgpt.GPTTokenizer.gpt1())
        kgpt.GPTBackbone.from_original("hf")                   # the same weights back
        ```
        """
        if checks.one_of(format, "format", ("original", "huggingface")) == "original":
            original_convert.save_original(self, directory, num_shards=num_shards, tokenizer=tokenizer)
        else:
            original_convert.save_huggingface(self, directory, tokenizer=tokenizer, overwrite=overwrite)

    def transferred_layers(self, num_layers):
        """The layers copied when transferring the embeddings and the first `num_layers` blocks."""
        return [self.token_embedding, self.position_embedding, *self.transformer_layers[:num_layers]]

    # --- generation: keys and values of earlier positions are kept -----------

    supports_cache = True  # GPTCausalLM.generate asks; LSTMBackbone says False

    def empty_cache(self, batch_size, max_length):
        """Zeros `[batch, num_layers, 2, max_length, num_heads, head_dim]` for `call_with_cache`."""
        head_dim = self.hidden_dim // self.num_heads
        shape = [batch_size, self.num_layers, 2, max_length, self.num_heads, head_dim]
        return ops.zeros(shape, dtype=self.compute_dtype)

    def call_with_cache(self, token_ids, cache, cache_update_index):
        """Hidden states of `token_ids` `[batch, n]` at positions `cache_update_index ..`, and the updated cache.

        Keys and values of the positions before come from `cache` (see
        `empty_cache`); those of `token_ids` are written into it. With the
        whole sequence from index 0 this equals the plain forward pass.
        """
        tokens = self.token_embedding(token_ids)
        positions = self.position_embedding(tokens, start_index=cache_update_index)
        x = self.embeddings_dropout(self.embeddings_add((tokens, positions)))
        caches = []
        for i, layer in enumerate(self.transformer_layers):
            x, layer_cache = layer(x, cache=cache[:, i, ...], cache_update_index=cache_update_index)
            caches.append(layer_cache)
        return x, ops.stack(caches, axis=1)


def task_config_with_dtype(config):
    """A task's `from_config` config with its `dtype`, when given, moved into its backbone's config.

    A keras-hub task computes in its backbone's dtype policy, and keras-hub's
    task loader passes `from_preset(..., dtype=...)` on to the backbone; a
    task's own config holds no dtype, so one there is such an override
    (`kgpt.io.presets.load_task_preset` puts it there).
    """
    dtype = config.get("dtype")
    backbone = config.get("backbone")
    if dtype is None or not isinstance(backbone, dict) or not isinstance(backbone.get("config"), dict):
        return config
    config = {k: v for k, v in config.items() if k != "dtype"}
    config["backbone"] = {**backbone, "config": {**backbone["config"], "dtype": dtype}}
    return config


def check_dtype(dtype):
    """A dtype given by name is a float or mixed policy: a quantized or integer one cannot build the model."""
    if not isinstance(dtype, str):
        return  # None, or a policy object or config (a saved model's), which Keras checks itself
    try:
        policy = keras.dtype_policies.get(dtype)
    except ValueError:
        policy = None
    if policy is None or getattr(policy, "quantization_mode", None) or "int" in str(policy.variable_dtype):
        raise ValueError(
            f"dtype must name a float or mixed policy ('float32', 'bfloat16', 'mixed_bfloat16', "
            f"'mixed_float16'), got {dtype!r}. For int8 weights, build the model in float and call "
            f"model.quantize('int8')."
        )
