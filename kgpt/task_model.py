"""Fine-tuning model: backbone + task head at the extract token + tied LM head.

Paper section 3.2: the head is a linear layer on the last layer's hidden
state at each view's extract token (its last real token), after classifier
dropout; training minimises `task loss + lm_coef * LM loss`, the LM loss
being next-token cross-entropy over the real tokens of the same views.
"""

import keras
from keras import ops
from keras_hub.models import Task as KerasHubTask

from kgpt.backbone import GPTBackbone
from kgpt.lm_loss import DEFAULT_CHUNK_SIZE, TiedLMLoss
from kgpt.optimizers import gpt_adamw
from kgpt.presets import PresetMixin
from kgpt.task import HEADS


@keras.saving.register_keras_serializable(package="kgpt")
class FoldViews(keras.layers.Layer):
    """`[batch, views, length]` -> `[batch * views, length]`."""

    def call(self, x):
        return ops.reshape(x, (-1, ops.shape(x)[-1]))

    def compute_output_shape(self, input_shape):
        batch, views = input_shape[0], input_shape[1]
        return (None if batch is None or views is None else batch * views, input_shape[-1])


@keras.saving.register_keras_serializable(package="kgpt")
class ExtractStates(keras.layers.Layer):
    """Hidden state at each view's last real token: `[B*K, L, H]` -> `[B, K, H]`."""

    def __init__(self, num_views, **kwargs):
        super().__init__(**kwargs)
        self.num_views = num_views

    def call(self, hidden, padding_mask):
        last = ops.sum(ops.cast(padding_mask, "int32"), axis=-1) - 1  # [B*K]
        last = ops.maximum(last, 0)
        states = ops.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]  # [B*K, H]
        return ops.reshape(states, (-1, self.num_views, ops.shape(hidden)[-1]))

    def compute_output_shape(self, hidden_shape, padding_mask_shape=None):
        return (None, self.num_views, hidden_shape[-1])

    def get_config(self):
        return {**super().get_config(), "num_views": self.num_views}


@keras.saving.register_keras_serializable(package="kgpt")
class UnfoldViews(keras.layers.Layer):
    """`[batch * views, ...]` -> `[batch, views, ...]`."""

    def __init__(self, num_views, **kwargs):
        super().__init__(**kwargs)
        self.num_views = num_views

    def call(self, x):
        shape = ops.shape(x)
        return ops.reshape(x, (-1, self.num_views, *shape[1:]))

    def compute_output_shape(self, input_shape):
        return (None, self.num_views, *input_shape[1:])

    def get_config(self):
        return {**super().get_config(), "num_views": self.num_views}


