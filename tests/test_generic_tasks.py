"""Your own tables with no plugin (docs/your-data.md): text-classification, text-regression and multiple-choice.

The readers' error paths run without a model. The guide's commands run for real on a tiny model: its
text-classification ones (a CSV, JSON-lines pairs) in one process, its kgpt-predict command and its
Python example; its multiple-choice and regression commands under `-m large` (their readers, and a
training step on their embedded data in tests/test_task_contract.py, run in CI).
"""

import csv
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import TINY, char_tokenizer, commands_in_one_process, one_backend

import kgpt
from kgpt.data import tables
from kgpt.errors import ConfigError, DataError
from kgpt.jobs import finetune as finetune_lib
from kgpt.jobs import predict as predict_lib
from kgpt.jobs.config import FinetuneConfig
from kgpt.tasks import metrics as metrics_lib

REGISTRY = kgpt.TaskRegistry()
GUIDE = pathlib.Path(__file__).parents[1] / "docs" / "your-data.md"
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def write_csv(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return str(path)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def with_files(kind, **options):
    return REGISTRY.get(kind).with_files(**options)


# --- tables ----------------------------------------------------------------------------------------------------


def test_csv_round_trips_quotes_commas_and_line_breaks(tmp_path):
    rows = [{"id": "1", "text": 'she said "hi", then\nleft', "label": "a"}, {"id": "2", "text": "plain", "label": "b"}]
    path = str(tmp_path / "t.csv")
    assert tables.write_table(path, "csv", ["id", "text", "label"], rows) == 2
    table = tables.read_table(path)
    assert table.columns == ["id", "text", "label"]
    assert list(table.rows) == [(2, rows[0]), (4, rows[1])]  # a row is named by the line it starts on


@pytest.mark.parametrize(
    "name, content, error",
    [
        ("a.csv", "x,y\n1,2\n3\n", r"a.csv:3: 1 field\(s\), but the header \(line 1\) names 2"),
        ("a.csv", 'x,y\n"1,2\n', r"a.csv:2: a quoted field opens here and is never closed"),
        ("a.csv", 'x,y\n1,2\n"3"4,5\n', r"a.csv:3: malformed CSV"),
        ("a.tsv", "x\ty\n1\t2\n\n3\t4\n", r"a.tsv:3: blank line inside the data"),
        ("a.csv", "x,x\n1,2\n", r"a.csv:1: the header names column 'x' twice"),
        ("a.jsonl", '{"x": "1"}\n[1, 2]\n', r"a.jsonl:2: expected a JSON object, got list"),
        ("a.jsonl", '{"x": "1"}\n{"x": \n', r"a.jsonl:2: not valid JSON"),
        ("a.csv", "", r"a.csv: the file is empty"),
        ("a.csv", "x,y\n", r"a.csv: no rows after the header"),
        ("a.csv", b"x,y\n1,\xff\n", r"a.csv:2: byte 3 of the line \(0xff\) is not valid UTF-8"),
    ],
)
def test_malformed_tables_name_file_and_line(tmp_path, name, content, error):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DataError, match=error):
        list(tables.read_table(str(path)).rows)


def test_unknown_extensions_and_tsv_values_tsv_cannot_hold(tmp_path):
    with pytest.raises(ConfigError, match=r"reviews.xlsx: cannot tell the format .*'.xlsx'"):
        tables.table_format("reviews.xlsx")
    with pytest.raises(DataError, match=r"o.tsv: row 1 holds a tab or a line break"):
        tables.write_table(str(tmp_path / "o.tsv"), "tsv", ["t"], [{"t": "a\nb"}])
    assert not (tmp_path / "o.tsv").exists()


# --- the tasks' options and readers ------------------------------------------------------------------------------


@pytest.fixture
def reviews(tmp_path):
    train = write_csv(
        tmp_path / "train.csv",
        [
            ["review", "title", "stars"],
            ["good film", "A", "10"],
            ["bad film", "B", "2"],
            ["fine", "", "2"],
            ["great", "C", "10"],
        ],
    )
    dev = write_csv(tmp_path / "dev.csv", [["review", "title", "stars"], ["ok", "D", "2"], ["meh", "E", "5"]])
    return train, dev


