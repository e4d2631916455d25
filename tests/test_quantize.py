"""int8: quantized causal LMs and task models round trip through presets; `kgpt-predict --quantize int8`."""

import gc
import os
import warnings

import numpy as np
import pytest
from conftest import TINY, commands_in_one_process, random_inputs, to_numpy
from test_use_trained import make_preset, write_data

import kgpt
from kgpt.errors import CheckpointError
from kgpt.io import presets
from kgpt.jobs import finetune as finetune_lib
from kgpt.jobs.config import FinetuneConfig
from kgpt.layers import int8


def int8_arrays(model):
    return [v.path for v in model.weights if v.dtype == "int8"]


def test_a_quantized_causal_lm_saves_and_loads_with_the_same_outputs(tmp_path):
    lm = kgpt.GPTCausalLM(kgpt.GPTBackbone(**TINY))
    x = random_inputs()
    before = to_numpy(lm(x))
    assert int8.quantize(lm) is lm and int8.is_quantized(lm)
    quantized = to_numpy(lm(x))
    # Every attention and MLP kernel is int8; the embeddings (and the tied LM head) stay float32.
    assert len(int8_arrays(lm)) == 6 * TINY["num_layers"]
    assert not [p for p in int8_arrays(lm) if "embedding" in p]
    assert 0 < np.abs(quantized - before).max() < 0.05 * np.abs(before).max()
    lm.save_to_preset(str(tmp_path / "lm"))
    loaded = kgpt.GPTCausalLM.from_preset(str(tmp_path / "lm"))
    assert int8_arrays(loaded) == int8_arrays(lm)
    np.testing.assert_array_equal(to_numpy(loaded(x)), quantized)
    assert int8.quantize(loaded) is loaded  # already int8: unchanged, not quantized twice
    np.testing.assert_array_equal(to_numpy(loaded(x)), quantized)
    with pytest.raises(ValueError, match="Only 'int8'"):
        int8.quantize(loaded, "int4")


def test_quantizing_collects_garbage_once_not_once_per_layer(monkeypatch):
    # Keras runs gc.collect() for each kernel it replaces: seconds per layer in a process holding many objects.
    calls, collect = [], gc.collect
    monkeypatch.setattr(gc, "collect", lambda *args: calls.append(args) or collect(*args))
    int8.quantize(kgpt.GPTCausalLM(kgpt.GPTBackbone(**TINY)))
    assert len(calls) == 1
    model = kgpt.GPTTaskModel(kgpt.GPTBackbone(**TINY), num_classes=2)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        model.quantize("int8")
    # Keras warned once for each norm and embedding layer, which stay float by design.
    assert not [w for w in warned if "quantize` method" in str(w.message)]
    assert len(calls) == 2 and "classifier/kernel" in int8_arrays(model)
    with pytest.raises(ValueError, match="Only 'int8'"), presets.one_garbage_collection():
        int8.quantize(model, "int4")
    assert len(calls) == 3  # collected once on the way out of an error too
    gc.collect()
    assert len(calls) == 4  # and gc.collect is the one it replaced again, not the no-op


def test_quantizing_twice_is_refused_in_one_line():
    """Keras' own error was "Layer 'feedforward_output_dense' is already quantized with dtype_policy=..."."""
    for model in (
        kgpt.GPTCausalLM(kgpt.GPTBackbone(**TINY)),
        kgpt.GPTTaskModel(kgpt.GPTBackbone(**TINY), num_classes=2),
    ):
        x = random_inputs()
        if isinstance(model, kgpt.GPTTaskModel):
            x = {k: v[:, None] for k, v in x.items()}
        model.quantize("int8")
        before = model.predict(x, verbose=0)
        with pytest.raises(
            ValueError,
            match=rf"^This {type(model).__name__} is already quantized \(int8, \d+ layers "
            rf"such as '\w+'\): quantize\(\) runs once; load the float model again",
        ):
            model.quantize("int8")
        np.testing.assert_array_equal(model.predict(x, verbose=0), before)  # left as it was
        assert int8.quantize(model) is model  # kgpt-predict's helper: an int8 model is left unchanged


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    """A tiny fine-tuned SciTail preset: `(preset, data_dir)`."""
    root = tmp_path_factory.mktemp("quantize")
    preset, data = make_preset(root / "preset"), write_data(root / "data")
    config = FinetuneConfig(
        task="scitail",
        data_dir=data,
        init=preset,
        output_dir=str(root / "out"),
        epochs=1,
        batch_size=8,
        learning_rate=1e-3,
        max_length=64,
        seed=1,
    )
    finetune_lib.finetune(config)
    return str(root / "out"), data


def test_a_quantized_task_model_saves_and_loads_with_the_same_predictions(finetuned, tmp_path):
    preset, _ = finetuned
    model = kgpt.GPTTaskModel.from_preset(preset)
    texts = [("a cell has a nucleus.", "a cell has a nucleus."), ("water is wet.", "iron is a metal.")]
    probabilities = lambda m: m.head.probabilities(m.predict(texts))  # noqa: E731
    before = probabilities(model)
    model.quantize("int8")  # Keras' own call: the cached prediction model (TensorFlow) must not stay float32
    assert "classifier/kernel" in int8_arrays(model)
    after = probabilities(model)
    np.testing.assert_allclose(after, before, atol=0.05)
    assert not np.array_equal(after, before)
    model.save_to_preset(str(tmp_path / "int8"))
    loaded = kgpt.GPTTaskModel.from_preset(str(tmp_path / "int8"))  # the head is quantized again from its file
    assert int8_arrays(loaded) == int8_arrays(model)
    np.testing.assert_array_equal(probabilities(loaded), after)
    # A quantized head file under a float model's task.json that does not match: named, not half-loaded.
    (tmp_path / "int8" / "task.weights.h5").write_bytes(b"truncated")
    with pytest.raises(CheckpointError, match="task.weights.h5"):
        kgpt.GPTTaskModel.from_preset(str(tmp_path / "int8"))


def test_kgpt_predict_quantize_int8(finetuned, tmp_path):
    preset, data = finetuned
    plain, quantized = os.path.join(preset, "predictions", "dev.tsv"), tmp_path / "int8.tsv"  # float: the run's
    result, int4 = commands_in_one_process(
        "kgpt.cli.predict",
        [
            [f"--model={preset}", f"--data_dir={data}", "--split=dev", f"--output={quantized}", "--quantize=int8"],
            [f"--model={preset}", f"--data_dir={data}", f"--output={tmp_path / 'x.tsv'}", "--quantize=int4"],
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split("\t") for line in open(plain, encoding="utf-8").read().splitlines()]
    rows_int8 = [line.split("\t") for line in quantized.read_text().splitlines()]
    assert len(rows) == len(rows_int8) == 9 and rows[0] == rows_int8[0]
    p, q = (np.array([r[2:4] for r in table[1:]], float) for table in (rows, rows_int8))
    np.testing.assert_allclose(q, p, atol=0.05)
    assert np.abs(q - p).max() > 0  # the int8 kernels were used
    assert int4.returncode != 0 and "--quantize" in int4.stderr and "Traceback" not in int4.stderr
