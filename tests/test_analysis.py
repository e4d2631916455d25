"""kgpt-analyze end to end on tiny models: transfer depth, zero-shot curves and tables, ablations."""

import csv
import json
import os
import subprocess
import sys

import keras
import pytest
from conftest import char_tokenizer, one_backend
from test_train_callbacks import async_dispatch, events

import kgpt
from kgpt.errors import ConfigError
from kgpt.jobs import experiments as analysis
from kgpt.jobs import run
from kgpt.jobs.config import FinetuneConfig, PretrainConfig

PNG = b"\x89PNG\r\n\x1a\n"
JAX = keras.config.backend() == "jax"

# kgpt-analyze's studies (kgpt/jobs/experiments.py) build configs and call the jobs, with no code of their own for
# either backend; the jobs themselves (fine-tuning, pre-training, the LSTM) are tested on both (test_finetune.py,
# test_pretrain.py, test_lstm.py, test_zero_shot.py). What these tests check (tables, plots, the runs' folders and
# settings) comes out the same on both, so each runs on the backend where its runs take less time (measured one
# after the other on a 2-core machine: ablations 27 s on TensorFlow, 62 s on JAX; seeds 18 s on JAX, 33 s on
# TensorFlow; transfer depth 17 s / 19 s; the zero-shot curve 11 s / 21 s; the command 11 s / 12 s).
ON_TENSORFLOW = one_backend("tensorflow")


def fine(init, **overrides):
    values = dict(task="scitail", init=init, epochs=1, batch_size=64, learning_rate=1e-3, max_length=48)
    return FinetuneConfig(**{**values, **overrides})


def read_csv(path):
    return list(csv.reader(open(path)))


@ON_TENSORFLOW
def test_transfer_depth_table_and_plot(tiny_preset, tmp_path, capsys, progress):
    rows = analysis.transfer_depth(fine(tiny_preset), layers=[0, 2], output_dir=str(tmp_path))
    lines = capsys.readouterr().out.splitlines()
    assert [r[0] for r in rows] == [0, 2] and all(0 <= r[2] <= 100 for r in rows)
    table = read_csv(tmp_path / "transfer_depth.csv")
    assert table[0] == ["layers transferred", "metric", "scitail dev"] and len(table) == 3
    assert (tmp_path / "transfer_depth.png").read_bytes().startswith(PNG)
    assert any("embeddings + 0 of 2 block(s)" in line for line in lines)
    with pytest.raises(ValueError, match=r"layers must be within 0..2"):
        analysis.transfer_depth(fine(tiny_preset), layers=[3], output_dir=str(tmp_path))


@pytest.fixture
def tiny_lstm_preset(tmp_path):
    tokenizer = char_tokenizer()
    lm = kgpt.GPTCausalLM(
        kgpt.LSTMBackbone(tokenizer.vocabulary_size(), hidden_dim=16, lstm_units=24, max_sequence_length=128)
    )
    path = str(tmp_path / "lstm")
    lm.save_to_preset(path)
    tokenizer.save_to_preset(path)
    return path


@ON_TENSORFLOW
def test_ablations_table_puts_the_paper_beside(tiny_preset, tiny_lstm_preset, tmp_path):
    scores = analysis.ablations(fine(tiny_preset), {"sst2": None}, lstm_init=tiny_lstm_preset, output_dir=str(tmp_path))
    assert set(scores) == {"full", "no_pretraining", "no_aux_lm", "lstm"}
    table = read_csv(tmp_path / "ablations.csv")
    assert table[0] == ["method", "avg", "sst2 (accuracy)"]
    methods = [row[0] for row in table[1:]]
    assert methods[:2] == ["Transformer w/ aux LM (full)", "  paper: Transformer w/ aux LM (full)"]
    assert table[2][2] == "91.3" and table[4][2] == "84.0"  # the paper's SST-2 numbers, Table 5
    assert "| LSTM w/ aux LM |" in (tmp_path / "ablations.md").read_text()
    # The aux-LM row really trained without the LM loss, the other rows with it.
    runs = tmp_path / "runs"
    assert "lm_loss" not in open(runs / "no_aux_lm_sst2" / "history.csv").readline()
    assert "lm_loss" in open(runs / "full_sst2" / "history.csv").readline()


