"""`kgpt.jobs.dry_run`: the mistakes a real run would meet, found without training or writing anything.

Each mistake is compared with what the real code path raises on the same
input (the job's reader, `RunDirectory`, preset loading), so the dry run
says what the run would say. The commands' `--dry_run` flag is exercised on
every documented command by tests/test_documented_commands.py.
"""

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys

import keras
import pytest
from conftest import TINY, char_tokenizer, cli, one_backend
from test_paper_tasks import write_glue

import kgpt
from kgpt.cli import train
from kgpt.errors import DataError, OutputDirError
from kgpt.jobs import dry_run, finetune, finetune_data, finetune_model
from kgpt.jobs.config import FinetuneConfig, PretrainConfig
from kgpt.jobs.rundir import RunDirectory

REGISTRY = kgpt.TaskRegistry()


def listing(folder):
    """Every path under `folder` with its size and modification time."""
    return sorted(
        (os.path.join(d, n), os.stat(os.path.join(d, n)).st_size, os.stat(os.path.join(d, n)).st_mtime_ns)
        for d, _, names in os.walk(folder)
        for n in names
    )


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("preset") / "lm")
    tokenizer = char_tokenizer()
    kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size()}).save_to_preset(path)
    tokenizer.save_to_preset(path)
    return path


def test_a_finetuning_dry_run_reports_the_data_and_model_and_writes_nothing(preset, tmp_path):
    data = write_glue(tmp_path / "RTE", "rte")
    before = listing(tmp_path)
    found = dict(
        dry_run.finetune(
            FinetuneConfig(task="rte", init=preset, data_dir=data, output_dir=str(tmp_path / "out")), REGISTRY
        )
    )
    assert listing(tmp_path) == before and not os.path.exists(tmp_path / "out")
    assert found["data"].startswith(f"{data}: train: 12 rows read, 12 used; dev: 6 rows read, 6 used; test: 4 rows")
    # The weights of the file, counted from its header, are the model's own count.
    weights = kgpt.GPTBackbone.from_preset(preset).count_params()
    assert f"{weights:,} weights" in found["init"]
    assert found["output"] == f"{tmp_path / 'out'} (new)"


def test_the_dry_run_counts_the_updates_and_warns_of_a_batch_larger_than_the_training_set(preset, tmp_path, caplog):
    data = write_glue(tmp_path / "RTE", "rte")  # 12 training rows

    def training(**fields):
        caplog.clear()
        with caplog.at_level("WARNING", logger="kgpt"):
            found = dict(dry_run.finetune(FinetuneConfig(task="rte", init=preset, data_dir=data, **fields), REGISTRY))
        return found["training"], [r.getMessage() for r in caplog.records]

    assert training(batch_size=5, epochs=10**9) == (
        "1,000,000,000 epoch(s) of 3 update(s) (3,000,000,000 in all), batch 5, peak rate 6.25e-05, lm_coef 0.5, "
        "keep last",
        [],
    )
    found, warnings = training(batch_size=10**9)
    assert found.startswith("3 epoch(s) of 1 update(s) (3 in all), batch 1,000,000,000,")
    assert warnings == [
        "Warning: batch_size 1,000,000,000 is more than the 12 training examples: each epoch is one update on all "
        "12 of them."
    ]


def test_a_finetuned_init_without_batch_size_is_planned_with_the_batch_the_run_takes(preset, tmp_path):
    # The run takes the batch the model was fine-tuned with; the dry run (and the run's own checks before it
    # loads the model) once took the default 32, warning of a batch larger than the training set.
    data = write_glue(tmp_path / "RTE", "rte")  # 12 training rows
    model = str(tmp_path / "rte-model")
    kgpt.GPTTaskModel.from_preset(preset, task="rte").save_to_preset(model)
    with open(os.path.join(model, "metrics.json"), "w") as f:
        json.dump({"init_dir": preset, "batch_size": 6}, f)
    config = FinetuneConfig(task="rte", init=model, data_dir=data, epochs=1, output_dir=str(tmp_path / "out"))
    assert dict(dry_run.finetune(config, REGISTRY))["training"].startswith(
        "1 epoch(s) of 2 update(s) (2 in all), batch 6,"
    )
    _, metrics = finetune.finetune(config, REGISTRY)
    assert metrics["batch_size"] == 6


