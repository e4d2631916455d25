"""Data- and model-parallel training on the engine of the active Keras backend, on one host or several.

`training_scope(distribution, dtype, batch_size)` is what the jobs build, compile
and fit under:

- `data_parallel()`: every device of every process of the run (`kgpt.parallel.cluster`)
  holds the model and trains on an equal slice of every batch. JAX:
  `keras.distribution.DataParallel` over all devices; TensorFlow:
  `tf.distribute.MirroredStrategy` on one host, `MultiWorkerMirroredStrategy`
  across hosts. On TPUs with TensorFlow, build and fit under a
  `tf.distribute.TPUStrategy` scope instead (docs/guide-devices.md); JAX handles TPUs as is.
- `model_parallel(k)` (JAX): each model split over `k` devices
  (`model_parallel_layout`), the batch over the rest, across hosts too.

Gradients are averaged over the global batch, so results match one device
(tests check the losses on 2 virtual CPU devices and on 2 processes).
Each process feeds only its rows of every global batch: `local_shards()`
says which, and `feed()` turns a builder of those rows into what `fit` takes.
"""

import contextlib
import logging

import keras

from kgpt.checks import one_of, option, positive_int
from kgpt.errors import ConfigError
from kgpt.parallel import cluster

logger = logging.getLogger(__name__)


def mesh_devices():
    """The devices a distributed run uses: accelerators if any, else CPUs; every process's, in process order."""
    if keras.config.backend() == "jax":
        import jax

        accelerators = [d for d in jax.devices() if d.platform != "cpu"]
        return accelerators or jax.devices("cpu")
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return gpus or tf.config.list_logical_devices("CPU")


def _check_split(batch_size, parts, what, accumulation=1):
    """Refuses a batch (of `accumulation` micro-batches of `batch_size` rows) that does not split over `parts`."""
    if batch_size is None or batch_size % parts == 0:
        return
    if accumulation > 1:
        raise ConfigError(
            f"{what}: each micro-batch (batch_size / gradient_accumulation_steps = {batch_size} rows) "
            f"must be a multiple of {parts}."
        )
    raise ConfigError(f"{what}: batch_size {batch_size} must be a multiple of {parts}.")


@contextlib.contextmanager
def data_parallel(batch_size=None, accumulation=1):
    """Trains models created inside on every device of every process of the run; yields the replica count.

    Args:
        batch_size: the global batch (of one micro-batch, with `accumulation`), checked to split evenly.
        accumulation: micro-batches per update, for the error message.

    Example:
    ```python
    with kgpt.parallel.distribute.data_parallel(batch_size=64):
        lm = kgpt.GPTCausalLM(kgpt.GPTBackbone.gpt1())
        lm.compile(total_steps=10_000)
        lm.fit(dataset, steps_per_epoch=1000)
    ```
    """
    backend = keras.config.backend()
    several = cluster.current().several
    check_placement("data_parallel", batch_size, accumulation=accumulation)
    if backend == "tensorflow" and several:
        strategy = cluster.strategy()
        logger.info(
            f"Data-parallel on {strategy.num_replicas_in_sync} TensorFlow replica(s) of "
            f"{cluster.current().num_processes} processes (MultiWorkerMirroredStrategy)."
        )
        with strategy.scope():
            yield strategy.num_replicas_in_sync
        return
    devices = mesh_devices()
    if backend == "jax":
        previous = keras.distribution.distribution()
        names = [f"{d.platform}:{d.id}" for d in devices]
        # Each process feeds only its rows of every batch (local_rows); Keras joins them into the global batch.
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=names, auto_shard_dataset=False))
        logger.info(
            f"Data-parallel on {len(devices)} JAX device(s)"
            + (f" of {cluster.current().num_processes} processes." if several else f": {', '.join(names)}.")
        )
        try:
            yield len(devices)
        finally:
            keras.distribution.set_distribution(previous)
        return
    if backend != "tensorflow":
        raise ValueError(f"Data-parallel training supports the jax and tensorflow backends, not {backend!r}.")
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy([d.name for d in devices])
    logger.info(
        f"Data-parallel on {strategy.num_replicas_in_sync} TensorFlow device(s) (MirroredStrategy): "
        f"{', '.join(d.name for d in devices)}."
    )
    with strategy.scope():
        yield strategy.num_replicas_in_sync