def test_classification_takes_the_training_labels_and_a_pair_of_columns(reviews, tmp_path, capsys, progress):
    train, dev = reviews
    task = with_files("text-classification", train_file=train, text_columns="review,title", label_column="stars")
    assert task.labels == ("2", "10")  # integers in numeric order
    assert isinstance(task.transform, kgpt.tasks.transforms.Entailment) and task.metrics == ("accuracy", "f1")
    examples, skipped, read = task.examples("train", None)
    assert read == 4 and [e.label for e in examples] == ["10", "2", "10"]
    assert examples[0].segments == ("good film", "A") and examples[0].source == f"{train}:2"
    assert skipped == {"empty text in column 'title'": 1}
    assert f"1 row(s) with an empty text skipped (first at {train}:4)" in capsys.readouterr().out
    one = with_files(
        "text-classification", train_file=train, validation_file=dev, text_columns=["review"], label_column="stars"
    )
    assert isinstance(one.transform, kgpt.tasks.transforms.Classification)
    with pytest.raises(DataError, match=rf"{dev}:3: label '5' is not one of the training file's labels \('2', '10'\)"):
        one.examples("validation", None)
    with pytest.raises(FileNotFoundError, match="no test_file given"):
        one.examples("test", None)


def test_options_that_cannot_work_are_named(reviews, tmp_path):
    # From Python by their keywords; the command names its flags (test_cli_errors).
    train, dev = reviews
    with pytest.raises(ConfigError, match="give train_file"):
        with_files("text-classification", validation_file=dev, text_columns=["review"], label_column="stars")
    with pytest.raises(ConfigError, match=r"validation_file .*nope.csv: no such file"):
        with_files(
            "text-classification",
            train_file=train,
            validation_file=str(tmp_path / "nope.csv"),
            text_columns=["review"],
            label_column="stars",
        )
    with pytest.raises(ConfigError, match="text_columns: name the text column"):
        with_files("text-classification", train_file=train, label_column="stars")
    with pytest.raises(
        DataError,
        match=rf"{train}: no column 'text' \(text_columns\); it has 'review', 'title', "
        r"'stars'",
    ):
        with_files("text-classification", train_file=train, text_columns=["text"], label_column="stars")
    with pytest.raises(ConfigError, match="choice_columns is for task 'multiple-choice'"):
        with_files(
            "text-classification",
            train_file=train,
            text_columns=["review"],
            label_column="stars",
            choice_columns=["title", "review"],
        )
    with pytest.raises(ConfigError, match="takes one text column or a pair, got 3"):
        with_files("text-regression", train_file=train, text_columns=["review", "title", "stars"], label_column="x")
    with pytest.raises(ConfigError, match=r"Column\(s\) 'review' given twice"):
        with_files("text-classification", train_file=train, text_columns=["review"], label_column="review")
    with pytest.raises(ConfigError, match="choice_columns: multiple-choice needs two or more"):
        with_files("multiple-choice", train_file=train, text_columns=["review"], label_column="stars")
    # Read as review alone, and as one metric, before.
    with pytest.raises(ConfigError, match=r"^text_columns 'review,': an empty name"):
        with_files("text-classification", train_file=train, text_columns=["review", ""], label_column="stars")
    with pytest.raises(ConfigError, match=r"^metrics: 'f1' named twice"):
        with_files(
            "text-classification", train_file=train, text_columns="review", label_column="stars", metrics="f1,f1"
        )
    # Accuracy of floats is exact equality: it reported 0.0000 as the headline; f1 raised a plugin author's ValueError.
    for kind, metrics, error in (
        ("text-regression", "accuracy,pearson", r"^metrics: 'accuracy' compare\(s\) classes; text-regression predicts"),
        ("text-regression", "f1", r"^metrics: 'f1' compare\(s\) classes"),
    ):
        with pytest.raises(ConfigError, match=error):
            with_files(kind, train_file=train, text_columns="review", label_column="stars", metrics=metrics)
    with pytest.raises(ConfigError, match="metrics: 'auc' is no metric; kgpt has accuracy, f1, matthews"):
        with_files(
            "text-classification",
            train_file=train,
            text_columns=["review"],
            label_column="stars",
            metrics="matthews,auc",
        )
    assert with_files(
        "text-classification",
        train_file=train,
        text_columns=["review"],
        label_column="stars",
        metrics="matthews,accuracy",
    ).metrics == ("matthews", "accuracy")
    config = FinetuneConfig(task="sst2", init="scratch", train_file=train)
    with pytest.raises(ConfigError, match="--train_file: task 'sst2' reads --data_dir in its own format"):
        finetune_lib.with_files(REGISTRY.get("sst2"), config)


