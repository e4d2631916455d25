"""kgpt's models as TensorFlow SavedModels for serving, from either backend.

A fine-tuned `GPTTaskModel`'s SavedModel has one endpoint, `serve`: token ids
in, the task head's outputs (logits or values) out. The LM hidden states that
the model also outputs for the auxiliary loss are left out: they are only
needed in training and are `[batch, views, length, hidden]` large. A
`GPTCausalLM`'s `serve` gives the logits `[batch, length, vocabulary]`.
"""

import keras

ENDPOINT = "serve"


def serving_signature(num_views):
    """The `serve` endpoint's inputs: int32 `[batch, num_views, length]`, batch and length dynamic."""
    return [
        {
            name: keras.InputSpec(shape=(None, num_views, None), dtype="int32", name=name)
            for name in ("token_ids", "padding_mask")
        }
    ]


def _jax2tf_kwargs(num_views, max_length):
    # One symbolic length for both inputs, bounded by the position table:
    # jax2tf must prove that slicing the first `length` positions is valid.
    # Serving needs no gradient (the dropout seeds' uint32 states have none).
    # The module is lowered per platform; by default only for the exporting one,
    # which would leave a GPU export unservable on a CPU.
    shape = "(batch, length)" if num_views is None else f"(batch, {num_views}, length)"
    return {
        "polymorphic_shapes": [{"token_ids": shape, "padding_mask": shape}],
        "polymorphic_constraints": [f"length <= {max_length}"],
        "with_gradient": False,
        "native_serialization_platforms": ("cpu", "cuda"),
    }


def export_task_model(model, filepath, format="tf_saved_model", verbose=True, **kwargs):
    """Exports a `kgpt.GPTTaskModel` for inference, with only its task output.

    The artifact, a TensorFlow SavedModel, needs only TensorFlow to serve
    (`tf.saved_model.load`, TF Serving; no kgpt or Keras) and has one
    endpoint, `serve` (also the `serving_default` signature). It takes
    `{"token_ids", "padding_mask"}`, int32 `[batch, num_views, length]`
    with any batch size and any length up to the model's
    `max_sequence_length`, right-padded, and returns the head's raw outputs
    (as `model.task_predictor()`): logits `[batch, classes]` or `[batch,
    choices]`, or values `[batch]`; never the LM hidden states. Both
    backends export it; JAX through `jax2tf` with symbolic batch and
    length, for CPU and CUDA (`jax2tf_kwargs={"native_serialization_platforms":
    ("tpu",)}` for a TPU).

    It takes token ids, not text: the GPT-1 tokenizer's exact algorithm is
    Python, so text goes through `model.preprocessor` first (it returns
    these two arrays).

    Args:
        model: a `kgpt.GPTTaskModel`.
        filepath: the directory to write the SavedModel to.
        format: `"tf_saved_model"` (the only format).
        verbose: print the endpoint and its variables once written.
        **kwargs: passed to `keras.export.ExportArchive.add_endpoint` (on
            JAX, `jax2tf_kwargs` entries replace the defaults above).

    Example:
    ```python
    import tensorflow as tf
    import kgpt
    from kgpt.io.export import export_task_model

    tokenizer = kgpt.GPTTokenizer.gpt1()
    backbone = kgpt.GPTBackbone(vocabulary_size=tokenizer.vocabulary_size(), num_layers=2, num_heads=2,
                                hidden_dim=16, intermediate_dim=64, max_sequence_length=64)
    preprocessor = kgpt.GPTTaskPreprocessor(tokenizer, kgpt.tasks.transforms.Classification(), sequence_length=64)
    model = kgpt.GPTTaskModel(backbone, head=kgpt.tasks.heads.ClassificationHead(["neg", "pos"]), preprocessor=preprocessor)
    export_task_model(model, "sst2_savedmodel")
    served = tf.saved_model.load("sst2_savedmodel")
    x = model.preprocessor(["a joy to watch", "dull and long"])  # text -> token ids, in Python
    served.serve(x)                                              # logits [2, 2]
    ```
    """
    if format != "tf_saved_model":
        raise ValueError(f"format must be 'tf_saved_model', got {format!r}.")
    predictor = getattr(model, "task_predictor", None)
    if predictor is None:
        raise TypeError(f"model must be a kgpt.GPTTaskModel, got {type(model).__name__}.")
    if "input_signature" in kwargs:
        raise ValueError("input_signature is fixed: int32 token_ids and padding_mask [batch, num_views, length].")
    predictor = predictor()
    if keras.config.backend() == "jax":
        defaults = _jax2tf_kwargs(model.num_views, model.backbone.max_sequence_length)
        kwargs["jax2tf_kwargs"] = {**defaults, **kwargs.get("jax2tf_kwargs", {})}
    archive = keras.export.ExportArchive()
    archive.track(predictor)
    archive.add_endpoint(
        ENDPOINT, lambda inputs: predictor(inputs, training=False), serving_signature(model.num_views), **kwargs
    )
    archive.write_out(str(filepath), verbose=verbose)


def export_causal_lm(model, filepath, format="tf_saved_model", verbose=True, **kwargs):
    """Exports a `kgpt.GPTCausalLM` as a TensorFlow SavedModel (Keras' `Model.export`), on either backend.

    `serve` takes `{"token_ids", "padding_mask"}`, int32 `[batch, length]`
    (any batch size, any length up to `max_sequence_length`) and returns
    the logits `[batch, length, vocabulary_size]`. On JAX the model goes
    through `jax2tf` with a symbolic batch and length bounded by the position
    table (Keras' default shapes leave that bound unproven and the export
    fails), for CPU and CUDA; `jax2tf_kwargs` entries replace these defaults.
    Token ids, not text: the tokenizer's exact algorithm is Python.

    Example:
    ```python
    lm.export("lm_savedmodel")
    served = tf.saved_model.load("lm_savedmodel")
    served.serve({"token_ids": ids, "padding_mask": mask})  # logits [batch, length, vocabulary]
    ```
    """
    if format != "tf_saved_model":
        raise ValueError(f"format must be 'tf_saved_model', got {format!r}.")
    if keras.config.backend() == "jax":
        defaults = _jax2tf_kwargs(None, model.backbone.max_sequence_length)
        kwargs["jax2tf_kwargs"] = {**defaults, **kwargs.get("jax2tf_kwargs", {})}
    return keras.Model.export(model, str(filepath), format=format, verbose=verbose, **kwargs)
