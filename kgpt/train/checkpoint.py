"""Training checkpoints that resume a run exactly: weights, optimizer, dropout RNG and progress.

A checkpoint is a folder `step-NNNNNNNNN/` holding `model.weights.h5` (the
model's and the optimizer's variables), `rng.npz` (the dropout layers' seed
generator states, which Keras' weight files leave out: without them a
resumed run would repeat the first steps' dropout masks) and `state.json`
(the run's settings and progress). `latest.json` names the current one and
is replaced atomically after the folder is complete, so a kill at any moment
leaves a whole checkpoint behind; older folders are removed afterwards.

Every process of a run calls `save` and `restore`. Process 0 writes the
checkpoint (the weights of a data-parallel run are replicated: it holds them
all). A model split across processes (JAX, `--distribution model_parallel`
over several hosts) is never gathered onto one: each process writes its own
parts of every array through Orbax (`sharded/`, JAX's checkpointing library,
`pip install orbax-checkpoint`) and reads them back onto the same layout.

A checkpoint in the local mirror of a remote output directory
(`kgpt.io.storage.Mirror`) is copied out by the run that owns the mirror as
soon as it is complete (`kgpt.train.callbacks.Progress`), `latest.json` last.
Orbax checkpoints need one folder every process writes, so a remote output
directory is refused for a model split across processes (`kgpt.jobs.run.join`).

Example:
```python
kgpt.train.checkpoint.save(model, "out/checkpoint", {"settings": settings, "step": 120})
state = kgpt.train.checkpoint.restore(model, "out/checkpoint", settings)  # None when there is none
```
"""

import contextlib
import logging
import os
import re
import shutil

import keras
import numpy as np

from kgpt import checks
from kgpt.errors import CheckpointError
from kgpt.io import storage
from kgpt.io.presets import check_weights_file, read_json, writing_weights
from kgpt.io.run_folder import LATEST, STATE
from kgpt.io.storage import write_json
from kgpt.layers import lora
from kgpt.parallel import cluster
from kgpt.parallel.distribute import spread_over_processes, writing

logger = logging.getLogger(__name__)

WEIGHTS = "model.weights.h5"
SHARDED = "sharded"
RNG = "rng.npz"


def rng_variables(model):
    """The model's seed generator states (dropout masks are drawn from them), in a fixed order."""
    return [v for v in model.variables if v.name == "seed_generator_state"]


def metric_state(model):
    """The running sums of the model's loss and metrics (JSON-able): an interrupted epoch's, for its resumption."""
    return [keras.ops.convert_to_numpy(v).tolist() for v in model.metrics_variables]


def restore_metric_state(model, values):
    """Puts `metric_state`'s sums back (at the start of the resumed epoch); skipped if the metrics differ."""
    variables = model.metrics_variables
    if len(values) != len(variables) or any(np.shape(v) != tuple(w.shape) for v, w in zip(values, variables)):
        return False
    for variable, value in zip(variables, values):
        variable.assign(np.asarray(value, dtype=variable.dtype))
    return True


def save(model, directory, state, keep=()):
    """Writes a checkpoint of `model` with `state` (JSON-able, `state["step"]` required); every process calls it.

    Folders named in `keep` (e.g. the best epoch's weights) survive the
    clean-up of older checkpoints.
    """
    name = f"step-{int(state['step']):09d}"
    if not spread_over_processes(model):
        with writing(directory) as target:
            if target is not None:
                partial = _begin(target, name)
                with _removed_on_error(partial):
                    _write_weights(model, partial, f"checkpoint {name}")
                    _finish(model, target, name, state, keep)
        return
    here = cluster.current()
    if here.chief:
        _begin(directory, name)
    cluster.barrier()  # the folder exists
    _orbax_save(model, os.path.join(directory, name + ".partial", SHARDED))  # every process writes its parts
    cluster.barrier()
    if here.chief:
        with writing(directory):  # reading the replicated RNG states touches no other process
            _finish(model, directory, name, state, keep)
    cluster.barrier()  # no process reads the checkpoint before it is complete


