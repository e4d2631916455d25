"""kgpt presets: keras-hub's directory layout, loaded only after the files are checked.

A preset directory holds `config.json` + `model.weights.h5` (the backbone),
`task.json` + `task.weights.h5` (a causal LM or fine-tuned task model),
`tokenizer.json` + `assets/tokenizer/` (the BPE files), `preprocessor.json`
(a task's text preprocessor, when one was attached) and `metadata.json`
(keras, keras-hub and kgpt versions). Loading never runs code from the files:
configs are JSON read with Keras' safe deserialisation (only registered classes,
no lambdas) and weights are HDF5 arrays. Before any weight is assigned, the
arrays in the file are matched against the model the config describes, so a
truncated, foreign or mismatched file fails with an error naming it instead of
half-loading (Keras itself ignores surplus arrays silently).
"""

import collections
import contextlib
import functools
import gc
import inspect
import json
import logging
import math
import os
import re
import shutil
import sys
import traceback
import warnings

import h5py
import keras

from kgpt import checks
from kgpt.errors import CheckpointError, RepeatedKeyError, WeightsWriteError
from kgpt.io import run_folder, storage

CONFIG_FILE = "config.json"
MODEL_WEIGHTS_FILE = "model.weights.h5"
TASK_CONFIG_FILE = "task.json"
TASK_WEIGHTS_FILE = "task.weights.h5"
PREPROCESSOR_CONFIG_FILE = "preprocessor.json"  # keras-hub's copy of the preprocessor in task.json
METADATA_FILE = "metadata.json"

logger = logging.getLogger(__name__)


def read_json(path, what):
    """Parses a JSON file, naming it in the error when it is missing or broken."""
    if not os.path.isfile(path):
        raise CheckpointError(f"Missing {path}: expected {what}.")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, object_pairs_hook=checks.unique_keys)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); expected {what}.") from e
    except RepeatedKeyError as e:
        raise CheckpointError(f"{path}: the key {e.args[0]!r} is given twice in one object; expected {what}.") from None
    except RecursionError:
        raise CheckpointError(f"{path} is nested too deeply to be {what}.") from None


def deserialize(config, path, what):
    """Keras' safe deserialisation, its many error types (and a config that asks for too much memory)
    re-raised as one `CheckpointError` naming the file."""
    try:
        return keras.saving.deserialize_keras_object(config, safe_mode=True)
    except (
        TypeError,
        ValueError,
        KeyError,
        AttributeError,
        IndexError,
        RecursionError,
        MemoryError,
        OverflowError,
    ) as e:
        raise CheckpointError(f"{path}: cannot build {what} from it ({type(e).__name__}: {str(e)[:300]}).") from e


def constructor_arguments(cls):
    """`{name: default}` of what `cls`'s constructor takes by name (`inspect.Parameter.empty` for those it needs),
    with Keras' `name`, `dtype` and `trainable`: the entries its config may hold."""
    arguments = {
        name: p.default
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self"
    }
    return {**checks.KERAS_MODEL_ARGUMENTS, **arguments}