@one_backend("jax")
def test_ablations_over_seeds_give_each_seed_and_the_mean(tiny_preset, tmp_path):
    scores = analysis.ablations(
        fine(tiny_preset), {"sst2": None}, rows=["full", "no_pretraining"], seeds=[3, 5], output_dir=str(tmp_path)
    )
    per_seed = read_csv(tmp_path / "ablations_seeds.csv")
    assert per_seed[0] == ["method", "task", "seed 3", "seed 5", "mean", "sd"] and len(per_seed) == 3
    for row, line in zip(("full", "no_pretraining"), per_seed[1:]):
        values = [float(v) for v in line[2:4]]
        assert float(line[4]) == pytest.approx(sum(values) / 2) == pytest.approx(scores[row]["sst2"])
    assert float(read_csv(tmp_path / "ablations.csv")[1][2]) == pytest.approx(scores["full"]["sst2"])
    for name in ("full_sst2_seed3", "full_sst2_seed5", "no_pretraining_sst2_seed5"):
        assert json.loads((tmp_path / "runs" / name / "run.json").read_text())["settings"]["seed"] == int(name[-1])
    with pytest.raises(ValueError, match="seeds must be distinct"):
        analysis.ablations(fine(tiny_preset), {"sst2": None}, rows=["full"], seeds=[1, 1], output_dir=str(tmp_path))


def test_ablations_errors(tiny_preset, tmp_path):
    with pytest.raises(ValueError, match="Unknown ablation row"):
        analysis.ablations(fine(tiny_preset), {"sst2": None}, rows=["bigger"], output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="The lstm row needs --lstm_init"):
        analysis.ablations(fine(tiny_preset), {"sst2": None}, rows=["lstm"], output_dir=str(tmp_path))


def test_an_ablation_started_from_the_wrong_architecture_is_refused(
    tiny_preset, tiny_lstm_preset, tmp_path, monkeypatch
):
    from kgpt.jobs import dry_run

    # Both were fine-tuned and reported under the row's title.
    for init, lstm_init, message in (
        (tiny_preset, tiny_preset, rf"^--lstm_init {tiny_preset} is a pre-trained transformer, not an LSTM"),
        (tiny_lstm_preset, tiny_lstm_preset, rf"^--init {tiny_lstm_preset} is a pre-trained lstm, not a transformer"),
    ):
        config = fine(init)
        with pytest.raises(ConfigError, match=message):
            analysis.ablations(config, {"sst2": None}, lstm_init=lstm_init, output_dir=str(tmp_path / "run"))
        with pytest.raises(ConfigError, match=message):
            dry_run.analyze(
                "ablations",
                config,
                {"sst2": None},
                str(tmp_path / "dry"),
                rows=list(analysis.TABLE5),
                lstm_init=lstm_init,
            )
    assert not os.path.exists(tmp_path / "run" / "runs")
    monkeypatch.setattr(analysis, "_demo_pretrained", lambda *a: pytest.fail("pre-trained before the refusal"))
    with pytest.raises(ConfigError, match=r"^--lstm_init .* is a pre-trained transformer"):
        analysis.ablations(fine("demo"), {"sst2": None}, lstm_init=tiny_preset, output_dir=str(tmp_path / "demo"))
    for init in ("scratch", "demo"):  # no files to check: "scratch" was refused as no folder
        analysis.check_starts(["full", "no_aux_lm"], init, None)