def test_labels_one_class_and_rare_classes(tmp_path, capsys, progress):
    one = write_csv(tmp_path / "one.csv", [["t", "l"], ["a", "x"], ["b", "x"]])
    with pytest.raises(DataError, match=r"every row has label 'x' in column 'l': a classifier needs two labels"):
        with_files("text-classification", train_file=one, text_columns=["t"], label_column="l")
    empty = write_csv(tmp_path / "empty.csv", [["t", "l"], ["a", "x"], ["b", " "]])
    with pytest.raises(DataError, match=r"empty.csv:3: empty label in column 'l'"):
        with_files("text-classification", train_file=empty, text_columns=["t"], label_column="l")
    rare = write_csv(tmp_path / "rare.csv", [["t", "l"], ["a", "x"], ["b", "x"], ["c", "y"]])
    assert with_files("text-classification", train_file=rare, text_columns=["t"], label_column="l").labels == ("x", "y")
    assert "label(s) 'y' (1) occur once only in 3 rows" in capsys.readouterr().out


def test_regression_values_and_an_unlabeled_test_file(tmp_path):
    train = write_jsonl(tmp_path / "s.jsonl", [{"a": "x", "b": "y", "score": 3.5}, {"a": "z", "b": "w", "score": "1"}])
    test = write_jsonl(tmp_path / "t.jsonl", [{"a": "x", "b": "y"}])
    task = with_files(
        "text-regression", train_file=train, test_file=test, text_columns=["a", "b"], label_column="score"
    )
    assert task.head.kind == "regression" and task.metrics == ("pearson", "spearman")
    assert [e.label for e in task.examples("train", None)[0]] == [3.5, 1.0]
    assert [e.label for e in task.examples("test", None)[0]] == [None]
    for bad in ("high", "nan"):
        write_jsonl(tmp_path / "s.jsonl", [{"a": "x", "b": "y", "score": 1}, {"a": "x", "b": "y", "score": bad}])
        with pytest.raises(DataError, match=rf"s.jsonl:2: 'score' holds '{bad}', not a finite number"):
            task.examples("train", None)
    write_jsonl(tmp_path / "s.jsonl", [{"a": "x", "b": ["y"], "score": 1}])
    with pytest.raises(DataError, match=r"s.jsonl:1: 'b' is a JSON list, not text"):
        task.examples("train", None)


def test_training_answers_that_are_all_one_choice_are_warned_of(tmp_path, capsys, progress):
    rows = [["q", "e1", "e2", "answer"]] + [[f"q{i}", "right", "wrong", "0"] for i in range(3)]
    train = tmp_path / "mc.tsv"
    train.write_text("".join("\t".join(r) + "\n" for r in rows))
    task = with_files(
        "multiple-choice", train_file=str(train), text_columns=["q"], choice_columns="e1,e2", label_column="answer"
    )
    assert [e.label for e in task.examples("train", None)[0]] == [0, 0, 0]
    assert (
        "mc.tsv: every one of its 3 answers in 'answer' is choice 0 ('e1'): the model can learn the position, not "
        "the texts." in capsys.readouterr().out
    )
    train.write_text("".join("\t".join(r) + "\n" for r in [*rows, ["q3", "wrong", "right", "1"]]))
    task.examples("train", None)
    assert "every one of its" not in capsys.readouterr().out


def test_multiple_choice_answers_by_index_or_text(tmp_path):
    rows = [
        ["story", "q", "e1", "e2", "e3", "answer"],
        ["s1", "why?", "x", "y", "z", "2"],
        ["s2", "who?", "x", "y", "z", "y"],
    ]
    train = tmp_path / "mc.tsv"
    train.write_text("".join("\t".join(r) + "\n" for r in rows))
    task = with_files(
        "multiple-choice",
        train_file=str(train),
        text_columns=["story", "q"],
        choice_columns="e1,e2,e3",
        label_column="answer",
    )
    assert task.transform.num_views == 3 and task.head.kind == "multiple_choice"
    examples = task.examples("train", None)[0]
    assert [(e.segments, e.choices, e.label) for e in examples] == [
        (("s1", "why?"), ("x", "y", "z"), 2),
        (("s2", "who?"), ("x", "y", "z"), 1),
    ]
    for answer, error in (
        (
            "3",
            r"mc.tsv:2: answer 3 in 'answer' is out of range: the 3 choices \(e1, e2, e3\) are "
            r"0..2",
        ),
        ("w", r"mc.tsv:2: answer 'w' in 'answer' is neither a choice index"),
    ):
        train.write_text("".join("\t".join(r) + "\n" for r in [rows[0], [*rows[1][:5], answer]]))
        with pytest.raises(DataError, match=error):
            task.examples("train", None)