def _write_weights(model, partial, what):
    """`model`'s weights (and its optimizer's) into the folder `partial`, LoRA factors unmerged; refused without
    the room for them, the error naming `what` (`writing_weights`)."""
    optimizer = model.optimizer.variables if getattr(model, "optimizer", None) is not None else []
    with writing_weights(os.path.dirname(partial), [*model.weights, *optimizer], what):
        lora.save_weights(model, os.path.join(partial, WEIGHTS))


@contextlib.contextmanager
def _removed_on_error(partial):
    """Within it, an `OSError` (a full disk) removes the half-written folder `partial`, which would hold the space
    until the next save; the last whole checkpoint stays."""
    try:
        yield
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _begin(directory, name):
    partial = os.path.join(directory, name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    return partial


def _finish(model, directory, name, state, keep):
    target = os.path.join(directory, name)
    partial = target + ".partial"
    with storage.naming(os.path.join(partial, RNG)):
        np.savez(os.path.join(partial, RNG), *[keras.ops.convert_to_numpy(v) for v in rng_variables(model)])
    write_json(os.path.join(partial, STATE), state)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)
    write_json(os.path.join(directory, LATEST), {"checkpoint": name})
    for old in os.listdir(directory):
        if old not in (name, LATEST, *keep):
            path = os.path.join(directory, old)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError:
        from kgpt.errors import ConfigError

        raise ConfigError(
            "A model split across processes is checkpointed by each process through Orbax: pip "
            "install orbax-checkpoint (or kgpt[multihost])."
        ) from None
    return ocp


def _state_tree(model):
    return {"model": [v.value for v in model.weights], "optimizer": [v.value for v in model.optimizer.variables]}


def _orbax_save(model, path):
    checkpointer = _orbax().StandardCheckpointer()
    checkpointer.save(os.path.abspath(path), _state_tree(model))
    checkpointer.wait_until_finished()
    checkpointer.close()


def _orbax_restore(model, path):
    import jax

    tree = _state_tree(model)
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), tree)
    checkpointer = _orbax().StandardCheckpointer()
    try:
        restored = checkpointer.restore(os.path.abspath(path), target)
    except Exception as e:  # noqa: BLE001 - tensorstore and Orbax raise many types for a damaged folder
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise CheckpointError(f"{path}: the checkpoint cannot be read ({type(e).__name__}: {first}).") from e
    finally:
        checkpointer.close()
    for variable, value in zip(
        [*model.weights, *model.optimizer.variables], [*restored["model"], *restored["optimizer"]]
    ):
        variable.assign(value)


def save_weights(model, directory, name):
    """Writes `model`'s weights alone to `directory/name/` (e.g. the best epoch's), atomically (process 0)."""
    if spread_over_processes(model):
        from kgpt.errors import ConfigError

        raise ConfigError(
            "keep='best' keeps a copy of the best epoch's weights in one file, which a model split "
            "across processes has not: use keep='last'."
        )
    with writing(directory) as target_directory:
        if target_directory is not None:
            return _save_weights(model, target_directory, name)


def _save_weights(model, directory, name):
    target = os.path.join(directory, name)
    partial = target + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    with _removed_on_error(partial):
        _write_weights(model, partial, f"the {name} weights")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)
    return os.path.join(target, WEIGHTS)


