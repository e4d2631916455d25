"""LoRA (low-rank adaptation) on kgpt's backbone, saved merged or separately, and checkpointed exactly.

`backbone.enable_lora(rank)` is keras-hub's: every backbone weight is
frozen and Keras' `EinsumDense.enable_lora` adds two trainable factors
(Keras' factorisation of an `[hidden, heads, head_dim]` kernel: `A [hidden,
heads, rank]`, `B [rank, head_dim]`) to the attention's query
and value projections (keras-hub's default targets; kgpt's layers are
named `query` and `value`). Unlike keras-hub, their biases stay frozen too:
the factors are then the backbone's whole change, and a `.lora.h5` file
with the base preset rebuilds it exactly.
The kernel used is `W + (alpha / rank) A B` with `B` starting at 0, so the
model starts exactly where it was. The token embedding, and with it the
special tokens' new rows and the tied LM head, stays frozen; a task model's
head (outside the backbone) trains.

Saving:
- merged (the default): `save_to_preset` writes `W + (alpha / rank) A B`
  into the plain kernels (Keras' `save_own_variables`), so the preset loads
  anywhere as an ordinary model;
- separate: `backbone.save_lora_weights("x.lora.h5")` writes the factors
  only, in keras-hub's format; `load_lora_weights` reads them onto the base
  backbone, after checking the file against it (`CheckpointError` naming
  the file otherwise).

Training checkpoints (`kgpt.train.checkpoint`) must not merge: a resumed
run would start with `A = B = 0` (Keras zeroes them on loading), from which
neither factor gets a gradient. `save_weights` / `load_weights` here write
the unmerged kernels to the weights file and the factors beside it.

Example:
```python
backbone = kgpt.GPTBackbone.from_preset("lm")
backbone.enable_lora(8)
model = kgpt.GPTTaskModel(backbone, head=task.head, preprocessor=preprocessor)
model.fit(...)                                     # only A, B, query/value biases and the head change
model.save_to_preset("tuned")                      # merged: loads as a plain model
backbone.save_lora_weights("tuned.lora.h5")        # or the factors alone (with the base preset)
```
"""

import contextlib
import logging
import os

import h5py
import keras
import numpy as np

from kgpt.checks import positive_int
from kgpt.errors import CheckpointError

logger = logging.getLogger(__name__)

LORA_SUFFIX = ".lora.h5"
# Beside a checkpoint's `model.weights.h5`: the factors the weights file leaves out.
FACTORS_FILE = "lora_factors.npz"


def check_rank(rank, width, name="rank"):
    """`rank` for the LoRA factors of a model `width` wide (its `hidden_dim`), named `name` in errors: a
    positive integer of at most `width`. An update `A B` of a kernel with a `width`-wide side has at most that
    rank, so a higher one adds weights (a rank of 10^9 would try to allocate them) and never capacity."""
    rank = positive_int(rank, name)
    if rank > width:
        raise ValueError(
            f"{name} {rank} is more than the model's width ({width}): an update A B of its kernels has rank "
            f"{width} at most, so the extra factors would add weights and no capacity: give at most {width}."
        )
    return rank


def lora_layers(model):
    """The LoRA-enabled layers of `model` (a backbone or a task model), in a fixed order."""
    return [layer for layer in model._flatten_layers(include_self=False) if getattr(layer, "lora_enabled", False)]


def factor_variables(model):
    """The LoRA factors `A`, `B` of every LoRA-enabled layer (what a weights file does not hold)."""
    return [v for layer in lora_layers(model) for v in (layer.lora_kernel_a, layer.lora_kernel_b)]


def file_variables(model):
    """The variables a `.weights.h5` file of `model` holds: all but the LoRA factors."""
    factors = {id(v) for v in factor_variables(model)}
    return [v for v in model.weights if id(v) not in factors]


def forget_lora_layers(backbone):
    """Empties keras-hub's record of `backbone`'s LoRA-enabled layers once none is left (all merged,
    `kgpt.layers.int8.merge_lora`): keras-hub's `save_lora_weights` and `load_lora_weights` read that record."""
    if not lora_layers(backbone):
        backbone._lora_enabled_layers = []