def test_unknown_or_repeated_architectures_and_rows_are_refused_before_any_work(tmp_path):
    from kgpt.cli import analyze

    assert analyze.ARCHITECTURES == analysis.ARCHITECTURES  # --help names them without importing Keras
    base = PretrainConfig(corpus=str(tmp_path / "nowhere"), zero_shot={"sst2": None})
    for architectures in (["gru"], ["lstm", "lstm"], []):
        with pytest.raises(ValueError, match=r"name one or more of transformer, lstm, each once \(--architectures\)"):
            analysis.zero_shot_curve(base, architectures=architectures, output_dir=str(tmp_path / "out"))
    for rows in (["full", "full"], []):
        with pytest.raises(ValueError, match=r"name one or more of full, .*, each once \(--rows\)"):
            analysis.ablations(fine("demo"), {"sst2": None}, rows=rows, output_dir=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@ON_TENSORFLOW
def test_zero_shot_curve_for_both_architectures(tmp_path, monkeypatch):
    """Also: kgpt-train's callbacks (NaN stop, zero-shot, progress, TensorBoard) need no sync per step."""
    fit, fitted = run.fit, []

    def checked_fit(model, calls, callbacks, validation=None):
        fitted.append([type(c).__name__ for c in callbacks])
        assert async_dispatch(callbacks)
        fit(model, calls, callbacks, validation)

    monkeypatch.setattr(run, "fit", checked_fit)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the film was very good . the plot was very bad .\n" * 40)
    base = PretrainConfig(
        corpus=str(corpus),
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        lstm_units=24,
        sequence_length=16,
        batch_size=4,
        max_steps=4,
        evaluations=1,
        warmup_steps=1,
        sample_tokens=2,
        zero_shot={"sst2": None},
        zero_shot_every=2,
        zero_shot_examples=10,
        tokenizer="train",
        num_merges=20,
        log_every="2",
    )
    rows = analysis.zero_shot_curve(base, output_dir=str(tmp_path / "out"), lstm={"lstm_units": 12})
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("transformer", 2, "sst2"),
        ("transformer", 4, "sst2"),
        ("lstm", 2, "sst2"),
        ("lstm", 4, "sst2"),
    ]
    assert (tmp_path / "out" / "zero_shot_curve.png").read_bytes().startswith(PNG)
    assert len(read_csv(tmp_path / "out" / "runs" / "curve_lstm" / "zero_shot.csv")) == 3
    lstm = json.loads((tmp_path / "out" / "runs" / "curve_lstm" / "config.json").read_text())["config"]
    assert (lstm["lstm_units"], lstm["num_layers"]) == (12, 1)  # the LSTM's settings replace the base's
    assert (
        fitted
        == [
            [
                "StopOnNonFiniteLoss",
                "ZeroShotCallback",
                "PretrainProgress",
                "ProgressLog",
                "EpochTensorBoard",
                "EpochBar",
            ]
        ]
        * 2
    )
    run_dir = tmp_path / "out" / "runs" / "curve_transformer"
    written = events(str(run_dir / "logs"))
    assert [(tag, step) for tag, step, _ in written["train"]] == [
        ("epoch_loss", 0),
        ("epoch_sparse_categorical_accuracy", 0),
        ("epoch_learning_rate", 0),
    ]
    assert [tag for tag, _, _ in written["validation"]] == [
        "evaluation_loss_vs_iterations",
        "evaluation_sparse_categorical_accuracy_vs_iterations",
        "epoch_loss",
        "epoch_sparse_categorical_accuracy",
    ]
    assert [(tag, step) for tag, step, _ in written["zero_shot"]] == [
        ("zero_shot/sst2/accuracy", 2),
        ("zero_shot/sst2/accuracy", 4),
    ]
    checkpoint = run_dir / "checkpoint" / json.loads((run_dir / "checkpoint" / "latest.json").read_text())["checkpoint"]
    state = json.loads((checkpoint / "state.json").read_text())
    assert [row[:2] for row in state["zero_shot"]] == [[2, "sst2"], [4, "sst2"]]  # with its own step's evaluation


