"""A disk that is full, or fills while kgpt writes: one line naming the folder or file, what was being written and
why; the last whole checkpoint (or preset) stays, and nothing half-written is left.

A weights file is never begun without the room for it (HDF5 files cut short crash h5py at exit). A disk that
fills during a write all the same is made here with a file-size limit (`RLIMIT_FSIZE`), which fails a write as
a full disk does, with `EFBIG` for `ENOSPC` (Python ignores the signal that would otherwise come with it).
"""

import collections
import contextlib
import errno
import os
import re
import resource
import shutil
import sys
import types

import keras
import numpy as np
import pytest
from conftest import TINY, char_tokenizer

import kgpt
from kgpt.cli import common
from kgpt.data.shard_index import ShardWriter
from kgpt.errors import WeightsWriteError
from kgpt.io import presets, storage
from kgpt.train import checkpoint

Usage = collections.namedtuple("Usage", "total used free")


@contextlib.contextmanager
def file_size_limit(nbytes):
    """Within it, this process cannot make a file longer than `nbytes`: writes past it fail with `EFBIG`."""
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)


def compiled_model():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(64), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 8)), np.ones((4, 1)), epochs=1, verbose=0)
    return model


def test_a_checkpoint_without_room_is_refused_before_a_byte_and_the_last_one_stays(tmp_path, monkeypatch):
    model = compiled_model()
    directory = str(tmp_path / "checkpoint")
    checkpoint.save(model, directory, {"step": 1})
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(OSError) as info:
        checkpoint.save(model, directory, {"step": 2})
    assert info.value.errno == errno.ENOSPC
    assert re.fullmatch(
        rf"{directory}: no space left on device for checkpoint step-000000002 \(it needs about \d+ KB, 1 KB free\)",
        str(info.value),
    ), info.value
    assert sorted(os.listdir(directory)) == ["latest.json", "step-000000001"]  # no half-written step 2
    assert checkpoint.latest(directory)[1] == {"step": 1}


def test_a_preset_without_room_is_refused_and_the_old_one_still_loads(tmp_path, monkeypatch):
    preset = str(tmp_path / "preset")
    old = kgpt.GPTBackbone(**TINY)
    old.save_to_preset(preset)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(OSError, match=rf"^{preset}: no space left on device for the preset \(it needs about"):
        kgpt.GPTBackbone(**{**TINY, "num_layers": 1}).save_to_preset(preset)
    with pytest.raises(OSError, match=r"no space left on device for the preset"):
        kgpt.GPTBackbone(**TINY).save_to_preset(str(tmp_path / "new"))
    assert not (tmp_path / "new").exists()  # no empty folder left for a save that did not happen
    monkeypatch.undo()
    assert kgpt.GPTBackbone.from_preset(preset).num_layers == TINY["num_layers"]
    assert ".preset.partial" not in os.listdir(preset)


def test_a_disk_that_fills_while_a_file_is_written_names_the_file(tmp_path):
    writer = ShardWriter(str(tmp_path), np.int32, shard_tokens=10**6)
    with file_size_limit(4096), pytest.raises(OSError) as info:
        writer.write(np.zeros(10_000, np.int32))
        writer.close()
    assert str(info.value) == f"{tmp_path}/tokens_00000.bin: file too large"
    assert info.value.errno == errno.EFBIG
    with file_size_limit(4096), pytest.raises(OSError, match=rf"^{tmp_path}/history\.csv: file too large$"):
        storage.write_text(str(tmp_path / "history.csv"), "x" * 10_000)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]  # the temporary file is removed


def test_a_full_disk_is_one_line_that_says_what_to_do():
    error = storage.os_error("/out/checkpoint: no space left on device for checkpoint step-000000002", errno.ENOSPC)
    assert common.out_of_space(error, lambda: "/out") == (
        "/out/checkpoint: no space left on device for checkpoint step-000000002: free some space and run the same "
        "command again: it resumes from the last checkpoint (/out)."
    )
    assert common.out_of_space(OSError(errno.ENOSPC, "No space left on device"), lambda: None) == (
        "[Errno 28] No space left on device: free some space and run the same command again."
    )
    predict = storage.os_error("--output p.csv: no space left on device.", errno.ENOSPC)  # a sentence already
    assert (
        common.out_of_space(predict)
        == "--output p.csv: no space left on device: free some space and run the same command again."
    )
    assert common.out_of_space(OSError(errno.ENOENT, "No such file or directory"), None) is None