class LoraMixin:
    """keras-hub's `enable_lora` / `save_lora_weights` / `load_lora_weights` with kgpt's checks."""

    def default_lora_layer_names(self):
        """The layers `enable_lora` adapts by default: the attention's query and value projections."""
        return ["query", "value"]

    def enable_lora(self, rank, target_layer_names=None):
        """Freezes the backbone and adds trainable rank-`rank` factors to the target layers.

        Args:
            rank: int from 1 to the model's width (`hidden_dim`). The rank of
                each update `A B`.
            target_layer_names: names of the `Dense`/`EinsumDense` layers to
                adapt (default `default_lora_layer_names()`: `query`, `value`;
                e.g. add `key`, `attention_output`,
                `feedforward_intermediate_dense`, `feedforward_output_dense`).
        """
        rank = check_rank(rank, self.hidden_dim)
        if rank == self.hidden_dim:
            logger.warning(
                f"Warning: LoRA rank {rank} is the model's width: each update A B has full rank and more weights "
                f"than the kernel it adapts (ranks of 4 to 64 are usual)."
            )
        if lora_layers(self):
            raise ValueError(f"LoRA is already enabled on this backbone (rank {self._lora_rank}).")
        names = self.default_lora_layer_names() if target_layer_names is None else list(target_layer_names)
        adaptable = {layer.name for layer in self._flatten_layers(include_self=False) if hasattr(layer, "enable_lora")}
        unknown = sorted(set(names) - adaptable)
        if unknown or not names:
            raise ValueError(
                f"target_layer_names {unknown or names} name no layer LoRA can adapt; the backbone's are "
                f"{', '.join(sorted(adaptable)) or 'none'}."
            )
        super().enable_lora(rank, target_layer_names=names)
        # keras-hub leaves these layers' biases trainable; frozen here, the factors are the backbone's whole
        # change, so the base preset and a `.lora.h5` file rebuild the adapted backbone exactly.
        for layer in lora_layers(self):
            if getattr(layer, "bias", None) is not None:
                layer.bias.trainable = False

    def save_lora_weights(self, filepath):
        """Writes the LoRA factors alone (keras-hub's `.lora.h5` format); `load_lora_weights` reads them back."""
        if not str(filepath).endswith(LORA_SUFFIX):
            raise ValueError(f"The file name must end in {LORA_SUFFIX}, got {filepath}.")
        if not lora_layers(self):
            raise ValueError("LoRA is not enabled on this backbone: call enable_lora(rank) first.")
        super().save_lora_weights(filepath)

    def load_lora_weights(self, filepath):
        """Loads factors written by `save_lora_weights` (enabling LoRA at their rank if needed).

        The file is checked against this backbone first: a missing, corrupt,
        tampered or foreign file raises `CheckpointError` naming it, and
        nothing is changed.
        """
        path = os.fspath(filepath)
        rank, factors = _read_lora_file(path)
        enabled_here = not lora_layers(self)
        if not enabled_here and self._lora_rank != rank:
            raise CheckpointError(
                f"{path} holds rank-{rank} factors, but LoRA is enabled here at rank {self._lora_rank}."
            )
        expected = self._lora_shapes(rank)
        if set(factors) != set(expected) or any(factors[k] != expected[k] for k in expected):
            raise CheckpointError(
                f"{path} does not fit this backbone: it holds factors for layers "
                f"{sorted(factors)}, the backbone's query/value layers are {sorted(expected)} "
                f"(shapes {[expected[k] for k in sorted(expected)]}). Was it saved from another "
                f"model?"
            )
        if enabled_here:
            self.enable_lora(rank)
        try:
            super().load_lora_weights(path)
        except (OSError, KeyError, ValueError) as e:
            raise CheckpointError(f"Could not load {path}: {e}") from e
        if not all(np.isfinite(keras.ops.convert_to_numpy(v)).all() for v in factor_variables(self)):
            raise CheckpointError(f"{path} holds non-finite LoRA factors.")

    def _lora_shapes(self, rank):
        """`{index: (A shape, B shape)}` that `enable_lora(rank)` gives, keyed as keras-hub's file is."""
        weighted = [layer for layer in self._flatten_layers(include_self=False) if layer.weights]
        names = set(self.default_lora_layer_names())
        shapes = {}
        for i, layer in enumerate(weighted):
            if layer.name in names and hasattr(layer, "enable_lora"):
                kernel = tuple(getattr(layer, "original_kernel_shape", None) or layer.kernel.shape)
                shapes[str(i)] = (kernel[:-1] + (rank,), (rank, kernel[-1]))
        return shapes


