"""Data-parallel training on the engine of the active Keras backend.

`data_parallel()` is a context manager that every model built, compiled and
fitted inside it trains on all local accelerators (or all local CPU devices
when there are none), each replica on an equal slice of every batch:

- JAX: `keras.distribution.DataParallel` over `keras.distribution.list_devices()`;
- TensorFlow: `tf.distribute.MirroredStrategy` over the GPUs (or CPUs).
  On TPUs, build and fit under a `tf.distribute.TPUStrategy` scope instead
  (see README); the JAX backend handles TPUs through `DataParallel` as is.

Gradients are averaged over the global batch, so results match one device
(the tests check the losses of a few steps on 2 virtual CPU devices).
`model_parallel_layout(backbone_config)` is a `keras.distribution.LayoutMap`
that shards a `GPTBackbone` over a `("batch", "model")` mesh on JAX, for
models larger than one device.
"""

import contextlib
import logging

import keras

logger = logging.getLogger(__name__)


def local_devices():
    """The devices a data-parallel run uses: accelerators if any, else CPUs."""
    if keras.config.backend() == "jax":
        import jax

        accelerators = [d for d in jax.devices() if d.platform != "cpu"]
        return accelerators or jax.devices("cpu")
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return gpus or tf.config.list_logical_devices("CPU")


@contextlib.contextmanager
def data_parallel(batch_size=None):
    """Trains models created inside on every local device; yields the replica count.

    Args:
        batch_size: the global batch, checked to split evenly over the replicas.

    Example:
    ```python
    with kgpt.train.distribute.data_parallel(batch_size=64):
        lm = kgpt.GPTCausalLM(kgpt.GPTBackbone.gpt1())
        lm.compile(total_steps=10_000)
        lm.fit(dataset, steps_per_epoch=1000)
    ```
    """
    devices = local_devices()
    if batch_size is not None and batch_size % len(devices):
        raise ValueError(
            f"Data-parallel training splits each batch over {len(devices)} devices: batch_size {batch_size} "
            f"must be a multiple of {len(devices)}."
        )
    backend = keras.config.backend()
    if backend == "jax":
        previous = keras.distribution.distribution()
        names = [f"{d.platform}:{d.id}" for d in devices]
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=names))
        logger.info(f"Data-parallel on {len(devices)} JAX device(s): {', '.join(names)}.")
        try:
            yield len(devices)
        finally:
            keras.distribution.set_distribution(previous)
        return
    if backend != "tensorflow":
        raise ValueError(f"Data-parallel training supports the jax and tensorflow backends, not {backend!r}.")
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy([d.name for d in devices])
    logger.info(f"Data-parallel on {strategy.num_replicas_in_sync} TensorFlow device(s) (MirroredStrategy): "
        f"{', '.join(d.name for d in devices)}.")
    with strategy.scope():
        yield strategy.num_replicas_in_sync


def model_parallel_layout(device_mesh):
    """A `keras.distribution.LayoutMap` sharding a `GPTBackbone` over `device_mesh` (JAX).

    Embeddings are split along the hidden axis, attention projections along
    the heads, feed-forward kernels along the inner axis (Megatron-style), on
    the mesh's `"model"` axis; the batch goes along `"batch"`.

    Example:
    ```python
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], keras.distribution.list_devices())
    keras.distribution.set_distribution(keras.distribution.ModelParallel(
        layout_map=kgpt.train.distribute.model_parallel_layout(mesh), batch_dim_name="batch"))
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


DISTRIBUTIONS = ("none", "data_parallel")
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
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}.")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


@contextlib.contextmanager
def training_scope(distribution="none", dtype=None, batch_size=None):
    """The dtype policy and device placement a kgpt job builds and trains its model under."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}.")
    with dtype_policy(dtype):
        if dtype:
            logger.info(f"Dtype policy {dtype}.")
        if distribution == "none":
            yield 1
            return
        with data_parallel(batch_size) as replicas:
            yield replicas