def test_kgpt_predict_reads_the_trained_columns_and_names_a_missing_one(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "metrics.json").write_text(
        json.dumps({"inputs": {"text_columns": ["ctx"], "choice_columns": ["a", "b"], "label_column": "y"}})
    )
    assert predict_lib.trained_columns(str(model_dir)) == ["ctx", "a", "b"]
    assert predict_lib.trained_columns(str(tmp_path)) is None
    path = write_csv(tmp_path / "in.csv", [["id", "a", "ctx", "b"], ["7", "yes", 'c,"d"\ne', "no"]])
    inputs = predict_lib.read_inputs(path, kgpt.tasks.transforms.MultipleChoice(2), columns=["ctx", "a", "b"])
    assert inputs.examples == [(('c,"d"\ne',), ("yes", "no"))] and inputs.ids == ["7"] and inputs.format == "csv"
    assert inputs.records == [{"id": "7", "a": "yes", "ctx": 'c,"d"\ne', "b": "no"}]
    with pytest.raises(DataError, match=r"in.csv: no column 'q' \(columns\); it has 'id', 'a', 'ctx', 'b'"):
        predict_lib.read_inputs(path, kgpt.tasks.transforms.Classification(), columns=["q"])


# --- a fine-tuning that learned nothing says so ---------------------------------------------------------------------


@one_backend("tensorflow")
def test_a_run_predicting_one_label_ends_with_the_warning_and_its_baselines(tiny_preset, tmp_path, monkeypatch, capsys):
    from conftest import cli

    from kgpt.cli import train

    # The same text under every label: no model can tell them apart, so it gives one label to all of dev.
    train_file = write_csv(
        tmp_path / "train.csv", [["text", "label"]] + [["same words", "neg"]] * 6 + [["same words", "pos"]] * 4
    )
    dev = write_csv(
        tmp_path / "dev.csv", [["text", "label"]] + [["same words", "neg"]] * 3 + [["same words", "pos"]] * 2
    )
    code, out, err = cli(
        monkeypatch,
        capsys,
        train,
        "--task",
        "text-classification",
        "--init",
        tiny_preset,
        "--train_file",
        train_file,
        "--validation_file",
        dev,
        "--text_columns",
        "text",
        "--label_column",
        "label",
        "--output_dir",
        str(tmp_path / "out"),
        "--epochs",
        "1",
        "--batch_size",
        "4",
    )
    assert not code, err  # absl exits with None on success
    warning, tries = out.rstrip("\n").splitlines()[-2:]
    assert re.fullmatch(
        r"Warning: this fine-tuning learned nothing measurable\. On validation: accuracy 0\.[46]000, "
        r"the majority-class baseline 0\.6000 \(always predicting 'neg', 60\.0% of validation\), "
        r"chance 0\.5000; the model predicts '(neg|pos)' for every example\.",
        warning,
    ), warning
    assert (
        tries.startswith("  To try: another --learning_rate (this run 6.25e-05")
        and "more --epochs (this run 1)" in tries
        and f"a larger pre-trained model than --init {tiny_preset}" in tries
    )
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    validation = metrics["splits"]["validation"]
    assert validation["baselines"] == {
        "label_counts": {"neg": 3, "pos": 2},
        "majority_label": "neg",
        "majority_share": 0.6,
        "majority_scores": {"accuracy": 0.6, "f1": 0.0},
        "chance": 0.5,
    }
    assert len(validation["prediction_counts"]) == 1 and sum(validation["prediction_counts"].values()) == 5
    assert metrics["splits"]["train"]["baselines"]["majority_share"] == 0.6
    assert metrics["baseline_check"]["learned"] is False and metrics["baseline_check"]["majority"] == 0.6


def test_a_run_that_learns_ends_without_the_warning(tiny_preset, tmp_path, capsys, progress):
    rows = [["text", "label"]] + [["aaaa aaa", "neg"] if i % 2 else ["bbb bbbb", "pos"] for i in range(32)]
    dev = [
        ["text", "label"],
        ["aa aaaa", "neg"],
        ["bbbb bb", "pos"],
        ["aaa aa", "neg"],
        ["bbb", "pos"],
        ["a aaa", "neg"],
    ]
    config = FinetuneConfig(
        task="text-classification",
        init=tiny_preset,
        train_file=write_csv(tmp_path / "t.csv", rows),
        validation_file=write_csv(tmp_path / "d.csv", dev),
        text_columns=["text"],
        label_column="label",
        epochs=6,
        batch_size=8,
        learning_rate=1e-2,
        lm_coef=0.0,
    )
    _, results = finetune_lib.finetune(config, REGISTRY)
    check = results["baseline_check"]
    assert check["learned"] and check["score"] > check["majority"] == 0.6, check
    assert "learned nothing" not in capsys.readouterr().out


