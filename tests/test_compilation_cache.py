"""The persistent XLA compilation cache of training runs (`kgpt.jobs.run.compilation_cache`)."""

import contextlib
import os

import keras
import pytest
from conftest import TINY, random_inputs

import kgpt
from kgpt.errors import ConfigError
from kgpt.jobs import run
from kgpt.jobs.config import PretrainConfig, recorded_settings


def test_the_folder_comes_from_the_flag_then_kgpt_s_variable_then_jax_s_then_the_user_cache(tmp_path):
    env = {
        "KGPT_COMPILATION_CACHE": str(tmp_path / "k"),
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "j"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
    }
    assert run.compilation_cache_dir(str(tmp_path / "f"), env) == str(tmp_path / "f")
    assert run.compilation_cache_dir(None, env) == str(tmp_path / "k")
    assert os.path.isdir(tmp_path / "k")
    assert run.compilation_cache_dir("none", env) is None
    assert run.compilation_cache_dir(None, {**env, "KGPT_COMPILATION_CACHE": "None"}) is None
    del env["KGPT_COMPILATION_CACHE"]
    assert run.compilation_cache_dir(None, env) == str(tmp_path / "j")
    del env["JAX_COMPILATION_CACHE_DIR"]
    assert run.compilation_cache_dir(None, env) == str(tmp_path / "xdg" / "kgpt" / "xla")


def test_a_cache_that_cannot_be_a_folder_is_one_line_naming_its_origin(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"^--compilation_cache .*file: not a folder\.$"):
        run.compilation_cache_dir(str(tmp_path / "file"), {})
    with pytest.raises(ConfigError, match=r"^\$KGPT_COMPILATION_CACHE .*cannot make the folder"):
        run.compilation_cache_dir(None, {"KGPT_COMPILATION_CACHE": str(tmp_path / "file" / "sub")})
    with pytest.raises(ConfigError, match="is empty"):
        run.compilation_cache_dir(" ", {})


@pytest.mark.skipif(keras.config.backend() != "jax", reason="TensorFlow's steps are not XLA-compiled on a CPU")
def test_a_second_run_loads_its_programs_from_the_cache_and_trains_the_same(tmp_path):
    import jax

    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None
    )
    cache = tmp_path / "xla"
    before = jax.config.jax_compilation_cache_dir
    x = random_inputs(batch=8, length=16)

    def losses(where):
        with run.compilation_cache(where):
            keras.utils.set_random_seed(7)
            lm = kgpt.GPTCausalLM(kgpt.GPTBackbone(**TINY), preprocessor=None)
            lm.compile(optimizer=keras.optimizers.Adam(1e-2))
            return lm.fit(x, x["token_ids"], batch_size=4, epochs=2, shuffle=False, verbose=0).history["loss"]

    without = losses("none")
    assert not hits and not cache.exists()
    first = losses(str(cache))
    written = sorted(os.listdir(cache))
    assert any(name.endswith("-cache") for name in written) and not hits
    second = losses(str(cache))
    assert len(hits) >= sum(name.endswith("-cache") for name in written) > 0  # the train step among them
    assert sorted(os.listdir(cache)) == written  # nothing compiled anew
    assert without == first == second
    assert jax.config.jax_compilation_cache_dir == before  # the run's settings do not outlive it


def test_training_jobs_compile_through_the_run_s_cache(tmp_path, monkeypatch):
    used = []
    monkeypatch.setattr(run, "compilation_cache", lambda value: used.append(value) or contextlib.nullcontext())
    with run.scope(PretrainConfig(compilation_cache=str(tmp_path)), 8):
        pass
    assert used == [str(tmp_path)]
    assert "compilation_cache" not in recorded_settings(PretrainConfig(compilation_cache="none"), ())  # resumable


def test_a_folder_written_without_a_bound_stays_unbounded(tmp_path):
    """JAX's eviction needs each program's access time; a folder plain JAX wrote has none (every write would fail)."""
    assert run._evictable(str(tmp_path))
    (tmp_path / "jit_step-123-cache").write_bytes(b"x")
    assert not run._evictable(str(tmp_path))
    (tmp_path / "jit_step-123-atime").write_bytes(b"t")
    assert run._evictable(str(tmp_path))