def test_model_parallel_is_refused_without_its_distribution_and_checked_against_the_devices(preset, tmp_path):
    data = write_glue(tmp_path / "RTE", "rte")

    def check(**fields):
        return dict(dry_run.finetune(FinetuneConfig(task="rte", init=preset, data_dir=data, **fields), REGISTRY))

    with pytest.raises(kgpt.ConfigError, match=r"^model_parallel 2 splits each model with distribution "):
        check(model_parallel=2)  # 2 is the default with --distribution model_parallel: given alone it did nothing
    if keras.backend.backend() != "jax":
        with pytest.raises(kgpt.ConfigError, match=r"^distribution model_parallel runs on the jax backend"):
            check(distribution="model_parallel")
        return
    import jax

    devices = len(jax.devices())
    with pytest.raises(
        kgpt.ConfigError, match=rf"^model_parallel {devices + 1}: the {devices} device\(s\) do not split"
    ):
        check(distribution="model_parallel", model_parallel=devices + 1)  # the dry run said no problem
    found = check(distribution="model_parallel", model_parallel=1, batch_size=devices)
    assert found["processes"] == f"1, each model split over 1 device(s), each batch over {devices} such groups"


def test_a_bad_label_is_the_error_the_job_gives(preset, tmp_path):
    data = write_glue(tmp_path / "RTE", "rte")
    path = os.path.join(data, "dev.tsv")
    lines = open(path, encoding="utf-8").read().splitlines()
    lines[3] = lines[3].rsplit("\t", 1)[0] + "\tmaybe"
    open(path, "w", encoding="utf-8").write("\n".join(lines) + "\n")
    task = REGISTRY.get("rte")
    preprocessor = kgpt.GPTTaskPreprocessor(char_tokenizer(), task.transform, sequence_length=16)
    with pytest.raises(kgpt.DataError) as job:
        finetune_data.encode_split(task, "dev", data, preprocessor)
    with pytest.raises(kgpt.DataError) as dry:
        dry_run.finetune(FinetuneConfig(task="rte", init=preset, data_dir=data), REGISTRY)
    assert str(dry.value) == str(job.value) and "dev.tsv:4" in str(dry.value)


def test_an_output_directory_of_another_run_is_refused_as_the_run_refuses_it(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"job": "finetune", "settings": {"task": "cola"}}))
    settings = {"task": "rte"}
    before = listing(tmp_path)
    with pytest.raises(OutputDirError) as dry:
        dry_run.output_dir(str(out), "finetune", settings)
    assert listing(tmp_path) == before
    with pytest.raises(OutputDirError) as real:
        with RunDirectory(str(out), "finetune", settings):
            pass
    assert str(dry.value) == str(real.value) and "task: 'cola' there, 'rte' now" in str(dry.value)
    assert dry_run.output_dir(str(out), "finetune", settings, overwrite=True).startswith(f"{out}: --overwrite")
    assert dry_run.output_dir(str(out), "finetune", {"task": "cola"}).endswith("starts again (no checkpoint)")
    (out / "checkpoint" / "step-000000007").mkdir(parents=True)  # named as the run names it
    (out / "checkpoint" / "latest.json").write_text(json.dumps({"checkpoint": "step-000000007"}))
    (out / "checkpoint" / "step-000000007" / "state.json").write_text(json.dumps({"step": 7}))
    assert dry_run.output_dir(str(out), "finetune", {"task": "cola"}).endswith("resumes from its checkpoint at step 7")