def test_a_checkpoint_whose_last_files_fail_leaves_no_half_written_folder(tmp_path, monkeypatch):
    model = compiled_model()
    directory = str(tmp_path / "checkpoint")
    checkpoint.save(model, directory, {"step": 1})

    def full(path, *arrays):
        open(path, "wb").close()  # begun, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(OSError, match=rf"^{directory}/step-000000002\.partial/rng\.npz: no space left on device$"):
        checkpoint.save(model, directory, {"step": 2})
    assert sorted(os.listdir(directory)) == ["latest.json", "step-000000001"]


def test_a_tokenizer_save_that_fails_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    from keras_hub.tokenizers import Tokenizer

    tokenizer = char_tokenizer()
    folder = tmp_path / "preset"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")

    def cut_short(self, preset_dir):
        os.makedirs(preset_dir, exist_ok=True)
        with open(os.path.join(preset_dir, "tokenizer.json"), "w") as f:
            f.write("{")  # a rerun read this as a broken config
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(Tokenizer, "save_to_preset", cut_short)
        with pytest.raises(OSError, match=rf"^{folder}: no space left on device$"):
            tokenizer.save_to_preset(str(folder))
    assert sorted(os.listdir(folder)) == ["notes.txt"]

    def cut_an_asset(self, preset_dir):  # named where it would have gone, not in the hidden folder it was written to
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(preset_dir, "assets", "tokenizer", "v"))

    with monkeypatch.context() as patch:
        patch.setattr(Tokenizer, "save_to_preset", cut_an_asset)
        with pytest.raises(OSError, match=rf"^{folder}/assets/tokenizer/v: no space left on device$"):
            tokenizer.save_to_preset(str(folder))
    tokenizer.save_to_preset(str(folder))  # moved in whole
    assert sorted(os.listdir(folder)) == ["assets", "notes.txt", "tokenizer.json"]
    assert kgpt.GPTTokenizer.from_preset(str(folder)).vocabulary_size() == tokenizer.vocabulary_size()
    (folder / "tokenizer.json").write_text('{"my": "own"}')
    with pytest.raises(ValueError, match=r"holds 'tokenizer\.json', which no Keras model save wrote"):
        tokenizer.save_to_preset(str(folder))
    assert (folder / "tokenizer.json").read_text() == '{"my": "own"}'


def test_a_weights_file_that_fails_half_way_is_named_and_h5pys_destructor_noise_is_left_out(tmp_path, monkeypatch):
    # A full disk in the middle of an HDF5 write: h5py raises its page of HDF5 internals, then each of its
    # destructors prints a traceback (through sys.unraisablehook and, from Cython, sys.excepthook).
    variables, printed = compiled_model().weights, []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: printed.append(("unraisable", str(u.exc_value))))
    monkeypatch.setattr(sys, "excepthook", lambda kind, e, trace: printed.append(("except", str(e))))
    hooks = sys.unraisablehook, sys.excepthook

    def destructor_noise(source):
        try:  # raised where `source` names the code, as Cython's tracebacks name h5py's .pyx files
            exec(compile(f"raise RuntimeError('from {source}')", source, "exec"))
        except RuntimeError as e:
            sys.unraisablehook(types.SimpleNamespace(exc_value=e, exc_traceback=e.__traceback__, object=None))
            sys.excepthook(RuntimeError, e, e.__traceback__)

    with pytest.raises(WeightsWriteError) as info:
        with presets.writing_weights(str(tmp_path), variables, "checkpoint step-000000002"):
            destructor_noise("h5py/_objects.pyx")
            destructor_noise("another/library.pyx")
            raise OSError(errno.ENOSPC, "Can't synchronously write data (file write failed: time = ...)")
    assert str(info.value) == f"{tmp_path}: checkpoint step-000000002 could not be written (no space left on device)"
    assert info.value.errno == errno.ENOSPC
    assert printed == [("unraisable", "from another/library.pyx"), ("except", "from another/library.pyx")]
    assert (sys.unraisablehook, sys.excepthook) == hooks
