"""The jobs' configs and the command line built from them; `import kgpt` and `--help` without Keras."""

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import TINY, char_tokenizer

from kgpt.jobs import config as config_lib

HEAVY = ("keras", "tensorflow", "jax", "keras_hub")


def python(code, cwd=None):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


def test_every_config_field_has_a_flag_and_every_flag_a_field():
    from absl import flags

    from kgpt.cli import train

    fields = {f.name for cls in (config_lib.PretrainConfig, config_lib.FinetuneConfig) for f in dataclasses.fields(cls)}
    defined = {f.name for f in flags.FLAGS.get_flags_for_module(train.__name__)}
    assert fields <= defined, f"fields without a flag: {fields - defined}"
    assert defined - fields <= set(train.CLI_ONLY), f"flags without a field: {defined - fields - set(train.CLI_ONLY)}"
    for cls in (config_lib.PretrainConfig, config_lib.FinetuneConfig):
        for field in dataclasses.fields(cls):
            assert field.metadata.get("help"), f"{cls.__name__}.{field.name} has no help"
    # Flags once forgotten (the config had the field, the command line did not):
    assert {"pretrained_weights", "sample_tokens"} <= defined
    grouped = {name for names in train.GROUPS.values() for name in names}
    assert defined - {"verbose"} <= grouped


def test_flags_fill_the_configs_and_demo_settings_are_explicit(capsys, progress):
    from absl import flags

    from kgpt.cli import train

    flags.FLAGS(["kgpt-train", "--task=scitail", "--nopretrained_weights", "--epochs=2"])
    try:
        config = train.finetune_config_from_flags()
    finally:
        flags.FLAGS.unparse_flags()
    assert config.task == "scitail" and config.init == "demo" and not config.pretrained_weights
    assert config.epochs == 2 and config.learning_rate == config_lib.DEMO_FINETUNE["learning_rate"]
    assert "No --init: --init demo" in capsys.readouterr().out
    flags.FLAGS(["kgpt-train", "--task=lm", "--zero_shot=sst2,cola=glue/CoLA", "--sample_tokens=7"])
    try:
        config = train.pretrain_config_from_flags()
    finally:
        flags.FLAGS.unparse_flags()
    assert config.zero_shot == {"sst2": None, "cola": "glue/CoLA"} and config.sample_tokens == 7
    assert config.max_steps == config_lib.DEMO_PRETRAIN["max_steps"]  # no --corpus: the demo
    assert config.learning_rate == config_lib.DEMO_PRETRAIN["learning_rate"]


def test_a_recipe_fills_the_flags_not_given(capsys, progress):
    from absl import app, flags

    from kgpt.cli import train

    recipe = config_lib.RECIPES["cpu-small"]
    flags.FLAGS(["kgpt-train", "--task=lm", "--recipe=cpu-small", "--corpus=books", "--max_steps=7"])
    try:
        config = train.pretrain_config_from_flags()
    finally:
        flags.FLAGS.unparse_flags()
    assert config.max_steps == 7 and config.corpus == "books"  # given: kept
    assert {k: getattr(config, k) for k in recipe["lm"] if k != "max_steps"} == {
        k: v for k, v in recipe["lm"].items() if k != "max_steps"
    }
    printed = capsys.readouterr().out
    assert "--recipe cpu-small: its settings" in printed and "max_steps" not in printed
    flags.FLAGS(["kgpt-train", "--task=lm", "--recipe=cpu-small"])
    try:
        with pytest.raises(app.UsageError, match="--recipe cpu-small pre-trains on your text: give --corpus"):
            train.pretrain_config_from_flags()
    finally:
        flags.FLAGS.unparse_flags()
    # Fine-tuning: the recipe's fine-tuning settings, over the demo's where --init demo.
    for init in ("--init=lm_dir", "--init=demo"):
        flags.FLAGS(["kgpt-train", "--task=cola", "--recipe=cpu-small", init, "--epochs=1"])
        try:
            config = train.finetune_config_from_flags()
        finally:
            flags.FLAGS.unparse_flags()
        assert config.epochs == 1 and config.learning_rate == recipe["finetune"]["learning_rate"]
        assert config.batch_size == recipe["finetune"]["batch_size"]


