"""The GPT-1 language model: backbone + LM head tied to the token embedding.

Its parts by concern: `kgpt.models.gpt.causal_lm_inputs` (what `fit`, `evaluate`
and `predict` check), `kgpt.models.gpt.scoring` (`score`), `kgpt.models.gpt.generation`
(`generate`) and `kgpt.models.lm_loss` (the memory-lean training loss).
"""

import os

import keras
import numpy as np
from keras import ops
from keras_hub.models import CausalLM

from kgpt.data import inputs_kind
from kgpt.models.gpt import generation
from kgpt.models.gpt import scoring
from kgpt import checks
from kgpt.models.gpt.gpt_backbone import GPTBackbone
from kgpt.models.gpt.causal_lm_inputs import (NO_PREPROCESSOR, check_call, check_length, is_distributed_dataset,
                                          warn_if_warming_up)
from kgpt.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor
from kgpt.layers.int8 import QuantizeMixin
from kgpt.models.lm_loss import LMLossMixin, resolve_chunk_size
from kgpt.models.optimizers import gpt_adamw
from kgpt.io import hub
from kgpt.io.presets import (CONFIG_FILE, TASK_CONFIG_FILE, CheckpointError, PresetMixin, check_overrides,
                             tokenizer_fits)
from kgpt.tokenizers.gpt1.files import holds_bpe_files
from kgpt.tokenizers.interface import PRESET_CONFIG

try:
    import tensorflow as tf
except ImportError:
    tf = None