@one_backend("tensorflow")
def test_a_correlation_that_is_undefined_is_warned_of_and_written_as_null(tiny_preset, tmp_path, capsys, progress):
    # Every validation label 2: Pearson and Spearman are NaN, which Python's json writes as NaN (not JSON).
    config = FinetuneConfig(
        task="text-regression",
        init=tiny_preset,
        train_file=write_csv(tmp_path / "t.csv", [["text", "y"]] + [[f"row {i}", str(i % 3)] for i in range(8)]),
        validation_file=write_csv(tmp_path / "d.csv", [["text", "y"]] + [[f"dev {i}", "2"] for i in range(4)]),
        text_columns=["text"],
        label_column="y",
        epochs=1,
        batch_size=4,
        output_dir=str(tmp_path / "out"),
    )
    finetune_lib.finetune(config, REGISTRY)
    assert (
        "Warning: pearson, spearman on validation is undefined (NaN; null in metrics.json): every one of its 4 labels "
        "is 2.0, so its score cannot show learning." in capsys.readouterr().out
    )
    text = (tmp_path / "out" / "metrics.json").read_text()
    assert "NaN" not in text and json.loads(text)["splits"]["validation"]["pearson"] is None


def test_multiple_choice_baselines_and_warning_name_the_choice():
    from kgpt.jobs import finetune_outputs

    task = REGISTRY.get("multiple-choice")
    assert task.head.kind == "multiple_choice"
    found = metrics_lib.baselines(task, np.array([1, 1, 0, 1]))
    chance = 1 / task.head.num_choices
    assert found == {
        "label_counts": {"0": 1, "1": 3},
        "majority_label": 1,
        "majority_share": 0.75,
        "majority_scores": {"accuracy": 0.75},
        "chance": chance,
    }
    results = {task.splits[1]: {"accuracy": 0.75, "baselines": found, "prediction_counts": {"1": 4}}}
    check = finetune_outputs.baseline_check(task, results)
    assert not check["learned"] and check["one_label_predicted"] == "1"
    text = finetune_outputs.learned_nothing(task, check, init="scratch", epochs=3, learning_rate=0.0)
    assert (
        f"the majority-class baseline 0.7500 (always predicting choice 1, 75.0% of {task.splits[1]}), chance "
        f"{chance:.4f}; the model predicts choice 1 for every example" in text
    )
    assert "--learning_rate is 0" in text and "--init PRESET" in text
    assert metrics_lib.baselines(REGISTRY.get("text-regression"), np.array([0.5, 2.0], "float32")) is None


# --- the guide's commands, for real on a tiny model -----------------------------------------------------------------


def guide_blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(), re.S)


def guide_files():
    """`{file name: content}` of the guide's example files: a `name` line, then its csv/jsonl block."""
    found = re.findall(
        r"^`([\w.]+)`[^\n]*\n(?:[^\n`][^\n]*\n)*?\n```(?:csv|jsonl)\n(.*?)```", GUIDE.read_text(), re.S | re.M
    )
    return dict(found)


def guide_commands(program):
    return [
        shlex.split(line)[1:]
        for block in guide_blocks("bash")
        for line in block.splitlines()
        if line.startswith(program + " ")
    ]


def extra_files(folder):
    """The files the guide names but does not show: a multiple-choice TSV and a regression CSV."""
    stories = [["story", "ending1", "ending2", "right_ending"]] + [
        [f"tom {verb} the ball .", "he was happy .", "he was sad .", str(i % 2)]
        for i, verb in enumerate(["caught", "dropped", "kicked", "lost", "threw", "found"])
    ]
    for name, rows in (("stories.tsv", stories), ("stories_dev.tsv", stories[:3])):
        (folder / name).write_text("".join("\t".join(r) + "\n" for r in rows))
    scores = [
        ["sentence1", "sentence2", "score"],
        ["a cat sits .", "a cat sits .", "5"],
        ["a cat sits .", "a dog runs .", "0.5"],
        ["rain falls .", "it rains .", "4.2"],
    ]
    write_csv(folder / "scores.csv", scores)
    write_csv(folder / "scores_dev.csv", scores[:3])
    (folder / "mnli_dev.jsonl").write_text((folder / "mnli_train.jsonl").read_text())  # the guide shows one file