def run_analyze(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "kgpt.cli.analyze", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


@ON_TENSORFLOW
def test_cli_zero_shot_and_usage(tiny_preset, tmp_path):
    out = tmp_path / "analysis"  # tmp_path holds the preset: files no kgpt-analyze run wrote
    result = run_analyze("zero-shot", f"--init={tiny_preset}", "--tasks=sst2,cola", f"--output_dir={out}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sst2: accuracy" in result.stdout and "cola: matthews" in result.stdout
    table = read_csv(out / "zero_shot.csv")
    assert table[0] == ["task", "metric", "value (x100)", "majority label (x100)", "heuristic"]
    assert [row[3] for row in table[1:]] == ["50.0", "0.0"]  # the embedded SST-2's dev is balanced; CoLA's MCC
    assert json.loads((out / "run.json").read_text())["job"] == "analyze"


def test_cli_usage_errors():
    from absl import app, flags

    from kgpt.cli import analyze

    with pytest.raises(app.UsageError) as raised:
        analyze.main(["kgpt-analyze", "plots"])
    assert str(raised.value) == (
        "Give one mode: zero-shot, zero-shot-curve, transfer, ablations (kgpt-analyze MODE [flags]); got 'plots'."
    )
    flags.FLAGS(["kgpt-analyze", "--tasks=rte"])
    try:
        with pytest.raises(app.UsageError, match="zero-shot needs --init"):
            analyze.main(["kgpt-analyze", "zero-shot"])
    finally:
        flags.FLAGS.unparse_flags()
    for args, message in (
        (["--seeds=0,x"], "--seeds: expected integers"),
        (["--seeds=1_000,٣"], "--seeds: expected integers"),  # read as 1000 and 3
        (["--seeds=1,1"], "--seeds: expected distinct integers"),
        # These passed --dry_run and failed after the first seed's runs.
        (["--seeds=0,-1"], r"^--seeds: each seed must be an integer between 0 and 4294967295, got -1\.$"),
        (["--seeds=99999999999"], "--seeds: each seed must be an integer between 0 and 4294967295, got 99999999999"),
        (["--tasks=,"], r"^--tasks: expected NAME or NAME=DATA_DIR, got ''\.$"),  # it named --zero_shot
        (["--tasks=sst2="], r"^--tasks: expected .*, got 'sst2=' \(drop '=' for the task's embedded data\)\.$"),
        (["--tasks=sst2,sst2=glue/SST-2"], r"^--tasks: task 'sst2' is named twice; name it once\.$"),
        (["--tasks="], r"^--tasks is empty: name one or more"),  # the default tasks, without a word
        (["--seeds=0,1", "--init=x"], "--seeds only applies to ablations, not zero-shot"),
    ):
        flags.FLAGS(["kgpt-analyze", *args])
        try:
            with pytest.raises(app.UsageError, match=message):
                analyze.main(["kgpt-analyze", "zero-shot"])
        finally:
            flags.FLAGS.unparse_flags()


@pytest.mark.parametrize(
    "mode, args, message",
    [
        # These ran, the flags ignored: --task even named another task than --tasks.
        (
            "zero-shot",
            ["--init=x", "--tasks=sst2", "--task=cola", "--epochs=7", "--lm_coef=3"],
            r"^--task, --epochs, --lm_coef do nothing in kgpt-analyze zero-shot \(it scores --init on --tasks\); "
            r"remove them\.$",
        ),
        ("transfer", ["--corpus=text"], r"^--corpus does nothing in kgpt-analyze transfer \(it fine-tunes on the"),
        ("zero-shot-curve", ["--zero_shot=cola"], r"^--zero_shot does nothing in kgpt-analyze zero-shot-curve"),
        ("ablations", ["--layers=0,1"], r"^--layers only applies to transfer, not ablations; remove it\.$"),
        ("transfer", ["--architectures=lstm"], r"^--architectures only applies to zero-shot-curve, not transfer"),
        # These two ran on cola alone, with the blocks of --layers: sst2 and --transfer_layers were ignored.
        ("transfer", ["--transfer_layers=1"], r"^--transfer_layers does nothing in kgpt-analyze transfer \(.*--layers"),
        (
            "transfer",
            ["--tasks=cola,sst2"],
            r"^transfer fine-tunes on one task; --tasks names 2 \(cola, sst2\): run it once per task\.$",
        ),
    ],
)
def test_flags_a_mode_would_ignore_are_refused(mode, args, message):
    from absl import app, flags

    from kgpt.cli import analyze

    flags.FLAGS(["kgpt-analyze", *args, "--dry_run"])  # refused by the dry run as by the run, before either
    try:
        with pytest.raises(app.UsageError, match=message):
            analyze.main(["kgpt-analyze", mode])
    finally:
        flags.FLAGS.unparse_flags()


def test_cli_claims_its_output_directory(tmp_path):
    from absl import flags

    from kgpt.cli import analyze
    from kgpt.errors import OutputDirError
    from kgpt.jobs.rundir import RunDirectory

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not kgpt's")
    with RunDirectory(str(tmp_path / "lm"), "pretrain", {"seed": 0}):
        pass
    for directory, message in (
        ("mine", "already holds files that no kgpt analyze run wrote"),
        ("lm", "holds the outputs of a pretrain run, not analyze"),
    ):
        flags.FLAGS(["kgpt-analyze", f"--init={tmp_path}", f"--output_dir={tmp_path / directory}"])
        try:
            with pytest.raises(OutputDirError, match=message):
                analyze.main(["kgpt-analyze", "zero-shot"])
        finally:
            flags.FLAGS.unparse_flags()
    assert (tmp_path / "mine" / "notes.txt").read_text() == "not kgpt's"
    # --overwrite cleared the pre-trained model the analysis was to score.
    os.symlink(tmp_path / "lm", tmp_path / "link")
    for extra in ([], ["--dry_run"]):
        flags.FLAGS(
            ["kgpt-analyze", f"--init={tmp_path / 'lm'}", f"--output_dir={tmp_path / 'link'}", "--overwrite", *extra]
        )
        try:
            with pytest.raises(ConfigError, match=r"^--init .*lm is the output directory .*link, which the run writes"):
                analyze.main(["kgpt-analyze", "zero-shot"])
        finally:
            flags.FLAGS.unparse_flags()