@pytest.mark.parametrize(
    "argv, expected",
    [
        # A recipe's 4 transformer blocks are not 4 LSTM layers: its own LSTM sizes replace them.
        (["--recipe=cpu-small", "--corpus=books"], config_lib.RECIPES["cpu-small"]["lstm"]),
        ([], {k: v for k, v in config_lib.DEMO_LSTM.items() if k != "architecture"}),  # the demo's, not its 2 blocks
        (["--corpus=books"], config_lib.PAPER_LSTM),  # not the transformer's 12
        (
            ["--recipe=cpu-small", "--corpus=books", "--num_layers=2", "--lstm_units=64"],
            {"num_layers": 2, "lstm_units": 64},
        ),  # given: kept
    ],
)
def test_an_lstm_gets_lstm_sizes_not_the_transformers(capsys, progress, argv, expected):
    from absl import flags

    from kgpt.cli import train

    flags.FLAGS(["kgpt-train", "--task=lm", "--architecture=lstm", *argv])
    try:
        config = train.pretrain_config_from_flags()
        overrides = train.lstm_settings()  # what kgpt-analyze zero-shot-curve gives its LSTM run
    finally:
        flags.FLAGS.unparse_flags()
    assert (config.architecture, config.num_layers, config.lstm_units) == (
        "lstm",
        expected["num_layers"],
        expected["lstm_units"],
    )
    assert overrides == {k: v for k, v in expected.items() if f"--{k}={v}" not in argv}
    assert ("The LSTM:" in capsys.readouterr().out) == bool(overrides)


def test_runs_record_what_decides_their_outputs_not_where_they_go():
    from kgpt.jobs import finetune, pretrain

    assert pretrain.run_settings(config_lib.PretrainConfig())["initializer_range"] == 0.02
    assert pretrain.run_settings(config_lib.PretrainConfig(initializer_range=0.06))["initializer_range"] == 0.06
    assert finetune.run_settings(config_lib.FinetuneConfig())["gradient_accumulation_steps"] == 1
    assert "output_dir" not in finetune.run_settings(config_lib.FinetuneConfig(output_dir="x"))
    assert "num_processes" not in pretrain.run_settings(config_lib.PretrainConfig(num_processes=2))


@pytest.mark.parametrize("cls", [config_lib.PretrainConfig, config_lib.FinetuneConfig])
def test_configs_are_frozen(cls):
    config = cls(output_dir="out")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.output_dir = "elsewhere"
    assert dataclasses.replace(config, output_dir="elsewhere").output_dir == "elsewhere"
    assert config.output_dir == "out"


def test_jobs_share_their_common_fields_once():
    pre, fine = config_lib.PretrainConfig(), config_lib.FinetuneConfig()
    shared = {f.name for f in dataclasses.fields(config_lib.RunConfig)} | {
        f.name for f in dataclasses.fields(config_lib.ModelConfig)
    }
    assert shared <= {f.name for f in dataclasses.fields(pre)} & {f.name for f in dataclasses.fields(fine)}
    assert (pre.batch_size, pre.learning_rate, pre.checkpoint_every) == (64, 2.5e-4, 500)  # paper, section 4.1
    assert (fine.batch_size, fine.learning_rate, fine.checkpoint_every) == (None, 6.25e-5, 0)
    own = [set(config_lib.own_fields(cls)) for cls in (config_lib.PretrainConfig, config_lib.FinetuneConfig)]
    assert not own[0] & own[1]


def test_kgpt_analyze_reads_its_flags_once_and_sets_none(tmp_path):
    """zero-shot-curve scores its --tasks: its config takes them, and the --zero_shot flag stays unset (given, it is
    refused: tests/test_analysis.py)."""
    from absl import flags

    from kgpt.cli import analyze

    flags.FLAGS(["kgpt-analyze", "--tasks=sst2", "--dry_run", f"--output_dir={tmp_path / 'out'}"])
    try:
        before = flags.FLAGS.flag_values_dict()
        config = analyze._config("zero-shot-curve", {"sst2": None})
        analyze.main(["kgpt-analyze", "zero-shot-curve"])
        after = flags.FLAGS.flag_values_dict()
    finally:
        flags.FLAGS.unparse_flags()
    assert config.zero_shot == {"sst2": None}
    assert after == before and after["zero_shot"] is None
    assert not (tmp_path / "out").exists()  # a dry run


