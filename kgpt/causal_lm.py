"""The GPT-1 language model: backbone + LM head tied to the token embedding."""

import keras
import numpy as np
from keras import ops
from keras_hub.models import CausalLM

from kgpt.backbone import GPTBackbone
from kgpt.lm_loss import DEFAULT_CHUNK_SIZE, TiedLMLoss
from kgpt.optimizers import gpt_adamw
from kgpt.presets import PresetMixin


@keras.saving.register_keras_serializable(package="kgpt")
class GPTCausalLM(PresetMixin, CausalLM):
    """Next-token prediction with a `GPTBackbone` (paper equation 2).

    Outputs logits `[batch, length, vocabulary_size]` from
    `{"token_ids", "padding_mask"}`. Train it like keras-hub's causal LMs
    without a preprocessor: `x` holds the windows, `y` the next-token ids and
    `sample_weight` (optional) zeroes the padded targets. `compile()` defaults
    to the paper's optimiser (`kgpt.gpt_adamw`) and to the memory-lean loss:
    `fit()` never holds the `[batch, length, vocabulary]` logits, as its
    forward pass stops at the hidden states and the loss projects them
    through the tied embedding 1024 tokens at a time (`kgpt.lm_loss`).
    `predict()`, `evaluate()`, `score()` and `generate()` use logits.

    Args:
        backbone: a `kgpt.GPTBackbone`.
        preprocessor: optional keras-hub preprocessor for string `generate()`.

    Example:
    ```python
    import numpy as np
    import kgpt

    backbone = kgpt.GPTBackbone(vocabulary_size=64, num_layers=2, num_heads=2,
                                hidden_dim=16, intermediate_dim=32,
                                max_sequence_length=16)
    lm = kgpt.GPTCausalLM(backbone)
    lm.compile(total_steps=100)  # Adam, warm-up 2000 then cosine by default
    ids = np.random.randint(0, 64, (8, 17)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((8, 16), "int32")}
    lm.fit(x, ids[:, 1:], batch_size=4, epochs=1, verbose=0)
    lm.score(ids[:, :16]).shape  # (8, 15): log P(token t+1 | tokens <= t)
    ```
    """

    backbone_cls = GPTBackbone

    def __init__(self, backbone, preprocessor=None, **kwargs):
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
            lm_loss_chunk_size: train with the memory-lean loss, computing
                the logits of this many tokens at a time instead of all
                `[batch, length, vocabulary]` of them; it needs the `"auto"`
                loss and metrics. `"auto"`: 1024 tokens with those, plain
                logits with any other loss or metric. `None`: plain logits.
        """
        if optimizer == "auto":
            optimizer = gpt_adamw(total_steps=total_steps)
        custom = loss != "auto" or weighted_metrics != "auto" or bool(kwargs.get("metrics"))
        if lm_loss_chunk_size == "auto":
            lm_loss_chunk_size = None if custom else DEFAULT_CHUNK_SIZE
        chunked = None
        if lm_loss_chunk_size is not None:
            if custom:
                raise ValueError(
                    "lm_loss_chunk_size trains without logits, so it computes the loss and next-token accuracy "
                    "itself: leave loss and weighted_metrics at 'auto' and metrics unset."
                )
            # Keras' loss stays compiled for evaluate(), whose forward pass gives logits.
            chunked = TiedLMLoss(self.backbone.token_embedding, lm_loss_chunk_size, reduction="sum_over_batch_size")
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
                config["lm_loss_chunk_size"] = None
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
        chunked = self._chunked_loss
        if chunked is None:
            return super().compute_loss(x, y, y_pred, sample_weight, training=training)
        if training:
            sums = chunked.sums(y, y_pred, sample_weight)  # y_pred: hidden states
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

    # --- scoring -----------------------------------------------------------

    def score(self, token_ids, padding_mask=None, batch_size=32):
        """Log-probability of every token given the tokens before it.

        Args:
            token_ids: int array `[batch, length]`.
            padding_mask: optional `[batch, length]`, 1 for real tokens.
            batch_size: rows per forward pass.

        Returns:
            float32 NumPy array `[batch, length - 1]`: entry `t` is
            `log P(token_ids[:, t + 1] | token_ids[:, :t + 1])`, and 0 where
            token `t + 1` is padding. Sums and means over a span give the
            sequence scores of the paper's zero-shot heuristics (section 5).
        """
        token_ids = np.asarray(token_ids, dtype="int32")
        if token_ids.ndim != 2 or token_ids.shape[1] < 2:
            raise ValueError(
                "score() needs token_ids of shape [batch, length >= 2], got "
                f"{token_ids.shape}."
            )
        if padding_mask is None:
            padding_mask = np.ones_like(token_ids)
        self._check_length(token_ids.shape[1])
        inputs = {"token_ids": token_ids, "padding_mask": np.asarray(padding_mask, "int32")}
        return self._scorer().predict(inputs, batch_size=batch_size, verbose=0)

    def _scorer(self):
        scorer = getattr(self, "_score_model", None)
        if scorer is None:
            ids, mask = self.input["token_ids"], self.input["padding_mask"]
            logits = ops.cast(self.output[:, :-1, :], "float32")
            log_probs = ops.log_softmax(logits, axis=-1)
            targets = ops.expand_dims(ids[:, 1:], -1)
            picked = ops.take_along_axis(log_probs, targets, axis=-1)[..., 0]
            picked = picked * ops.cast(mask[:, 1:], "float32")
            scorer = keras.Model(self.input, picked, name="scorer")
            # Plain attribute: the scorer shares our layers and must not be
            # tracked (it would be saved twice).
            object.__setattr__(self, "_score_model", scorer)
        return scorer

    # --- generation --------------------------------------------------------

    def _check_length(self, length):
        limit = self.backbone.max_sequence_length
        if length > limit:
            raise ValueError(
                f"Sequence length {length} exceeds the model's context "
                f"max_sequence_length={limit}."
            )

    def generate(self, inputs, max_length=None, stop_token_ids=None, strip_prompt=False):
        """Continues prompts token by token with the compiled sampler.

        Args:
            inputs: either a list of prompts (lists of token ids), padded here
                to `max_length`, or keras-hub's dict `{"token_ids",
                "padding_mask"}` of right-padded `[batch, max_length]` arrays
                where `padding_mask` marks the prompt.
            max_length: total length (prompt + continuation) for list inputs;
                at most `max_sequence_length`.
            stop_token_ids: token ids that end a sequence, or `None`.
            strip_prompt: return only the continuation.

        Returns:
            dict of NumPy `token_ids` and `padding_mask` (0 after a stop token).

        Example:
        ```python
        lm.compile(sampler="greedy")
        out = lm.generate([[5, 6, 7]], max_length=12)
        out["token_ids"].shape  # (1, 12)
        ```
        """
        if self.preprocessor is None and not isinstance(inputs, dict):
            inputs = self._pack_prompts(inputs, max_length)
        if isinstance(inputs, dict):
            self._check_length(np.shape(inputs["token_ids"])[1])
        return super().generate(
            inputs,
            max_length=max_length,
            stop_token_ids=stop_token_ids,
            strip_prompt=strip_prompt,
        )

    def _pack_prompts(self, prompts, max_length):
        prompts = [list(p) for p in prompts]
        if max_length is None:
            max_length = self.backbone.max_sequence_length
        self._check_length(max_length)
        if not prompts or any(not p for p in prompts):
            raise ValueError("generate() needs at least one token in every prompt.")
        longest = max(len(p) for p in prompts)
        if longest >= max_length:
            raise ValueError(
                f"A prompt has {longest} tokens, leaving no room to generate "
                f"within max_length={max_length}."
            )
        token_ids = np.zeros((len(prompts), max_length), "int32")
        padding_mask = np.zeros((len(prompts), max_length), "int32")
        for row, prompt in enumerate(prompts):
            token_ids[row, : len(prompt)] = prompt
            padding_mask[row, : len(prompt)] = 1
        return {"token_ids": token_ids, "padding_mask": padding_mask}

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
        backbone = self.backbone
        tokens = backbone.token_embedding(token_ids)
        positions = backbone.position_embedding(tokens, start_index=cache_update_index)
        x = backbone.embeddings_dropout(backbone.embeddings_add((tokens, positions)))
        caches = []
        for i, layer in enumerate(backbone.transformer_layers):
            x, layer_cache = layer(
                x,
                self_attention_cache=cache[:, i, ...],
                self_attention_cache_update_index=cache_update_index,
            )
            caches.append(layer_cache)
        logits = backbone.token_embedding(x, reverse=True)
        return logits, x, ops.stack(caches, axis=1)

    def _build_cache(self, token_ids):
        backbone = self.backbone
        batch_size, max_length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        head_dim = backbone.hidden_dim // backbone.num_heads
        shape = [batch_size, backbone.num_layers, 2, max_length, backbone.num_heads, head_dim]
        cache = ops.zeros(shape, dtype=self.compute_dtype)
        _, hidden_states, cache = self.call_with_cache(token_ids, cache, 0)
        return hidden_states, cache

    def generate_step(self, inputs, stop_token_ids=None):
        """One compiled generation pass over a batch (see keras-hub CausalLM)."""
        token_ids, padding_mask = inputs["token_ids"], inputs["padding_mask"]
        # Generation starts where the shortest prompt ends; longer prompts keep
        # their own tokens (the sampler only writes where the mask is 0).
        index = ops.min(ops.sum(ops.cast(padding_mask, "int32"), axis=-1))

        if hasattr(self.backbone, "transformer_layers"):
            hidden_states, cache = self._build_cache(token_ids)

            def step(prompt, cache, index):
                batch_size = ops.shape(prompt)[0]
                current = ops.slice(prompt, [0, index - 1], [batch_size, 1])
                logits, hidden, cache = self.call_with_cache(current, cache, index - 1)
                return ops.squeeze(logits, 1), ops.squeeze(hidden, 1), cache
        else:
            # Backbones without a key/value cache (the LSTM ablation) rerun the
            # whole sequence each step: quadratic, fine for samples.
            mask = ops.ones_like(token_ids)
            hidden_states = self.backbone({"token_ids": token_ids, "padding_mask": mask})
            cache = ops.zeros((1,), dtype=self.compute_dtype)

            def step(prompt, cache, index):
                hidden = self.backbone({"token_ids": prompt, "padding_mask": mask})
                hidden = ops.take(hidden, index - 1, axis=1)  # [B, H]
                logits = self.backbone.token_embedding(hidden, reverse=True)
                return logits, hidden, cache

        token_ids = self.sampler(
            next=step,
            prompt=token_ids,
            cache=cache,
            index=index,
            mask=padding_mask,
            stop_token_ids=stop_token_ids,
            hidden_states=hidden_states,
            model=self,
        )
        if stop_token_ids is None:
            padding_mask = ops.ones_like(token_ids, dtype="bool")
        else:
            # Keep every generated token up to and including the first stop.
            generated = ops.logical_not(ops.cast(padding_mask, "bool"))
            is_stop = ops.zeros_like(generated)
            for stop in stop_token_ids:
                is_stop = ops.logical_or(is_stop, ops.equal(token_ids, stop))
            is_stop = ops.cast(ops.logical_and(is_stop, generated), "int32")
            stops_before = ops.cumsum(is_stop, axis=-1) - is_stop
            padding_mask = ops.equal(stops_before, 0)
        return {"token_ids": token_ids, "padding_mask": padding_mask}