@keras.saving.register_keras_serializable(package="kgpt")
class GPTTaskModel(PresetMixin, KerasHubTask):
    """A `GPTBackbone` fine-tuned on a task, with the auxiliary LM loss.

    Inputs `{"token_ids", "padding_mask"}` of shape `[batch, num_views,
    length]` (see `kgpt.transforms.pack`). Outputs a dict:
    `"task"`: logits `[batch, num_outputs]` (classification), a value
    `[batch]` (regression) or one logit per choice `[batch, num_views]`
    (multiple choice); and, when `lm_coef > 0`, `"lm"`: the final hidden
    states `[batch, num_views, length - 1, hidden]` that predict the next
    tokens. The LM loss (`kgpt.lm_loss.TiedLMLoss`) projects them through the
    tied embedding a chunk of tokens at a time, so the `[batch, views,
    length, vocabulary]` logits never exist at once. Feed targets as
    `y = {"task": labels, "lm": token_ids[..., 1:]}` with
    `sample_weight = {"task": ..., "lm": padding_mask[..., 1:]}`
    (`kgpt.finetune.model_targets` builds these).

    Args:
        backbone: a `kgpt.GPTBackbone` whose vocabulary includes the start,
            delimiter and extract tokens.
        head: `"classification"`, `"regression"` or `"multiple_choice"`.
        num_outputs: classes for classification; ignored otherwise.
        num_views: views per example (1; 2 for similarity; choices).
        pooling: `"sum"` adds the views' extract states before the linear
            layer; `"each"` scores each view (multiple choice).
        lm_coef: weight of the auxiliary LM loss (paper: 0.5); 0 removes it
            and its output.
        classifier_dropout: dropout before the linear layer (paper: 0.1).
        task_name: the registered task it was fine-tuned for; saved in its
            preset so `kgpt.load_finetuned` finds the plugin again.

    Example:
    ```python
    import numpy as np
    import kgpt

    backbone = kgpt.GPTBackbone(vocabulary_size=64, num_layers=2, num_heads=2,
                                hidden_dim=16, intermediate_dim=32,
                                max_sequence_length=16)
    model = kgpt.GPTTaskModel(backbone, head="classification", num_outputs=3)
    x = {"token_ids": np.ones((4, 1, 8), "int32"),
         "padding_mask": np.ones((4, 1, 8), "int32")}
    model.predict(x, verbose=0)["task"].shape  # (4, 3)
    ```
    """

    backbone_cls = GPTBackbone

    def __init__(
        self,
        backbone,
        head="classification",
        num_outputs=2,
        num_views=1,
        pooling="sum",
        lm_coef=0.5,
        classifier_dropout=0.1,
        task_name=None,
        preprocessor=None,
        **kwargs,
    ):
        if head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}, got {head!r}.")
        if pooling not in ("sum", "each"):
            raise ValueError(f"pooling must be 'sum' or 'each', got {pooling!r}.")
        if (head == "multiple_choice") != (pooling == "each"):
            raise ValueError("The multiple_choice head needs pooling='each' and only it does.")
        if lm_coef < 0:
            raise ValueError(f"lm_coef must be >= 0, got {lm_coef}.")
        units = num_outputs if head == "classification" else 1

        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.fold_ids = FoldViews(name="fold_token_ids")
        self.fold_mask = FoldViews(name="fold_padding_mask")
        self.extract_states = ExtractStates(num_views, name="extract_states")
        self.classifier_dropout_layer = keras.layers.Dropout(classifier_dropout, name="classifier_dropout")
        self.classifier = keras.layers.Dense(
            units,
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
        if pooling == "sum":
            states = ops.sum(states, axis=1)  # [B, H]
        scores = self.classifier(self.classifier_dropout_layer(states))  # [B, C] or [B, K, 1]
        if head != "classification":
            scores = ops.squeeze(scores, axis=-1)  # [B] or [B, K]
        outputs = {"task": scores}
        if lm_coef > 0:
            outputs["lm"] = self.unfold_lm(hidden[:, :-1])  # [B, K, L-1, H]
        compile_now = kwargs.pop("compile", True)  # after the config below, which compile() reads
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask}, outputs=outputs, compile=False, **kwargs
        )

        # === Config ===
        self.head = head
        self.num_outputs = num_outputs
        self.num_views = num_views
        self.pooling = pooling
        self.lm_coef = lm_coef
        self.classifier_dropout = classifier_dropout
        self.task_name = task_name
        if compile_now:
            self.compile()

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "head": self.head,
                "num_outputs": self.num_outputs,
                "num_views": self.num_views,
                "pooling": self.pooling,
                "lm_coef": self.lm_coef,
                "classifier_dropout": self.classifier_dropout,
                "task_name": self.task_name,
            }
        )
        return config

    def compile(self, optimizer="auto", loss="auto", *, weighted_metrics="auto", total_steps=None,
                lm_loss_chunk_size=DEFAULT_CHUNK_SIZE, **kwargs):
        """Configures fine-tuning with the paper's defaults.

        Args:
            optimizer: `"auto"` for `kgpt.gpt_adamw(6.25e-5)` with 0.2% linear
                warm-up and linear decay to 0 at `total_steps` (constant
                after warm-up when `None`), or any optimizer.
            loss: `"auto"` for the head's loss (cross-entropy on logits or
                mean squared error) plus `lm_coef` x the LM cross-entropy
                averaged over real tokens; or a Keras loss spec.
            weighted_metrics: `"auto"` for accuracy on classification and
                multiple choice heads.
            total_steps: the fine-tuning run's number of updates.
            lm_loss_chunk_size: tokens whose logits the `"auto"` LM loss
                computes at once; `None` for all of them at once.
        """
        if optimizer == "auto":
            warmup = int(0.002 * total_steps) if total_steps else 0
            optimizer = gpt_adamw(6.25e-5, warmup_steps=warmup, total_steps=total_steps, decay="linear")
        loss_weights = kwargs.pop("loss_weights", None)
        if loss == "auto":
            loss = {"task": self.task_loss()}
            loss_weights = {"task": 1.0}
            if "lm" in self.output:
                loss["lm"] = TiedLMLoss(self.backbone.token_embedding, lm_loss_chunk_size)
                loss_weights["lm"] = self.lm_coef
        elif isinstance(loss, dict) and "lm" in loss and not isinstance(loss["lm"], TiedLMLoss):
            raise ValueError(
                "The 'lm' output holds hidden states, not logits: its loss must be a kgpt.lm_loss.TiedLMLoss."
            )
        if weighted_metrics == "auto":
            weighted_metrics = {"task": [] if self.head == "regression" else ["accuracy"]}
        super().compile(
            optimizer=optimizer, loss=loss, loss_weights=loss_weights, weighted_metrics=weighted_metrics, **kwargs
        )

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        lm_loss = self.loss.get("lm") if isinstance(self.loss, dict) else None
        if isinstance(lm_loss, TiedLMLoss):
            lm_loss.training = training  # evaluation graphs skip the gradient computation
        return super().compute_loss(x, y, y_pred, sample_weight, training=training)

    def task_loss(self):
        """The head's loss: cross-entropy on logits, or mean squared error for regression."""
        if self.head == "regression":
            return keras.losses.MeanSquaredError()
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def compile_from_config(self, config):
        # Keras skips this for models with a custom compile(); restore the
        # optimizer (and its state, loaded after this) with our default losses.
        optimizer = keras.saving.deserialize_keras_object(config["optimizer"])
        self.compile(optimizer=optimizer)
        if self.built:
            self.optimizer.build(self.trainable_variables)

    # keras-hub's PipelineModel turns NumPy inputs into an unshuffled tf.data
    # pipeline (ignoring shuffle=True) and converts `y` with one
    # convert_to_tensor call, which fails on our dict targets. There is no
    # preprocessor to apply, so use Keras' own loops.
    def fit(self, *args, **kwargs):
        return keras.Model.fit(self, *args, **kwargs)

    def evaluate(self, *args, **kwargs):
        return keras.Model.evaluate(self, *args, **kwargs)

    def train_on_batch(self, x, y=None, sample_weight=None, **kwargs):
        return keras.Model.train_on_batch(self, x, y, sample_weight=sample_weight, **kwargs)

    def test_on_batch(self, x, y=None, sample_weight=None, **kwargs):
        return keras.Model.test_on_batch(self, x, y, sample_weight=sample_weight, **kwargs)

    def predict_task(self, x, batch_size=32):
        """Task outputs only, as NumPy: logits, values or choice logits.

        Unlike `predict()`, skips the LM output (hidden states
        `[examples, views, length, hidden]`), which only the loss needs.
        """
        predictor = getattr(self, "_task_predictor", None)
        if predictor is None:
            predictor = keras.Model(self.input, self.output["task"], name="task_predictor")
            # Plain attribute: it shares our layers and must not be tracked or saved.
            object.__setattr__(self, "_task_predictor", predictor)
        return predictor.predict(x, batch_size=batch_size, verbose=0)