def latest(directory):
    """`(folder, state)` of the newest complete checkpoint in `directory`, or None.

    With several processes, process 0's answer is every process's: a shared
    file system may show another process an older `latest.json` for a while.
    """
    pointer = os.path.join(directory, LATEST)
    name = (
        read_json(pointer, "the name of the latest checkpoint").get("checkpoint") if os.path.exists(pointer) else None
    )
    if cluster.current().several:
        import json

        chosen = json.loads(cluster.allgather(json.dumps(name if isinstance(name, str) else None).encode())[0])
        if chosen != name and cluster.current().process_id:
            logger.warning(f"Resuming from {chosen or 'the start'}, as process 0 does (this process sees {name}).")
            name = chosen
    if name is None:
        steps = (
            sorted(n for n in os.listdir(directory) if re.fullmatch(r"step-\d{9}", n))
            if os.path.isdir(directory)
            else []
        )
        if steps:  # the pointer is written last: without it the newest folder is not known to be whole
            raise CheckpointError(
                f"{directory} holds {steps[-1]} but no {LATEST}, which names the newest complete checkpoint: "
                f'write {{"checkpoint": "{steps[-1]}"}} to {pointer} to resume from it, or delete {directory} to '
                f"start over."
            )
        return None
    folder = os.path.join(directory, str(name))
    if not isinstance(name, str) or os.sep in name or not os.path.isdir(folder):
        raise CheckpointError(
            f"{pointer} names checkpoint {name!r}, which is not in {directory}: delete {directory} to start over."
        )
    state = read_json(os.path.join(folder, STATE), "the checkpoint's settings and progress")
    path = os.path.join(folder, STATE)
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) or isinstance(state["step"], bool):
        raise CheckpointError(f"{path} holds no step: delete {directory} to start over.")
    if name != f"step-{state['step']:09d}" or state["step"] < 0:
        raise CheckpointError(
            f"{path} says step {state['step']:,}, its folder {name}: the checkpoint was altered or "
            f"damaged; delete {directory} to start over."
        )
    return folder, state


def check_progress(state, path, total_steps=None, epochs=None):
    """Refuses a checkpoint `state` (read from `path`) past the run's end: `total_steps` or `epochs` (if given)."""
    if total_steps is not None and state["step"] > total_steps:
        raise CheckpointError(
            f"{path} says step {state['step']:,}, past this run's {total_steps:,} steps: the checkpoint was "
            f"altered or belongs to another run; delete its folder to start over."
        )
    done = state.get("epochs", [])
    if epochs is not None and (not isinstance(done, list) or len(done) > epochs):
        count = len(done) if isinstance(done, list) else "no list of"
        raise CheckpointError(
            f"{path} records {count} finished epochs, past this run's {epochs}: the checkpoint was "
            f"altered or belongs to another run; delete its folder to start over."
        )


def restore(model, directory, settings, total_steps=None, epochs=None):
    """Loads the latest checkpoint in `directory` into the compiled `model`; returns its state, or None.

    A checkpoint written with other `settings` is refused with the
    differences listed; a damaged one raises `CheckpointError` naming its file,
    and so does one whose step disagrees with its folder's name or lies past
    the run's `total_steps` (or whose finished epochs outnumber `epochs`).
    """
    found = latest(directory)
    if found is None:
        return None
    folder, state = found
    changed = checks.differences(state.get("settings") or {}, settings)
    if changed:
        raise CheckpointError(
            f"{directory} holds a checkpoint of a run with other settings ({changed}): pass "
            f"another --output_dir, or --overwrite to start over."
        )
    check_progress(state, os.path.join(folder, STATE), total_steps, epochs)
    model.optimizer.build(model.trainable_variables)
    if os.path.isdir(os.path.join(folder, SHARDED)):
        _orbax_restore(model, os.path.join(folder, SHARDED))
        _restore_rng(model, os.path.join(folder, RNG))
        return state
    load_weights(model, os.path.join(folder, WEIGHTS))
    _restore_rng(model, os.path.join(folder, RNG))
    return state


def load_weights(model, path):
    """Loads a checkpoint's weights file (a step's, or the best epoch's) into `model`; a missing, damaged or
    other model's file is a `CheckpointError` naming it, not h5py's own words."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: the checkpoint is missing.")
    try:
        check_weights_file(path, lora.file_variables(model))
        lora.load_weights(model, path)
    except CheckpointError:
        raise
    except Exception as e:  # h5py and Keras raise many types for a damaged file
        why = checks.shown(str(e), 200, quote=False)
        raise CheckpointError(f"{path}: the checkpoint cannot be read ({type(e).__name__}: {why}).") from e


def _restore_rng(model, path):
    variables = rng_variables(model)
    try:
        with np.load(path) as saved:
            arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path}: the checkpoint's random-number state cannot be read ({e}).") from e
    if [a.shape for a in arrays] != [tuple(v.shape) for v in variables]:
        raise CheckpointError(f"{path} holds {len(arrays)} random-number states, the model has {len(variables)}.")
    for variable, array in zip(variables, arrays):
        variable.assign(array)
