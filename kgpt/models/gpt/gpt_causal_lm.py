"""The GPT-1 language model: backbone + LM head tied to the token embedding.

One class, as keras-hub keeps `GPT2CausalLM`: what `fit`, `evaluate` and
`predict` check, `score`, `generate` and keras-hub's interpretability and
quantization hooks; the memory-lean training loss is `kgpt.train.lm_loss`.
"""

import contextlib
import numbers
import os
import random
import threading
import warnings

import keras
import keras_hub
import numpy as np
from keras import ops
from keras_hub.models import CausalLM
from keras_hub.samplers import Sampler

from kgpt import checks
from kgpt.data import inputs_kind
from kgpt.errors import CheckpointError
from kgpt.io import hub
from kgpt.io.presets import CONFIG_FILE, TASK_CONFIG_FILE, PresetMixin, check_overrides, tokenizer_fits
from kgpt.layers.int8 import QuantizeMixin
from kgpt.models.gpt.gpt_backbone import GPTBackbone, check_dtype, task_config_with_dtype
from kgpt.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor
from kgpt.tokenizers.gpt1.files import holds_bpe_files
from kgpt.tokenizers.interface import PRESET_CONFIG
from kgpt.train.lm_loss import BatchMean, LMLossMixin, resolve_chunk_size
from kgpt.train.optimizers import WarmupSchedule, gpt_adamw

try:
    import tensorflow as tf
except ImportError:
    tf = None

NO_PREPROCESSOR = (
    "This GPTCausalLM has no preprocessor, so it takes token ids only. Load it with "
    "kgpt.GPTCausalLM.from_preset(dir) from a preset that holds a tokenizer, or attach one: "
    "lm.preprocessor = kgpt.GPTCausalLMPreprocessor(tokenizer, sequence_length=lm.backbone.max_sequence_length)."
)
# keras-hub's make_generate_function sets `generate_function` to the plain step before it compiles it:
# a second thread must not pick up that half-made state.
_MAKE_FUNCTION_LOCK = threading.Lock()
# Held while a sampler that draws random numbers generates (see `make_generate_function`).
_SAMPLER_STATE_LOCK = threading.Lock()