@keras.saving.register_keras_serializable(package="kgpt")
class GPTCausalLM(QuantizeMixin, LMLossMixin, PresetMixin, CausalLM):
    """Next-token prediction with a `GPTBackbone` (paper equation 2).

    Outputs logits `[batch, length, vocabulary_size]` from
    `{"token_ids", "padding_mask"}`. Train it like keras-hub's causal LMs
    without a preprocessor: `x` holds the windows, `y` the next-token ids and
    `sample_weight` (optional) zeroes the padded targets. `compile()` defaults
    to the paper's optimiser (`kgpt.gpt_adamw`) and to the memory-lean loss:
    `fit()` never holds the `[batch, length, vocabulary]` logits, as its
    forward pass stops at the hidden states and the loss projects them
    through the tied embedding 1024 tokens at a time (`kgpt.models.lm_loss`).
    `predict()`, `evaluate()`, `score()` and `generate()` use logits.

    With a `kgpt.GPTCausalLMPreprocessor` (`from_preset` attaches one when
    the preset holds a tokenizer) the model also takes raw text:
    `generate("prompt")` returns a string, `fit(texts)`, `evaluate(texts)`
    and `predict(texts)` tokenize and pack on the fly, and `score(text)`
    gives each token's log-probability. Token-id inputs work the same with
    or without a preprocessor.

    Args:
        backbone: a `kgpt.GPTBackbone`.
        preprocessor: optional `kgpt.GPTCausalLMPreprocessor`, for text.

    Example:
    ```python
    import numpy as np
    import kgpt

    backbone = kgpt.GPTBackbone(vocabulary_size=64, num_layers=2, num_heads=2,
                                hidden_dim=16, intermediate_dim=32,
                                max_sequence_length=16)
    lm = kgpt.GPTCausalLM(backbone)
    lm.compile(optimizer=kgpt.gpt_adamw(warmup_steps=10, total_steps=100))  # default: 2,000 warm-up updates
    ids = np.random.randint(0, 64, (8, 17)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((8, 16), "int32")}
    lm.fit(x, ids[:, 1:], batch_size=4, epochs=1, verbose=0)
    lm.score(ids[:, :16]).shape  # (8, 15): log P(token t+1 | tokens <= t)
    ```

    Text in, text out, from a preset (e.g. `kgpt-train --task lm --output_dir out`):
    ```python
    lm = kgpt.GPTCausalLM.from_preset("out")
    lm.compile(sampler="greedy")
    lm.generate("The keeper", max_length=20)  # 'the keeper climbed ...'
    lm.fit(["Some text.", "More text."], batch_size=2)
    lm.score("The keeper climbed.")  # log P of each token, the first after a newline
    ```
    """

    backbone_cls = GPTBackbone
    preprocessor_cls = GPTCausalLMPreprocessor

    def __init__(self, backbone, preprocessor=None, **kwargs):
        if preprocessor is not None:
            tokenizer_fits(preprocessor, backbone)
        length = getattr(preprocessor, "sequence_length", None)
        if isinstance(length, int) and length > backbone.max_sequence_length:
            raise ValueError(
                f"The preprocessor packs sequence_length={length} tokens, more than the backbone's "
                f"max_sequence_length={backbone.max_sequence_length}."
            )
        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor

        # === Functional Model ===
        inputs = backbone.input
        hidden_states = backbone(inputs)  # [B, T, H]
        logits = backbone.token_embedding(hidden_states, reverse=True)  # [B, T, V]
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Compile state ===
        self._chunked_loss = None  # TiedLMLoss when compile(lm_loss_chunk_size=...)
        self._token_accuracy = None  # its next-token accuracy tracker

    def compile(
        self,
        optimizer="auto",
        loss="auto",
        *,
        weighted_metrics="auto",
        sampler="top_k",
        total_steps=None,
        lm_loss_chunk_size="auto",
        **kwargs,
    ):
        """Configures training and generation, with the paper's defaults.

        Args:
            optimizer: `"auto"` for `kgpt.gpt_adamw(total_steps=total_steps)`
                (Adam 2.5e-4, 2000 warm-up steps, cosine to 0 at
                `total_steps`, decoupled weight decay 0.01), or any optimizer.
            loss: `"auto"` for sparse categorical cross-entropy on logits.
            weighted_metrics: `"auto"` for next-token accuracy.
            sampler: `"greedy"`, `"top_k"`, `"top_p"` or a
                `keras_hub.samplers.Sampler`, used by `generate()`.
            total_steps: horizon of the cosine decay for `optimizer="auto"`;
                `None` holds the peak rate after warm-up.
            lm_loss_chunk_size: the `"auto"` loss trains without the
                `[batch, length, vocabulary]` logits, computing those of this
                many tokens at a time (`kgpt.models.lm_loss`; `"auto"`: 1024,
                `None`: all tokens at once). A custom loss or metric trains on
                the logits; it takes `"auto"` or `None` only.
        """
        if isinstance(sampler, str):
            from keras_hub.samplers import Sampler, get

            if not isinstance(get(sampler), Sampler):  # keras-hub hands back an unknown name as it is
                raise ValueError(f"sampler={sampler!r} is not a keras-hub sampler: pass 'greedy', 'top_k', 'top_p', "
                                 f"'beam', 'random', 'contrastive' or a keras_hub.samplers.Sampler.")
        if optimizer == "auto":
            optimizer = gpt_adamw(total_steps=total_steps)
        custom = loss != "auto" or weighted_metrics != "auto" or bool(kwargs.get("metrics"))
        chunked = None
        if resolve_chunk_size(lm_loss_chunk_size, default_loss=not custom) != "logits":
            # Keras' loss stays compiled for evaluate(), whose forward pass gives logits.
            chunked = self.tied_lm_loss(lm_loss_chunk_size, reduction="sum_over_batch_size")
            weighted_metrics = None
        super().compile(
            optimizer=optimizer,
            loss=loss,
            weighted_metrics=weighted_metrics,
            sampler=sampler,
            **kwargs,
        )
        # Plain attributes, not tracked layer state: reported through `metrics`.
        object.__setattr__(self, "_chunked_loss", chunked)
        accuracy = None if chunked is None else keras.metrics.Mean(name="sparse_categorical_accuracy")
        object.__setattr__(self, "_token_accuracy", accuracy)

    def get_compile_config(self):
        config = super().get_compile_config()
        if config:
            config["sampler"] = keras.saving.serialize_keras_object(self.sampler)
            chunked = self._chunked_loss
            if chunked is not None:
                config.update(loss="auto", weighted_metrics="auto", lm_loss_chunk_size=chunked.chunk_size)
            else:
                config["lm_loss_chunk_size"] = "auto"  # the compiled loss and metrics on logits
        return config

    def compile_from_config(self, config):
        # Keras skips this for models with a custom compile(); without it a
        # loaded model would lose its optimizer state and schedule.
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    # --- the memory-lean training loss -------------------------------------

    def call(self, inputs, training=None, mask=None):
        if training and self._chunked_loss is not None:
            return self.backbone(inputs, training=training)  # [B, T, H]; compute_loss projects them
        return super().call(inputs, training=training, mask=mask)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if sample_weight is not None:  # the text preprocessor's weights are the boolean padding mask
            sample_weight = ops.cast(sample_weight, "float32")
        chunked = self._chunked_loss
        if chunked is None:
            return super().compute_loss(x, y, y_pred, sample_weight, training=training)
        if training:  # y_pred: hidden states (see call)
            sums = chunked.sums(y, y_pred, sample_weight, training=True)
            loss = chunked.reduce(sums[0], y, sample_weight)
            weight = ops.sum(ops.ones_like(y, "float32") if sample_weight is None else sample_weight)
            self._token_accuracy.update_state(ops.divide_no_nan(sums[1], weight)[None], sample_weight=weight[None])
            for extra in self.losses:  # regularisers and add_loss(), as Keras adds them
                loss = loss + ops.cast(ops.sum(extra), loss.dtype)
            return loss
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        hits = ops.cast(ops.equal(predicted, ops.cast(y, "int32")), "float32")
        self._token_accuracy.update_state(hits, sample_weight=sample_weight)
        return super().compute_loss(x, y, y_pred, sample_weight, training=training)

    @property
    def metrics(self):
        metrics = super().metrics
        return metrics if self._token_accuracy is None else [*metrics, self._token_accuracy]

    # --- text ----------------------------------------------------------------

    @classmethod
    def from_preset(cls, preset, **kwargs):
        """Loads a kgpt preset (a local folder, `hf://OWNER/REPO[@REVISION]` or a named preset such as
        `"gpt1_base_en"`), with a text preprocessor when it holds a tokenizer.

        The preprocessor is the one saved with the model (`preprocessor.json`,
        as `save_to_preset` writes when one is attached), or else one built
        around the preset's tokenizer with the model's context as
        `sequence_length`. A preset without a tokenizer loads without one
        (token ids only); so does `preprocessor=None`. A preset that holds a
        backbone only (as converted from the Hub's openai-gpt files) gets
        the tied LM head, as keras-hub builds a task without `task.json`.
        `kwargs` override config entries (e.g. `dropout`).
        """
        preset = hub.local(preset, cls.backbone_cls)
        if isinstance(preset, (str, os.PathLike)) and not os.path.isfile(os.path.join(preset, TASK_CONFIG_FILE)) \
                and os.path.isfile(os.path.join(preset, CONFIG_FILE)):
            load_weights = kwargs.pop("load_weights", True)
            check_overrides(cls, kwargs)
            backbone = cls.backbone_cls.from_preset(preset, load_weights=load_weights)
            lm = cls(backbone, **{"preprocessor": None, **kwargs})
        else:
            lm = super().from_preset(preset, **kwargs)
        if lm.preprocessor is None and "preprocessor" not in kwargs:
            if os.path.isfile(os.path.join(preset, PRESET_CONFIG)) or holds_bpe_files(preset):
                preprocessor = cls.preprocessor_cls.from_preset(preset)
                limit = lm.backbone.max_sequence_length
                preprocessor.sequence_length = min(preprocessor.sequence_length, limit)
                try:
                    tokenizer_fits(preprocessor, lm.backbone)
                except ValueError as e:
                    raise CheckpointError(f"{preset}: {e}") from None
                lm.preprocessor = preprocessor
        return lm

    def fit(self, x=None, y=None, batch_size=None, **kwargs):
        """keras-hub's `fit` (text goes through the preprocessor), or Keras' own for a `tf.distribute` dataset.

        A distributed dataset (TensorFlow, several processes:
        `kgpt.parallel.distribute.feed`) holds model inputs already, and
        keras-hub's `fit` cannot map a preprocessor over one.
        """
        if is_distributed_dataset(x):
            return keras.Model.fit(self, x, y, batch_size=batch_size, **kwargs)
        x, batch_size = check_call(self, "fit", x, y, batch_size)
        warn_if_warming_up(self, x, batch_size, kwargs)
        with checks.dataset_errors(self):
            return super().fit(x, y, batch_size=batch_size, **kwargs)

    def evaluate(self, x=None, y=None, batch_size=None, **kwargs):
        """keras-hub's `evaluate`; text is checked as `fit` checks it."""
        x, batch_size = check_call(self, "evaluate", x, y, batch_size)
        with checks.dataset_errors(self):
            return super().evaluate(x, y, batch_size=batch_size, **kwargs)

    def predict(self, x=None, batch_size=None, **kwargs):
        """keras-hub's `predict` (logits); over-long texts are counted and warned of, as in `fit`."""
        x, batch_size = check_call(self, "predict", x, None, batch_size)
        with checks.dataset_errors(self):
            return super().predict(x, batch_size=batch_size, **kwargs)

    def preprocess_samples(self, x, y=None, sample_weight=None):
        # Text goes through the preprocessor; token ids (dicts, arrays) pass unchanged.
        if self.preprocessor is None or not inputs_kind.is_text(x):
            return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        return super().preprocess_samples(x, y, sample_weight)

    # --- scoring -----------------------------------------------------------

    def score(self, token_ids, padding_mask=None, scoring_mode="log_probs", layer_intercept_fn=None,
              target_ids=None, batch_size=32):
        """Scores token ids (or texts): kgpt's log-probabilities, or keras-hub's logits and per-token losses.

        Args:
            token_ids: int array `[batch, length]`; or, with a preprocessor
                and `scoring_mode="log_probs"`, a text or a list of texts.
            padding_mask: optional `[batch, length]`, 1 for real tokens
                (token ids only).
            scoring_mode: `"log_probs"` (kgpt's default, below); or
                keras-hub's `CausalLM.score` modes: `"logits"` gives the logits
                `[batch, length, vocabulary]` and `"loss"` the cross-entropy of
                `target_ids` at each position `[batch, length]`, both as
                backend tensors from one eager forward pass (so a
                `tf.GradientTape` or `jax.grad` can follow them).
            layer_intercept_fn: `"logits"`/`"loss"` only, keras-hub's hook
                `fn(x, i) -> x`: called on the summed token and position
                embeddings with `i = -1` (before the embedding dropout), then
                on each block's output with its index `0..num_layers-1`; what
                it returns goes on through the model.
            target_ids: `"loss"` only: int `[batch, length]`, the token to
                score at each position (keras-hub passes
                `ops.roll(token_ids, -1, axis=1)`).
            batch_size: rows per forward pass (`"log_probs"`).

        Returns:
            For `"log_probs"` on token ids, a float32 NumPy array `[batch,
            length - 1]`: entry `t` is `log P(token_ids[:, t + 1] |
            token_ids[:, :t + 1])`, and 0 where token `t + 1` is padding. Sums
            and means over a span give the sequence scores of the paper's
            zero-shot heuristics (section 5). For a text, a float32 array with
            one entry per token of the text: its log-probability given the
            tokens before it, the first one given the newline token (a
            document boundary) when the vocabulary has one (else the first
            token is not scored), as `kgpt.tasks.heuristics.Scorer` does;
            for a list of texts, a list of them.

        Example:
        ```python
        lm.score("The keeper climbed the tower.")  # array([-3.1, -7.9, ...], dtype=float32)
        lm.score(ids, scoring_mode="loss", target_ids=keras.ops.roll(ids, -1, axis=1))  # [batch, length]
        ```
        """
        if scoring_mode not in ("log_probs", "logits", "loss"):
            raise ValueError(f"scoring_mode must be 'log_probs' (kgpt's), 'logits' or 'loss' (keras-hub's), got "
                             f"{scoring_mode!r}.")
        batch_size = checks.positive_int(batch_size, "batch_size")
        if scoring_mode == "log_probs":
            for name, value in (("layer_intercept_fn", layer_intercept_fn), ("target_ids", target_ids)):
                if value is not None:
                    raise ValueError(f"{name} is for scoring_mode='logits' or 'loss' (keras-hub's); "
                                     f"scoring_mode='log_probs' scores each next token of token_ids.")
            if inputs_kind.is_text(token_ids):
                return scoring.score_text(self, token_ids, batch_size)
        elif inputs_kind.is_text(token_ids):
            raise ValueError(f"scoring_mode={scoring_mode!r} takes token ids; texts are scored with "
                             f"scoring_mode='log_probs', or go through lm.preprocessor.generate_preprocess first.")
        return scoring.score_ids(self, token_ids, padding_mask, scoring_mode, layer_intercept_fn, target_ids,
                                 batch_size)

    # --- generation --------------------------------------------------------

    def generate(self, inputs, max_length=None, stop_token_ids=None, strip_prompt=False):
        """Continues prompts token by token with the compiled sampler.

        Args:
            inputs: text (needs a preprocessor): a prompt string or a list of
                them; or token ids: a list of prompts (lists of token ids),
                padded here to `max_length`, or keras-hub's dict
                `{"token_ids", "padding_mask"}` of right-padded
                `[batch, max_length]` arrays where `padding_mask` marks the
                prompt. Token ids never go through the preprocessor.
            max_length: total length (prompt + continuation), at most
                `max_sequence_length`; for text, default the preprocessor's
                `sequence_length`, for lists of ids the model's context.
            stop_token_ids: token ids that end a sequence, or `None` (the
                default: GPT-1 has no end-of-text token, so `"auto"` means
                `None` too).
            strip_prompt: return only the continuation.

        Returns:
            For a string, a string (words joined by spaces, lower-cased, as
            `GPTTokenizer.decode` gives them); for a list of strings, a list.
            For token ids, a dict of NumPy `token_ids` and `padding_mask` (0
            after a stop token).

        Example:
        ```python
        lm.compile(sampler="greedy")
        out = lm.generate([[5, 6, 7]], max_length=12)
        out["token_ids"].shape  # (1, 12)
        lm.generate("The keeper", max_length=20)  # a str (needs a preprocessor)
        ```
        """
        if isinstance(stop_token_ids, str) and stop_token_ids == "auto":
            stop_token_ids = None  # keras-hub's "auto" is the end token, which GPT-1 lacks
        stop_token_ids = generation.check_stop_token_ids(self, stop_token_ids)
        max_length = checks.positive_int(max_length, "max_length", minimum=2, allow_none=True)
        if max_length is not None:
            check_length(self, max_length)
        if isinstance(inputs, np.ndarray) and inputs.ndim == 0:
            inputs = inputs.item()  # a 0-d array of one prompt: the prompt
        checks.not_a_generator(inputs, "inputs")
        if inputs_kind.is_text(inputs):
            if self.preprocessor is None:
                raise ValueError(NO_PREPROCESSOR)
            check_length(self, max_length or self.preprocessor.sequence_length)
            return super().generate(
                inputs, max_length=max_length, stop_token_ids=stop_token_ids, strip_prompt=strip_prompt
            )
        if tf is not None and isinstance(inputs, tf.data.Dataset):
            return super().generate(
                inputs, max_length=max_length, stop_token_ids=stop_token_ids, strip_prompt=strip_prompt
            )
        if isinstance(inputs, dict):
            inputs = generation.check_packed_prompts(self, inputs, max_length)
        else:
            inputs = generation.pack_prompts(self, inputs, max_length)
        return generation.generate_ids(self, inputs, stop_token_ids, strip_prompt)

    def make_generate_function(self):
        """keras-hub's compiled generate function, made once; safe to call from several threads at once
        (`kgpt.models.gpt.generation.one_draw_at_a_time`)."""
        with generation.MAKE_FUNCTION_LOCK:
            compiled = super().make_generate_function()
        return generation.one_draw_at_a_time(self, compiled)

    def export(self, filepath, format="tf_saved_model", verbose=True, **kwargs):
        """A TensorFlow SavedModel whose `serve` maps token ids `[batch, length]` to logits; on both backends.

        See `kgpt.io.export.export_causal_lm` (on JAX, the symbolic length is
        bounded by `max_sequence_length`, which Keras' defaults leave out).
        """
        from kgpt.io.export import export_causal_lm

        return export_causal_lm(self, filepath, format=format, verbose=verbose, **kwargs)

    def get_quantization_layer_structure(self, mode):
        """keras-hub's layout for GPTQ/AWQ calibration (`kgpt.models.gpt.keras_hub_scoring.quantization_layer_structure`):
        token plus position embeddings as one pre-block model, then the transformer blocks."""
        from kgpt.models.gpt.keras_hub_scoring import quantization_layer_structure

        return quantization_layer_structure(self, mode)

    def call_with_cache(self, token_ids, cache, cache_update_index):
        """Forward pass over `token_ids` reusing cached keys/values.

        Args:
            token_ids: int `[batch, n]`, the tokens at positions
                `cache_update_index .. cache_update_index + n - 1`.
            cache: float `[batch, num_layers, 2, max_length, num_heads, head_dim]`.
            cache_update_index: position of `token_ids[:, 0]`.

        Returns:
            `(logits [batch, n, vocab], hidden_states [batch, n, hidden], cache)`.
        """
        hidden, cache = self.backbone.call_with_cache(token_ids, cache, cache_update_index)
        return self.backbone.token_embedding(hidden, reverse=True), hidden, cache

    def _build_cache(self, token_ids):
        batch_size, max_length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        cache = self.backbone.empty_cache(batch_size, max_length)
        _, hidden_states, cache = self.call_with_cache(token_ids, cache, 0)
        return hidden_states, cache

    def generate_step(self, inputs, stop_token_ids=None):
        """One compiled generation pass over a batch (see keras-hub CausalLM)."""
        return generation.generate_step(self, inputs, stop_token_ids)