def check_backbone_config(config, path, weights_path=None):
    """Refuses, before anything is built, a backbone config (`path`'s) that cannot build its model or does not fit
    the weights file `weights_path` (None: not checked), in one line naming `path` and the entry.

    A missing entry is named; an entry the class does not take is named in a warning and removed from
    `config` (its constructor refuses it); the values are checked by the class's `check_config` where it has
    one. A config whose sizes were tampered with (`vocabulary_size: 2e7`, `num_layers: 1e9`) would allocate
    gigabytes before the weights are compared: the file's arrays are compared first with the sizes
    (`min_weight_count`), then, unless the model is quantized (its file holds scales too), one by one with the
    arrays the config describes (`weight_shapes`); where one size alone differs from the weights', it is named
    with the weights' value. Classes without these methods are checked as far as they have them.
    """
    cls = keras.saving.get_registered_object(config.get("registered_name") or "")
    if not isinstance(cls, type):
        return
    inner, arguments = config["config"], constructor_arguments(cls)
    required = [name for name, default in arguments.items() if default is inspect.Parameter.empty]
    missing = [name for name in required if name not in inner]
    if missing:
        raise CheckpointError(
            f"{path}: missing key {', '.join(map(repr, missing))}: a {cls.__name__} config needs {', '.join(required)}."
        )
    unknown = sorted(set(inner) - set(arguments))
    if unknown:
        logger.warning(
            f"Warning: {path}: {cls.__name__} takes no {', '.join(map(repr, unknown))}: ignored. Its config "
            f"takes {', '.join(sorted(arguments))}."
        )
        for key in unknown:  # the constructor refuses them
            del inner[key]
    if not hasattr(cls, "check_config"):
        return
    try:
        sizes = cls.check_config({**arguments, **inner})  # defaults filled in, sizes as ints: what is counted below
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: {e}") from None
    if weights_path is None or not hasattr(cls, "min_weight_count"):
        return
    needed = cls.min_weight_count(sizes)
    found = collections.Counter(file_shapes(weights_path))
    held = sum(math.prod(shape) * n for shape, n in found.items())
    dtype = inner.get("dtype")
    quantized = isinstance(dtype, dict) and dtype.get("class_name") == "DTypePolicyMap"
    shapes = hasattr(cls, "weight_shapes") and not quantized
    if needed > held or (shapes and found != cls.weight_shapes(sizes)):
        changed = _changed_entry(cls, sizes, found) if shapes else None
        if changed:
            key, value = changed
            raise CheckpointError(
                f"{path}: {key} is {sizes[key]}, but {weights_path} holds the weights of a model with {key}="
                f"{value}: the config and the weights do not belong together (was {key} edited?)."
            )
    if needed > held:
        raise CheckpointError(
            f"{path} describes a model of at least {needed:,} weights, but {weights_path} holds "
            f"{held:,}: the config and the weights do not belong together."
        )
    if shapes:
        _check_shapes(weights_path, f"the model {path} describes", found, cls.weight_shapes(sizes))


def _changed_entry(cls, config, found):
    """`(key, value)`: the one size of `config` that, set to `value`, describes the arrays `found` (`{shape:
    count}`), where exactly one does; None otherwise. Values are tried from the arrays' sizes and counts."""
    candidates = {size for shape in found for size in shape} | set(range(1, sum(found.values()) + 1))
    sizes = [k for k, v in config.items() if isinstance(v, int) and not isinstance(v, bool)]
    matches = []
    for key in sizes:
        for value in candidates - {config[key]}:
            try:
                if cls.weight_shapes({**config, key: value}) == found:
                    matches.append((key, value))
            except (TypeError, ValueError, KeyError, ZeroDivisionError):
                continue
    return matches[0] if len(matches) == 1 else None


# A run's output directory holds its model only once the run ends: what each job is, the command resuming it and
# the file of its model.
_RUN_JOBS = {
    "pretrain": ("pre-training", "kgpt-train --task lm", CONFIG_FILE),
    "finetune": ("fine-tuning", "kgpt-train --task {task}", TASK_CONFIG_FILE),
}


def check_finished(path):
    """Raises `CheckpointError` when the folder `path` is the output directory of a kgpt pre-training or
    fine-tuning run that has not saved its model yet (still running, or stopped before its end), naming its last
    checkpoint; returns otherwise. Loaders call it where they find no model, so that such a folder is not
    called "not a preset"."""
    try:
        with open(os.path.join(path, run_folder.RUN_FILE), encoding="utf-8") as f:
            run = json.load(f)
        job, settings = run["job"], run.get("settings") or {}
        what, command, model = _RUN_JOBS[job]
        command = command.format(task=settings.get("task", "NAME"))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # no kgpt run of a job that saves a model
        return
    if os.path.exists(os.path.join(path, model)):  # finished: what is missing is for its loader to name
        return
    step = _last_checkpoint(os.path.join(path, run_folder.CHECKPOINTS))
    total = settings.get("max_steps") if job == "pretrain" else None
    progress = (
        "no checkpoint written yet"
        if step is None
        else f"last checkpoint: step {step:,}" + (f" of {total:,}" if isinstance(total, int) else "")
    )
    try:
        holder = run_folder.lock_holder(path)
    except OSError:
        holder = None
    if holder:
        raise CheckpointError(
            f"{path} is a {what} run still in progress ({holder}; {progress}): it saves its model there when it "
            f"ends. Until then, start from a finished model."
        )
    raise CheckpointError(
        f"{path} is a {what} run that has not finished ({progress}): resume it by running its {command} command "
        f"again (--output_dir {path}), or start from a finished model."
    )


