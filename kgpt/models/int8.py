"""int8 weight quantization of a trained model (Keras' `quantize("int8")`), as `kgpt-predict --quantize` does it.

`model.quantize("int8")` replaces every `Dense`/`EinsumDense` kernel of a
`GPTTaskModel` or `GPTCausalLM` by int8 values and a float32 scale per
output unit; the layer multiplies in int8 with the inputs quantized on the
fly. Keras leaves the token and position embeddings float32 (its type
check refuses keras-hub's `ReversibleEmbedding` subclass), so the tied LM
head of a causal LM stays float32 too. `save_to_preset` writes the int8
arrays and `from_preset` builds the quantized layers again (the backbone's
config records them; a task head is re-quantized from its weights file).
"""

import warnings

import keras

from kgpt.io import presets

INT8 = "int8"


def is_quantized(model):
    """Whether any layer of `model` holds quantized weights."""
    return any(getattr(layer, "quantization_mode", None) for layer in model._flatten_layers(include_self=False))


def quantize(model, mode=INT8):
    """`model.quantize(mode)` without Keras' warning per layer it cannot quantize; returns `model`.

    A model whose layers are already quantized (an int8 preset) is returned
    unchanged.
    """
    if mode != INT8:
        raise ValueError(f"Only 'int8' is supported, got {mode!r}.")
    if is_quantized(model):
        return model
    with warnings.catch_warnings(), presets.one_garbage_collection():
        # One "does not have a `quantize` method" per norm and embedding layer: expected.
        warnings.filterwarnings("ignore", message=r".*does not have a `quantize` method")
        # Layers without weights are left alone: a loaded task model's preprocessor holds an unbuilt
        # tokenizer layer, which Keras would refuse to quantize.
        model.quantize(mode, filters=lambda layer: bool(layer.weights))
    # Keras resets the model's own compiled functions; a task model's prediction sub-model keeps its own,
    # which on TensorFlow would go on running the float kernels it was traced with.
    if getattr(model, "_task_predictor", None) is not None:
        object.__setattr__(model, "_task_predictor", None)
    for layer in model._flatten_layers(include_self=True):
        if isinstance(layer, keras.Model):
            layer.train_function = layer.test_function = layer.predict_function = None
    return model
