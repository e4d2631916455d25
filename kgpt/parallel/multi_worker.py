"""Keras 3's `fit` under TensorFlow's `MultiWorkerMirroredStrategy`: two repairs, applied by `kgpt.parallel.cluster`.

Keras 3 (3.15 here) fails to train under `MultiWorkerMirroredStrategy`
(keras-team/keras#20585, open), in two places of its TensorFlow trainer:

1. `_maybe_symbolic_build` averages the first batch across replicas with
   `strategy.reduce("MEAN", batch)`, which the multi-worker strategy cannot do
   for a nested batch ("Attempt to convert a value (PerReplica...)"); the batch
   is only needed for its shapes, so any one replica's part serves.
2. `reduce_per_replica` reduces each replica's logs (scalar loss and metric
   values) with `strategy.reduce("MEAN", v, axis=0)`, invalid for a scalar
   ("Invalid reduction dimension 0 for input with 0 dimensions"); the
   reduction of a scalar is over the replicas (`axis=None`).

Both repairs change only the multi-worker path (a test trains 2 processes and
compares with 1). They reach into Keras' private trainer module, so
`apply()` checks that the names it replaces exist and refuses otherwise.
"""

_APPLIED = False


def apply():
    """Installs both repairs into Keras' TensorFlow trainer (once)."""
    global _APPLIED
    if _APPLIED:
        return
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer

    for name in ("reduce_per_replica", "_collective_all_reduce_multi_worker", "_is_per_replica_instance"):
        if not hasattr(trainer, name):
            raise RuntimeError(
                f"keras.src.backend.tensorflow.trainer has no {name} in this Keras version: kgpt's "
                f"multi-worker repair (kgpt/parallel/multi_worker.py) needs updating."
            )
    multi_worker = trainer._collective_all_reduce_multi_worker
    build, reduce = trainer.TensorFlowTrainer._maybe_symbolic_build, trainer.reduce_per_replica

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if strategy is None or iterator is None or not multi_worker(strategy):
            return build(self, iterator=iterator, data_batch=data_batch)
        for _, _, it in iterator:
            batch = next(it)
            data_batch = tree.map_structure(
                lambda x: (
                    strategy.experimental_local_results(x)[0] if isinstance(x, tf.distribute.DistributedValues) else x
                ),
                batch,
            )
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean", "sum", "first") or not multi_worker(strategy):
            return reduce(values, strategy, reduction)
        op = "SUM" if reduction == "sum" else "MEAN"

        def one(v):
            if not isinstance(v, tf.distribute.DistributedValues) and not trainer._is_per_replica_instance(v):
                return v
            return strategy.reduce(op, v, axis=None)

        return tree.map_structure(one, values)

    trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    trainer.reduce_per_replica = reduce_per_replica
    _APPLIED = True
