"""Fine-tuning model: backbone + task head at the extract token + tied LM head.

Paper section 3.2: the head is a linear layer on the last layer's hidden
state at each view's extract token (its last real token), after classifier
dropout; training minimises `task loss + lm_coef * LM loss`, the LM loss
being next-token cross-entropy over the real tokens of the same views.
Its parts: `kgpt.layers.views` (the layers that fold views into the batch),
`kgpt.models.gpt.gpt_task_preprocessor` (raw text in) and `kgpt.train.lm_loss`.
"""

import os
import random
import warnings

import keras
import numpy as np
from keras import ops
from keras_hub.models import Task as KerasHubTask
from keras_hub.models import TextClassifier

from kgpt import checks
from kgpt.data import batching, inputs_kind
from kgpt.io import hub
from kgpt.io.presets import (
    CONFIG_FILE,
    TASK_CONFIG_FILE,
    PresetMixin,
    check_overrides,
    check_preset_dir,
    load_task_preset,
    read_json,
    tokenizer_fits,
)
from kgpt.layers.dropout import Dropout
from kgpt.layers.int8 import QuantizeMixin
from kgpt.layers.views import ExtractStates, FoldViews, UnfoldViews
from kgpt.models.gpt.gpt_backbone import GPTBackbone, check_dtype, task_config_with_dtype
from kgpt.models.gpt.gpt_task_preprocessor import (
    GPTTaskPreprocessor,
    cut_to_context,
    encode_dataset,
    segment_columns,
)
from kgpt.models.pretrained import load_pretrained, with_special_tokens
from kgpt.parallel import distribute
from kgpt.tasks import heads as heads_lib
from kgpt.tasks.registry import TaskRegistry
from kgpt.tasks.task import Example
from kgpt.train import compile_cost
from kgpt.train.lm_loss import BatchMean, LMLossMixin, TiedLMLoss
from kgpt.train.optimizers import gpt_adamw