@contextlib.contextmanager
def model_parallel(model_devices, batch_size=None, accumulation=1):
    """Splits every model over `model_devices` devices and the batch over the rest (JAX); yields the batch shards.

    The mesh is `(devices / model_devices, model_devices)` over every device of
    every process, named `("batch", "model")`, with `model_parallel_layout`:
    a model too large for one device, on one host or across hosts.
    """
    shards = check_placement("model_parallel", batch_size, model_devices, accumulation)
    devices = mesh_devices()
    mesh = keras.distribution.DeviceMesh(
        (shards, model_devices), ["batch", "model"], [f"{d.platform}:{d.id}" for d in devices]
    )
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(
            layout_map=model_parallel_layout(mesh), batch_dim_name="batch", auto_shard_dataset=False
        )
    )
    logger.info(
        f"Model-parallel on {len(devices)} JAX device(s): each model split over {model_devices}, the batch "
        f"over {shards}."
    )
    try:
        yield shards
    finally:
        keras.distribution.set_distribution(previous)


def check_placement(distribution, batch_size=None, model_devices=1, accumulation=1):
    """The batch shards `distribution` would give, or a `ConfigError` saying why it cannot run; changes nothing.

    The jobs call it before they write or read anything, the scopes again
    when they set the distribution up. `batch_size` is a micro-batch's rows.
    """
    here, backend = cluster.current(), keras.config.backend()
    if distribution == "none" and not here.several:
        return 1
    of = f" of {here.num_processes} processes" if here.several else ""
    if distribution == "model_parallel":
        # The one check of --model_parallel (RunConfig.model_parallel) too: every run it splits comes here first.
        try:
            positive_int(model_devices, option("model_parallel"))
        except (TypeError, ValueError) as e:
            raise ConfigError(str(e)) from None
        if backend != "jax":
            raise ConfigError(
                "--distribution model_parallel runs on the jax backend (keras.distribution.ModelParallel); "
                "on TensorFlow use data_parallel."
            )
        devices = len(mesh_devices())
        if devices % model_devices:
            raise ConfigError(
                f"{option('model_parallel')} {model_devices}: the {devices} device(s){of} do not split into groups "
                f"of {model_devices}."
            )
        shards = devices // model_devices
        what = f"Model-parallel training splits each batch over {shards} groups of {model_devices} devices{of}"
    elif backend == "tensorflow" and here.several:
        shards = cluster.strategy().num_replicas_in_sync
        what = f"Data-parallel training splits each batch over {shards} replicas{of}"
    else:
        shards = len(mesh_devices())
        what = f"Data-parallel training splits each batch over {shards} devices{of}"
    _check_split(batch_size, shards, what, accumulation)
    if accumulation > 1 and shards > 1 and backend == "tensorflow":
        raise ConfigError(
            f"gradient_accumulation_steps {accumulation} with {shards} TensorFlow replicas: Keras "
            "accumulates inside a conditional that tf.distribute cannot synchronise across replicas. "
            "Accumulate on one device, or train data-parallel on the jax backend."
        )
    return shards


@contextlib.contextmanager
def writing(directory):
    """Yields where this process writes what only process 0 keeps (a checkpoint, a preset): or None to skip it.

    Process 0 gets `directory`. On JAX the others skip the write, and
    process 0 writes with the distribution unset: Keras creates variables
    while saving (a throw-away optimizer, to learn which attributes to skip),
    and a variable created under a distribution across processes is a
    collective the others would never join (the weights are replicated, so
    reading them needs no other process). On TensorFlow such a variable is a
    collective of `MultiWorkerMirroredStrategy` whatever the scope, so every
    process saves, the others into a temporary folder removed after.
    """
    here = cluster.current()
    if not here.several:
        yield directory
        return
    if keras.config.backend() == "tensorflow":
        if here.chief:
            yield directory
            return
        import tempfile

        with tempfile.TemporaryDirectory(prefix="kgpt-not-chief-") as scratch:
            yield scratch
        return
    if not here.chief:
        yield None
        return
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield directory
    finally:
        keras.distribution.set_distribution(previous)


def spread_over_processes(model):
    """Whether some of `model`'s arrays are split across processes, so that no process holds all of them (JAX)."""
    if not cluster.current().several or keras.config.backend() != "jax":
        return False
    return any(not _held_here(v.value) for v in model.weights)


def _held_here(array):
    sharding = getattr(array, "sharding", None)
    if sharding is None:
        return True

    def key(index):
        return tuple((s.start, s.stop) for s in index)

    here = {key(i) for i in sharding.addressable_devices_indices_map(array.shape).values()}
    return here >= {key(i) for i in sharding.devices_indices_map(array.shape).values()}