@contextlib.contextmanager
def held_by_another_process(folder, settings):
    """Inside, another process holds `folder` as a pre-training run's output directory; yields that process."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nfrom kgpt.jobs.rundir import RunDirectory\n"
            f"with RunDirectory({str(folder)!r}, 'pretrain', {settings!r}):\n"
            "    print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_an_output_directory_in_use_is_refused(tmp_path):
    out = tmp_path / "busy"
    with held_by_another_process(out, {}):
        with pytest.raises(OutputDirError, match="in use by another kgpt run"):
            dry_run.output_dir(str(out), "pretrain", {})
    mine = tmp_path / "mine"
    with RunDirectory(str(mine), "pretrain", {}):  # this process's own claim: refused as a second claim would be
        with pytest.raises(OutputDirError, match=f"in use by another kgpt run \\(pid {os.getpid()}\\)"):
            dry_run.output_dir(str(mine), "pretrain", {})
        other = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from kgpt.jobs.rundir import RunDirectory\nRunDirectory({str(mine)!r}, 'pretrain', {{}}).__enter__()",
            ],
            capture_output=True,
            text=True,
        )
        assert "is in use by another kgpt run" in other.stderr  # the check left the claim's lock in place


def test_a_pretraining_dry_run_reads_the_corpus_and_counts_the_model(tmp_path):
    corpus = tmp_path / "books"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat.\n" * 50)
    (corpus / "b.txt").write_text("")
    config = PretrainConfig(
        corpus=str(corpus),
        output_dir=str(tmp_path / "lm"),
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        sequence_length=16,
        max_steps=10,
        warmup_steps=1,
    )
    found = dict(dry_run.pretrain(config))
    assert found["corpus"].startswith("2 file(s) (1,200 bytes), 1 empty")
    tokenizer = kgpt.GPTTokenizer.gpt1()
    built = kgpt.GPTBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=16,
    )
    assert f"{built.count_params():,} weights" in found["model"]
    assert not os.path.exists(tmp_path / "lm")
    (corpus / "c.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(DataError, match=r"c.txt:1: byte 4 of the line \(0xe9\) is not valid UTF-8"):
        dry_run.pretrain(config)


def test_a_prompt_longer_than_the_context_is_refused_by_the_dry_run_as_by_the_run(tmp_path):
    config = PretrainConfig(sequence_length=4, prompt="a prompt of more than four tokens", max_steps=1, warmup_steps=0)
    with pytest.raises(kgpt.ConfigError, match=r"^--prompt is \d+ tokens, which leaves no room in --sequence_length=4"):
        dry_run.pretrain(config)
    found = dict(dry_run.pretrain(dataclasses.replace(config, tokenizer="train")))  # not learned yet: said so
    assert "--prompt is measured against --sequence_length once it is" in found["tokenizer"]


def test_a_max_length_with_no_room_for_a_pairs_text_is_refused_by_the_dry_run_as_by_the_run(
    preset, monkeypatch, capsys, tmp_path
):
    # 4 fits one text ([start] t [extract]) but not a pair: a ValueError traceback from the first example.
    train_file = tmp_path / "pairs.csv"
    train_file.write_text("a,b,label\n" + "".join(f"row {i},other {i},{'xy'[i % 2]}\n" for i in range(8)))
    flags = ("--task=text-classification", f"--train_file={train_file}", "--text_columns=a,b", "--label_column=label")
    errors = []
    for dry in ([], ["--dry_run"]):
        args = (*flags, f"--init={preset}", "--max_length=4", *dry, f"--output_dir={tmp_path / 'o'}")
        code, _, err = cli(monkeypatch, capsys, train, *args)
        assert code == 1 and "Traceback" not in err, err[-3000:]
        errors.append(err.strip().splitlines()[-1])
    assert (
        errors[0]
        == errors[1]
        == (
            "kgpt-train: error: --max_length 4 leaves no room for text in each entailment view: its start, delimiter and "
            "extract tokens and a token of each part take 5."
        )
    )
    with pytest.raises(ValueError, match="sequence_length must be an integer >= 5, got 4"):
        kgpt.GPTTaskPreprocessor(char_tokenizer(), kgpt.tasks.transforms.MultipleChoice(2), sequence_length=4)


def test_a_length_with_no_room_for_text_names_where_it_came_from():
    # The length is the typed --max_length, that cut to the context, a fine-tuned init's own, or the context:
    # the message names the one the run uses, not a clipped value as if typed.
    task = kgpt.TaskRegistry().get("scitail")  # entailment: 5 tokens at least

    def refusal(max_length, context, saved_length=None):
        with pytest.raises(kgpt.ConfigError) as caught:
            finetune.task_preprocessor(task, max_length, char_tokenizer(), context, saved_length, "preset p")
        return str(caught.value).split(" leaves no room for text in each entailment view")[0]

    assert refusal(4, 64) == "max_length 4"
    assert refusal(1000, 4) == "max_length 1000, cut to the model's context of 4 tokens (preset p),"
    assert refusal(None, 64, saved_length=4) == "The length the fine-tuned model was trained with (4 tokens, preset p)"
    assert refusal(None, 4) == "The model's context of 4 tokens (preset p)"
    assert finetune.task_preprocessor(task, 1000, char_tokenizer(), 5, None, "preset p").sequence_length == 5


def test_keep_best_without_a_labeled_split_to_pick_by_is_refused_by_the_dry_run_as_by_the_run(
    preset, monkeypatch, capsys, tmp_path
):
    train_file = tmp_path / "train.csv"
    train_file.write_text("text,label\n" + "".join(f"row {i},{'ab'[i % 2]}\n" for i in range(8)))
    flags = (
        "--task=text-classification",
        f"--train_file={train_file}",
        "--text_columns=text",
        "--label_column=label",
        f"--init={preset}",
        "--keep=best",
        "--batch_size=4",
    )
    refused = (
        "kgpt-train: error: keep='best' picks the epoch by dev score, but no labeled split besides 'train' was "
        "found (a test split is never used to choose the model: give a validation split)."
    )
    # A labeled --test_file alone: each epoch was scored on it and the best test epoch kept, reported as "dev".
    for test in ([], [f"--test_file={train_file}"]):
        errors = []
        for dry in ([], ["--dry_run"]):
            code, _, err = cli(monkeypatch, capsys, train, *flags, *test, *dry, f"--output_dir={tmp_path / 'o'}")
            assert code == 1 and "Traceback" not in err, err[-3000:]
            errors.append(err.strip().splitlines()[-1])
        assert errors[0] == errors[1] == refused


def test_a_truncated_weights_file_is_named(preset, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(preset, broken)
    weights = broken / "model.weights.h5"
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(kgpt.CheckpointError, match="model.weights.h5 is not a readable Keras weights file"):
        dry_run.pretrained(str(broken))
    with pytest.raises(kgpt.CheckpointError, match="model.weights.h5"):
        kgpt.GPTBackbone.from_preset(str(broken))


@pytest.mark.parametrize("format", ["original", "huggingface"])
def test_release_files_are_checked_and_counted_by_the_loaders_readers(tmp_path, format):
    backbone = kgpt.GPTBackbone(**{**TINY, "intermediate_dim": 4 * TINY["hidden_dim"]})
    backbone.save_original(str(tmp_path / "release"), format=format)
    sizes = {}
    found = dry_run.pretrained(str(tmp_path / "release"), sizes)
    assert f"{backbone.count_params():,} weights" in found
    assert (sizes["num_layers"], sizes["hidden_dim"]) == (TINY["num_layers"], TINY["hidden_dim"])
    if format == "original":
        os.remove(tmp_path / "release" / "params_9.npy")  # the loader's own error, before any number is read
        with pytest.raises(kgpt.CheckpointError, match=r"the 9 shard\(s\) params_0..8.npy hold"):
            dry_run.pretrained(str(tmp_path / "release"))


def test_a_mistake_the_dry_run_finds_is_the_commands_one_line_error(preset, tmp_path, command):
    from kgpt.cli import train

    data = write_glue(tmp_path / "RTE", "rte")
    os.remove(os.path.join(data, "train.tsv"))
    result = command(
        train, "--task=rte", f"--init={preset}", f"--data_dir={data}", f"--output_dir={tmp_path / 'out'}", "--dry_run"
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("kgpt-train: error:")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr[-2000:]
    assert "train.tsv" in errors[0] and "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "out")


SMALL = ["--num_layers=1", "--num_heads=2", "--hidden_dim=16", "--intermediate_dim=32", "--max_length=16"]


@pytest.mark.parametrize(
    "flags, message, run_too",
    [
        # Tracebacks from the backbone's constructor, and dry runs that passed.
        (["--num_heads=3"], r"hidden_dim 16 must be a multiple of num_heads 3", True),
        (["--hidden_dim=0"], r"hidden_dim must be an integer >= 1, got 0", True),
        # The run said it after building the model; the dry run passed.
        (["--transfer_layers=5"], r"transfer_layers must be in 0..1, got 5", False),
        (["--transfer_layers=-1"], r"transfer_layers must be in 0..1, got -1", False),
    ],
)
def test_sizes_of_a_model_fine_tuned_from_scratch_are_checked_by_the_dry_run_as_by_the_run(
    flags, message, run_too, tmp_path, monkeypatch, capsys
):
    args = ["--task=scitail", "--init=scratch", *SMALL, *flags, f"--output_dir={tmp_path / 'out'}"]
    for extra in (["--dry_run"], []) if run_too else (["--dry_run"],):
        code, _, err = cli(monkeypatch, capsys, train, *args, *extra)
        last = err.strip().splitlines()[-1]
        assert code == 1 and "Traceback" not in err and last.startswith("kgpt-train: error: "), err[-2000:]
        assert re.search(message, last), last
        assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def cola_model(preset, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cola") / "cola")
    kgpt.GPTTaskModel.from_preset(preset, task="cola").save_to_preset(path)
    with open(os.path.join(path, "metrics.json"), "w") as f:  # as kgpt-train writes it: errors name the origin
        json.dump({"init_dir": preset}, f)
    return path


@pytest.mark.parametrize(
    "case",
    [
        "epochs 0 on a pre-trained model",
        "fine-tuned for another task",
        "transfer from a fine-tuned model",
        "a folder with no model",
        "no embedded data",
    ],
)
def test_the_starting_point_and_task_errors_are_the_jobs(case, preset, cola_model, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    task, config = {
        "epochs 0 on a pre-trained model": ("rte", dict(init=preset, epochs=0)),
        "fine-tuned for another task": ("sst2", dict(init=cola_model)),
        "transfer from a fine-tuned model": ("cola", dict(init=cola_model, transfer_layers=1)),
        "a folder with no model": ("rte", dict(init=str(empty))),
        "no embedded data": ("rte", dict(init=preset)),
    }[case]
    config = FinetuneConfig(task=task, **config)
    whole_job = case == "no embedded data"
    if whole_job:
        run = lambda: finetune.finetune(config, REGISTRY)  # noqa: E731 - raised before anything is read
    else:
        run = lambda: finetune_model.starting_point(config, REGISTRY.get(task))  # noqa: E731
    with pytest.raises(Exception) as job:
        run()
    with pytest.raises(type(job.value)) as dry:
        dry_run.finetune(config, REGISTRY) if whole_job else dry_run.init(config, REGISTRY.get(task))
    assert str(dry.value) == str(job.value)


def test_a_finetuned_init_whose_labels_differ_from_the_training_files_is_named_so(preset, tmp_path):
    def table(name, labels):
        path = tmp_path / name
        path.write_text("text,label\n" + "".join(f"row {i},{label}\n" for i, label in enumerate(labels)))
        return str(path)

    def config(train_file, **values):
        return FinetuneConfig(
            task="text-classification", train_file=train_file, text_columns=["text"], label_column="label", **values
        )

    two = finetune.resolve_task(config(table("two.csv", ["neg", "pos", "neg"]), init=preset), REGISTRY)
    tuned = str(tmp_path / "tuned")
    kgpt.GPTTaskModel.from_preset(preset, task=two).save_to_preset(tuned)
    three = config(table("three.csv", ["neg", "neutral", "pos"]), init=tuned)
    with pytest.raises(kgpt.ConfigError) as job:
        finetune_model.starting_point(three, finetune.resolve_task(three, REGISTRY))
    with pytest.raises(kgpt.ConfigError) as dry:
        dry_run.finetune(three, REGISTRY)
    assert str(dry.value) == str(job.value)
    assert f"was fine-tuned on the labels neg, pos, but {three.train_file} has neg, neutral, pos" in str(job.value)
    # A one-text model given a pair of columns: evaluated with --epochs 0 as if its scores were reproduced.
    path = tmp_path / "pairs.csv"
    path.write_text("text,more,label\n" + "".join(f"row {i},other,{'neg pos'.split()[i % 2]}\n" for i in range(4)))
    pairs = dataclasses.replace(config(str(path), init=tuned, epochs=0), text_columns=["text", "more"])
    for check in (
        lambda: finetune_model.starting_point(pairs, finetune.resolve_task(pairs, REGISTRY)),
        lambda: dry_run.finetune(pairs, REGISTRY),
    ):
        with pytest.raises(kgpt.ConfigError, match=r"was fine-tuned on 1 column\(s\) \(text\), .*pairs.csv gives 2 "):
            check()


def test_a_finetuned_multiple_choice_init_given_another_number_of_choices_is_named_by_its_columns(preset, tmp_path):
    path = tmp_path / "three.csv"
    path.write_text("q,a,b,c,label\n" + "".join(f"question {i},yes,no,maybe,{i % 2}\n" for i in range(4)))

    def config(choices, **values):
        return FinetuneConfig(
            task="multiple-choice",
            train_file=str(path),
            text_columns=["q"],
            choice_columns=choices,
            label_column="label",
            **values,
        )

    two = config(["a", "b"])
    tuned = str(tmp_path / "tuned")
    kgpt.GPTTaskModel.from_preset(preset, task=finetune.resolve_task(two, REGISTRY)).save_to_preset(tuned)
    three = config(["a", "b", "c"], init=tuned)
    # The head differs too (3 choices, not 2), but the plugin did not change: the columns say what did.
    for check in (
        lambda: finetune_model.starting_point(three, finetune.resolve_task(three, REGISTRY)),
        lambda: dry_run.finetune(three, REGISTRY),
    ):
        with pytest.raises(
            kgpt.ConfigError, match=r"was fine-tuned on 3 column\(s\) \(q, a, b\), .*three.csv gives 4 "
        ):
            check()


def test_an_unfinished_pretraining_run_as_init_is_named_so(tmp_path):
    run = tmp_path / "lm"
    with RunDirectory(str(run), "pretrain", {"max_steps": 10}):  # its run.json, as the run writes it
        pass
    (run / "checkpoint" / "step-000000004").mkdir(parents=True)
    (run / "checkpoint" / "latest.json").write_text(json.dumps({"checkpoint": "step-000000004"}))
    (run / "checkpoint" / "step-000000004" / "state.json").write_text(json.dumps({"step": 4}))
    config, task = FinetuneConfig(task="rte", init=str(run)), REGISTRY.get("rte")

    def refusals():
        with pytest.raises(kgpt.CheckpointError) as job:
            finetune_model.starting_point(config, task)
        with pytest.raises(kgpt.CheckpointError) as dry:
            dry_run.init(config, task)
        with pytest.raises(kgpt.CheckpointError) as loaded:
            kgpt.GPTBackbone.from_preset(str(run))
        assert str(dry.value) == str(job.value) == str(loaded.value)
        return str(job.value)

    assert refusals() == (
        f"{run} is a pre-training run that has not finished (last checkpoint: step 4 of 10): resume it by running "
        f"its kgpt-train --task lm command again (--output_dir {run}), or start from a finished model."
    )
    with held_by_another_process(run, {"max_steps": 10}) as holder:
        assert refusals().startswith(
            f"{run} is a pre-training run still in progress (pid {holder.pid}; last checkpoint: step 4 of 10)"
        )


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.pop("num_heads"), "missing key 'num_heads': a GPTBackbone config needs vocabulary_size, "),
        (lambda c: c.update(dropout=-0.5), "dropout must be a number in [0, 1), got -0.5."),
        (lambda c: c.update(dropout=float("nan")), "dropout must be a number in [0, 1), got nan."),
        (lambda c: c.update(num_heads=4), "num_heads is 4, but "),  # as many weights, in other shapes
        (lambda c: c.update(num_layers=1), "num_layers is 1, but "),  # fewer weights than the file holds
    ],
    ids=["missing key", "negative dropout", "NaN dropout", "other heads", "fewer layers"],
)
def test_a_tampered_init_config_is_the_runs_one_line_naming_the_file_and_key(preset, tmp_path, edit, message):
    import shutil

    init = tmp_path / "lm"
    shutil.copytree(preset, init)
    saved = json.loads((init / "config.json").read_text())
    edit(saved["config"])
    (init / "config.json").write_text(json.dumps(saved))
    config, task = FinetuneConfig(task="rte", init=str(init)), REGISTRY.get("rte")
    with pytest.raises(kgpt.CheckpointError) as job:
        finetune_model.starting_point(config, task)
    with pytest.raises(kgpt.CheckpointError) as dry:
        dry_run.init(config, task)
    assert str(dry.value) == str(job.value) and message in str(job.value)
    assert str(init / "config.json") in str(job.value) and "\n" not in str(job.value)


def test_a_key_the_init_config_does_not_take_is_warned_of_by_the_run_and_the_dry_run(preset, tmp_path, caplog):
    import shutil

    init = tmp_path / "lm"
    shutil.copytree(preset, init)
    saved = json.loads((init / "config.json").read_text())
    saved["config"]["colour"] = "blue"
    (init / "config.json").write_text(json.dumps(saved))
    config, task = FinetuneConfig(task="rte", init=str(init)), REGISTRY.get("rte")
    warning = f"{init / 'config.json'}: GPTBackbone takes no 'colour': ignored."
    for check in (lambda: dry_run.init(config, task), lambda: finetune_model.starting_point(config, task)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="kgpt"):
            check()
        assert [r.getMessage() for r in caplog.records if warning in r.getMessage()], caplog.text


@one_backend("tensorflow")
def test_the_rows_cut_to_the_context_and_the_labels_are_counted_as_the_run_counts_them(preset, tmp_path, monkeypatch):
    def write(name, rows):
        path = tmp_path / name
        path.write_text("text,label\n" + "".join(f"{text},{label}\n" for text, label in rows))
        return str(path)

    # The preset's context is 16 tokens: a start, an extract and 14 of text; the longer rows are cut.
    train = write(
        "train.csv",
        [
            ("short", "neg"),
            ("a row far longer than sixteen tokens", "neg"),
            ("tiny", "pos"),
            ("another row longer than the context", "neg"),
            ("ok", "pos"),
        ],
    )
    dev = write("dev.csv", [("this one is cut as well by the run", "neg"), ("fits", "pos")])
    config = FinetuneConfig(
        task="text-classification",
        init=preset,
        train_file=train,
        validation_file=dev,
        text_columns=["text"],
        label_column="label",
        epochs=1,
        batch_size=4,
    )
    found = dict(dry_run.finetune(config, REGISTRY))
    _, results = finetune.finetune(config, REGISTRY)
    cut = {name: results["splits"][name]["examples"] for name in ("train", "validation")}
    assert cut["train"]["truncated"] == 2 and cut["validation"]["truncated"] == 1
    assert found["tokens"] == (
        f"views of up to 16 tokens (the model's context: 16): train: {cut['train']['truncated']} of 5 rows cut "
        f"({cut['train']['tokens_cut']} tokens); validation: {cut['validation']['truncated']} of 2 rows cut "
        f"({cut['validation']['tokens_cut']} tokens)"
    )
    assert found["labels"] == (
        "train: neg 3, pos 2 (majority neg 60.0%, chance 50.0%); validation: neg 1, pos 1 "
        "(majority neg 50.0%, chance 50.0%)"
    )
    # A split longer than the dry run tokenizes says how many rows it read.
    monkeypatch.setattr(dry_run, "TOKENIZED_ROWS", 3)
    found = dict(dry_run.finetune(config, REGISTRY))
    assert found["data"].endswith(
        "train: 3+ rows read, 3 used; validation: 2 rows read, 2 used; test: not found "
        "(no test_file given) (the first 3 rows of each split tokenized)"
    ), found["data"]
    assert found["tokens"].startswith("views of up to 16 tokens (the model's context: 16): train: 1 of 3 rows cut")


def test_hugging_face_files_with_only_tf_model_h5_are_checked_as_the_run_reads_them(tmp_path):
    import gpt1_reference
    from hub_server import openai_gpt_files

    arrays = gpt1_reference.random_checkpoint(vocab=95, n_ctx=16, hidden=24, inner=96, n_layer=2)[1]
    folder = tmp_path / "hf"
    folder.mkdir()
    for name, data in openai_gpt_files(arrays, weights="tf").items():
        (folder / name).write_bytes(data)
    assert not (folder / "model.safetensors").exists()
    sizes = {}
    assert dry_run.pretrained(str(folder), sizes).startswith("Hugging Face openai-gpt files, 2 x 24")
    assert kgpt.GPTBackbone.from_original(str(folder)).num_layers == sizes["num_layers"] == 2


@pytest.mark.parametrize("tasks", [{"sst2": "/no/such/folder"}, {"rte": None}], ids=["missing data", "no heuristic"])
def test_zero_shot_tasks_are_refused_as_the_runs_refuse_them(preset, tasks, tmp_path):
    from kgpt.jobs import experiments, pretrain

    with pytest.raises(kgpt.ConfigError) as job:
        experiments.zero_shot_table(preset, tasks, registry=REGISTRY)
    for mode in ("zero-shot", "zero-shot-curve"):
        config = FinetuneConfig(init=preset) if mode == "zero-shot" else PretrainConfig(zero_shot=tasks)
        with pytest.raises(kgpt.ConfigError) as dry:
            dry_run.analyze(mode, config, tasks, None, architectures=["transformer"], registry=REGISTRY)
        assert str(dry.value) == str(job.value)
    config = PretrainConfig(corpus=str(tmp_path / "none"), zero_shot=tasks)  # kgpt-train --task lm --zero_shot
    with pytest.raises(kgpt.ConfigError) as run:
        pretrain.pretrain(config, registry=REGISTRY)
    with pytest.raises(kgpt.ConfigError) as dry:
        dry_run.pretrain(config)
    assert str(dry.value) == str(run.value) == str(job.value)


def test_a_zero_shot_analysis_without_the_split_it_scores_is_refused_as_the_run_refuses_it(preset, tmp_path):
    from kgpt.jobs import experiments

    data = REGISTRY.get("sst2").write_default_data(str(tmp_path / "SST-2"))
    os.remove(os.path.join(data, "dev.tsv"))  # the split zero-shot scores: the dry run called it "not found"
    tasks = {"sst2": data}
    with pytest.raises(FileNotFoundError) as job:
        experiments.zero_shot_table(preset, tasks, registry=REGISTRY)
    with pytest.raises(FileNotFoundError) as dry:
        dry_run.analyze("zero-shot", FinetuneConfig(init=preset), tasks, None, registry=REGISTRY)
    assert str(dry.value) == str(job.value)
    assert "dev" in str(dry.value)


@pytest.mark.parametrize("mode", ["transfer", "ablations"])
def test_a_fine_tuning_analysis_without_its_tasks_training_data_is_refused(mode):
    # The runs fine-tune on each task's train split: without it they stop at their first run.
    tasks = {"sst2": "/no/such/folder"}
    with pytest.raises(FileNotFoundError, match="Data directory '/no/such/folder' does not exist .*train"):
        dry_run.analyze(mode, FinetuneConfig(), tasks, None, rows=["full"], seeds=[0], registry=REGISTRY)