@keras.saving.register_keras_serializable(package="kgpt")
class GPTTaskModel(QuantizeMixin, LMLossMixin, PresetMixin, TextClassifier):
    """A `GPTBackbone` fine-tuned on a task, with the auxiliary LM loss.

    Inputs `{"token_ids", "padding_mask"}` of shape `[batch, num_views,
    length]`. Outputs a dict: `"task"`, what the head outputs (logits
    `[batch, classes]`, a value `[batch]`, or one logit per choice `[batch,
    choices]`); and, when `lm_coef > 0`, `"lm"`: the final hidden states
    `[batch, num_views, length - 1, hidden]` that predict the next tokens.
    The LM loss (`kgpt.train.lm_loss.TiedLMLoss`) projects them through the tied
    embedding a chunk of tokens at a time, so the `[batch, views, length,
    vocabulary]` logits never exist at once.

    With a preprocessor (`from_preset` attaches one), `fit`, `evaluate` and
    `predict` take raw text, batched by length (`kgpt.data.batching`). `predict`
    returns the head's raw outputs on every kind of input, as keras-hub's
    classifiers do: logits (classification, multiple choice) or values
    (regression); `head.probabilities` turns them into probabilities. Arrays
    and `tf.data` datasets of token ids work as for any Keras model, with targets
    `y = {"task": ..., "lm": token_ids[..., 1:]}` and `sample_weight = {"task": ..., "lm": padding_mask[..., 1:]}`.

    It is a `keras_hub.models.TextClassifier`: keras-hub's
    `TextClassifier.from_preset(dir)` on a kgpt task preset gives this class
    (through keras-hub's own loader; `GPTTaskModel.from_preset` checks more).

    Args:
        backbone: a `kgpt.GPTBackbone` whose vocabulary includes the start,
            delimiter and extract tokens.
        head: a `kgpt.tasks.heads.Head`: what the model outputs, its loss, how a
            prediction is decoded (e.g. `kgpt.tasks.heads.ClassificationHead(labels)`).
        num_classes: instead of `head`, as keras-hub's classifiers take it:
            `ClassificationHead` over labels `0..num_classes-1` (names `"0"`, `"1"`, ...).
        num_views: views per example (1; 2 for similarity; the choices for
            multiple choice).
        lm_coef: weight of the auxiliary LM loss (paper: 0.5); 0 removes it
            and its output.
        classifier_dropout: dropout before the linear layer (paper: 0.1).
        task_name: the registered task it was fine-tuned for, saved with it.
        preprocessor: a `kgpt.GPTTaskPreprocessor`, or None.

    Example:
    ```python
    import kgpt

    model = kgpt.GPTTaskModel.from_preset("lm_out", task="sst2")   # a kgpt-train --task lm preset
    model.fit(["a joy to watch", "dull and long"], ["1", "0"], batch_size=2)
    logits = model.predict(["what a film"])                        # [[logit("0"), logit("1")]]
    model.head.probabilities(logits)                               # [[p("0"), p("1")]]
    model.predict_labels(["what a film"])                          # ['1']
    model.save_to_preset("sst2_out")    # GPTTaskModel.from_preset("sst2_out") predicts on text again
    ```
    """

    backbone_cls = GPTBackbone
    preprocessor_cls = GPTTaskPreprocessor

    def __init__(
        self,
        backbone,
        head=None,
        num_views=1,
        lm_coef=0.5,
        classifier_dropout=0.1,
        task_name=None,
        preprocessor=None,
        num_classes=None,
        **kwargs,
    ):
        checks.model_kwargs(kwargs, type(self).__name__, also=("compile",))
        num_views = checks.positive_int(num_views, "num_views")
        lm_coef = checks.nonnegative(lm_coef, "lm_coef")  # a float: a NumPy scalar is not saved in JSON
        classifier_dropout = checks.rate(classifier_dropout, "classifier_dropout")
        head = _head(head, num_classes, num_views)
        if preprocessor is not None:
            _check_fits(preprocessor, backbone, head, num_views)

        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.fold_ids = FoldViews(name="fold_token_ids")
        self.fold_mask = FoldViews(name="fold_padding_mask")
        self.extract_states = ExtractStates(num_views, name="extract_states")
        self.classifier_dropout_layer = Dropout(classifier_dropout, name="classifier_dropout")
        self.classifier = keras.layers.Dense(
            head.units(num_views),
            kernel_initializer=keras.initializers.RandomNormal(stddev=0.02),
            name="classifier",
        )
        self.unfold_lm = UnfoldViews(num_views, name="unfold_lm_states")

        # === Functional Model ===
        token_ids = keras.Input(shape=(num_views, None), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(num_views, None), dtype="int32", name="padding_mask")
        flat_mask = self.fold_mask(padding_mask)  # [B*K, L]
        hidden = backbone({"token_ids": self.fold_ids(token_ids), "padding_mask": flat_mask})  # [B*K, L, H]
        states = self.extract_states(hidden, flat_mask)  # [B, K, H]
        if head.pooling == "sum":
            states = ops.sum(states, axis=1)  # [B, H]
        scores = self.classifier(self.classifier_dropout_layer(states))  # [B, units] or [B, K, units]
        outputs = {"task": head.outputs(scores)}
        if lm_coef > 0:
            outputs["lm"] = self.unfold_lm(hidden[:, :-1])  # [B, K, L-1, H]
        compile_now = kwargs.pop("compile", True)  # after the config below, which compile() reads
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask}, outputs=outputs, compile=False, **kwargs
        )

        # === Config ===
        # Plain attribute: a head is configuration, not a tracked layer.
        object.__setattr__(self, "head", head)
        self.num_views = num_views
        self.lm_coef = lm_coef
        self.classifier_dropout = classifier_dropout
        self.task_name = task_name
        if compile_now:
            self.compile()

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "head": keras.saving.serialize_keras_object(self.head),
                "num_views": self.num_views,
                "lm_coef": self.lm_coef,
                "classifier_dropout": self.classifier_dropout,
                "task_name": self.task_name,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = task_config_with_dtype(config)  # a `dtype` (from_preset's) is the backbone's
        if isinstance(config.get("head"), dict):
            config["head"] = keras.saving.deserialize_keras_object(config["head"])
        return super().from_config(config)

    @classmethod
    def from_preset(
        cls,
        preset,
        task=None,
        registry=None,
        sequence_length=None,
        lm_coef=None,
        classifier_dropout=None,
        **kwargs,
    ):
        """A task model from a fine-tuned preset, or a new one on a pre-trained model for `task`.

        Args:
            preset: a fine-tuned preset (`kgpt-train --task NAME --output_dir`,
                or `save_to_preset`; a folder or `hf://OWNER/REPO`): loaded with its head, label names and
                input transformation, so it predicts on text without the
                task's plugin. Or a starting point to fine-tune: a kgpt
                preset (`kgpt-train --task lm --output_dir`), the original
                GPT-1 release's `model/` folder, Hugging Face openai-gpt
                files, or the released GPT-1 from the Hub (`"gpt1_base_en"`);
                the start, delimiter and extract tokens are added when the
                vocabulary lacks them.
            task: with a starting point, the task: a registered name
                (`"sst2"`) or a `kgpt.Task`. With a fine-tuned preset, None
                or its own task's name.
            registry: where names are looked up (default: every installed
                task plugin).
            sequence_length: tokens per view, keras-hub's packed length
                (kgpt-train's `--max_length`; default: the model's context, or
                a fine-tuned preset's own); cut to the context, with a warning.
            lm_coef, classifier_dropout: for a new model (default: the
                paper's 0.5 and 0.1); a fine-tuned preset keeps its own.
            **kwargs: overrides of the saved config; `dtype` (e.g. `"mixed_bfloat16"`) is the
                backbone's dtype policy, as in keras-hub.
        """
        load_weights = kwargs.pop("load_weights", True)
        checks.boolean(load_weights, "load_weights")
        check_overrides(cls, kwargs)
        check_dtype(kwargs.get("dtype"))
        sequence_length = checks.positive_int(sequence_length, "sequence_length", allow_none=True)
        if task is not None and not isinstance(task, str) and not hasattr(task, "transform"):
            raise TypeError(f"task must be a registered task's name or a kgpt.Task, got {task!r}.")
        preset = hub.local(preset, cls.backbone_cls)
        if is_task_preset(preset, cls):
            if lm_coef is not None or classifier_dropout is not None:
                raise ValueError(
                    f"{preset} is fine-tuned: lm_coef and classifier_dropout are its own; they are "
                    f"chosen when fine-tuning starts from a pre-trained preset."
                )
            model = load_task_preset(cls, preset, load_weights=load_weights, **kwargs)
            if sequence_length is not None and model.preprocessor is not None:
                model.preprocessor.sequence_length = cut_to_context(
                    sequence_length, model.backbone.max_sequence_length, f"preset {preset}", "sequence_length"
                )
            name = getattr(task, "name", task)
            if name is not None and name != model.task_name:
                raise ValueError(
                    f"{preset} is fine-tuned for task {model.task_name!r}, not {name!r}: load it without "
                    f"task=, or fine-tune its pre-trained model (kgpt-train --init) for {name!r}."
                )
            return model
        # A missing folder, a run still in progress or no preset at all is named as such, not as a pre-trained model.
        check_preset_dir(preset, CONFIG_FILE, cls.backbone_cls)
        if task is None:
            raise ValueError(
                f"{preset} is not a fine-tuned task model: pass task=NAME (a registered task or a "
                f"kgpt.Task) to fine-tune it."
            )
        if not load_weights:
            raise ValueError(
                f"load_weights=False: {preset} is a pre-trained model to fine-tune from, so its weights "
                f"are the point. For fresh weights build kgpt.GPTTaskModel(kgpt.GPTBackbone(...), ...)."
            )
        if isinstance(task, str):
            task = (registry or TaskRegistry()).get(task)
        backbone, tokenizer, _ = load_pretrained(preset, dtype=kwargs.pop("dtype", None))
        backbone = with_special_tokens(backbone, tokenizer)
        limit = backbone.max_sequence_length
        # A table task's columns are saved, as kgpt-train saves them: kgpt-predict reads the same ones by default.
        columns = segment_columns(task.inputs()) if hasattr(task, "inputs") else None
        preprocessor = GPTTaskPreprocessor(
            tokenizer,
            task.transform,
            sequence_length=cut_to_context(sequence_length, limit, f"preset {preset}", "sequence_length") or limit,
            columns=columns,
        )
        chosen = {"lm_coef": lm_coef, "classifier_dropout": classifier_dropout}
        return cls(
            backbone,
            head=task.head,
            num_views=task.transform.num_views,
            task_name=task.name,
            preprocessor=preprocessor,
            **{k: v for k, v in chosen.items() if v is not None},
            **kwargs,
        )

    def compile(
        self,
        optimizer="auto",
        loss="auto",
        *,
        weighted_metrics="auto",
        total_steps=None,
        lm_loss_chunk_size="auto",
        **kwargs,
    ):
        """Configures fine-tuning with the paper's defaults.

        Args:
            optimizer: `"auto"` for `kgpt.gpt_adamw(6.25e-5)` with 0.2% linear
                warm-up and linear decay to 0 at `total_steps` (constant
                after warm-up when `None`), or any optimizer.
            loss: `"auto"` for the head's loss (averaged over the batch's
                examples by sample weight, `kgpt.train.lm_loss.BatchMean`)
                plus `lm_coef` x the LM cross-entropy averaged over real
                tokens; or a Keras loss spec.
            weighted_metrics: `"auto"` for the head's metrics (accuracy for
                classification and multiple choice).
            total_steps: the fine-tuning run's number of updates.
            lm_loss_chunk_size: tokens whose logits the `"auto"` LM loss
                computes at once (`kgpt.train.lm_loss`; `"auto"`: 1024,
                `None`: all of them at once), as for `GPTCausalLM`.
        """
        if optimizer == "auto":
            warmup = int(0.002 * total_steps) if total_steps else 0
            optimizer = gpt_adamw(6.25e-5, warmup_steps=warmup, total_steps=total_steps, decay="linear")
        loss_weights = kwargs.pop("loss_weights", None)
        if loss == "auto":
            loss = {"task": BatchMean(self.head.loss())}
            loss_weights = {"task": 1.0}
            if "lm" in self.output:
                loss["lm"] = self.tied_lm_loss(lm_loss_chunk_size)
                loss_weights["lm"] = self.lm_coef
        elif isinstance(loss, dict) and "lm" in loss and not isinstance(loss["lm"], TiedLMLoss):
            raise ValueError(
                "The 'lm' output holds hidden states, not logits: its loss must be a kgpt.train.lm_loss.TiedLMLoss."
            )
        if weighted_metrics == "auto":
            weighted_metrics = {"task": self.head.metrics()}
        # keras-hub's Task.compile: TextClassifier's would add its own "auto" accuracy on the dict of outputs.
        KerasHubTask.compile(
            self, optimizer=optimizer, loss=loss, loss_weights=loss_weights, weighted_metrics=weighted_metrics, **kwargs
        )

    def get_compile_config(self):
        config = super().get_compile_config()
        lm_loss = self.loss.get("lm") if config and isinstance(self.loss, dict) else None
        if isinstance(lm_loss, TiedLMLoss):
            config["lm_loss_chunk_size"] = lm_loss.chunk_size
        return config

    def compile_from_config(self, config):
        # Keras skips this for models with a custom compile(); restore the
        # optimizer (and its state, loaded after this) with our default losses.
        optimizer = keras.saving.deserialize_keras_object(config["optimizer"])
        self.compile(optimizer=optimizer, lm_loss_chunk_size=config.get("lm_loss_chunk_size", "auto"))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    # --- raw text in ----------------------------------------------------------------

    def encode(self, x, y=None, name="inputs"):
        """Raw text (and labels) -> a `kgpt.data.batching.EncodedSplit` through the attached preprocessor."""
        if self.preprocessor is None:
            raise ValueError(
                "Text inputs need a preprocessor: load with GPTTaskModel.from_preset(dir, task=...) or "
                "pass preprocessor=kgpt.GPTTaskPreprocessor(tokenizer, transform)."
            )
        targets = None
        if y is None and isinstance(x, list) and x and all(isinstance(e, Example) for e in x):
            if all(e.label is not None for e in x):  # labelled examples carry their labels and sources
                targets = np.asarray(
                    [self.head.target(e.label, e.source or f"{name} example {i}") for i, e in enumerate(x)],
                    self.head.target_dtype,
                )
        elif y is not None:
            if hasattr(y, "numpy") and not isinstance(y, np.ndarray):
                y = y.numpy()
            labels = y.tolist() if isinstance(y, np.ndarray) else list(y)
            targets = np.asarray(
                [self.head.target(label, f"{name} label {i}") for i, label in enumerate(labels)], self.head.target_dtype
            )
        split = self.preprocessor.encode_batch(x, targets, name=name)
        if split.counts["truncated"]:
            warnings.warn(
                f"{split.counts['truncated']} of {len(split)} examples in {name} are longer than "
                f"sequence_length={self.preprocessor.sequence_length} tokens: {split.counts['tokens_cut']} "
                f"tokens were cut from the end of their longest segments.",
                stacklevel=2,
            )
        return split

    def _labeled_split(self, x, y, name="inputs"):
        """Texts and labels (or an `EncodedSplit`) as an `EncodedSplit` with targets."""
        split = x if isinstance(x, batching.EncodedSplit) else self.encode(x, y, name=name)
        if split.targets is None:
            raise ValueError(
                f"Training or evaluating on text needs labels: pass y (label names or indices) for {name}."
            )
        return split

    def _text_dataset(
        self,
        x,
        y,
        batch_size,
        seed=None,
        name="inputs",
        epochs=1,
        compile_batches=batching.COMPILE_BATCHES,
        attention_length=None,
    ):
        """Texts and labels (or an `EncodedSplit`) as a `tf.data` dataset of length-bucketed model batches.

        Its padded lengths are planned for `epochs` passes, each compilation
        worth `compile_batches` steps, a row's cost growing with `attention_length`
        (`kgpt.data.batching.length_plan`).
        """
        split = self._labeled_split(x, y, name=name)
        batch_size = batch_size or 32
        return batching.dataset(
            split,
            batch_size,
            seed=seed,
            lm="lm" in self.output,
            epochs=epochs,
            max_lengths=self.max_padded_lengths(split, batch_size, epochs, compile_batches, attention_length),
            compile_batches=compile_batches,
            attention_length=attention_length,
        )

    def _encode_dataset(self, ds, targets):
        """A batched `tf.data.Dataset` of raw text -> model batches (`gpt_task_preprocessor.encode_dataset`)."""
        if self.preprocessor is None:
            raise ValueError(
                "A dataset of text needs a preprocessor: load with GPTTaskModel.from_preset(dir, "
                "task=...) or attach preprocessor=kgpt.GPTTaskPreprocessor(tokenizer, transform)."
            )
        return encode_dataset(ds, self.encode, self.num_views, self.head.target_dtype, "lm" in self.output, targets)

    def _check_inputs(self, x, batch_size, y=None, sample_weight=None, name="x", targets=None):
        """What `fit`, `evaluate` and the `predict` methods check before anything runs; returns `batch_size`.

        On token ids, `y` and `sample_weight` too (`_check_targets`; `targets`
        names the method that needs `y`).
        """
        checks.not_none(x, name)
        checks.not_a_generator(x, name)
        checks.text_list(x, name)
        if not _is_text(x) and not isinstance(x, batching.EncodedSplit):
            checks.token_id_dict(x, "[batch, num_views, length]", name)
            checks.model_inputs(x, self.backbone.vocabulary_size, self.backbone.max_sequence_length, ndim=3, name=name)
            self._check_views(x, name)
            self._check_targets(x, y, sample_weight, targets)
        return checks.batch_size(batch_size)

    def _check_views(self, x, name):
        """Each example has `num_views` right-padded views with a real token: a view count the model does not take
        came back as that many rows of outputs, and an empty or left-padded view's extract state is a padding one."""
        if not isinstance(x, dict):
            return
        ids, mask = (checks.concrete(x.get(key)) for key in checks.INPUT_KEYS)
        if ids is None or mask is None:
            return
        ids, mask = np.asarray(ids), np.asarray(mask).astype(bool)
        if ids.shape[1] != self.num_views:
            raise ValueError(
                f"{name}['token_ids'] has {ids.shape[1]} views per example (shape {ids.shape}); this "
                f"model takes num_views={self.num_views}: [batch, {self.num_views}, length]."
            )
        empty = np.argwhere(~mask.any(-1))
        if len(empty):
            raise ValueError(
                f"{name}['padding_mask']{empty[0].tolist()} has no real token: every view needs its "
                f"tokens (at least the extract token the head reads)."
            )
        unpadded = np.argwhere((mask[..., 1:] > mask[..., :-1]).any(-1))
        if len(unpadded):
            raise ValueError(
                f"{name}['padding_mask']{unpadded[0].tolist()} is not right-padded: real tokens first, "
                f"then padding (the head reads the last real token)."
            )

    def _check_targets(self, x, y, sample_weight, targets=None):
        """Targets beside token-id arrays (required by the method `targets` names, `"fit"` or `"evaluate"`): `{"task": [batch], "lm": token_ids[..., 1:]}` (a bare task array
        without the LM output), each in range and one per example. Class indices past the head's classes
        trained silently on JAX and failed deep in TensorFlow's graph; LM targets past the vocabulary gave NaN."""
        ids = checks.concrete(x.get("token_ids")) if isinstance(x, dict) else None
        if ids is None:
            return
        ids = np.asarray(ids)
        outputs = sorted(self.output)
        layout = "{'task': targets [batch]" + (", 'lm': x['token_ids'][..., 1:]}" if "lm" in outputs else "}")
        if y is not None:
            if not isinstance(y, dict) and outputs == ["task"]:
                y = {"task": y}
            if not isinstance(y, dict) or sorted(map(str, y)) != outputs:
                got = f"has keys {sorted(map(str, y))}" if isinstance(y, dict) else f"is a {type(y).__name__}"
                raise ValueError(
                    f"y {got}; the model's outputs are {outputs}, so y on token ids is {layout}"
                    + (" (lm_coef=0 removes the LM output)." if "lm" in outputs else ".")
                )
            task = checks.concrete(y["task"])
            if task is not None and isinstance(self.head, heads_lib.Categorical):
                checks.class_indices(task, "y['task']", int(self.output["task"].shape[-1]))
            elif task is not None and not np.isfinite(np.asarray(task, "float64")).all():
                raise ValueError("y['task'] holds a non-finite value: regression targets must be finite numbers.")
            lm = checks.concrete(y.get("lm"))
            if lm is not None:
                lm = checks.token_ids(lm, "y['lm']", self.backbone.vocabulary_size, ndim=3)
                if lm.shape != ids.shape[:-1] + (ids.shape[-1] - 1,):
                    raise ValueError(
                        f"y['lm'] must have shape {ids.shape[:-1] + (ids.shape[-1] - 1,)} "
                        f"(x['token_ids'][..., 1:], each position's next token), got {lm.shape}."
                    )
            checks.same_batch(len(ids), {f"y[{k!r}]": v for k, v in y.items()})
        elif targets:
            raise ValueError(f"{targets}() on token ids needs y, {layout}; or pass text with its labels.")
        if isinstance(sample_weight, dict):
            checks.same_batch(len(ids), {f"sample_weight[{k!r}]": v for k, v in sample_weight.items()})
        elif sample_weight is not None:
            checks.same_batch(len(ids), {"sample_weight": sample_weight})

    def max_padded_lengths(
        self, split, batch_size, epochs=1, compile_batches=batching.COMPILE_BATCHES, attention_length=None
    ):
        """How many padded lengths batches of `split` may use in `epochs` passes: all without XLA, fewer with (each
        compilation worth `compile_batches` steps, a row's cost growing with `attention_length`:
        `kgpt.data.batching`)."""
        return batching.max_lengths_of(self.jit_compile, split, batch_size, epochs, compile_batches, attention_length)

    # keras-hub's PipelineModel maps the preprocessor over tf.data batches;
    # task examples are tokenized in Python and batched by length instead.
    def fit(
        self,
        x=None,
        y=None,
        batch_size=None,
        epochs=1,
        verbose="auto",
        callbacks=None,
        validation_data=None,
        shuffle=True,
        **kwargs,
    ):
        """Keras `fit`; on raw text (see the class docstring), `y` holds labels (names or indices).

        Text batches are drawn by length (`kgpt.data.batching`) and, when
        `shuffle`, shuffled from a seed drawn where Keras draws its default
        seeds (Python's `random`, which `keras.utils.set_random_seed` seeds);
        NumPy's global generator is left alone.
        `validation_data=(texts, labels)` is encoded the same way.
        """
        batch_size = self._check_inputs(x, batch_size, y, kwargs.get("sample_weight"), targets="fit")
        if isinstance(validation_data, tuple) and len(validation_data) in (2, 3):
            self._check_inputs(validation_data[0], None, *validation_data[1:], name="validation_data[0]")
        if inputs_kind.is_text_dataset(x):
            x = self._encode_dataset(x, targets=True)
            if inputs_kind.is_text_dataset(validation_data):
                validation_data = self._encode_dataset(validation_data, targets=True)
        elif _is_text(x) or isinstance(x, batching.EncodedSplit):
            checks.refuse_on_text("fit", kwargs, ("sample_weight", "class_weight", "validation_split"))
            seed = random.getrandbits(31) if shuffle else None
            batch_size = batch_size or 32
            split = self._labeled_split(x, y)
            passes = epochs - kwargs.get("initial_epoch", 0)
            # On JAX each padded length compiles: what that costs is measured before the lengths are planned.
            attention = compile_cost.attention_length(self.backbone, "lm" in self.output)
            cost = (
                compile_cost.compile_batches(self, split, batch_size, "lm" in self.output, attention_length=attention)
                if self.compiled
                else batching.COMPILE_BATCHES
            )
            x = self._text_dataset(
                split, None, batch_size, seed=seed, epochs=passes, compile_batches=cost, attention_length=attention
            )
            if validation_data is not None:
                # Keras' form: a tuple is (x, y) or (x, y, sample_weight), never text alone: (texts, label names)
                # was read as a pair of text columns, with no labels.
                if not isinstance(validation_data, tuple):
                    validation_data = (validation_data, None)
                if len(validation_data) > 2 and validation_data[2] is not None:
                    raise ValueError("validation_data on text is (texts, labels): sample weights are not supported.")
                validation_data = self._text_dataset(
                    validation_data[0],
                    validation_data[1],
                    batch_size,
                    name="validation_data",
                    epochs=passes,
                    compile_batches=cost,
                    attention_length=attention,
                )
            y = batch_size = None
            shuffle = False  # the dataset draws each epoch's order itself
        vocabulary = self.backbone.vocabulary_size
        x = checks.dataset_ids(x, vocabulary, needs_y="fit")
        validation_data = checks.dataset_ids(validation_data, vocabulary, needs_y="evaluate")
        with checks.dataset_errors(self):
            return keras.Model.fit(
                self,
                x,
                y,
                batch_size=batch_size,
                epochs=epochs,
                verbose=verbose,
                callbacks=callbacks,
                validation_data=validation_data,
                shuffle=shuffle,
                **kwargs,
            )

    def evaluate(self, x=None, y=None, batch_size=None, **kwargs):
        """Keras `evaluate`; on raw text, `y` holds labels."""
        batch_size = self._check_inputs(x, batch_size, y, kwargs.get("sample_weight"), targets="evaluate")
        if inputs_kind.is_text_dataset(x):
            x = self._encode_dataset(x, targets=True)
        elif _is_text(x) or isinstance(x, batching.EncodedSplit):
            x, y, batch_size = self._text_dataset(x, y, batch_size), None, None
        with checks.dataset_errors(self):
            return keras.Model.evaluate(
                self,
                checks.dataset_ids(x, self.backbone.vocabulary_size, needs_y="evaluate"),
                y,
                batch_size=batch_size,
                **kwargs,
            )

    def predict(self, x, batch_size=None, verbose="auto", **kwargs):
        """The head's raw outputs, in input order, whatever the input: as keras-hub's classifiers give logits.

        Logits `[examples, classes]` (classification), one logit per choice
        `[examples, choices]` (multiple choice) or values `[examples]`
        (regression), on raw text, a batched `tf.data.Dataset` of text, an
        `EncodedSplit`, token-id arrays `{"token_ids", "padding_mask"}` of shape
        `[examples, num_views, length]` or a dataset of them. The LM output,
        which only the loss needs, is not computed (`model(x)["lm"]` gives it).
        Probabilities: `model.head.probabilities(model.predict(x))`.
        """
        batch_size = self._check_inputs(x, batch_size)
        if inputs_kind.is_text_dataset(x):
            x = self._encode_dataset(x, targets=False)
        elif _is_text(x) or isinstance(x, batching.EncodedSplit):
            checks.refuse_on_text("predict", kwargs, tuple(kwargs))  # steps, callbacks: the text's batches are kgpt's
            split = x if isinstance(x, batching.EncodedSplit) else self.encode(x)
            return distribute.predict_outputs(self.task_predictor(), split, batch_size or 32)
        predictor = self.task_predictor()
        # The loop runs on the predictor: its state is the one to restore.
        with checks.dataset_errors(predictor, metrics=False):
            return predictor.predict(
                checks.dataset_ids(x, self.backbone.vocabulary_size), batch_size=batch_size, verbose=verbose, **kwargs
            )

    def predict_labels(self, x, batch_size=None):
        """Predictions on raw text as the task names them: label names, choice indices or values."""
        outputs = self.predict(x, batch_size)
        return [self.head.prediction_name(p) for p in self.head.decode(outputs)]

    def export(self, filepath, format="tf_saved_model", verbose=True, **kwargs):
        """Exports a TensorFlow SavedModel whose `serve` endpoint returns the task output only.

        `serve` (also `serving_default`) takes `{"token_ids", "padding_mask"}`,
        int32 `[batch, num_views, length]` (any batch size, any length up to
        `backbone.max_sequence_length`, right-padded) and returns the head's raw
        outputs as `task_predictor()` does: logits `[batch, classes]` or
        `[batch, choices]`, or values `[batch]`. The LM hidden states are not
        exported. It takes token ids, not text: the GPT-1 tokenizer's exact
        algorithm is Python, so text goes through `model.preprocessor` first.
        Works on the TensorFlow and JAX backends (JAX through jax2tf); serving
        needs only TensorFlow. See `kgpt.io.export.export_task_model`.

        Example:
        ```python
        model.export("sst2_savedmodel")
        served = tf.saved_model.load("sst2_savedmodel")
        served.serve(model.preprocessor(["a joy to watch"]))  # logits [1, 2]
        ```
        """
        from kgpt.io.export import export_task_model

        return export_task_model(self, filepath, format=format, verbose=verbose, **kwargs)

    def train_on_batch(self, x, y=None, sample_weight=None, **kwargs):
        self._check_inputs(x, None, y, sample_weight, targets="train_on_batch")
        return keras.Model.train_on_batch(self, x, y, sample_weight=sample_weight, **kwargs)

    def test_on_batch(self, x, y=None, sample_weight=None, **kwargs):
        self._check_inputs(x, None, y, sample_weight, targets="test_on_batch")
        return keras.Model.test_on_batch(self, x, y, sample_weight=sample_weight, **kwargs)

    def save_task_weights(self, filepath):
        """keras-hub's `save_task_weights` (the head's weights, for `task.weights.h5`), without the optimizer.

        keras-hub's writes the optimizer's state too: about twice the model's
        size after fine-tuning. A preset never needs it: `from_preset` builds
        a fresh optimizer, and a run resumes from its own checkpoint
        (`kgpt.train.checkpoint`), which holds the optimizer.
        """
        self._check_weights_path(filepath)
        keras.saving.save_weights(self, filepath=filepath, objects_to_skip=self._not_task_weights())

    def load_task_weights(self, filepath):
        """keras-hub's `load_task_weights`; the optimizer state an earlier kgpt saved in the file is not read."""
        self._check_weights_path(filepath)
        keras.saving.load_weights(self, filepath, objects_to_skip=self._not_task_weights())

    def _not_task_weights(self):
        optimizer = [self.optimizer] if getattr(self, "optimizer", None) is not None else []
        return [*self.backbone._flatten_layers(), *optimizer]

    @staticmethod
    def _check_weights_path(filepath):
        if not str(filepath).endswith(".weights.h5"):  # as keras-hub checks it
            raise ValueError(f"The filename must end in `.weights.h5`. Received: filepath={filepath}")

    def task_predictor(self):
        """A Keras model of the same layers with the task output only (no LM hidden states)."""
        predictor = getattr(self, "_task_predictor", None)
        if predictor is None:
            predictor = keras.Model(self.input, self.output["task"], name="task_predictor")
            # Plain attribute: it shares our layers and must not be tracked or saved.
            object.__setattr__(self, "_task_predictor", predictor)
        return predictor


