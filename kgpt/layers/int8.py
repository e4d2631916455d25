"""int8 weight quantization of a trained model (Keras' `quantize("int8")`), as `kgpt-predict --quantize` does it.

`model.quantize("int8")` replaces every `Dense`/`EinsumDense` kernel of a
`GPTTaskModel` or `GPTCausalLM` by int8 values and a float32 scale per
output unit; the layer multiplies in int8 with the inputs quantized on the
fly. Keras leaves the token and position embeddings float32 (its type
check refuses keras-hub's `ReversibleEmbedding` subclass), so the tied LM
head of a causal LM stays float32 too. `save_to_preset` writes the int8
arrays and `from_preset` builds the quantized layers again (the backbone's
config records them; a task head is re-quantized from its weights file).

LoRA factors are merged into the float kernels before these are quantized
(`QuantizeMixin.quantize`): Keras quantized the base kernel alone and kept
adding the float factors, while its saved file holds the merged kernel
quantized again, so a reloaded model differed from the live one by about
one int8 step.
"""

import warnings

import keras
from keras.src.quantizers.utils import should_quantize_layer

from kgpt.io import presets
from kgpt.layers import lora

INT8 = "int8"
# Modes whose saved kernels Keras re-quantizes with the LoRA update merged in.
REQUANTIZED_ON_SAVE = ("int8", "int4")


def is_quantized(model):
    """Whether any layer of `model` holds quantized weights."""
    return any(getattr(layer, "quantization_mode", None) for layer in model._flatten_layers(include_self=False))


def quantize(model, mode=INT8):
    """`model.quantize(mode)` for `"int8"`; returns `model`.

    A model whose layers are already quantized (an int8 preset) is returned
    unchanged.
    """
    if mode != INT8:
        raise ValueError(f"Only 'int8' is supported, got {mode!r}.")
    if is_quantized(model):
        return model
    model.quantize(mode)
    return model


class QuantizeMixin:
    """Keras' `quantize` for kgpt's models: once, LoRA merged first, cached sub-models dropped after."""

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Keras' `quantize` (e.g. `"int8"`): once per layer, with LoRA factors merged into the kernels first.

        Norms and embeddings stay float, without Keras' warning for each.
        By default only layers with weights are quantized: a loaded model's
        preprocessor holds a tokenizer layer Keras would refuse. The cached
        prediction, scoring and generation functions are dropped: on
        TensorFlow they kept running the float32 kernels they were traced
        with (docs/lora-int8.md).
        """
        if filters is None:
            filters = lambda layer: bool(layer.weights)  # noqa: E731
        chosen = [
            layer
            for layer in self._flatten_layers(include_self=False)
            if layer.weights and should_quantize_layer(layer, filters)
        ]
        done = [layer for layer in chosen if getattr(layer, "quantization_mode", None)]
        if done:
            raise ValueError(
                f"This {type(self).__name__} is already quantized ({done[0].quantization_mode}, "
                f"{len(done)} layers such as {done[0].name!r}): quantize() runs once; load the float "
                f"model again to quantize it another way."
            )
        # not one gc.collect() per quantized layer or removed factor
        with presets.one_garbage_collection(), warnings.catch_warnings():
            # Keras warns once per norm and embedding layer, which stay float by design (docs/lora-int8.md).
            warnings.filterwarnings("ignore", message=r".*does not have a `quantize` method")
            if (mode or getattr(config, "mode", None)) in REQUANTIZED_ON_SAVE:
                merge_lora(self, [layer for layer in chosen if getattr(layer, "lora_enabled", False)])
            super().quantize(mode, config=config, filters=filters, **kwargs)
        for name in ("_task_predictor", "_score_model"):
            if getattr(self, name, None) is not None:
                object.__setattr__(self, name, None)
        if getattr(self, "generate_function", None) is not None:
            self.generate_function = None
        for layer in self._flatten_layers(include_self=True):
            if isinstance(layer, keras.Model):
                layer.train_function = layer.test_function = layer.predict_function = None


def merge_lora(model, layers):
    """Folds each of `layers`' LoRA factors into its float kernel (`W + (alpha / rank) A B`, as a merged save
    writes it) and removes them: the layers become plain ones, and the model runs what its preset will hold."""
    for layer in layers:
        merged = keras.ops.convert_to_numpy(layer.kernel)
        layer._tracker.unlock()
        del layer.lora_kernel_a
        del layer.lora_kernel_b
        layer._tracker.lock()
        layer.lora_enabled, layer.lora_rank = False, None
        layer._kernel.assign(merged)
    backbone = getattr(model, "backbone", model)
    if layers:
        lora.forget_lora_layers(backbone)