def gathered_copy(model):
    """`model`, or for a model split across processes a copy of it on this process with every array gathered.

    Every process must call it (a collective per array); for a preset, which
    holds the whole model in one file anyway. The copy is built with no
    distribution and shares `model`'s preprocessor.
    """
    if not spread_over_processes(model):
        return model
    import numpy as np
    from jax.experimental import multihost_utils

    values = [np.asarray(multihost_utils.process_allgather(v.value, tiled=True)) for v in model.weights]
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        copy = type(model).from_config(model.get_config())
        copy.set_weights(values)
    finally:
        keras.distribution.set_distribution(previous)
    if getattr(model, "preprocessor", None) is not None:
        copy.preprocessor = model.preprocessor
    return copy


def local_shards():
    """`(first, stop, total)`: this process feeds batch shards `first..stop-1` of `total` equal row blocks.

    One process feeds them all. Several processes each feed their own rows
    (JAX: the rows its devices hold in the distribution's data layout; those
    of a model split across processes are fed by each of them).
    """
    c = cluster.current()
    distribution = keras.distribution.distribution() if keras.config.backend() == "jax" else None
    if not c.several or (distribution is None and keras.config.backend() == "jax"):
        return 0, 1, 1
    if keras.config.backend() == "tensorflow":
        return c.process_id, c.process_id + 1, c.num_processes
    total = distribution.device_mesh.shape[distribution.device_mesh.axis_names.index(distribution.batch_dim_name)]
    layout = distribution.get_data_layout((total, 1)).backend_layout
    rows = sorted(
        {
            (s[0].start or 0, total if s[0].stop is None else s[0].stop)
            for s in layout.addressable_devices_indices_map((total, 1)).values()
        }
    )
    first, stop = rows[0][0], rows[-1][1]
    if any(a[1] != b[0] for a, b in zip(rows, rows[1:])):
        raise ValueError(f"This process's devices hold rows {rows} of every batch, not one block.")
    return first, stop, total


def local_rows(size, shards=None):
    """`(start, stop)`: the rows of a batch of `size` (a multiple of the shard count) this process feeds."""
    first, stop, total = shards or local_shards()
    return size * first // total, size * stop // total


def feed(make_dataset, shards=None):
    """What `fit`, `evaluate` and `predict` take: `make_dataset(first, stop, total)` gives this process's rows.

    `make_dataset` builds a `tf.data.Dataset` of the rows of every global batch
    in shards `first` to `stop` of `total` equal row blocks (`local_rows`).
    On TensorFlow with several processes it runs inside
    `distribute_datasets_from_function`, once per local replica: worker w's
    replica r gets block `r * workers + w` (`replica_blocks`), the order in
    which Keras puts the replicas' predictions back together.
    """
    c = cluster.current()
    if keras.config.backend() == "tensorflow" and c.several:
        import tensorflow as tf

        def per_process(context):
            replicas = context.num_replicas_in_sync // context.num_input_pipelines
            total = context.num_replicas_in_sync
            parts = [
                make_dataset(b, b + 1, total)
                for b in replica_blocks(context.input_pipeline_id, context.num_input_pipelines, replicas)
            ]
            if replicas == 1:
                return parts[0]
            # Batches go to this process's replicas in turn: replica 0's part of a batch, replica 1's, ...
            together = tf.data.Dataset.choose_from_datasets(parts, tf.data.Dataset.range(replicas).repeat())
            return together.apply(tf.data.experimental.assert_cardinality(parts[0].cardinality() * replicas))

        return cluster.strategy().distribute_datasets_from_function(per_process)
    return make_dataset(*(shards or local_shards()))


def replica_blocks(worker, workers, replicas):
    """The row blocks (of `workers * replicas`) each local replica of `worker` feeds, replica by replica.

    Keras concatenates a multi-worker strategy's outputs replica-major (every
    worker's replica 0, then every worker's replica 1, ...), so replica r of
    worker w holds block `r * workers + w` for the outputs to come back in
    the batch's order.
    """
    return [r * workers + worker for r in range(replicas)]


def batch_shards():
    """How many equal row blocks each batch is split into under the current distribution (1 without one)."""
    if keras.config.backend() == "tensorflow":
        import tensorflow as tf

        return tf.distribute.get_strategy().num_replicas_in_sync
    distribution = keras.distribution.distribution()
    if distribution is None:
        return 1
    mesh = distribution.device_mesh
    return mesh.shape[mesh.axis_names.index(distribution.batch_dim_name)]


