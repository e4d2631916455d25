"""LoRA: what trains, merged and separate saving, checked loading, and `--lora_rank` fine-tuning end to end."""

import json
import os
import subprocess
import sys

import h5py
import keras
import numpy as np
import pytest
from conftest import TINY, to_numpy
from test_task_model import packed, targets
from test_use_trained import make_preset, write_data

import kgpt
from kgpt.errors import CheckpointError
from kgpt.jobs import finetune as finetune_lib
from kgpt.jobs.config import FinetuneConfig
from kgpt.layers import lora
from kgpt.tasks import transforms
from kgpt.train import checkpoint

RANK = 2


def data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    examples = [([rng.integers(1, 60, rng.integers(3, 9)).tolist()], ()) for _ in range(n)]
    x = packed(transforms.Classification(), examples)
    return x, targets(x, rng.integers(0, 2, n))


def task_model(dropout=0.0):
    backbone = kgpt.GPTBackbone(**{**TINY, "dropout": dropout})
    return kgpt.GPTTaskModel(backbone, head=kgpt.tasks.heads.ClassificationHead(["a", "b"]), compile=False)


def compile_and_fit(model, x, y, sample_weight, epochs=2):
    model.compile(optimizer=kgpt.gpt_adamw(1e-2, warmup_steps=1, total_steps=8, decay="linear"))
    model.fit(x, y, sample_weight=sample_weight, batch_size=16, epochs=epochs, shuffle=False, verbose=0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A task model trained a few steps with LoRA, beside its starting weights: `(model, before, x)`."""
    keras.utils.set_random_seed(7)
    model = task_model()
    x, (y, sample_weight) = data()
    model.backbone.enable_lora(RANK)
    before = {v.path: to_numpy(v) for v in model.weights}
    compile_and_fit(model, x, y, sample_weight)
    return model, before, x


def test_enable_lora_trains_only_the_factors_and_the_head(trained):
    model, before, _ = trained
    trainable = {v.path for v in model.trainable_weights}
    expected = {
        f"transformer_layer_{i}/{layer}/{name}"
        for i in range(TINY["num_layers"])
        for layer in ("query", "value")
        for name in ("lora_kernel_a", "lora_kernel_b")
    }
    assert {p for p in trainable if p.startswith("transformer_layer")} == expected
    assert {p for p in trainable if not p.startswith("transformer_layer")} == {"classifier/kernel", "classifier/bias"}
    for variable in model.weights:
        changed = not np.array_equal(before[variable.path], to_numpy(variable))
        assert changed == (variable.path in trainable), variable.path  # frozen stay put, trainable all move
    assert lora.count_trainable(model) == sum(int(np.prod(v.shape)) for v in model.trainable_weights)


def test_the_merged_preset_predicts_like_the_adapted_model_and_loads_as_a_plain_one(trained, tmp_path):
    model, _, x = trained
    model.save_to_preset(str(tmp_path / "merged"))
    loaded = kgpt.GPTTaskModel.from_preset(str(tmp_path / "merged"))
    assert not lora.lora_layers(loaded) and len(loaded.weights) == len(lora.file_variables(model))
    np.testing.assert_allclose(loaded.predict(x), model.predict(x), rtol=1e-5, atol=1e-5)


def test_separate_lora_weights_round_trip_onto_the_base_backbone(trained, tmp_path):
    model, before, x = trained
    path = str(tmp_path / "adapter.lora.h5")
    model.backbone.save_lora_weights(path)
    base = kgpt.GPTBackbone(**{**TINY, "dropout": 0.0})
    for variable in base.weights:
        variable.assign(before[variable.path])
    base.load_lora_weights(path)  # enables LoRA at the file's rank
    assert base._lora_rank == RANK
    inputs = {"token_ids": x["token_ids"][:, 0], "padding_mask": x["padding_mask"][:, 0]}
    np.testing.assert_allclose(to_numpy(base(inputs)), to_numpy(model.backbone(inputs)), rtol=1e-5, atol=1e-5)


def test_a_bad_lora_file_is_a_checkpoint_error_naming_it(trained, tmp_path):
    model, _, _ = trained
    good = str(tmp_path / "good.lora.h5")
    model.backbone.save_lora_weights(good)
    fresh = kgpt.GPTBackbone(**TINY)
    with pytest.raises(CheckpointError, match=r"Missing .*none.lora.h5"):
        fresh.load_lora_weights(str(tmp_path / "none.lora.h5"))
    corrupt = tmp_path / "corrupt.lora.h5"
    corrupt.write_bytes(b"not hdf5")
    with pytest.raises(CheckpointError, match=r"corrupt.lora.h5 is not a readable LoRA file"):
        fresh.load_lora_weights(str(corrupt))
    wider = kgpt.GPTBackbone(**{**TINY, "hidden_dim": 32})
    with pytest.raises(CheckpointError, match=r"good.lora.h5 does not fit this backbone"):
        wider.load_lora_weights(good)
    assert not lora.lora_layers(wider)  # nothing was changed
    other_rank = kgpt.GPTBackbone(**TINY)
    other_rank.enable_lora(RANK + 1)
    with pytest.raises(CheckpointError, match=rf"rank-{RANK} factors, but LoRA is enabled here at rank {RANK + 1}"):
        other_rank.load_lora_weights(good)
    tampered = tmp_path / "tampered.lora.h5"
    tampered.write_bytes(open(good, "rb").read())
    with h5py.File(tampered, "r+") as f:
        group = next(name for name in f["lora"] if name != "vars")
        del f[f"lora/{group}/vars/lora_kernel_b"]
    with pytest.raises(CheckpointError, match=rf"tampered.lora.h5: lora/{group} lacks"):
        kgpt.GPTBackbone(**TINY).load_lora_weights(str(tampered))
    zero = tmp_path / "zero.lora.h5"
    zero.write_bytes(open(good, "rb").read())
    with h5py.File(zero, "r+") as f:
        key = "lora/rank" if "rank" in f["lora"] else "lora/vars/rank"
        del f[key]
        f[key] = 0
    with pytest.raises(CheckpointError, match=r"zero.lora.h5: its LoRA rank must be an integer >= 1, got 0\."):
        kgpt.GPTBackbone(**TINY).load_lora_weights(str(zero))


@pytest.mark.parametrize("kind", ["task", "lm"])
def test_quantizing_a_lora_model_merges_first_so_its_preset_predicts_what_it_does(kind, tmp_path):
    """Keras quantized the base kernels and kept adding the float factors, while its saved file held the merged
    kernels quantized again: the reloaded model differed by about one int8 step (1e-3)."""
    keras.utils.set_random_seed(3)
    model = task_model() if kind == "task" else kgpt.GPTCausalLM(kgpt.GPTBackbone(**TINY))
    x = data(8)[0] if kind == "task" else {k: v[:, 0] for k, v in data(8)[0].items()}
    model.backbone.enable_lora(RANK)
    rng = np.random.default_rng(0)
    for layer in lora.lora_layers(model):  # a trained adapter: an update as large as the kernels' own steps
        layer.lora_kernel_b.assign(rng.normal(0, 0.3, layer.lora_kernel_b.shape).astype("float32"))
    adapted = model.predict(x, verbose=0)
    model.save_to_preset(str(tmp_path / "float"))
    model.quantize("int8")
    assert not lora.lora_layers(model)  # merged: the model is the plain int8 one its preset will hold
    live = model.predict(x, verbose=0)
    assert 0 < np.abs(live - adapted).max() < 0.1 * np.abs(adapted).max()
    model.save_to_preset(str(tmp_path / "int8"))
    cls = type(model)
    np.testing.assert_allclose(cls.from_preset(str(tmp_path / "int8")).predict(x, verbose=0), live, rtol=0, atol=1e-6)
    # And the same as quantizing its merged float preset (what kgpt-predict --quantize int8 does).
    merged = cls.from_preset(str(tmp_path / "float"))
    merged.quantize("int8")
    np.testing.assert_allclose(merged.predict(x, verbose=0), live, rtol=0, atol=1e-6)


def test_a_rank_of_the_width_is_warned_of_and_a_higher_one_refused(caplog):
    width = TINY["hidden_dim"]
    with caplog.at_level("WARNING", logger="kgpt"):
        kgpt.GPTBackbone(**TINY).enable_lora(width - 1)
        assert caplog.records == []
        kgpt.GPTBackbone(**TINY).enable_lora(width)
    assert [r.getMessage() for r in caplog.records] == [
        f"Warning: LoRA rank {width} is the model's width: each update A B has full rank and more weights than the "
        f"kernel it adapts (ranks of 4 to 64 are usual)."
    ]
    for rank in (width + 1, 10**9):  # 10**9 tried to allocate its factors, and failed inside the backend
        backbone = kgpt.GPTBackbone(**TINY)
        with pytest.raises(ValueError, match=rf"^rank {rank} is more than the model's width \({width}\): .* give at"):
            backbone.enable_lora(rank)
        assert not kgpt.layers.lora.lora_layers(backbone)


def test_enable_lora_refuses_bad_ranks_targets_and_a_second_call():
    backbone = kgpt.GPTBackbone(**TINY)
    for rank in (0, -1):
        with pytest.raises(ValueError, match=f"rank must be an integer >= 1, got {rank}"):
            backbone.enable_lora(rank)
    for rank in (1.5, True, "8"):
        with pytest.raises(TypeError, match=f"rank must be an integer, got {rank!r}"):
            backbone.enable_lora(rank)
    with pytest.raises(ValueError, match=r"\['querry'\] name no layer LoRA can adapt"):
        backbone.enable_lora(2, target_layer_names=["querry"])
    with pytest.raises(ValueError, match="not enabled"):
        backbone.save_lora_weights("x.lora.h5")
    backbone.enable_lora(2, target_layer_names=["query", "feedforward_output_dense"])
    assert len(lora.lora_layers(backbone)) == 2 * TINY["num_layers"]
    with pytest.raises(ValueError, match="already enabled"):
        backbone.enable_lora(2)
    with pytest.raises(ValueError, match=r"must end in \.lora\.h5"):
        backbone.save_lora_weights("x.h5")


def test_a_checkpoint_of_a_lora_model_resumes_exactly(tmp_path):
    """Keras merges the factors into the kernels when saving and zeroes them when loading; checkpoints must not."""
    x, (y, sample_weight) = data()

    def make():
        keras.utils.set_random_seed(3)
        model = task_model()
        model.backbone.enable_lora(RANK)
        model.compile(optimizer=kgpt.gpt_adamw(1e-2, warmup_steps=1, total_steps=8, decay="linear"))
        return model

    reference = make()
    reference.fit(x, y, sample_weight=sample_weight, batch_size=16, epochs=1, shuffle=False, verbose=0)
    checkpoint.save(reference, str(tmp_path / "ck"), {"step": 2, "settings": {}})
    assert os.path.exists(tmp_path / "ck" / "step-000000002" / lora.FACTORS_FILE)
    resumed = make()
    assert checkpoint.restore(resumed, str(tmp_path / "ck"), {})["step"] == 2
    for a, b in zip(reference.weights + reference.optimizer.variables, resumed.weights + resumed.optimizer.variables):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=a.path)
    for model in (reference, resumed):
        model.fit(x, y, sample_weight=sample_weight, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(reference.weights, resumed.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=a.path)
    # The factors file missing: named, not a silent restart of the factors from zero.
    os.remove(tmp_path / "ck" / "step-000000002" / lora.FACTORS_FILE)
    with pytest.raises(CheckpointError, match=lora.FACTORS_FILE):
        checkpoint.restore(make(), str(tmp_path / "ck"), {})


def test_lora_rank_fine_tunes_end_to_end_saves_merged_and_resumes(tmp_path, capsys, progress):
    preset, data_dir = make_preset(tmp_path / "preset"), write_data(tmp_path / "data")
    fields = dict(
        task="scitail",
        data_dir=data_dir,
        init=preset,
        output_dir=str(tmp_path / "out"),
        epochs=1,
        batch_size=8,
        learning_rate=1e-2,
        max_length=64,
        seed=3,
        lora_rank=RANK,
    )
    model, results = finetune_lib.finetune(FinetuneConfig(**fields))
    log = capsys.readouterr().out
    assert f"LoRA rank {RANK} on the query and value projections: {lora.count_trainable(model):,} of" in log
    base = kgpt.GPTBackbone.from_preset(preset)
    saved = kgpt.GPTTaskModel.from_preset(str(tmp_path / "out"))
    assert not lora.lora_layers(saved)
    changed = {
        a.path for a, b in zip(saved.backbone.weights, base.weights) if not np.array_equal(to_numpy(a), to_numpy(b))
    }
    # The factors merged into the query and value kernels of every block; everything else (the embedding and the
    # biases included) is the pre-trained model's.
    assert changed == {
        f"transformer_layer_{i}/{name}/kernel" for i in range(TINY["num_layers"]) for name in ("query", "value")
    }
    assert json.loads((tmp_path / "out" / "run.json").read_text())["settings"]["lora_rank"] == RANK
    # The same command again restores the LoRA run's last checkpoint and scores the same model.
    predictions = (tmp_path / "out" / "predictions" / "dev.tsv").read_bytes()
    _, again = finetune_lib.finetune(FinetuneConfig(**fields))
    assert "is at the last step" in capsys.readouterr().out
    assert (tmp_path / "out" / "predictions" / "dev.tsv").read_bytes() == predictions
    assert again["splits"]["dev"]["accuracy"] == results["splits"]["dev"]["accuracy"]


def test_a_bad_lora_rank_is_a_config_error(tmp_path):
    with pytest.raises(kgpt.ConfigError, match=r"^lora_rank must be an integer >= 1, got 0\.$"):
        finetune_lib.check_config(FinetuneConfig(lora_rank=0))


def test_cli_refuses_a_bad_lora_rank_by_flag_name(command):
    from kgpt.cli import train

    result = command(train, "--task=scitail", "--lora_rank=0")
    assert result.returncode != 0 and "--lora_rank" in result.stderr and "Traceback" not in result.stderr
    result = command(train, "--task=lm", "--lora_rank=4")
    assert result.returncode != 0 and "--lora_rank only applies to fine-tuning" in result.stderr


def test_a_lora_rank_above_the_inits_width_is_refused_by_the_dry_run_and_the_run(tmp_path, command):
    from kgpt.cli import train

    preset, data_dir = make_preset(tmp_path / "preset"), write_data(tmp_path / "data")
    flags = ["--task=scitail", f"--data_dir={data_dir}", f"--init={preset}", f"--output_dir={tmp_path / 'out'}"]
    width = TINY["hidden_dim"]
    for extra in (["--dry_run"], []):
        result = command(train, *flags, "--lora_rank=1000000000", *extra)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert f"error: --lora_rank 1000000000 is more than the model's width ({width}): " in result.stderr
    assert not os.path.exists(tmp_path / "out" / "model.weights.h5")


GUIDE = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "lora-int8.md")
PARSE = """
import json, sys
from absl import flags
import importlib.util
if sys.argv[1].endswith(".py"):  # a script: its flags are defined when it is loaded
    spec = importlib.util.spec_from_file_location("script", sys.argv[1])
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
else:
    importlib.import_module(sys.argv[1])
for line in json.loads(sys.argv[2]):
    values = flags.FLAGS(["prog", *line], known_only=False)
    print(json.dumps({name: flags.FLAGS[name].value for name in ("lora_rank", "quantize") if name in flags.FLAGS}))
    flags.FLAGS.unparse_flags()
"""


BENCHMARK = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "lora_int8.py")


@pytest.mark.parametrize(
    "program, module",
    [("kgpt-train", "kgpt.cli.train"), ("kgpt-predict", "kgpt.cli.predict"), ("benchmarks/lora_int8.py", BENCHMARK)],
)
def test_the_guide_commands_parse_with_the_cli_flags(program, module):
    import re
    import shlex

    text = open(GUIDE, encoding="utf-8").read()
    lines = [
        shlex.split(line.split(program, 1)[1])
        for block in re.findall(r"```bash\n(.*?)```", text, re.S)
        for line in block.splitlines()
        if program in line and not line.lstrip().startswith("#")
    ]
    assert lines
    result = subprocess.run(
        [sys.executable, "-c", PARSE, module, json.dumps(lines)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    parsed = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert len(parsed) == len(lines)
    if program.startswith("kgpt"):
        assert any(p.get("lora_rank") == 8 or p.get("quantize") == "int8" for p in parsed)