def test_no_module_of_kgpt_sets_a_flag():
    """The commands read their flags into the job's config and never set one: a flag set outlives the command."""
    import ast
    import pathlib

    root = pathlib.Path(config_lib.__file__).parents[1]
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                else []
            )
            found += [
                f"{path.relative_to(root.parent)}:{node.lineno}"
                for target in targets
                if isinstance(target, (ast.Attribute, ast.Subscript)) and "FLAGS" in ast.unparse(target)
            ]
    assert not found, f"flags set after parsing: {found}"


def test_finetune_without_init_is_an_error_naming_the_choices():
    from kgpt.errors import ConfigError
    from kgpt.jobs import finetune

    with pytest.raises(ConfigError, match="init is required: .*'scratch'.*'demo'"):
        finetune.finetune(config_lib.FinetuneConfig(init=None))


@pytest.mark.parametrize("command", ["train", "predict", "analyze"])
def test_help_imports_no_keras(command):
    result = python(f"""
        import runpy, sys
        sys.argv = ["kgpt-{command}", "--help"]
        try:
            runpy.run_module("kgpt.cli.{command}", run_name="__main__")
        except SystemExit as e:
            assert e.code == 0, e.code
        print("HEAVY", sorted(m for m in {HEAVY!r} if m in sys.modules))
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--output" in result.stdout and "HEAVY []" in result.stdout


def test_analyze_rows_are_table5s():
    from kgpt.cli import analyze
    from kgpt.jobs import experiments

    assert analyze.TABLE5_ROWS == tuple(experiments.TABLE5)


def test_import_kgpt_is_lazy_and_registers_every_class_on_first_use(tmp_path):
    import keras

    import kgpt

    tokenizer = char_tokenizer()
    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size()})
    lm = kgpt.GPTCausalLM(backbone, preprocessor=kgpt.GPTCausalLMPreprocessor(tokenizer, sequence_length=16))
    lm.save_to_preset(str(tmp_path / "preset"))
    task_model = kgpt.GPTTaskModel(backbone, head=kgpt.tasks.heads.ClassificationHead(["a", "b", "c"]), compile=False)
    task_model.save(str(tmp_path / "model.keras"))
    assert isinstance(keras.saving.load_model(str(tmp_path / "model.keras")), kgpt.GPTTaskModel)
    # A fresh process: `import kgpt` loads no Keras; the first name used registers every kgpt class.
    result = python(f"""
        import sys
        import kgpt
        assert not [m for m in {HEAVY!r} if m in sys.modules], "import kgpt started Keras"
        assert set(kgpt.__all__) <= set(dir(kgpt))
        kgpt.GPTTokenizer
        assert all(getattr(kgpt, name) is not None for name in kgpt.__all__)
        import keras, keras_hub
        model = keras.saving.load_model({str(tmp_path / "model.keras")!r})  # its head class was never named
        print(type(model).__name__, type(model.head).__name__)
        print(type(keras_hub.models.CausalLM.from_preset({str(tmp_path / "preset")!r})).__name__)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["GPTTaskModel", "ClassificationHead", "GPTCausalLM"]
    # A program that imported Keras first: `import kgpt` registers the classes at once.
    result = python(f"""
        import keras, keras_hub
        import kgpt
        print(type(keras_hub.models.Backbone.from_preset({str(tmp_path / "preset")!r})).__name__)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["GPTBackbone"]


@pytest.mark.parametrize(
    "job, field, value, message",
    [
        ("pretrain", "batch_size", 0, "batch_size must be an integer >= 1, got 0."),
        ("pretrain", "num_merges", -1, "num_merges must be an integer >= 0, got -1."),
        ("pretrain", "max_steps", 2.5, "max_steps must be an integer, got 2.5 (float)."),
        ("pretrain", "gradient_accumulation_steps", True, "gradient_accumulation_steps must be an integer, got True"),
        ("finetune", "max_length", 0, "max_length must be an integer >= 4, got 0."),
        ("finetune", "max_length", 2.0, "max_length must be an integer, got 2.0 (float)."),
        ("finetune", "epochs", -1, "epochs must be an integer >= 0, got -1."),
        ("finetune", "startup_timeout", 0, "startup_timeout must be an integer >= 1, got 0."),
        ("pretrain", "learning_rate", float("nan"), "learning_rate must be a finite number >= 0, got nan."),
        ("pretrain", "dropout", 1.0, "dropout must be a number in [0, 1), got 1.0."),
        ("pretrain", "validation_fraction", "0.1", "validation_fraction must be a number in [0, 1), got '0.1'."),
        ("finetune", "lm_coef", -0.5, "lm_coef must be a finite number >= 0, got -0.5."),
        ("finetune", "classifier_dropout", 1.5, "classifier_dropout must be a number in [0, 1), got 1.5."),
        ("finetune", "keep", "first", "keep must be one of 'last', 'best', got 'first'."),
        # These were tracebacks from Keras or the optimizer once the run had started.
        ("pretrain", "seed", -1, "seed must be an integer between 0 and 4294967295, got -1."),
        ("finetune", "seed", 2**40, f"seed must be an integer between 0 and 4294967295, got {2**40}."),
        ("finetune", "warmup_fraction", 2.0, "warmup_fraction must be a number in [0, 1], got 2.0."),
        ("pretrain", "initializer_range", 0.0, "initializer_range must be a finite number > 0, got 0.0."),
        ("finetune", "initializer_range", -1.0, "initializer_range must be a finite number > 0, got -1.0."),
        ("pretrain", "attention_dropout", 1.5, "attention_dropout must be a number in [0, 1), got 1.5."),
        # These scored no example (a mean of nothing, nan) or all but the last (a slice to -1).
        ("pretrain", "zero_shot_examples", 0, "zero_shot_examples must be an integer >= 1, got 0."),
        ("pretrain", "zero_shot_examples", -1, "zero_shot_examples must be an integer >= 1, got -1."),
        ("pretrain", "zero_shot_every", 0, "zero_shot_every must be an integer >= 1, got 0."),
        # A traceback from Keras when the model was built, after --dry_run had found no problem.
        ("pretrain", "lstm_units", 0, "lstm_units must be an integer >= 1, got 0."),
    ],
)
def test_a_setting_that_is_no_count_is_a_config_error_naming_it(job, field, value, message):
    from kgpt.errors import ConfigError
    from kgpt.jobs import finetune, pretrain

    lib, cls = (pretrain, config_lib.PretrainConfig) if job == "pretrain" else (finetune, config_lib.FinetuneConfig)
    with pytest.raises(ConfigError) as raised:
        lib.check_config(cls(**{field: value}))
    assert str(raised.value).startswith(message)


# Checked where the run uses them, with the same bound: placement.resolve and distribute.check_placement.
PLACEMENT_CHECKED = ("num_processes", "process_id", "model_parallel")


@pytest.mark.parametrize("job", ["pretrain", "finetune"])
def test_a_count_below_its_flags_lower_bound_is_refused_by_the_job_with_that_bound(job):
    from kgpt.errors import ConfigError
    from kgpt.jobs import finetune, pretrain

    lib, cls = (pretrain, config_lib.PretrainConfig) if job == "pretrain" else (finetune, config_lib.FinetuneConfig)
    bounded = {
        f.name: f.metadata["flag"]["lower_bound"]
        for f in dataclasses.fields(cls)
        if "lower_bound" in f.metadata["flag"] and f.name not in PLACEMENT_CHECKED
    }
    assert {"batch_size", "checkpoint_every", "gradient_accumulation_steps"} <= set(bounded)
    for name, bound in bounded.items():
        with pytest.raises(ConfigError, match=rf"^{name} must be an integer >= {bound}, got {bound - 1}\.$"):
            lib.check_config(cls(**{name: bound - 1}))


def test_a_bound_is_written_once_as_the_fields_lower_bound():
    with pytest.raises(TypeError, match="batch_size has a lower_bound in its field"):
        config_lib.check_integers(config_lib.PretrainConfig(), batch_size=1)