def _read_lora_file(path):
    """`(rank, {index: (A shape, B shape)})` of a `.lora.h5` file, or `CheckpointError` naming it."""
    if not os.path.isfile(path):
        raise CheckpointError(f"Missing {path}: expected LoRA factors written by save_lora_weights.")
    try:
        with h5py.File(path, "r") as f:
            lora = f.get("lora")
            rank = lora.get("rank") if isinstance(lora, h5py.Group) else None
            if rank is None:  # keras' H5IOStore keeps values under `vars`
                rank = lora.get("vars/rank") if isinstance(lora, h5py.Group) else None
            if not isinstance(rank, h5py.Dataset) or rank.shape != ():
                raise CheckpointError(f"{path} holds no LoRA rank: it was not written by save_lora_weights.")
            try:
                rank = positive_int(rank[()], "its LoRA rank")
            except (TypeError, ValueError) as e:
                raise CheckpointError(f"{path}: {e}") from None
            factors = {}
            for name, group in lora.items():
                if name in ("rank", "vars"):
                    continue
                values = group.get("vars", group) if isinstance(group, h5py.Group) else None
                a = values.get("lora_kernel_a") if values is not None else None
                b = values.get("lora_kernel_b") if values is not None else None
                if not isinstance(a, h5py.Dataset) or not isinstance(b, h5py.Dataset):
                    raise CheckpointError(f"{path}: lora/{name} lacks lora_kernel_a or lora_kernel_b.")
                factors[name] = (tuple(a.shape), tuple(b.shape))
    except OSError as e:
        raise CheckpointError(f"{path} is not a readable LoRA file (truncated or corrupt: {e}).") from e
    return rank, factors


# --- training checkpoints: unmerged kernels in the weights file, factors beside it ----------------


@contextlib.contextmanager
def _unmerged(model):
    """Within it, Keras saves the plain kernels of LoRA layers (else it merges `A B` into them)."""
    layers = lora_layers(model)
    for layer in layers:
        layer.lora_enabled = False
    try:
        yield layers
    finally:
        for layer in layers:
            layer.lora_enabled = True


def save_weights(model, path):
    """`model.save_weights(path)`; for a LoRA model the base kernels unmerged and the factors in `FACTORS_FILE`."""
    with _unmerged(model) as layers:
        model.save_weights(path)
    if layers:
        np.savez(
            os.path.join(os.path.dirname(path), FACTORS_FILE),
            *[keras.ops.convert_to_numpy(v) for v in factor_variables(model)],
        )


def load_weights(model, path):
    """Reads what `save_weights` wrote back into `model` exactly (the caller checks `path` first)."""
    model.load_weights(path)  # the plain kernels go where they were; Keras zeroes the factors
    variables = factor_variables(model)
    if not variables:
        return
    factors_path = os.path.join(os.path.dirname(path), FACTORS_FILE)
    try:
        with np.load(factors_path) as saved:
            arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(
            f"{factors_path}: the LoRA factors of this checkpoint cannot be read ({e}): was it "
            f"written by a run without --lora_rank?"
        ) from e
    if [a.shape for a in arrays] != [tuple(v.shape) for v in variables]:
        raise CheckpointError(
            f"{factors_path} holds {len(arrays)} LoRA factors of shapes "
            f"{[list(a.shape) for a in arrays]}, the model has {len(variables)} of shapes "
            f"{[list(v.shape) for v in variables]}."
        )
    for variable, array in zip(variables, arrays):
        variable.assign(array)


def count_trainable(model):
    """The number of trainable weights of `model` (what an optimizer updates)."""
    return int(sum(np.prod(v.shape) for v in model.trainable_weights))