def predict_outputs(predictor, split, batch_size, verbose=0):
    """`kgpt.data.batching.predict_outputs` under the current distribution: every process gets every output.

    Batches are filled to split evenly over the devices, each process feeds
    its rows, and on JAX with several processes the outputs are gathered
    onto every process inside the compiled step (`gathering`).
    """
    from kgpt.data import batching

    return batching.predict_outputs(
        gathering(predictor), split, batch_size, verbose=verbose, feed=feed, pad_to=batch_shards()
    )


def gathering(model):
    """`model`, or on JAX with several processes a model of the same layers whose outputs every process holds.

    Keras' `predict` turns each batch's outputs into NumPy, which a JAX array
    spread over other processes' devices cannot be; a replicated output can.
    """
    distribution = keras.distribution.distribution() if keras.config.backend() == "jax" else None
    if distribution is None or not cluster.current().several:
        return model
    cached = getattr(model, "_kgpt_gathering", None)
    if cached is not None and cached[0] is distribution:
        return cached[1]
    outputs = keras.tree.map_structure(Replicated(distribution.device_mesh), model.outputs)
    gathered = keras.Model(model.inputs, outputs, name=f"{model.name}_gathered")
    object.__setattr__(model, "_kgpt_gathering", (distribution, gathered))  # not tracked: it shares the layers
    return gathered


class Replicated(keras.layers.Layer):
    """Its input, laid out whole on every device of `mesh` (a sharding constraint inside the compiled step)."""

    def __init__(self, mesh, **kwargs):
        super().__init__(**kwargs)
        self.mesh = mesh

    def call(self, x):
        layout = keras.distribution.TensorLayout([None] * len(x.shape), self.mesh)
        return keras.distribution.distribute_tensor(x, layout)

    def compute_output_shape(self, input_shape):
        return input_shape


def model_parallel_layout(device_mesh):
    """A `keras.distribution.LayoutMap` sharding a `GPTBackbone` over `device_mesh` (JAX).

    Embeddings are split along the hidden axis, attention projections along
    the heads, feed-forward kernels along the inner axis (Megatron-style), on
    the mesh's `"model"` axis; the batch goes along `"batch"`.

    Example:
    ```python
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], keras.distribution.list_devices())
    keras.distribution.set_distribution(keras.distribution.ModelParallel(
        layout_map=kgpt.parallel.distribute.model_parallel_layout(mesh), batch_dim_name="batch"))
    backbone = kgpt.GPTBackbone.gpt1()  # created sharded
    ```
    """
    layout = keras.distribution.LayoutMap(device_mesh)  # keys are full-match regexes of weight paths
    layout[r"token_embedding/embeddings"] = (None, "model")
    layout[r"position_embedding/embeddings"] = (None, "model")
    layout[r".*/(query|key|value)/kernel"] = (None, "model", None)
    layout[r".*/(query|key|value)/bias"] = ("model", None)
    layout[r".*/attention_output/kernel"] = ("model", None, None)
    layout[r".*/feedforward_intermediate_dense/kernel"] = (None, "model")
    layout[r".*/feedforward_intermediate_dense/bias"] = ("model",)
    layout[r".*/feedforward_output_dense/kernel"] = ("model", None)
    return layout


DISTRIBUTIONS = ("none", "data_parallel", "model_parallel")
DTYPES = ("float32", "mixed_bfloat16", "mixed_float16", "bfloat16")


@contextlib.contextmanager
def dtype_policy(name):
    """Sets Keras' global dtype policy inside the block (restored after).

    `"mixed_bfloat16"`/`"mixed_float16"` keep float32 weights and compute in
    16 bits; kgpt's backbones keep attention softmax and layer norms in
    float32 and Keras computes losses in float32. Under `"mixed_float16"`
    `compile()` wraps the optimizer in a `LossScaleOptimizer` (dynamic loss
    scaling). `None` leaves the policy as it is.
    """
    if name is None:
        yield
        return
    one_of(name, "dtype", DTYPES)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


@contextlib.contextmanager
def training_scope(distribution="none", dtype=None, batch_size=None, model_devices=1, accumulation=1):
    """The dtype policy and device placement a kgpt job builds and trains its model under; yields the batch shards.

    With several processes, `"none"` means data parallel over all of them:
    a process alone on its own slice of the data would train a model of its own.
    """
    if one_of(distribution, "distribution", DISTRIBUTIONS) == "none" and cluster.current().several:
        distribution = "data_parallel"
    with dtype_policy(dtype):
        if dtype:
            logger.info(f"Dtype policy {dtype}.")
        if distribution == "none":
            yield 1
            return
        scope = (
            model_parallel(model_devices, batch_size, accumulation)
            if distribution == "model_parallel"
            else data_parallel(batch_size, accumulation)
        )
        with scope as shards:
            yield shards