def _check_sampler(sampler, vocabulary_size):
    """Refuses sampler settings that keras-hub runs without a word or fails on inside `generate()`.

    A temperature of 0 divides the logits into NaN (every token becomes id 0), a negative one picks the least
    likely tokens, and `p` outside (0, 1] is clipped; `k` of 0, `k` past the vocabulary and 0 beams fail in the
    middle of the generation loop.
    """
    name = type(sampler).__name__
    checks.positive(getattr(sampler, "temperature", 1.0), f"{name} temperature")
    for attribute, maximum in (("k", vocabulary_size), ("num_beams", None)):
        value = getattr(sampler, attribute, None)
        if value is not None:
            checks.positive_int(value, f"{name} {attribute}", maximum=maximum)
    p = getattr(sampler, "p", None)
    if p is not None and (isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 < p <= 1):
        raise ValueError(f"{name} p must be a number in (0, 1], got {p!r}.")
    alpha = getattr(sampler, "alpha", None)
    if alpha is not None:
        checks.fraction(alpha, f"{name} alpha")


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
    through the tied embedding 1024 tokens at a time (`kgpt.train.lm_loss`).
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
        checks.model_kwargs(kwargs, type(self).__name__, also=("compile",))
        if preprocessor is not None:
            tokenizer_fits(preprocessor, backbone)
        length = getattr(preprocessor, "sequence_length", None)
        if isinstance(length, int):
            checks.within_context(length, backbone.max_sequence_length, "The preprocessor's sequence_length")
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
            loss: `"auto"` for sparse categorical cross-entropy on logits,
                the mean over the tokens that count (a text preprocessor's
                padding weighs 0 and is not in the mean, where keras-hub's
                `"auto"` divides by every position).
            weighted_metrics: `"auto"` for next-token accuracy.
            sampler: `"greedy"`, `"top_k"`, `"top_p"` or a
                `keras_hub.samplers.Sampler`, used by `generate()`.
            total_steps: horizon of the cosine decay for `optimizer="auto"`;
                `None` holds the peak rate after warm-up.
            lm_loss_chunk_size: the `"auto"` loss trains without the
                `[batch, length, vocabulary]` logits, computing those of this
                many tokens at a time (`kgpt.train.lm_loss`; `"auto"`: 1024,
                `None`: all tokens at once). A custom loss or metric trains on
                the logits; it takes `"auto"` or `None` only.
        """
        if sampler is None or isinstance(sampler, str):
            # keras-hub hands back an unknown name as it is, None as None (generate() then fails on it), and
            # raises a KeyError for a name in capitals.
            if sampler is None or not sampler.islower() or not isinstance(keras_hub.samplers.get(sampler), Sampler):
                raise ValueError(
                    f"sampler={sampler!r} is not a keras-hub sampler: pass 'greedy', 'top_k', 'top_p', "
                    f"'beam', 'random', 'contrastive' or a keras_hub.samplers.Sampler."
                )
        resolved = keras_hub.samplers.get(sampler)
        if not isinstance(resolved, Sampler):
            raise TypeError(f"sampler must be a keras_hub.samplers.Sampler or its name, got {checks.shown(sampler)}.")
        _check_sampler(resolved, self.backbone.vocabulary_size)
        if optimizer == "auto":
            optimizer = gpt_adamw(total_steps=total_steps)
        custom = loss != "auto" or weighted_metrics != "auto" or bool(kwargs.get("metrics"))
        if loss == "auto":
            # The mean over the batch's weighted tokens, on several TensorFlow devices too (Keras' own is each
            # replica's mean: 0.34% off on a padded batch split over 2).
            loss = BatchMean(keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        chunked = None
        if resolve_chunk_size(lm_loss_chunk_size, default_loss=not custom) != "logits":
            # Keras' loss stays compiled for evaluate(), whose forward pass gives logits.
            chunked = self.tied_lm_loss(lm_loss_chunk_size, reduction="mean_with_sample_weight")
            weighted_metrics = None
        super().compile(
            optimizer=optimizer,
            loss=loss,
            weighted_metrics=weighted_metrics,
            sampler=resolved,
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
    def from_config(cls, config):
        # A `dtype` (from_preset's) is the backbone's: keras-hub's Task would take it and then keep the backbone's.
        return super().from_config(task_config_with_dtype(config))

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
        `kwargs` override config entries; `dtype` (e.g. `"mixed_bfloat16"`) is the backbone's dtype policy, as
        in keras-hub.
        """
        check_dtype(kwargs.get("dtype"))
        preset = hub.local(preset, cls.backbone_cls)
        if (
            isinstance(preset, (str, os.PathLike))
            and not os.path.isfile(os.path.join(preset, TASK_CONFIG_FILE))
            and os.path.isfile(os.path.join(preset, CONFIG_FILE))
        ):
            load_weights = kwargs.pop("load_weights", True)
            check_overrides(cls, kwargs)
            dtype = kwargs.pop("dtype", None)
            backbone = cls.backbone_cls.from_preset(
                preset, load_weights=load_weights, **({} if dtype is None else {"dtype": dtype})
            )
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
        if tf is not None and isinstance(x, tf.distribute.DistributedDataset):
            return keras.Model.fit(self, x, y, batch_size=batch_size, **kwargs)
        x, batch_size = self._check_call("fit", x, y, batch_size)
        if inputs_kind.is_text(x):  # the preprocessor's padding mask is the weight: keras-hub drops the user's
            checks.refuse_on_text("fit", kwargs, ("sample_weight", "class_weight", "validation_split"))
        self._warn_if_warming_up(x, batch_size, kwargs)
        if inputs_kind.is_text(x) and kwargs.get("shuffle", True) and tf is not None:
            x, batch_size, kwargs = self._text_batches(x, batch_size, shuffle=True), None, {**kwargs, "shuffle": False}
        with checks.dataset_errors(self):
            return super().fit(x, y, batch_size=batch_size, **kwargs)

    def evaluate(self, x=None, y=None, batch_size=None, **kwargs):
        """keras-hub's `evaluate`; text is checked as `fit` checks it."""
        x, batch_size = self._check_call("evaluate", x, y, batch_size)
        if inputs_kind.is_text(x):
            checks.refuse_on_text("evaluate", kwargs, ("sample_weight",))
        with checks.dataset_errors(self):
            return super().evaluate(x, y, batch_size=batch_size, **kwargs)

    def predict(self, x=None, batch_size=None, **kwargs):
        """keras-hub's `predict` (logits); over-long texts are counted and warned of, as in `fit`."""
        x, batch_size = self._check_call("predict", x, None, batch_size)
        with checks.dataset_errors(self, metrics=False):
            return super().predict(x, batch_size=batch_size, **kwargs)

    def _text_batches(self, texts, batch_size=None, shuffle=True):
        """In-memory `texts` as a `tf.data` dataset of batches, drawn in a new order every epoch with `shuffle`:
        keras-hub batches them in order, ignoring `fit(shuffle=True)` (Keras warns of it for its grain dataset).
        The order follows Python's `random` (`keras.utils.set_random_seed` seeds it)."""
        texts = np.asarray(texts, dtype=object).reshape(-1).tolist()
        data = tf.data.Dataset.from_tensor_slices(tf.constant(texts, tf.string))
        if shuffle:
            data = data.shuffle(len(texts), seed=random.getrandbits(31), reshuffle_each_iteration=True)
        return data.batch(batch_size or 32)

    def preprocess_samples(self, x, y=None, sample_weight=None):
        # Text goes through the preprocessor; token ids (dicts, arrays) pass unchanged.
        if self.preprocessor is None or not inputs_kind.is_text(x):
            return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        return super().preprocess_samples(x, y, sample_weight)

    # --- what fit, evaluate, predict, score and generate check -------------
    # Token ids in the vocabulary, texts only with a preprocessor and without
    # `y`, nothing empty, nothing past the context; each check names the
    # argument it refuses.

    def _check_preprocessor(self):
        """Refuses text when no preprocessor is attached."""
        if self.preprocessor is None:
            raise ValueError(NO_PREPROCESSOR)

    def _check_call(self, method, x, y, batch_size):
        """The checks `fit`, `evaluate` and `predict` share; returns `x` (a tuple of texts as a list, since
        keras-hub reads a tuple as `(x, y, sample_weight)`) and `batch_size`."""
        batch_size = checks.batch_size(batch_size)
        checks.not_none(x)
        checks.not_a_generator(x)
        _check_not_empty(x, method, "x")
        if isinstance(x, tuple) and inputs_kind.is_text(x):
            x = list(x)
        if isinstance(x, (str, bytes)):
            raise TypeError(f"{method}() takes a list of texts, got one string: pass [{checks.shown(x, 40)}].")
        self._check_ids(x, y)
        if method != "predict" and y is None and not inputs_kind.is_text(x) and _concrete_ids(x) is not None:
            raise ValueError(
                f"{method}() on token ids needs y, the next token at each position, of x['token_ids']'s shape "
                f"(as the preprocessor makes them: x from ids[:, :-1], y = ids[:, 1:]); or pass text."
            )
        if inputs_kind.is_text(x):
            self._check_texts(x, y, method)
        needs_y = method if method != "predict" else None
        return checks.dataset_ids(x, self.backbone.vocabulary_size, targets=True, needs_y=needs_y), batch_size

    def _check_ids(self, x, y):
        """Token ids given as arrays are in the vocabulary (a lookup past it gives NaN on JAX, an error deep
        in TensorFlow); datasets and tensors go unchecked."""
        vocabulary = self.backbone.vocabulary_size
        checks.text_list(x)
        if not inputs_kind.is_text(x):
            checks.token_id_dict(x, "[batch, length]")
        checks.model_inputs(x, vocabulary, self.backbone.max_sequence_length)
        targets = checks.concrete(y)
        if targets is not None and not inputs_kind.is_text(x):
            targets = checks.token_ids(targets, "y", vocabulary)
            ids = _concrete_ids(x)
            if ids is not None and targets.shape != np.shape(ids):
                raise ValueError(
                    f"y must have the shape of x['token_ids'] {np.shape(ids)} (the next token at "
                    f"each position), got {targets.shape}."
                )

    def _check_texts(self, texts, y, method):
        """Refuses `y` beside text (the targets are the text's own next tokens) and text with nothing to
        predict; warns, with counts, of texts with none and of texts longer than the packed length."""
        self._check_preprocessor()
        if y is not None:
            raise ValueError(
                f"{method}() on text uses each text's own next tokens as targets, so it takes no y: "
                f"leave y out (for labels, fine-tune a kgpt.GPTTaskModel)."
            )
        texts = texts.numpy() if tf is not None and isinstance(texts, tf.Tensor) else texts
        texts = [texts] if isinstance(texts, (str, bytes)) else np.asarray(texts, dtype=object).reshape(-1).tolist()
        start = int(bool(self.preprocessor.add_start_token))
        length = self.preprocessor.sequence_length
        sizes = []
        for i, text in enumerate(texts):
            try:  # TensorFlow's string tensors take UTF-8 only
                if isinstance(text, bytes):
                    text = text.decode("utf-8")
                else:
                    text.encode("utf-8")
            except UnicodeError as e:
                raise ValueError(
                    f"x[{i}] is not valid UTF-8 text ({e.reason} at character {e.start}): {checks.shown(text, 60)}"
                ) from None
            sizes.append(start + len(self.preprocessor.tokenizer.encode(text)))
        sizes = np.array(sizes)
        empty, cut = int((sizes < 2).sum()), int((sizes > length + 1).sum())
        used = {"fit": "trained on", "evaluate": "evaluated", "predict": "predicted"}[method]
        if empty == len(texts) and method != "predict":
            raise ValueError(
                f"{method}() got {len(texts)} text(s) with nothing to predict: each needs at least 2 "
                f"tokens (a token and the one after it)."
            )
        if empty:
            warnings.warn(
                f"{empty} of {len(texts)} texts have fewer than 2 tokens: nothing of them is {used}"
                + (" (their logits predict no token of theirs)." if method == "predict" else "."),
                stacklevel=3,
            )
        if cut:
            warnings.warn(
                f"{cut} of {len(texts)} texts are longer than sequence_length={length} tokens (+1 "
                f"target): {int(np.maximum(sizes - length - 1, 0).sum())} tokens past it are not "
                f"{used}. Split long texts into windows to use all of them.",
                stacklevel=3,
            )

    def _warn_if_warming_up(self, x, batch_size, kwargs):
        """Says so when the whole `fit` stays inside the learning-rate warm-up (`compile()`'s default is
        the paper's 2,000 updates of pre-training: a short fit barely moves the weights)."""
        schedule = getattr(getattr(self, "optimizer", None), "_learning_rate", None)
        if not isinstance(schedule, WarmupSchedule) or schedule.warmup_steps <= 0:
            return
        ids = _concrete_ids(x)
        rows = len(x) if isinstance(x, (list, np.ndarray)) else len(ids) if ids is not None else None
        steps = kwargs.get("steps_per_epoch") or (-(-rows // (batch_size or 32)) if rows else None)
        if not steps:
            return
        accumulation = schedule.gradient_accumulation_steps
        done = int(ops.convert_to_numpy(self.optimizer.iterations)) // accumulation
        end = done + steps * kwargs.get("epochs", 1) // accumulation
        if end < schedule.warmup_steps:
            reached = schedule.peak_learning_rate * end / schedule.warmup_steps
            warnings.warn(
                f"fit() runs {end - done} update(s), ending at update {end} of the optimizer's "
                f"{schedule.warmup_steps}-update warm-up: the learning rate reaches only {reached:.3g} of its peak "
                f"{schedule.peak_learning_rate:g}, so the model will barely change. For a short run, compile with "
                f"a shorter warm-up: lm.compile(optimizer=kgpt.gpt_adamw(warmup_steps=..., total_steps=...)).",
                stacklevel=3,
            )

    # --- scoring -----------------------------------------------------------

    def score(
        self,
        token_ids,
        padding_mask=None,
        scoring_mode="log_probs",
        layer_intercept_fn=None,
        target_ids=None,
        batch_size=32,
    ):
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
            raise ValueError(
                f"scoring_mode must be 'log_probs' (kgpt's), 'logits' or 'loss' (keras-hub's), got {scoring_mode!r}."
            )
        batch_size = checks.positive_int(batch_size, "batch_size")
        if scoring_mode == "log_probs":
            for name, value in (("layer_intercept_fn", layer_intercept_fn), ("target_ids", target_ids)):
                if value is not None:
                    raise ValueError(
                        f"{name} is for scoring_mode='logits' or 'loss' (keras-hub's); "
                        f"scoring_mode='log_probs' scores each next token of token_ids."
                    )
            if inputs_kind.is_text(token_ids):
                return self._score_text(token_ids, batch_size)
        elif inputs_kind.is_text(token_ids):
            raise ValueError(
                f"scoring_mode={scoring_mode!r} takes token ids; texts are scored with "
                f"scoring_mode='log_probs', or go through lm.preprocessor.generate_preprocess first."
            )
        token_ids = checks.token_ids(token_ids, "token_ids", self.backbone.vocabulary_size)
        if token_ids.shape[0] == 0 or token_ids.shape[1] < 2:
            raise ValueError(f"score() needs token_ids of shape [batch >= 1, length >= 2], got {token_ids.shape}.")
        if padding_mask is None:
            padding_mask = np.ones_like(token_ids)
        padding_mask = checks.padding_mask(padding_mask, "padding_mask", token_ids.shape)
        checks.within_context(token_ids.shape[1], self.backbone.max_sequence_length, "The length of token_ids")
        inputs = {"token_ids": token_ids, "padding_mask": padding_mask.astype("int32")}
        if scoring_mode == "log_probs":
            with checks.one_loop_at_a_time():
                return self._log_prob_model().predict(inputs, batch_size=batch_size, verbose=0)
        return self._keras_hub_score(inputs, scoring_mode, layer_intercept_fn, target_ids)

    def _score_text(self, texts, batch_size):
        """`score` on a text (an array) or a list of texts (a list of arrays), as `Scorer` scores them."""
        from kgpt.tasks.heuristics import Scorer

        self._check_preprocessor()
        texts, batched = inputs_kind.texts(texts, "score()")
        tokenizer = self.preprocessor.tokenizer
        scorer = Scorer(self, tokenizer, batch_size=batch_size)
        pairs = []
        for text in texts:
            context, tokens = list(scorer.prefix), tokenizer.encode(text)
            if not context:  # no newline token: the first token only conditions
                context, tokens = tokens[:1], tokens[1:]
            if not tokens:
                raise ValueError(f"Nothing to score in {checks.shown(text, 80)}: it has too few tokens.")
            newline = " (with the newline before it)" if scorer.prefix else ""
            what = f"The length in tokens of the text {checks.shown(text, 40)}{newline}"
            checks.within_context(len(context) + len(tokens), self.backbone.max_sequence_length, what, "; split it")
            pairs.append((context, tokens))
        scores = [s.astype("float32") for s in scorer.log_probs_of_ids(pairs)]
        return scores if batched else scores[0]

    def _log_prob_model(self):
        """The Keras model of `log P(token t+1 | tokens <= t)` `[batch, length - 1]`, made once."""
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

    def _keras_hub_score(self, inputs, scoring_mode, layer_intercept_fn, target_ids):
        """keras-hub's `score` modes on checked `inputs`: logits `[batch, length, vocabulary]` or per-token
        losses `[batch, length]`, as keras-hub's GPT-2 gives them (per-token losses, activation patching).

        One eager forward pass (a `tf.GradientTape` or `jax.grad` can follow it): the
        summed token and position embeddings go through `layer_intercept_fn(x, -1)`
        before the embedding dropout, each block's output through
        `layer_intercept_fn(x, i)`; what it returns goes on. `"loss"` is the
        cross-entropy of `target_ids` at every position (padding included, as
        keras-hub computes it).
        """
        if layer_intercept_fn is not None and not callable(layer_intercept_fn):
            raise TypeError(
                f"layer_intercept_fn must be a function fn(x, i) -> x, got {checks.shown(layer_intercept_fn, 80)}."
            )
        token_ids = inputs["token_ids"]
        if scoring_mode == "loss":
            if target_ids is None:
                raise ValueError(
                    "scoring_mode='loss' needs target_ids: the token to score at each position, e.g. "
                    "keras.ops.roll(token_ids, -1, axis=1)."
                )
            target_ids = checks.token_ids(target_ids, "target_ids", self.backbone.vocabulary_size)
            if target_ids.shape != token_ids.shape:
                raise ValueError(
                    f"target_ids must have the shape of token_ids {token_ids.shape}, got {target_ids.shape}."
                )
        elif target_ids is not None:
            raise ValueError("target_ids is for scoring_mode='loss'; 'logits' scores every vocabulary entry.")
        backbone = self.backbone
        if not hasattr(backbone, "transformer_layers"):  # the LSTM ablation: no blocks to intercept
            if layer_intercept_fn is not None:
                raise ValueError(
                    f"layer_intercept_fn needs a backbone of transformer blocks, not a {type(backbone).__name__}."
                )
            logits = self(inputs, training=False)
        else:
            intercept = layer_intercept_fn or (lambda x, i: x)
            tokens = backbone.token_embedding(token_ids)
            x = intercept(backbone.embeddings_add((tokens, backbone.position_embedding(tokens))), -1)
            x = backbone.embeddings_dropout(x, training=False)
            for i, block in enumerate(backbone.transformer_layers):
                x = intercept(block(x, padding_mask=inputs["padding_mask"], training=False), i)
            logits = backbone.token_embedding(x, reverse=True)
        if scoring_mode == "logits":
            return logits
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        return loss(target_ids, ops.cast(logits, "float32"))

    # --- generation --------------------------------------------------------

    def generate(self, inputs, max_length=None, stop_token_ids=None, strip_prompt=False):
        """Continues prompts token by token with the compiled sampler.

        Args:
            inputs: text (needs a preprocessor): a prompt string (or UTF-8
                bytes) or a list of them; or token ids: a list of prompts
                (lists of token ids), padded here to `max_length`, or keras-hub's dict
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
        stop_token_ids = self._check_stop_token_ids(stop_token_ids)
        max_length = checks.positive_int(max_length, "max_length", minimum=2, allow_none=True)
        if max_length is not None:
            checks.within_context(max_length, self.backbone.max_sequence_length, "max_length")
        if isinstance(inputs, np.ndarray) and inputs.ndim == 0:
            inputs = inputs.item()  # a 0-d array of one prompt: the prompt
        if isinstance(inputs, bytes):  # one prompt as UTF-8, as in a list of them or a tf.string tensor
            try:
                inputs = inputs.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"inputs is bytes that are not UTF-8 ({e.reason} at byte {e.start}): {checks.shown(inputs, 60)}; "
                    f"pass the prompt as a str."
                ) from None
        checks.not_a_generator(inputs, "inputs")
        text = inputs_kind.is_text(inputs)
        if text:
            self._check_preprocessor()
            if max_length is None:  # an attached preprocessor may pack more than the context
                checks.within_context(
                    self.preprocessor.sequence_length,
                    self.backbone.max_sequence_length,
                    "The preprocessor's sequence_length (generate's default max_length)",
                )
        if text or (tf is not None and isinstance(inputs, tf.data.Dataset)):
            return super().generate(
                inputs, max_length=max_length, stop_token_ids=stop_token_ids, strip_prompt=strip_prompt
            )
        if isinstance(inputs, dict):
            inputs = self._check_packed_prompts(inputs, max_length)
        else:
            inputs = self._pack_prompts(inputs, max_length)
        return self._generate_ids(inputs, stop_token_ids, strip_prompt)

    def _check_stop_token_ids(self, stop_token_ids):
        """`stop_token_ids` as a tuple of ids in the vocabulary (or None); one id is a list of one."""
        if stop_token_ids is None:
            return None
        if isinstance(stop_token_ids, numbers.Integral) and not isinstance(stop_token_ids, bool):
            stop_token_ids = [stop_token_ids]
        if isinstance(stop_token_ids, (str, bytes)) or not isinstance(stop_token_ids, (list, tuple, np.ndarray)):
            raise TypeError(f"stop_token_ids must be None or a list of token ids, got {stop_token_ids!r}.")
        vocabulary = self.backbone.vocabulary_size
        return tuple(
            checks.positive_int(t, "each of stop_token_ids", minimum=0, maximum=vocabulary - 1) for t in stop_token_ids
        )

    def _check_packed_prompts(self, inputs, max_length):
        """keras-hub's dict of right-padded prompts, checked: ids in the vocabulary, room to generate."""
        missing = {"token_ids", "padding_mask"} - set(inputs)
        if missing:
            raise ValueError(
                f"generate() on a dict needs the keys 'token_ids' and 'padding_mask' "
                f"(right-padded prompts); missing {sorted(missing)}."
            )
        ids = checks.token_ids(inputs["token_ids"], "token_ids", self.backbone.vocabulary_size)
        mask = checks.padding_mask(inputs["padding_mask"], "padding_mask", ids.shape)
        if max_length is not None and max_length != ids.shape[1]:
            raise ValueError(
                f"max_length={max_length}, but the token_ids are padded to {ids.shape[1]}: the "
                f"padded width is the generated length. Pad them to {max_length}, or leave out "
                f"max_length."
            )
        checks.within_context(ids.shape[1], self.backbone.max_sequence_length, "The length of token_ids")
        _check_room(mask.sum(axis=-1), ids.shape[1])
        return {"token_ids": ids, "padding_mask": mask}

    def _pack_prompts(self, prompts, max_length):
        """A list of token-id prompts, checked and right-padded to `max_length` (checked by `generate`;
        default: the model's context)."""
        if isinstance(prompts, np.ndarray):
            prompts = list(prompts)
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(
                f"generate() takes a prompt string, a list of them, a list of token-id lists or a "
                f"dict of padded arrays; got {type(prompts).__name__}."
            )
        if not prompts:
            raise ValueError("generate() got no prompts.")
        if any(isinstance(p, (str, bytes)) for p in prompts):
            raise TypeError(
                "generate() got a list that mixes strings with token ids: pass all prompts as text, "
                "or all as lists of token ids."
            )
        if not all(isinstance(p, (list, tuple, np.ndarray)) for p in prompts):
            raise TypeError(
                "generate() takes token ids as a list of prompts, each a list of ids (e.g. "
                "[[5, 6, 7]]), not a flat list of numbers."
            )
        prompts = [
            checks.token_ids([list(p)], f"prompt {i}", self.backbone.vocabulary_size)[0] for i, p in enumerate(prompts)
        ]
        max_length = max_length or self.backbone.max_sequence_length
        _check_room(np.array([len(p) for p in prompts]), max_length)
        token_ids = np.zeros((len(prompts), max_length), "int32")
        # Boolean, as the text preprocessor gives it: text and id prompts of
        # one shape then share one compiled generate function.
        padding_mask = np.zeros((len(prompts), max_length), "bool")
        for row, prompt in enumerate(prompts):
            token_ids[row, : len(prompt)] = prompt
            padding_mask[row, : len(prompt)] = 1
        return {"token_ids": token_ids, "padding_mask": padding_mask}

    def _generate_ids(self, inputs, stop_token_ids, strip_prompt):
        """keras-hub's generate() passes for packed token ids, without the preprocessor: compiled
        generation, then the prompt rolled to the end of each row when `strip_prompt`.

        keras-hub's `generate` would run the preprocessor on them, and detaching
        it for a call would race with other threads' calls on text.
        """
        generate_function = self.make_generate_function()
        distribution = keras.distribution.distribution()
        feed = dict(inputs)
        if distribution is not None:
            for key, value in feed.items():
                value = ops.convert_to_tensor(value)
                layout = distribution.get_data_layout(value.shape)
                feed[key] = keras.distribution.distribute_tensor(value, layout) if layout else value
        outputs = generate_function(feed, stop_token_ids=stop_token_ids)
        token_ids = np.asarray(ops.convert_to_numpy(outputs["token_ids"]))
        mask = np.asarray(ops.convert_to_numpy(outputs["padding_mask"])).astype(bool)
        if strip_prompt:
            prompt = np.asarray(inputs["padding_mask"]).astype(bool)
            shifts = -prompt.sum(axis=-1)
            token_ids = np.stack([np.roll(row, n) for row, n in zip(token_ids, shifts)])
            mask = np.stack([np.roll(m, n) ^ np.roll(p, n) for m, p, n in zip(mask, prompt, shifts)])
        return {"token_ids": token_ids, "padding_mask": mask}

    def make_generate_function(self):
        """keras-hub's compiled generate function, made once under a lock, run so that one model generates
        from many threads as it would from one.

        A call runs under a lock when the sampler has a random state, and on
        JAX never beside a Keras loop (`kgpt.checks.one_loop_at_a_time`: the
        loop detaches the variables' values, which keras-hub reads before each
        compiled call). A random sampler (top-k, top-p, random) keeps its seed
        in a variable that each call reads and advances: on JAX keras-hub
        reads it before the compiled call and writes it back after, so two
        threads at once would draw the same numbers and one advance would be
        lost; on TensorFlow the steps of two calls would take turns drawing
        from it. One call at a time gives each call the draws it would get
        from a single thread. Greedy, beam and contrastive search hold no
        state and run concurrently on TensorFlow.
        """
        with _MAKE_FUNCTION_LOCK:
            compiled = super().make_generate_function()
        sampler_lock = _SAMPLER_STATE_LOCK if self.sampler.variables else contextlib.nullcontext()

        def locked(inputs, stop_token_ids=None):
            with checks.one_loop_at_a_time(), sampler_lock:
                return compiled(inputs, stop_token_ids=stop_token_ids)

        return locked

    def export(self, filepath, format="tf_saved_model", verbose=True, **kwargs):
        """A TensorFlow SavedModel whose `serve` maps token ids `[batch, length]` to logits; on both backends.

        See `kgpt.io.export.export_causal_lm` (on JAX, the symbolic length is
        bounded by `max_sequence_length`, which Keras' defaults leave out).
        """
        from kgpt.io.export import export_causal_lm

        return export_causal_lm(self, filepath, format=format, verbose=verbose, **kwargs)

    def get_quantization_layer_structure(self, mode):
        """keras-hub's layout for GPTQ/AWQ calibration: what runs before the blocks, then the blocks.

        `pre_block_layers` is one Keras model from token ids `[batch, length]` to the
        first block's input: token plus position embeddings and the embedding
        dropout (the token embedding alone would feed the blocks inputs without
        positions). `sequential_blocks` are the backbone's transformer blocks.
        `None` for other modes, and for a backbone without blocks (the LSTM ablation).
        """
        backbone = self.backbone
        if mode not in ("gptq", "awq") or not hasattr(backbone, "transformer_layers"):
            return None
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        tokens = backbone.token_embedding(token_ids)
        x = backbone.embeddings_add((tokens, backbone.position_embedding(tokens)))
        embeddings = keras.Model(token_ids, backbone.embeddings_dropout(x), name="embeddings")
        return {"pre_block_layers": [embeddings], "sequential_blocks": backbone.transformer_layers}

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
        token_ids, padding_mask = inputs["token_ids"], inputs["padding_mask"]
        # Generation starts where the shortest prompt ends; longer prompts keep
        # their own tokens (the sampler only writes where the mask is 0).
        index = ops.min(ops.sum(ops.cast(padding_mask, "int32"), axis=-1))

        if self.backbone.supports_cache:
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


def _concrete_ids(x):
    """`x["token_ids"]` as NumPy when `x` is a dict holding concrete ids, else None."""
    return checks.concrete(x.get("token_ids")) if isinstance(x, dict) else None


def _check_not_empty(x, method, name):
    """Refuses an empty list or array (Keras would fail inside its first traced step)."""
    if isinstance(x, dict):
        for key, value in x.items():
            _check_not_empty(value, method, f"{name}[{key!r}]")
    elif isinstance(x, (list, tuple, np.ndarray)) and len(x) == 0:
        raise ValueError(f"{method}() got no examples: {name} is empty.")


def _check_room(lengths, max_length):
    """Every prompt has a token, and leaves room for one generated token within `max_length`."""
    if (lengths == 0).any():
        raise ValueError(
            f"generate() needs at least one token in every prompt; prompt {int(np.argmin(lengths))} has none."
        )
    if lengths.max() >= max_length:
        raise ValueError(
            f"Prompt {int(np.argmax(lengths))} has {int(lengths.max())} tokens, leaving no room to "
            f"generate within max_length={max_length}."
        )