# Every kgpt-train command of the guide, in one process (each is the real command's main, flags parsed by absl).
DRIVER = """
import json, sys
from absl import flags
from kgpt import checks, log
from kgpt.cli import common, train
log.to_stdout()  # as the command's run() does: the test reads the progress lines
for args in json.loads(sys.argv[1]):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["kgpt-train", *args])
    with checks.command_line():  # as run() calls main: messages name flags
        train.main(["kgpt-train"])
"""


def task_of(args):
    return args[args.index("--task") + 1]


def run_kgpt_train(folder, commands):
    """Runs kgpt-train `commands` of the guide in `folder` with one epoch (tiny); returns what they printed."""
    commands = [[*args, "--epochs", "1"] for args in commands]
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(commands)],
        cwd=folder,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for args in commands:
        out = folder / args[args.index("--output_dir") + 1]
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["task"] == task_of(args)
        assert metrics["inputs"]["label_column"] == args[args.index("--label_column") + 1]
        assert metrics["splits"]["train"]["examples"]["skipped"] == 0
    return done.stdout


# Every test of guide_run (the guide's own commands, the subject of the tests, not the backend's): on one backend,
# so the fixture is built on one.
WITH_GUIDE_RUN = one_backend("tensorflow")


@pytest.fixture(scope="module")
def guide_folder(tmp_path_factory):
    """The guide's files (and those it names), and a tiny pre-trained model at `lm`."""
    folder = tmp_path_factory.mktemp("guide")
    for name, content in guide_files().items():
        (folder / name).write_text(content)
    extra_files(folder)
    tokenizer = char_tokenizer()
    backbone = kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size(), "max_sequence_length": 64})
    backbone.save_to_preset(str(folder / "lm"))
    tokenizer.save_to_preset(str(folder / "lm"))
    return folder


@pytest.fixture(scope="module")
def guide_run(guide_folder):
    """The guide's text-classification commands run: the CSV quick start and the JSON-lines pairs."""
    commands = [args for args in guide_commands("kgpt-train") if task_of(args) == "text-classification"]
    assert len(commands) == 2
    return guide_folder, run_kgpt_train(guide_folder, commands)


def test_the_guide_shows_its_files_and_commands():
    assert set(guide_files()) == {"reviews.csv", "dev.csv", "new_reviews.csv", "mnli_train.jsonl"}
    assert len(guide_commands("kgpt-train")) == 4 and len(guide_commands("kgpt-predict")) == 1


@WITH_GUIDE_RUN
def test_the_guides_text_classification_commands_fine_tune_on_csv_and_json_lines(guide_run):
    folder, log = guide_run
    reviews = json.loads((folder / "my-reviews" / "metrics.json").read_text())
    assert set(reviews["splits"]["validation"]) >= {"accuracy", "f1"}
    assert reviews["splits"]["train"]["examples"]["read"] == 6
    predictions = (folder / "my-reviews" / "predictions" / "validation.tsv").read_text().splitlines()
    assert predictions[0] == "id\tprediction\tp_negative\tp_positive\tlabel" and predictions[1].startswith(
        "dev.csv:2\t"
    )
    assert kgpt.GPTTaskModel.from_preset(str(folder / "my-nli")).head.labels == (
        "contradiction",
        "entailment",
        "neutral",
    )
    assert "Split 'test' not evaluated: no --test_file given" in log


@pytest.mark.large  # two more tiny fine-tunings (~20 s of CPU); the tasks' readers and a train step are tested above
def test_the_guides_multiple_choice_and_regression_commands_fine_tune(guide_folder):
    commands = [args for args in guide_commands("kgpt-train") if task_of(args) != "text-classification"]
    assert {task_of(args) for args in commands} == {"multiple-choice", "text-regression"}
    run_kgpt_train(guide_folder, commands)
    scores = json.loads((guide_folder / "my-scores" / "metrics.json").read_text())
    assert set(scores["splits"]["validation"]) >= {"pearson", "spearman"}
    stories = json.loads((guide_folder / "my-stories" / "metrics.json").read_text())
    assert (
        stories["inputs"]["choice_columns"] == ["ending1", "ending2"] and "accuracy" in stories["splits"]["validation"]
    )