def is_task_preset(preset, cls=None):
    """Whether `preset` is a directory holding a fine-tuned task model (`task.json` of a `GPTTaskModel`)."""
    config = os.path.join(preset, TASK_CONFIG_FILE) if isinstance(preset, (str, os.PathLike)) else None
    if not config or not os.path.isfile(config):
        return False
    saved = read_json(config, "a kgpt task config")
    return isinstance(saved, dict) and saved.get("registered_name") == keras.saving.get_registered_name(
        cls or GPTTaskModel
    )


def _head(head, num_classes, num_views):
    """`head`, or keras-hub's `num_classes` as a classifier over labels `"0"`..`"num_classes-1"`, checked against
    `num_views`."""
    if num_classes is not None:
        if head is not None:
            raise ValueError(
                "Pass head= or num_classes=, not both (num_classes=N is "
                "head=kgpt.tasks.heads.ClassificationHead(['0', ..., 'N-1']))."
            )
        num_classes = checks.positive_int(num_classes, "num_classes", minimum=2)
        return heads_lib.ClassificationHead([str(i) for i in range(num_classes)])
    if head is None:
        raise ValueError(
            "GPTTaskModel needs head= (a kgpt.tasks.heads.Head) or num_classes= (a classifier "
            "whose labels are 0..num_classes-1)."
        )
    if isinstance(head, str):
        raise ValueError(
            f"head={head!r}: pass a head object, not a name: kgpt.tasks.heads.ClassificationHead(labels), "
            f"RegressionHead() or MultipleChoiceHead(k)."
        )
    if not isinstance(head, heads_lib.Head):
        raise ValueError(
            f"head must be a kgpt.tasks.heads.Head (e.g. kgpt.tasks.heads.ClassificationHead(labels)), got {head!r}."
        )
    checks.one_of(head.pooling, f"{head!r}: pooling", ("sum", "each"))
    if isinstance(head, heads_lib.MultipleChoiceHead) and head.num_choices != num_views:
        raise ValueError(f"{head!r} needs num_views={head.num_choices}, got {num_views}.")
    return head


def _check_fits(preprocessor, backbone, head, num_views):
    """Refuses a preprocessor whose ids, views or length the model cannot take."""
    tokenizer_fits(preprocessor, backbone)
    transform = preprocessor.transform
    problem = head.check(transform) or (
        f"the preprocessor's {transform.kind} transform makes {transform.num_views} view(s), the model takes "
        f"{num_views}"
        if transform.num_views != num_views
        else None
    )
    if problem:
        raise ValueError(f"The preprocessor does not fit the model: {problem}.")
    checks.within_context(
        preprocessor.sequence_length, backbone.max_sequence_length, "The preprocessor's sequence_length"
    )


def _is_text(x):
    """Whether `x` is raw text for the preprocessor (text columns, or a list of `Example`s), not token ids."""
    return inputs_kind.is_text_columns(x) or (isinstance(x, list) and bool(x) and isinstance(x[0], Example))