def _last_checkpoint(directory):
    """The step of the checkpoint `directory/latest.json` names, or None when there is none or it cannot be read."""
    try:
        with open(os.path.join(directory, run_folder.LATEST), encoding="utf-8") as f:
            name = json.load(f)["checkpoint"]
        with open(os.path.join(directory, str(name), run_folder.STATE), encoding="utf-8") as f:
            step = json.load(f)["step"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def check_preset_dir(preset, config_file, expected_class):
    """Checks that `preset` is a local directory whose `config_file` builds `expected_class`."""
    if not isinstance(preset, (str, os.PathLike)) or not os.path.isdir(preset):
        raise CheckpointError(
            f"No preset directory {preset!r}: a preset is a folder written by save_to_preset or kgpt-train "
            f"--output_dir, or hf://OWNER/REPO on the Hugging Face Hub."
        )
    path = os.path.join(preset, config_file)
    if not os.path.isfile(path):
        check_finished(preset)
    meta = os.path.join(preset, METADATA_FILE)
    if os.path.isfile(meta):
        _warn_of_newer_versions(meta, os.stat(meta).st_mtime_ns)
    config = read_json(path, f"the Keras config of a {expected_class.__name__}")
    name = config.get("registered_name") if isinstance(config, dict) else None
    expected = keras.saving.get_registered_name(expected_class)
    if not isinstance(config, dict) or not isinstance(config.get("config"), dict):
        raise CheckpointError(f"{path}: not a Keras object config (no 'config' mapping).")
    registered = keras.saving.get_registered_object(name) if name else None
    if not isinstance(registered, type) or not issubclass(registered, expected_class):  # a function is registered too
        raise CheckpointError(f"{path} describes {name!r}, expected {expected!r} (a kgpt preset of that kind).")
    return config


@functools.lru_cache(maxsize=64)
def _warn_of_newer_versions(path, mtime_ns):
    """Warns (once per file and version of it) when the preset's `metadata.json` at `path` says a newer kgpt or
    Keras wrote it, whose files this one may read otherwise, or gives a version that is none."""
    from packaging.version import InvalidVersion, Version

    from kgpt import __version__

    try:
        metadata = read_json(path, "keras-hub's metadata")
    except CheckpointError as e:
        logger.warning(f"Warning: {e}")
        return
    for key, here in (("kgpt_version", __version__), ("keras_version", keras.__version__)):
        saved = metadata.get(key) if isinstance(metadata, dict) else None
        if saved is None:
            continue
        try:
            newer = Version(str(saved)) > Version(here)
        except InvalidVersion:
            logger.warning(f"Warning: {path}: {key} {checks.shown(saved)} is not a version number.")
            continue
        if newer:
            package = key.split("_")[0]
            logger.warning(
                f"Warning: {path}: saved with {package} {saved}, newer than this {package} {here}: a setting it "
                f"added may be read otherwise or not at all; pip install -U {package} to load it as it was saved."
            )


def file_shapes(path):
    """Shapes of the model arrays (not the optimizer's) in a Keras `.weights.h5` file, read from its header.

    Raises `CheckpointError` naming the file when it is missing or not HDF5.
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"Missing {path}: expected the weights written by save_to_preset.")
    shapes = []
    try:
        with h5py.File(path, "r") as f:

            def visit(name, obj):
                if isinstance(obj, h5py.Dataset) and not name.startswith("optimizer/"):
                    shapes.append(tuple(obj.shape))

            f.visititems(visit)
    except OSError as e:
        raise CheckpointError(f"{path} is not a readable Keras weights file (truncated or corrupt: {e}).") from e
    return shapes


def _describe(counter):
    return ", ".join(f"{list(shape)} x{n}" for shape, n in sorted(counter.items()))


def check_weights_file(path, variables):
    """Raises `CheckpointError` unless `path` holds exactly one array per variable, of its shape."""
    found = collections.Counter(file_shapes(path))
    _check_shapes(path, "the model its config describes", found, collections.Counter(tuple(v.shape) for v in variables))


# What an HDF5 weights file holds beyond its arrays' bytes (headers, names, the file's own structure), with room
# to spare: Keras' files measure 0.85 to 1.4 KB per array over the arrays themselves, at 16 wide and at 768.
_H5_BYTES_PER_ARRAY = 2 << 10
_H5_BYTES_PER_FILE = 64 << 10


def check_room_for_weights(folder, variables, what):
    """Refuses to start a `.weights.h5` file of `variables` in `folder` without the room for it.

    An HDF5 file that a full disk cuts short leaves h5py raising from its
    destructors and crashing the interpreter at exit (a segmentation fault,
    h5py issue 914), after the run's one-line error; so the room is checked
    before the first byte, and the error names `folder` and what it was for.
    """
    nbytes = _H5_BYTES_PER_FILE + sum(math.prod(v.shape) * _itemsize(v.dtype) + _H5_BYTES_PER_ARRAY for v in variables)
    storage.check_room(folder, nbytes, what)


@contextlib.contextmanager
def writing_weights(folder, variables, what):
    """Within it, `.weights.h5` files of `variables` (`what`) are written into `folder`: refused first without
    the room (`check_room_for_weights`). If the disk fills all the same, the `OSError` names `folder` and
    `what` with the system's reason, not h5py's page of HDF5 internals, and h5py's destructors, which print
    a traceback per object they fail to flush, are silenced: the error says it once."""
    check_room_for_weights(folder, variables, what)
    hooks = sys.unraisablehook, sys.excepthook

    def from_h5py(error, trace, where=None):
        places = [repr(where), *(f.filename for f in traceback.extract_tb(trace))]
        return isinstance(error, RuntimeError) and any("h5py" in p for p in places)

    def unraisable(u):
        if not from_h5py(u.exc_value, u.exc_traceback, u.object):
            hooks[0](u)

    def printed(kind, error, trace):  # Cython prints a destructor's error through sys.excepthook too
        if not from_h5py(error, trace):
            hooks[1](kind, error, trace)

    sys.unraisablehook, sys.excepthook = unraisable, printed
    try:
        yield
    except OSError as e:
        error = WeightsWriteError(f"{folder}: {what} could not be written ({storage.reason(e)})")
        error.errno = e.errno
        raise error from e
    finally:
        sys.unraisablehook, sys.excepthook = hooks


def _itemsize(dtype):
    """Bytes per element of a Keras dtype name (`float32`, `bfloat16`, `int8`, `float8_e4m3fn`, `bool`)."""
    bits = re.search(r"\d+", str(dtype))
    return max(1, int(bits.group()) // 8) if bits else 1


def _check_shapes(path, model, found, expected):
    """Raises `CheckpointError` unless the arrays `found` in the weights file `path` are those `expected` of `model`
    (`{shape: count}` each)."""
    if found != expected:
        raise CheckpointError(
            f"{path} does not fit {model}: the file holds {sum(found.values())} arrays, the model has "
            f"{sum(expected.values())} weights. Only in the file: {_describe(found - expected) or '-'}. "
            f"Expected but missing: {_describe(expected - found) or '-'}. Was it saved from another model?"
        )


def _load_weights(load, path):
    """Runs Keras' own loader `load(path)`, re-raising its errors with the file named."""
    try:
        with warnings.catch_warnings():
            # Presets hold the model, not the training state (checkpoints do).
            warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
            load(path)
    except (ValueError, OSError, KeyError) as e:
        raise CheckpointError(f"Could not load {path}: {e}") from e


def check_overrides(cls, overrides):
    """Refuses `from_preset` keyword arguments that `cls`'s constructor does not take (Keras would drop them)."""
    allowed = set(constructor_arguments(cls))
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        hint = (
            " The packed length is the preprocessor's: set model.preprocessor.sequence_length after loading."
            if "sequence_length" in unknown
            else ""
        )
        raise TypeError(
            f"{cls.__name__}.from_preset() got {', '.join(map(repr, unknown))}, which {cls.__name__} "
            f"does not take; it takes load_weights and {', '.join(sorted(allowed))}.{hint}"
        )


def check_save_target(preset_dir):
    """A preset is a folder: refuses an empty path or the path of a file or of a folder inside one, naming the file,
    and a kgpt run's output directory, whose run writes its model there itself
    (`kgpt.io.run_folder.check_save_target`). Every kgpt `save_to_preset` checks its folder with it."""
    path = os.fspath(preset_dir)
    if not path:
        raise ValueError("preset_dir is empty: pass the folder to save the preset in.")
    storage.refuse_url(
        path,
        "save_to_preset writes a local folder",
        "save here, then copy it; a run's --output_dir may be remote",
        ValueError,
        "preset_dir",
    )
    found = os.path.normpath(path)
    while not os.path.exists(found) and os.path.dirname(found) not in ("", found):
        found = os.path.dirname(found)  # the nearest that exists on the way: the folders below it are made
    if os.path.exists(found) and not os.path.isdir(found):
        inside = "" if found == os.path.normpath(path) else f", not inside a file ({path})"
        raise ValueError(f"{found} is a file: a preset is saved as a folder{inside}; pass a folder's path.")
    run_folder.check_save_target(path)
    return path


PARTIAL_DIR = ".preset.partial"
TOKENIZER_FILE, TOKENIZER_ASSETS = "tokenizer.json", os.path.join("assets", "tokenizer")  # keras-hub's layout
# What a save replaces: the files of keras-hub's preset layout that belong to one model. The tokenizer
# stays when the new model has none (a pre-training run writes it first, the model later).
MODEL_FILES = {
    CONFIG_FILE,
    MODEL_WEIGHTS_FILE,
    "model.weights.json",
    TASK_CONFIG_FILE,
    TASK_WEIGHTS_FILE,
    PREPROCESSOR_CONFIG_FILE,
    METADATA_FILE,
}
_SHARD_FILE = re.compile(r"model_\d+\.weights\.h5$")


def replace_preset(directory, write):
    """Calls `write(folder)` on a hidden folder in `directory`, then moves what it wrote into `directory`.

    The model files of the preset already there that `write` did not write
    again are removed first. An error inside `write` (a full disk) leaves
    the old preset whole and removes the hidden folder; a crash leaves that
    folder for the next save to remove.
    """
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, PARTIAL_DIR)
    try:
        refuse_foreign_files(directory)
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created:  # a folder made for a save that did not happen
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        raise
    written = set(os.listdir(tmp))
    before = set(os.listdir(directory))
    old_config, new_config = _text(os.path.join(directory, CONFIG_FILE)), _text(os.path.join(tmp, CONFIG_FILE))
    if old_config is not None and new_config is not None and old_config != new_config and TOKENIZER_FILE not in written:
        # Another model's tokenizer, which this one would load with (refused for another vocabulary size, taken
        # without a word for the same one). The same model saved again (a pre-training run) keeps it.
        gone = [name for name in (TOKENIZER_FILE, TOKENIZER_ASSETS) if os.path.exists(os.path.join(directory, name))]
        for name in gone:
            path = os.path.join(directory, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        with contextlib.suppress(OSError):  # assets/ once empty
            os.rmdir(os.path.join(directory, os.path.dirname(TOKENIZER_ASSETS)))
        if gone:
            logger.warning(
                f"Warning: {directory} held another model's preset: its {', '.join(gone)} are removed, as this "
                f"model has no tokenizer."
            )
    results = [n for n in run_folder.RESULTS if n in before]
    if old_config is not None and old_config != new_config and results and not run_folder.job_is_saving(directory):
        shown = ", ".join(n + ("/" if os.path.isdir(os.path.join(directory, n)) else "") for n in results)
        logger.warning(
            f"Warning: {directory} holds {shown} of the model this save replaces: they describe that model, not "
            f"this one (move or delete them)."
        )
    added = sorted(n for n in written - before if n in MODEL_FILES and n != METADATA_FILE)
    if CONFIG_FILE in before and added:  # a task model, where a backbone preset was: its weights go too
        logger.warning(
            f"Warning: {directory} held another model's preset: it is replaced by this model's, which adds "
            f"{', '.join(added)}."
        )
    stale = sorted(n for n in os.listdir(directory) if n not in written and (n in MODEL_FILES or _SHARD_FILE.match(n)))
    for name in stale:
        os.remove(os.path.join(directory, name))
    removed = [n for n in stale if not _SHARD_FILE.match(n)]  # stale shards: the same model, sharded otherwise
    if removed:  # another kind of model was saved there (a task model, where a backbone is saved now)
        logger.warning(
            f"Warning: {directory} held another model's preset: its {', '.join(removed)} are removed, as this model "
            f"has none."
        )
    # The configs last: until they move, a reader loads the old config with the old weights it checks.
    for name in sorted(written, key=lambda n: (n.endswith(".json") and n != "model.weights.json", n)):
        source, target = os.path.join(tmp, name), os.path.join(directory, name)
        if os.path.isdir(source):
            shutil.rmtree(target, ignore_errors=True)
        os.replace(source, target)
    os.rmdir(tmp)


def refuse_foreign_files(directory, names=None):
    """Refuses a save over JSON files of a preset's `names` (by default all a model's save writes) that no Keras
    save wrote (a user's own `config.json`): a save replaces a preset's files, and would replace those without a
    word."""
    names = (*MODEL_FILES, TOKENIZER_FILE) if names is None else names
    foreign = []
    for name in sorted(n for n in names if n.endswith(".json") and "weights" not in n):
        text = _text(os.path.join(directory, name))
        if text is None:
            continue
        try:
            found = json.loads(text)
        except ValueError:
            found = None
        marks = ("keras_version",) if name == METADATA_FILE else ("class_name", "config")
        if not (isinstance(found, dict) and all(k in found for k in marks)):
            foreign.append(name)
    if foreign:
        raise ValueError(
            f"{directory} holds {checks.listed(foreign)}, which no Keras model save wrote: a preset saved there "
            f"would replace {'them' if len(foreign) > 1 else 'it'}. Save the preset in another folder, or move "
            f"{'them' if len(foreign) > 1 else 'it'} first."
        )


def _text(path):
    """The text of `path`, None when there is no such file."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def stamp_metadata(preset_dir, **extra):
    """Adds the kgpt version (and `extra`) to keras-hub's `metadata.json`."""
    from kgpt import __version__

    path = os.path.join(preset_dir, METADATA_FILE)
    metadata = read_json(path, "keras-hub's metadata") if os.path.exists(path) else {}
    # keras-hub lists the tasks by base class, which is PresetMixin here.
    metadata.update(kgpt_version=__version__, tasks=["GPTCausalLM", "GPTTaskModel"], **extra)
    with storage.naming(path), open(path, "w", encoding="utf-8") as f:
        json.dump(metadata, f, indent=4)


def check_backbone_preset(cls, preset, load_weights=True, **kwargs):
    """The `config.json` of the backbone preset `preset` (a `cls`), `kwargs` overriding its entries, checked with
    the weights file (with `load_weights`) before anything is built; `--dry_run` checks with it too."""
    config = check_preset_dir(preset, CONFIG_FILE, cls)
    config["config"].update(kwargs)
    weights = os.path.join(preset, MODEL_WEIGHTS_FILE) if load_weights else None
    check_backbone_config(config, os.path.join(preset, CONFIG_FILE), weights)
    return config


def load_backbone_preset(cls, preset, load_weights=True, **kwargs):
    """`cls.from_preset` for kgpt backbones: config and weights checked before loading.

    With `load_weights=False` the weights file is neither read nor needed:
    the model comes freshly initialised (keras-hub's meaning).
    """
    config = check_backbone_preset(cls, preset, load_weights, **kwargs)
    path = os.path.join(preset, MODEL_WEIGHTS_FILE)
    backbone = deserialize(config, os.path.join(preset, CONFIG_FILE), f"a {cls.__name__}")
    if load_weights:
        check_weights_file(path, backbone.weights)
        _load_weights(backbone.load_weights, path)
    return backbone


def load_any_backbone(preset, **kwargs):
    """The backbone of a preset, whichever kgpt backbone class its `config.json` names."""
    from keras_hub.models import Backbone

    config = check_preset_dir(preset, CONFIG_FILE, Backbone)
    cls = keras.saving.get_registered_object(config["registered_name"])
    return load_backbone_preset(cls, preset, **kwargs)


def tokenizer_fits(preprocessor, backbone):
    """The preprocessor's tokenizer gives only ids the backbone's embedding has rows for."""
    tokenizer = getattr(preprocessor, "tokenizer", None)
    if getattr(tokenizer, "encoder", None) is None:
        return  # a preset's tokenizer before its files are read: checked once they are
    size = tokenizer.vocabulary_size()
    if isinstance(size, int) and size > backbone.vocabulary_size:
        raise ValueError(
            f"The preprocessor's tokenizer has {size} ids, more than the backbone's vocabulary_size="
            f"{backbone.vocabulary_size}: its ids past {backbone.vocabulary_size - 1} have no embedding. "
            f"Use the tokenizer the backbone was trained with (backbone.with_added_tokens(n) makes rows for "
            f"n added tokens)."
        )


def check_task_preset(cls, preset, load_weights=True, **kwargs):
    """`(task config, backbone config)` of the task preset `preset` (a `cls`), `kwargs` overriding the task's
    entries: both backbone configs (`config.json`, and `task.json`'s own copy, which must be equal) checked with the
    weights file (with `load_weights`) before anything is built; `--dry_run` checks with it too."""
    from keras_hub.models import Backbone

    config = check_preset_dir(preset, TASK_CONFIG_FILE, cls)
    backbone_config = check_preset_dir(preset, CONFIG_FILE, Backbone)
    config["config"].update(kwargs)
    weights = os.path.join(preset, MODEL_WEIGHTS_FILE) if load_weights else None
    check_backbone_config(backbone_config, os.path.join(preset, CONFIG_FILE), weights)
    nested = config["config"].get("backbone")
    if isinstance(nested, dict) and isinstance(nested.get("config"), dict):  # task.json holds its own copy
        check_backbone_config(nested, os.path.join(preset, TASK_CONFIG_FILE), weights)
        check_task_copy(preset, CONFIG_FILE, backbone_config, "backbone", nested)  # keys warned of are gone from both
    saved_preprocessor(preset)
    return config, backbone_config


def saved_preprocessor(preset):
    """The config of the preprocessor a task preset loads (the one in `task.json`, as keras-hub's loader reads it),
    or None when it saves none. Refused naming the file: a packed length that is not a positive integer or
    exceeds the model's context, and a `preprocessor.json` (keras-hub's copy, which `Preprocessor.from_preset`
    and kgpt's own readers see) that differs from it (`check_task_copy`).
    """
    task_path = os.path.join(preset, TASK_CONFIG_FILE)
    if not os.path.isfile(task_path):
        return None
    task = read_json(task_path, "a kgpt task config")
    inner = task.get("config") if isinstance(task, dict) else None
    nested = inner.get("preprocessor") if isinstance(inner, dict) else None
    if not isinstance(nested, dict) or not isinstance(nested.get("config"), dict):
        return None
    config = nested["config"]
    backbone = (inner.get("backbone") or {}).get("config") if isinstance(inner.get("backbone"), dict) else None
    context = backbone.get("max_sequence_length") if isinstance(backbone, dict) else None
    if config.get("sequence_length") is not None:
        try:
            value = checks.positive_int(config["sequence_length"], "sequence_length")
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{task_path}: the preprocessor's {e}") from None
        if isinstance(context, int) and value > context:
            raise CheckpointError(
                f"{task_path}: the preprocessor's sequence_length is {value}, more than the model's context "
                f"max_sequence_length={context}."
            )
    copy_path = os.path.join(preset, PREPROCESSOR_CONFIG_FILE)
    if os.path.isfile(copy_path):
        copy = read_json(copy_path, "a preprocessor config")
        check_task_copy(preset, PREPROCESSOR_CONFIG_FILE, copy, "preprocessor", nested)
    return config


# What an edited copy's message offers beside making the two files equal again, by task.json's entry.
_COPY_HINTS = {
    "preprocessor": " To pack to another length, restore the file and load with sequence_length= (kgpt-predict "
    "--max_length): save_to_preset keeps it.",
}


def check_task_copy(preset, name, copy, key, saved):
    """Refuses the file `name` of the task preset `preset` (its config `copy`), keras-hub's copy of `task.json`'s
    entry `key` (`saved`), where the two differ: the task model loads `saved`, other readers the copy."""
    if copy == saved:
        return
    copy_path, task_path = os.path.join(preset, name), os.path.join(preset, TASK_CONFIG_FILE)
    copied, inner = (c.get("config") if isinstance(c, dict) else None for c in (copy, saved))
    where = (f"in {name}", f"in {TASK_CONFIG_FILE}")
    changed = (
        isinstance(copied, dict) and isinstance(inner, dict) and checks.differences(copied, inner, checks.shown, where)
    )
    raise CheckpointError(
        f"{copy_path} differs from the {key} saved in {task_path} ({changed or 'another object'}): the model loads "
        f"task.json's, other readers {name}, so an edit of one alone would be ignored. Restore the edited file, or "
        f"make the same edit in both.{_COPY_HINTS.get(key, '')}"
    )


def load_task_preset(cls, preset, load_weights=True, **kwargs):
    """`cls.from_preset` for kgpt task models: task config, task and backbone weights checked.

    A preprocessor saved inside `task.json` gets its tokenizer's files from
    the preset's `assets/` (keras-hub's `load_preset_assets`), after the
    weight files are checked and before any weight is assigned.
    """
    config, _ = check_task_preset(cls, preset, load_weights, **kwargs)
    backbone_path = os.path.join(preset, MODEL_WEIGHTS_FILE)
    task = deserialize(config, os.path.join(preset, TASK_CONFIG_FILE), f"a {cls.__name__}")
    task_path = os.path.join(preset, TASK_WEIGHTS_FILE)
    if load_weights:
        quantize_head_like_file(task, task_path)
    backbone_ids = {id(v) for v in task.backbone.weights}
    head = [v for v in task.weights if id(v) not in backbone_ids]
    if load_weights:
        check_weights_file(backbone_path, task.backbone.weights)
        if head:
            check_weights_file(task_path, head)
        elif os.path.exists(task_path):
            raise CheckpointError(f"{task_path} holds head weights, but the model in task.json has no head.")
    # A preprocessor in task.json comes back without its tokenizer's files (as in keras-hub).
    preprocessor = getattr(task, "preprocessor", None)
    if preprocessor is not None and hasattr(preprocessor, "load_preset_assets"):
        preprocessor.load_preset_assets(os.fspath(preset))
        try:
            tokenizer_fits(preprocessor, task.backbone)
        except ValueError as e:
            raise CheckpointError(f"{preset}: {e}") from None
    if load_weights:
        _load_weights(task.backbone.load_weights, backbone_path)
        if head:
            _load_weights(task.load_task_weights, task_path)
    return task


def _holds_int8(path):
    """Whether a `.weights.h5` file holds int8 arrays (weights of `quantize("int8")` layers)."""
    try:
        with h5py.File(path, "r") as f:
            found = []
            f.visititems(
                lambda name, obj: (
                    found.append(name)
                    if isinstance(obj, h5py.Dataset) and obj.dtype == "int8" and not name.startswith("optimizer/")
                    else None
                )
            )
            return bool(found)
    except OSError:  # missing or corrupt: check_weights_file names it
        return False


@contextlib.contextmanager
def one_garbage_collection():
    """Runs the block with `gc.collect()` a no-op, then collects once.

    Keras' `Layer.__delattr__` runs a full `gc.collect()` each time
    `quantize` deletes a float kernel: one per Dense/EinsumDense layer,
    each taking about half a second in a process that holds TensorFlow (more
    in one that holds many models). One collection after the last layer
    frees the same buffers.
    """
    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect
        collect()


def quantize_head_like_file(task, task_path):
    """Quantizes a task model's head layers to int8 when its saved head was.

    The backbone's config records which of its layers were quantized
    (keras-hub's `DTypePolicyMap`), so it is built quantized; a task
    model's head is built from the task's own config, which does not, so
    a head saved after `model.quantize("int8")` is re-quantized here before
    its weights are checked and loaded.
    """
    if not os.path.isfile(task_path) or not _holds_int8(task_path):
        return
    backbone_layers = {id(layer) for layer in task.backbone._flatten_layers()}
    with one_garbage_collection():  # not one gc.collect() per quantized layer
        for layer in task._flatten_layers(include_self=False):
            if id(layer) in backbone_layers or layer._flatten_layers(include_self=False):
                continue
            if layer.weights and getattr(layer, "quantization_mode", "none") is None and hasattr(layer, "quantize"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    layer.quantize("int8")


class PresetMixin:
    """`save_to_preset` that records the kgpt version, `from_preset` that checks before loading.

    Mixed into `GPTBackbone`, `GPTCausalLM` and `GPTTaskModel` ahead of their
    keras-hub base class.
    """

    def save_to_preset(self, preset_dir, max_shard_size=10):
        """Writes the keras-hub preset layout to `preset_dir` (created if needed), replacing any preset there.

        The files are written into a hidden folder inside `preset_dir` and
        moved into place only when all are complete, so an interrupted save
        leaves the previous preset loadable; the previous preset's files that
        this model does not write (a causal LM's `task.json` under a new
        backbone) are removed, never left to be loaded with the new weights.
        Other files in the folder stay.
        """
        if os.path.basename(os.path.normpath(os.fspath(preset_dir))) == PARTIAL_DIR:
            # A task saving its backbone: keras-hub's Task.save_to_preset calls the backbone's with the
            # task's folder and nothing else, and that folder is the hidden one of the task's own
            # replace_preset: the backbone writes there directly.
            super().save_to_preset(preset_dir, max_shard_size=max_shard_size)
            return

        def write(directory):
            with writing_weights(os.path.dirname(directory), self.weights, "the preset"):
                super(PresetMixin, self).save_to_preset(directory, max_shard_size=max_shard_size)
            stamp_metadata(directory)

        replace_preset(check_save_target(preset_dir), write)

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """Loads a kgpt preset: a local folder or `hf://OWNER/REPO[@REVISION]`; `kwargs` override config entries.

        `load_weights=False` builds the model the preset describes with fresh
        weights (keras-hub's meaning). An argument the class does not take is
        refused by name.
        """
        from keras_hub.models import Backbone

        checks.boolean(load_weights, "load_weights")
        check_overrides(cls, kwargs)
        if issubclass(cls, Backbone):
            return load_backbone_preset(cls, preset, load_weights=load_weights, **kwargs)
        return load_task_preset(cls, preset, load_weights=load_weights, **kwargs)