@WITH_GUIDE_RUN
def test_the_guides_kgpt_predict_labels_new_csv_rows(guide_run):
    folder, _ = guide_run
    [args] = guide_commands("kgpt-predict")
    [done] = commands_in_one_process("kgpt.cli.predict", [args], folder)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(folder / "labelled.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    with open(folder / "new_reviews.csv", newline="", encoding="utf-8") as f:
        inputs = list(csv.DictReader(f))
    assert [{k: r[k] for k in ("id", "review", "source")} for r in rows] == inputs
    assert list(rows[0]) == ["id", "review", "source", "prediction", "p_negative", "p_positive"]
    model = kgpt.GPTTaskModel.from_preset(str(folder / "my-reviews"))
    texts = [r["review"] for r in inputs]
    np.testing.assert_allclose(
        [[float(r["p_negative"]), float(r["p_positive"])] for r in rows],
        model.head.probabilities(model.predict(texts)),
        atol=1e-4,
    )
    assert [r["prediction"] for r in rows] == model.predict_labels(texts)
    # Its output again as input: the predictions would replace its columns, so it is refused.
    again = predict_lib.read_inputs(str(folder / "labelled.csv"), model.preprocessor.transform, columns=["review"])
    with pytest.raises(
        DataError,
        match=r"labelled.csv: the input already has column\(s\) 'prediction', 'p_negative', "
        r"'p_positive', which the predictions would replace",
    ):
        predict_lib.write(model, again, str(folder / "again.csv"))
    assert not (folder / "again.csv").exists()


@WITH_GUIDE_RUN
def test_json_lines_predictions_keep_each_rows_own_text(guide_run, tmp_path):
    folder, _ = guide_run
    model = kgpt.GPTTaskModel.from_preset(str(folder / "my-reviews"))
    lines = [
        '{"stars": 1.50, "review": "Great \\u00e9 value", "n": 1e3}',
        '  {"review":"bad" , "big": 12345678901234567890.5}',
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    inputs = predict_lib.read_inputs(str(tmp_path / "in.jsonl"), model.preprocessor.transform, columns=["review"])
    assert predict_lib.write(model, inputs, str(tmp_path / "out.jsonl")) == 2
    written = (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()
    # Loaded and dumped, 1.50 became 1.5, 1e3 1000.0 and the big number 1.2345678901234567e+19.
    for line, before in zip(written, lines):
        assert line.startswith(before.rstrip()[:-1].rstrip() + ", ")
        row = json.loads(line)
        assert list(row)[-3:] == ["prediction", "p_negative", "p_positive"] and row["prediction"] in (
            "negative",
            "positive",
        )


@WITH_GUIDE_RUN
def test_json_lines_predictions_refuse_a_later_line_they_would_spoil(guide_run, tmp_path):
    folder, _ = guide_run
    model = kgpt.GPTTaskModel.from_preset(str(folder / "my-reviews"))
    path = tmp_path / "in.jsonl"
    # A second "prediction" key in line 2 (the first line's keys alone were checked): kgpt refused its own output.
    path.write_text('{"review": "ab"}\n{"review": "cd", "prediction": "old"}\n', encoding="utf-8")
    inputs = predict_lib.read_inputs(str(path), model.preprocessor.transform, columns=["review"])
    with pytest.raises(DataError, match=rf"^{path}:2: the input already has column\(s\) 'prediction', which"):
        predict_lib.write(model, inputs, str(tmp_path / "out.jsonl"))
    assert not (tmp_path / "out.jsonl").exists()
    # As CSV, a key of line 2's own was dropped and one it lacks raised a bare KeyError.
    path.write_text('{"review": "ab", "x": 1}\n{"x": 2, "review": "cd"}\n{"review": "ef", "y": 3}\n', encoding="utf-8")
    inputs = predict_lib.read_inputs(str(path), model.preprocessor.transform, columns=["review"])
    with pytest.raises(DataError, match=rf"^{path}:3: keys 'y' and no 'x', where the first line has 'review', 'x': a "):
        predict_lib.write(model, inputs, str(tmp_path / "out.csv"))
    assert predict_lib.write(model, inputs, str(tmp_path / "out.jsonl")) == 3  # JSON lines keep each line's keys


def test_predicted_values_are_written_in_full():
    from kgpt.jobs.finetune_outputs import prediction_rows

    values = np.array([1234.567, 98765.43], "float32")  # 1234.57 and 98765.4 with six significant digits
    rows = list(prediction_rows(kgpt.tasks.heads.RegressionHead(), ["a", "b"], values, values, labels=values))
    assert rows == ["a\t1234.567\t1234.567", "b\t98765.43\t98765.43"]


def test_columns_must_name_as_many_distinct_columns_as_the_model_was_trained_on(tmp_path):
    def model_dir(name, transform, columns=None):
        folder = tmp_path / name
        folder.mkdir()
        config = {"transform": keras.saving.serialize_keras_object(transform)}
        if columns:
            config["columns"] = columns
        # The preprocessor a task preset loads (task.json's), and keras-hub's copy of it.
        (folder / "task.json").write_text(json.dumps({"config": {"preprocessor": {"config": config}}}))
        (folder / "preprocessor.json").write_text(json.dumps({"config": config}))
        return str(folder)

    reviews = model_dir("reviews", kgpt.tasks.transforms.Classification(), ["review"])
    mistakes = [
        ([], "^columns '' names an empty column"),
        (["review", ""], "^columns 'review,' names an empty column"),
        (["review", "review"], "^columns names 'review' more than once"),
        (["src", "review"], r"^columns names 2 column\(s\) \(src, review\); the model was trained on 1 text "),
    ]
    for columns, error in mistakes:
        with pytest.raises(ConfigError, match=error):
            predict_lib.columns_for(reviews, "c2.csv", columns=columns)
    assert predict_lib.columns_for(reviews, "c2.csv", columns=["src"]) == ["src"]
    assert predict_lib.columns_for(reviews, "c2.csv") == ["review"]
    pairs = model_dir("pairs", kgpt.tasks.transforms.Entailment())  # a task's own data: no trained columns
    with pytest.raises(ConfigError, match=r"^columns names 1 column\(s\) \(p\); the model was trained on 2 text"):
        predict_lib.columns_for(pairs, "in.jsonl", columns=["p"])
    assert predict_lib.columns_for(pairs, "in.jsonl", columns=["p", "h"]) == ["p", "h"]
    choices = model_dir("choices", kgpt.tasks.transforms.MultipleChoice(2), ["ctx", "a", "b"])  # or one list column
    assert predict_lib.columns_for(choices, "in.jsonl", columns=["ctx", "answers"]) == ["ctx", "answers"]
    # A third answer column for a 2-answer model: a ValueError from the preprocessor, naming no row, before.
    with pytest.raises(ConfigError, match=r"^columns names 4 column\(s\) \(ctx, a, b, c\); the model takes 1 context"):
        predict_lib.columns_for(choices, "in.csv", columns=["ctx", "a", "b", "c"])
    # A built-in task's model records no columns; its context count says how many (each row was refused before).
    race = model_dir("race", kgpt.tasks.transforms.MultipleChoice(4, num_segments=2))
    with pytest.raises(ConfigError, match=r"^columns names 7 column\(s\) \(a, q, 1, 2, 3, 4, 5\); the model takes 2 "):
        predict_lib.columns_for(race, "in.csv", columns=["a", "q", "1", "2", "3", "4", "5"])
    assert predict_lib.columns_for(race, "in.jsonl", columns=["a", "q", "answers"]) == ["a", "q", "answers"]


@WITH_GUIDE_RUN
def test_kgpt_predict_refuses_an_empty_columns_in_one_line(guide_run):
    folder, _ = guide_run
    (folder / "c2.csv").write_text("review,src\ngood film,a\n")
    args = ["--model=my-reviews", "--input=c2.csv", "--columns=", "--output=-"]
    [done] = commands_in_one_process("kgpt.cli.predict", [args], folder)
    assert done.returncode == 1 and "Traceback" not in done.stderr and not done.stdout, done.stderr[-3000:]
    assert (
        "kgpt-predict: error: --columns '' names an empty column: name the table columns holding the segments "
        "(the model was trained on review)" in done.stderr
    )


@WITH_GUIDE_RUN
def test_the_guides_python_example_runs(guide_run, monkeypatch):
    folder, _ = guide_run
    monkeypatch.chdir(folder)
    [code] = guide_blocks("python")
    namespace = {}
    exec(compile(code, str(GUIDE), "exec"), namespace)  # noqa: S102 - the guide's own example
    assert namespace["task"].labels == ("negative", "positive")
    assert namespace["read"] == 6 and len(namespace["examples"]) == 6 and not namespace["skipped"]
    assert namespace["model"].task_name == "text-classification"
